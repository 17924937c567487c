"""builtin:demo: every node kind the runner executes so far, end to end.

compute -> notify -> a shell command (an idempotent effect) -> an action that
writes a note file (a manual effect; only when the input names ``noteFile``) ->
an http POST of the greeting (an idempotent effect; only when the input names
``hookUrl``) -> an included child workflow -> checkpoint (answer it with
`pi-workflows answer RUN_ID ask JSON`) -> a switch on the answer -> a final
notification.
"""

from pathlib import Path

from piworkflows.workflows import (
    action,
    checkpoint,
    compute,
    define_workflow,
    edge,
    http,
    idempotent_effect,
    include_workflow,
    manual_effect,
    notify,
    shell,
    switch,
)

REVISION = "4"


def _write_note(ctx):
    """An outside effect that is not safe to repeat blindly: it appends to a file."""
    note = ctx.input.get("noteFile")
    if not note:
        return {"written": None}
    with Path(note).open("a", encoding="utf-8") as f:
        f.write(ctx.outputs["echo"]["echoed"] + "\n")
    return {"written": note}


summarise = define_workflow(
    name="demo-summary",
    start_at="count",
    nodes={
        "count": compute(run=lambda ctx: {"words": len(ctx.input["text"].split())}),
        "describe": compute(run=lambda ctx: {"line": f"{ctx.outputs['count']['words']} words"}),
    },
    edges=[edge("count", "describe")],
    exits={"done": {"from": "describe"}},
)

workflow = define_workflow(
    name="demo",
    description="Every node kind the runner executes, end to end, with a checkpoint to answer. "
    'Input: {"who": "NAME", "noteFile": "/abs/file" (optional), "hookUrl": "URL" (optional)}.',
    title=lambda ctx: f"demo for {ctx.input.get('who', 'you')}",
    start_at="greet",
    nodes={
        "greet": compute(run=lambda ctx: {"greeting": f"hello {ctx.input.get('who', 'you')}"}),
        "progress": notify(kind="progress", message=lambda ctx: ctx.outputs["greet"]["greeting"]),
        "echo": shell(
            effect=idempotent_effect("demo.echo"),
            exec=lambda ctx: {"command": "echo", "args": [ctx.outputs["greet"]["greeting"]], "timeoutMs": 10_000},
            parse=lambda out: {"echoed": out["stdout"].strip(), "exitCode": out["exitCode"]},
        ),
        "note": action(effect=manual_effect("demo.note"), run=_write_note),
        "hook": compute(run=lambda ctx: {"post": bool(ctx.input.get("hookUrl"))}),
        "post": http(
            effect=idempotent_effect("demo.post"),
            request=lambda ctx: {
                "method": "POST",
                "url": ctx.input["hookUrl"],
                "body": {"greeting": ctx.outputs["greet"]["greeting"]},
            },
            timeout_ms=10_000,
        ),
        "ask": checkpoint(summary='Continue the demo? Answer {"continue": true} or {"continue": false}.'),
        "finish": notify(kind="final", message=lambda ctx: "demo finished: " + ctx.outputs["summary/describe"]["line"]),
        "stop": notify(kind="final", message="demo stopped at the checkpoint"),
    },
    includes={"summary": include_workflow(summarise, input=lambda ctx: {"text": ctx.outputs["echo"]["echoed"]})},
    edges=[
        edge("greet", "progress"),
        edge("progress", "echo"),
        edge("echo", "note"),
        edge("note", "hook"),
        switch("hook", on="$.post", cases={"true": "post", "false": "summary"}),
        edge("post", "summary"),
        edge("summary.done", "ask"),
        switch("ask", on="$.continue", cases={"true": "finish", "false": "stop"}),
    ],
    max_steps=20,
)

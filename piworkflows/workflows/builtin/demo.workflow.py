"""builtin:demo: every node kind the runner executes so far, end to end.

compute -> notify -> an included child workflow -> checkpoint (answer it with
`pi-workflows answer RUN_ID ask JSON`) -> a switch on the answer -> a final
notification. (Shell and action nodes join when the runner performs effects.)
"""

from piworkflows.workflows import (
    checkpoint,
    compute,
    define_workflow,
    edge,
    include_workflow,
    notify,
    switch,
)

REVISION = "2"

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
    title=lambda ctx: f"demo for {ctx.input.get('who', 'you')}",
    start_at="greet",
    nodes={
        "greet": compute(run=lambda ctx: {"greeting": f"hello {ctx.input.get('who', 'you')}"}),
        "progress": notify(kind="progress", message=lambda ctx: ctx.outputs["greet"]["greeting"]),
        "ask": checkpoint(summary='Continue the demo? Answer {"continue": true} or {"continue": false}.'),
        "finish": notify(kind="final", message=lambda ctx: "demo finished: " + ctx.outputs["summary/describe"]["line"]),
        "stop": notify(kind="final", message="demo stopped at the checkpoint"),
    },
    includes={"summary": include_workflow(summarise, input=lambda ctx: {"text": ctx.outputs["greet"]["greeting"]})},
    edges=[
        edge("greet", "progress"),
        edge("progress", "summary"),
        edge("summary.done", "ask"),
        switch("ask", on="$.continue", cases={"true": "finish", "false": "stop"}),
    ],
    max_steps=20,
)

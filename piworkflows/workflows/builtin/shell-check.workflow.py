"""builtin:shell-check: run one command and report how it went.

Input: {"command": "pytest", "args": ["-q"], "cwd": "/path" (optional)}.
Output of the run: {"ok": bool, "exitCode": int, "tail": last lines of output}.
"""

from piworkflows.workflows import compute, define_workflow, edge, idempotent_effect, notify, shell

REVISION = "1"


def _message(ctx):
    report = ctx.outputs["report"]
    return "passed" if report["ok"] else f"failed (exit code {report['exitCode']})"


def _report(ctx):
    result = ctx.outputs["check"]
    text = (result["stdout"] + result["stderr"]).splitlines()
    return {"ok": result["exitCode"] == 0, "exitCode": result["exitCode"], "tail": "\n".join(text[-20:])}


workflow = define_workflow(
    name="shell-check",
    description='Run one command and report how it went. Input: {"command": "pytest", "args": ["-q"], '
    '"cwd": "/path" (optional)}.',
    start_at="check",
    nodes={
        "check": shell(
            effect=idempotent_effect("shell-check.run"),
            exec=lambda ctx: {
                "command": ctx.input["command"],
                "args": list(ctx.input.get("args", [])),
                **({"cwd": ctx.input["cwd"]} if "cwd" in ctx.input else {}),
            },
            allow_non_zero_exit=True,
        ),
        "report": compute(run=_report),
        "done": notify(kind="final", message=_message),
    },
    edges=[edge("check", "report"), edge("report", "done")],
    max_steps=10,
)

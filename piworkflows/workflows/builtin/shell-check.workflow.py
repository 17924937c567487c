"""builtin:shell-check: run one command; the run completes only if the command succeeds.

Input: {"command": "pytest", "args": ["-q"], "cwd": "/path" (optional)}.
A command that fails (a non-zero exit, a signal, a command that cannot be run)
fails the run at node ``check`` (``nonZeroExit``): the run error names the node
and holds the exit code and the end of stderr; the failed node keeps the
command's output ({stdout, stderr, exitCode, ...}).
A passing check reports {"ok": true, "exitCode": 0, "tail": the last lines of
output} at node ``report`` and ends with the message "passed".
"""

from piworkflows.workflows import compute, define_workflow, edge, idempotent_effect, notify, shell

REVISION = "2"


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
        ),
        "report": compute(run=_report),
        "done": notify(kind="final", message="passed"),
    },
    edges=[edge("check", "report"), edge("report", "done")],
    max_steps=10,
)

"""builtin:telegram-demo: a protected human decision delivered through Telegram, then a notice.

Input: {"release": "1.2.0"} (optional). The decision goes to the audience ``operator`` of
channels.json; ``ship`` completes the run with a notice to the same audience, ``hold`` asks why
(a force-reply) and records it. With no answer within 10 minutes the release is held.
"""

from piworkflows.workflows import choice, compute, define_workflow, human_decision, notify, switch, text_input

REVISION = "1"


def _release(ctx):
    return (ctx.input or {}).get("release", "1.2.0")


workflow = define_workflow(
    name="telegram-demo",
    description='A release decision answered in Telegram. Input: {"release": "1.2.0"} (optional).',
    start_at="approve",
    nodes={
        "approve": human_decision(
            audience="operator",
            choices={
                "ship": choice("Ship it"),
                "hold": choice("Hold", input=text_input("reason", "Why hold the release?")),
            },
            on_timeout={"after_ms": 600_000, "response": {"choice": "hold", "input": "no answer in time"}},
            request=lambda ctx: {"title": f"Ship release {_release(ctx)}?", "summary": "All checks passed."},
        ),
        "shipped": notify("progress", lambda ctx: f"Release {_release(ctx)} is shipping.", audience="operator"),
        "held": compute(lambda ctx: {"held": True, "reason": ctx.outputs["approve"]["input"]}),
    },
    edges=[switch("approve", on="$.choice", cases={"ship": "shipped", "hold": "held"})],
)

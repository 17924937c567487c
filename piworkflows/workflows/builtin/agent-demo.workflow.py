"""builtin:agent-demo: an agent step and a decision, each on the Pi coding agent.

compute (a test report) -> review (an agent step whose output a JSON Schema
checks) -> decide (a decision: exactly one of its choices) -> a final
notification on the chosen route. The model comes from
PI_WORKFLOWS_AGENT_MODEL (else Pi's default); ``python -m piworkflows.demo``
runs it on a scripted model, with no network and no API key.
"""

from piworkflows.workflows import agent, compute, decision, define_workflow, edge, notify, switch

REVISION = "1"

REVIEW = {
    "type": "object",
    "required": ["summary", "risk"],
    "properties": {"summary": {"type": "string", "minLength": 1}, "risk": {"enum": ["low", "high"]}},
    "additionalProperties": False,
}

workflow = define_workflow(
    name="agent-demo",
    description="An agent step whose output a JSON Schema checks, then a decision routes the run. "
    'Input: {"change": "what changed"} (optional).',
    title=lambda ctx: f"agent demo: {ctx.input.get('change', 'a small change')}",
    start_at="report",
    nodes={
        "report": compute(
            run=lambda ctx: {"change": ctx.input.get("change", "a small change"), "passed": 41, "failed": 0}
        ),
        "review": agent(
            prompt=lambda ctx: (
                f"Review this test report of {ctx.outputs['report']['change']!r}: "
                f"{ctx.outputs['report']['passed']} passed, {ctx.outputs['report']['failed']} failed. "
                "Summarise it in one sentence and rate the risk of shipping it."
            ),
            expected_output=REVIEW,
        ),
        "decide": decision(
            question=lambda ctx: f"The review says: {ctx.outputs['review']['summary']} Ship the change now?",
            choices=["ship", "hold"],
        ),
        "ship": notify(kind="final", message=lambda ctx: "shipping: " + ctx.outputs["review"]["summary"]),
        "hold": notify(kind="final", message="held for a person to look at"),
    },
    edges=[
        edge("report", "review"),
        edge("review", "decide"),
        switch("decide", on="$.route", cases={"ship": "ship", "hold": "hold"}),
    ],
    max_steps=10,
)

"""human_decision(...) authoring: what compiles into the definition snapshot, and every refusal
before any state is written, naming the node."""

from __future__ import annotations

from typing import Any

import pytest

from piworkflows.workflows import (
    WorkflowDefinitionError,
    choice,
    compute,
    define_workflow,
    edge,
    human_decision,
    switch,
    text_input,
)

pytestmark = pytest.mark.timeout(30)

CHOICES = {"ship": choice("Ship it"), "replan": choice("Replan", input=text_input("instructions", "What changes?"))}


def workflow(node: Any, edges: list[Any] | None = None) -> Any:
    nodes = {"approve": node, "shipped": compute(lambda ctx: 1), "replanned": compute(lambda ctx: 2)}
    cases = {"ship": "shipped", "replan": "replanned"}
    return define_workflow("flow", "approve", nodes, edges or [switch("approve", on="$.choice", cases=cases)])


def test_a_human_decision_compiles_into_the_snapshot():
    node = human_decision(
        "operator",
        CHOICES,
        on_timeout={"after_ms": 600_000, "response": {"choice": "ship"}},
        request=lambda ctx: {"title": "Ship?"},
    )
    snapshot = workflow(node).compile().snapshot
    assert snapshot["nodes"]["approve"] == {
        "kind": "human_decision",
        "audience": "operator",
        "choices": {
            "ship": {"label": "Ship it", "input": None},
            "replan": {"label": "Replan", "input": {"name": "instructions", "prompt": "What changes?"}},
        },
        "onTimeout": {"afterMs": 600_000, "response": {"choice": "ship"}},
    }
    no_default = workflow(human_decision("operator", CHOICES, on_timeout={"after_ms": 1}))
    assert no_default.compile().snapshot["nodes"]["approve"]["onTimeout"] == {"afterMs": 1, "response": None}


@pytest.mark.parametrize(
    ("node", "words"),
    [
        (human_decision("", CHOICES), "audience"),
        (human_decision("operator", {}), "at least one choice"),
        (human_decision("operator", {"ship": "Ship it"}), "use choice(label"),  # type: ignore[dict-item]
        (human_decision("operator", {"ship": choice("")}), "label"),
        (human_decision("operator", {"ship": choice("x" * 65)}), "label"),
        (human_decision("operator", {"bad key": choice("Ship")}), "choice key"),
        (human_decision("operator", {"ship": choice("Ship", input=text_input("why", ""))}), "prompt"),
        (human_decision("operator", {"ship": choice("Ship", input=text_input("why", "x" * 4001))}), "prompt"),
        (human_decision("operator", CHOICES, on_timeout={"after_ms": 0}), "after_ms"),
        (human_decision("operator", CHOICES, on_timeout={"after_ms": True}), "after_ms"),
        (human_decision("operator", CHOICES, on_timeout={"after": 5}), "on_timeout"),
        (human_decision("operator", CHOICES, on_timeout={"after_ms": 5, "response": {"choice": "no"}}), "choices"),
        (
            human_decision("operator", CHOICES, on_timeout={"after_ms": 5, "response": {"choice": "replan"}}),
            "needs its input",
        ),
        (
            human_decision(
                "operator", CHOICES, on_timeout={"after_ms": 5, "response": {"choice": "ship", "input": "x"}}
            ),
            "takes no input",
        ),
        (human_decision("operator", CHOICES, request="Ship?"), "request="),  # type: ignore[arg-type]
    ],
)
def test_a_bad_human_decision_is_refused_naming_the_node(node, words):
    with pytest.raises(WorkflowDefinitionError) as refused:
        workflow(node)
    assert "node 'approve'" in str(refused.value) and words in str(refused.value)


def test_a_switch_over_a_human_decision_reads_the_choice_and_covers_every_one():
    node = human_decision("operator", CHOICES)
    with pytest.raises(WorkflowDefinitionError, match=r"switch on \$\.choice"):
        workflow(node, [switch("approve", on="$.route", cases={"ship": "shipped", "replan": "replanned"})])
    with pytest.raises(WorkflowDefinitionError, match="no case for the decision's choice"):
        workflow(node, [switch("approve", on="$.choice", cases={"ship": "shipped"})])
    with pytest.raises(WorkflowDefinitionError, match="not choices of the decision"):
        cases = {"ship": "shipped", "replan": "replanned", "other": "shipped"}
        workflow(node, [switch("approve", on="$.choice", cases=cases)])
    routed = workflow(
        node, [switch("approve", on="$result.outcome", cases={"ok": "shipped", "timed_out": "replanned"})]
    )
    assert routed.compile().snapshot["nodes"]["approve"]["kind"] == "human_decision"
    assert workflow(node, [edge("approve", "shipped")]).compile() is not None

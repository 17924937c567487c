"""Agent and decision steps as a workflow declares them (docs/authoring.md, Agent steps): their
static fields in the definition snapshot, and every compile-time refusal, which names the node
(or the switch) at fault before any run exists."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from piworkflows.workflows import (
    DEFAULT,
    WorkflowDefinitionError,
    agent,
    assistant_message,
    command,
    compute,
    decision,
    define_workflow,
    edge,
    include_workflow,
    pi,
    switch,
)
from piworkflows.workflows.nodes import Node

pytestmark = pytest.mark.timeout(30)


class Summary(pydantic.BaseModel):
    summary: str
    files: list[str] = []


def _static(node: Node) -> dict[str, Any]:
    compiled = define_workflow("w", "step", {"step": node}).compile()
    return compiled.snapshot["nodes"]["step"]


def _refused(nodes: dict[str, Node], edges: list[Any] | None = None, **kwargs: Any) -> str:
    with pytest.raises(WorkflowDefinitionError) as info:
        define_workflow("w", next(iter(nodes)), nodes, edges or [], **kwargs)
    return str(info.value)


# ---------------------------------------------------------------- the snapshot


def test_an_agent_steps_static_fields_enter_the_snapshot_in_camel_case() -> None:
    static = _static(agent("fix it", "what you changed", allowed_tools=["read", "bash"], model="openai/gpt-4o"))
    assert static == {
        "kind": "agent",
        "expectedOutput": {"kind": "description", "description": "what you changed"},
        "validates": False,
        "model": "openai/gpt-4o",
        "allowedTools": ["read", "bash"],
        "session": "run",
        "timeoutMs": "default",
        "executor": {"kind": "pi"},
    }


@pytest.mark.parametrize(
    ("timeout_ms", "in_snapshot"),
    [(DEFAULT, "default"), (None, 0), (60_000, 60_000)],
    ids=["server-default", "unlimited", "budget"],
)
def test_timeout_ms_is_the_servers_default_unlimited_or_a_budget(timeout_ms: Any, in_snapshot: Any) -> None:
    assert _static(agent("p", "d", timeout_ms=timeout_ms))["timeoutMs"] == in_snapshot


def test_a_json_schema_output_is_kept_as_declared() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    static = _static(agent("count", schema))
    assert static["expectedOutput"] == {"kind": "schema", "schema": schema}
    assert static["validates"] is False  # the schema alone needs no workflow code


def test_a_pydantic_model_output_is_its_json_schema_and_the_code_validates() -> None:
    static = _static(agent("sum up", Summary))
    assert static["expectedOutput"] == {"kind": "schema", "schema": Summary.model_json_schema()}
    assert static["validates"] is True


def test_a_validate_function_makes_the_code_validate() -> None:
    assert _static(agent("p", "d", validate=lambda output: None))["validates"] is True


@pytest.mark.parametrize("max_chars", [None, 280])
def test_an_assistant_message_output_is_stored_with_its_limit(max_chars: int | None) -> None:
    expected = _static(agent("say hi", assistant_message(max_chars)))["expectedOutput"]
    assert expected == {"kind": "assistant-message", "maxChars": max_chars}


def test_a_command_executor_keeps_its_argv_and_pi_is_the_default() -> None:
    assert _static(agent("p", "d", executor=command(["my-agent", "--json"])))["executor"] == {
        "kind": "command",
        "argv": ["my-agent", "--json"],
    }
    assert _static(agent("p", "d", executor=pi()))["executor"] == {"kind": "pi"}


def test_a_decision_is_an_agent_step_whose_output_is_one_route() -> None:
    static = _static(decision("ship it?", ["ship", "hold"], model="anthropic/claude-sonnet-4:high", session="fresh"))
    assert static["kind"] == "decision"
    assert static["choices"] == ["ship", "hold"]
    assert static["expectedOutput"]["schema"]["properties"]["route"] == {"enum": ["ship", "hold"]}
    assert (static["model"], static["session"], static["executor"]) == (
        "anthropic/claude-sonnet-4:high",
        "fresh",
        {"kind": "pi"},
    )


def test_the_workflows_agent_model_enters_the_snapshot_only_when_set() -> None:
    nodes = {"a": agent("p", "d")}
    assert "agentModel" not in define_workflow("w", "a", nodes).compile().snapshot
    with_model = define_workflow("w", "a", nodes, agent_model="scripted/demo")
    assert with_model.agent_model == "scripted/demo"
    assert with_model.compile().snapshot["agentModel"] == "scripted/demo"
    assert with_model.compile().digest != define_workflow("w", "a", nodes).compile().digest


# ---------------------------------------------------------------- switches over a decision


def _decision_flow(cases: dict[str, str], on: str = "$.route") -> dict[str, Any]:
    return {
        "nodes": {
            "pick": decision("which?", ["ship", "hold"]),
            "ship": compute(lambda ctx: 1),
            "hold": compute(lambda ctx: 2),
        },
        "edges": [switch("pick", on=on, cases=cases)],
    }


@pytest.mark.parametrize("on", ["$.route", "$output.route"])
def test_a_switch_covering_every_choice_compiles(on: str) -> None:
    flow = _decision_flow({"ship": "ship", "hold": "hold"}, on)
    define_workflow("w", "pick", flow["nodes"], flow["edges"]).compile()


def test_a_switch_on_the_decisions_outcome_need_not_name_choices() -> None:
    flow = _decision_flow({"ok": "ship", "failed": "hold", "timed_out": "hold"}, "$result.outcome")
    define_workflow("w", "pick", flow["nodes"], flow["edges"]).compile()


def test_a_switch_missing_a_choice_is_refused_naming_the_node_and_the_choice() -> None:
    flow = _decision_flow({"ship": "ship"})
    message = _refused(flow["nodes"], flow["edges"])
    assert "'pick'" in message and "hold" in message


def test_a_switch_naming_something_that_is_not_a_choice_is_refused() -> None:
    flow = _decision_flow({"ship": "ship", "hold": "hold", "maybe": "hold"})
    message = _refused(flow["nodes"], flow["edges"])
    assert "'pick'" in message and "maybe" in message


def test_a_switch_over_a_decision_on_another_field_is_refused() -> None:
    flow = _decision_flow({"ship": "ship", "hold": "hold"}, "$.choice")
    message = _refused(flow["nodes"], flow["edges"])
    assert "'pick'" in message and "$.route" in message


def test_a_switch_over_an_included_decision_exit_is_checked_too() -> None:
    child = define_workflow("child", "pick", {"pick": decision("which?", ["a", "b"])}, exits={"out": {"from": "pick"}})
    nodes = {"start": compute(lambda ctx: 0), "after": compute(lambda ctx: 1)}
    edges = [edge("start", "sub"), switch("sub.out", on="$.route", cases={"a": "after"})]
    with pytest.raises(WorkflowDefinitionError, match="'sub.out'.*b"):
        define_workflow("w", "start", nodes, edges, includes={"sub": include_workflow(child)})


# ---------------------------------------------------------------- refusals, each naming the node


REFUSED_AGENTS = [
    pytest.param(agent("p", assistant_message(), validate=lambda output: None), "validate", id="assistant-validate"),
    pytest.param(agent("p", assistant_message(0)), "max_chars", id="max-chars-zero"),
    pytest.param(agent("", "d"), "prompt", id="empty-prompt"),
    pytest.param(agent(42, "d"), "prompt", id="prompt-not-text"),  # type: ignore[arg-type]
    pytest.param(agent("p", ""), "expected_output", id="empty-description"),
    pytest.param(agent("p", 42), "expected_output", id="expected-int"),
    pytest.param(agent("p", {"type": "no-such-type"}), "JSON Schema", id="invalid-schema"),
    pytest.param(agent("p", {"type": "object", "default": {1, 2}}), "JSON", id="schema-not-json"),
    pytest.param(agent("p", "d", validate="yes"), "validate", id="validate-not-callable"),  # type: ignore[arg-type]
    pytest.param(agent("p", "d", timeout_ms=0), "timeout_ms", id="timeout-zero"),
    pytest.param(agent("p", "d", timeout_ms=-5), "timeout_ms", id="timeout-negative"),
    pytest.param(agent("p", "d", timeout_ms=True), "timeout_ms", id="timeout-bool"),  # type: ignore[arg-type]
    pytest.param(agent("p", "d", timeout_ms="1m"), "timeout_ms", id="timeout-text"),  # type: ignore[arg-type]
    pytest.param(agent("p", "d", allowed_tools="bash"), "allowed_tools", id="tools-not-list"),  # type: ignore[arg-type]
    pytest.param(agent("p", "d", allowed_tools=["read", "a,b"]), "allowed_tools", id="tool-with-comma"),
    pytest.param(agent("p", "d", allowed_tools=["read", "read"]), "allowed_tools", id="tool-twice"),
    pytest.param(agent("p", "d", model="gpt-4o"), "model", id="model-without-provider"),
    pytest.param(agent("p", "d", model="openai/"), "model", id="model-without-id"),
    pytest.param(agent("p", "d", model="openai/gpt 4o"), "model", id="model-with-space"),
    pytest.param(agent("p", "d", model="openai/gpt-4o:"), "model", id="model-empty-thinking"),
    pytest.param(agent("p", "d", session="shared"), "session", id="session-unknown"),
    pytest.param(agent("p", "d", executor=command([])), "command", id="command-empty"),
    pytest.param(agent("p", "d", executor=command("my-agent")), "command", id="command-not-list"),
    pytest.param(agent("p", "d", executor=command(["my-agent", 3])), "command", id="command-non-text"),  # type: ignore[list-item]
    pytest.param(agent("p", "d", executor="pi"), "executor", id="executor-text"),  # type: ignore[arg-type]
    pytest.param(decision("q", []), "choices", id="choices-empty"),
    pytest.param(decision("q", ["a", "a"]), "choices", id="choices-twice"),
    pytest.param(decision("q", ["a", ""]), "choices", id="choice-empty"),
    pytest.param(decision("q", ["a", 1]), "choices", id="choice-not-text"),  # type: ignore[list-item]
    pytest.param(decision("q", "ab"), "choices", id="choices-text"),
    pytest.param(decision("", ["a"]), "question", id="empty-question"),
]


@pytest.mark.parametrize(("node", "named"), REFUSED_AGENTS)
def test_an_invalid_agent_step_is_refused_naming_the_node(node: Node, named: str) -> None:
    message = _refused({"start": compute(lambda ctx: 0), "fix_step": node}, [edge("start", "fix_step")])
    assert "'fix_step'" in message and named in message


@pytest.mark.parametrize("model", ["openai/gpt-4o", "openrouter/anthropic/claude-3.5", "ollama/llama3:8b", "a/b:high"])
def test_provider_slash_id_models_with_an_optional_suffix_compile(model: str) -> None:
    define_workflow("w", "a", {"a": agent("p", "d", model=model)}, agent_model=model).compile()


@pytest.mark.parametrize("bad", ["gpt-4o", "/id", "openai/ x", 3])
def test_an_invalid_agent_model_of_the_workflow_is_refused_naming_it(bad: Any) -> None:
    message = _refused({"a": agent("p", "d")}, agent_model=bad)
    assert "'w'" in message and "agent_model" in message


def test_a_prompt_function_and_a_callable_validate_compile() -> None:
    node = agent(lambda ctx: f"fix {ctx.input['path']}", Summary, validate=lambda output: output["summary"] != "")
    define_workflow("w", "a", {"a": node}).compile()

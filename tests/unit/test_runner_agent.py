"""The runner's part of an agent step (docs/agents.md, flow steps 1 and 10), with a fake channel:
node.request_agent carries the contract and the initial step message, and the runner exits;
a new runner routes the settled step like any other (its output, its failure or timeout)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from piworkflows.protocol import step_contract
from piworkflows.protocol.internal.agents import (
    AgentContract,
    NodeRequestAgentFrame,
    initial_step_key,
    message_id_of,
    request_id_of,
)
from piworkflows.protocol.internal.base import Frame
from piworkflows.protocol.internal.runner import RunnerExiting, RunnerLaunch
from piworkflows.protocol.internal.writer import Reply
from piworkflows.runner import run as runner
from piworkflows.workflows import discovery

pytestmark = pytest.mark.timeout(30)

WORKFLOW = """
import pydantic
from piworkflows.workflows import (
    DEFAULT, agent, assistant_message, command, compute, decision, define_workflow, edge, switch,
)

class Summary(pydantic.BaseModel):
    summary: str

def prompt(ctx):
    if ctx.input.get("explode"):
        raise RuntimeError("no prompt today")
    if ctx.input.get("not_text"):
        return {"prompt": 1}
    return "Fix the tests in " + ctx.input["path"]

workflow = define_workflow(
    name="agentflow",
    start_at="fix",
    agent_model="scripted/default",
    nodes={
        "fix": agent(prompt, Summary, allowed_tools=["read", "bash"], timeout_ms=TIMEOUT),
        "pick": decision("ship it?", ["ship", "hold"], model="scripted/picker:high", session="fresh"),
        "ship": compute(lambda ctx: {"shipped": ctx.outputs["fix"]["summary"]}),
        "hold": agent("say why", assistant_message(200), executor=command(["my-agent", "-q"]), timeout_ms=None),
    },
    edges=[edge("fix", "pick"), switch("pick", on="$.route", cases={"ship": "ship", "hold": "hold"})],
)
"""


class ScriptedChannel:
    """Records the runner's requests; each node.start gets attempt ``attempt-<n>``; ``reply``
    overrides the answer by kind."""

    def __init__(self, **reply: Reply) -> None:
        self.requests: list[Frame] = []
        self.reply = reply

    def request(self, frame: Frame) -> Reply:
        self.requests.append(frame)
        if frame.kind in self.reply:
            return self.reply[frame.kind]
        if frame.kind == "node.start":
            return Reply(outcome="accepted", revision=2, receipt={"attemptId": f"attempt-{len(self.requests)}"})
        if frame.kind == "node.request_agent":
            return Reply(outcome="accepted", revision=3, receipt={"runStatus": "waiting"})
        return Reply(outcome="accepted", revision=3, receipt={"runStatus": "ended"})

    def kinds(self) -> list[str]:
        return [frame.kind for frame in self.requests]


def _launch(project: Path, steps: list[dict[str, Any]], run_input: Any, timeout: str = "DEFAULT") -> RunnerLaunch:
    directory = project / ".pi" / "workflows"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "agentflow.workflow.py").write_text(textwrap.dedent(WORKFLOW).replace("TIMEOUT", timeout))
    resolved = discovery.resolve("agentflow", project)
    return RunnerLaunch(
        run_id="run-1",
        lease_generation=1,
        runner_epoch=1,
        project_path=str(project),
        source={
            "source_kind": "file",
            "source_path": str(resolved.path),
            "source_sha256": resolved.identity.source_sha256,
        },
        definition_digest=discovery.compiled(resolved).digest,
        input=run_input,
        steps=steps,
    )


def _run(launch: RunnerLaunch, channel: ScriptedChannel | None = None) -> ScriptedChannel:
    channel = channel or ScriptedChannel()
    assert runner.run(channel, launch) == RunnerExiting()  # type: ignore[arg-type]
    return channel


def _step(node: str, outcome: str, output: Any = None, **more: Any) -> dict[str, Any]:
    return {
        "node_path": node,
        "visit_number": 1,
        "attempt_number": 1,
        "outcome": outcome,
        "output": output,
        "interrupted": False,
        **more,
    }


def _request(channel: ScriptedChannel) -> tuple[NodeRequestAgentFrame, AgentContract]:
    frame = channel.requests[-1]
    assert isinstance(frame, NodeRequestAgentFrame)
    return frame, AgentContract.model_validate(json.loads(frame.contract.data))


# ---------------------------------------------------------------- the request


def test_an_agent_step_sends_its_contract_and_initial_step_then_the_runner_exits(tmp_path: Path) -> None:
    channel = _run(_launch(tmp_path, [], {"path": "src/"}))
    assert channel.kinds() == ["node.start", "node.request_agent"]  # nothing after: the run waits
    frame, contract = _request(channel)
    attempt_id = "attempt-1"
    assert frame.attempt_id == contract.attempt_id == attempt_id
    assert contract.request_id == request_id_of(attempt_id)
    assert (contract.workflow_name, contract.node_path) == ("agentflow", "fix")
    assert (contract.visit_number, contract.attempt_number) == (1, 1)
    assert contract.prompt == "Fix the tests in src/"
    assert contract.expected_output.kind == "schema"
    assert contract.expected_output.json_schema is not None
    assert contract.expected_output.json_schema["required"] == ["summary"]
    assert contract.validates is True  # a pydantic model: the workflow code checks submissions
    assert contract.choices is None
    assert contract.model == "scripted/default"  # the workflow's agent_model
    assert contract.allowed_tools == ["read", "bash"]
    assert (contract.session, contract.executor.kind) == ("run", "pi")
    marker = message_id_of(initial_step_key(contract.request_id))
    assert frame.step.data.decode() == step_contract.initial(contract, marker)
    assert step_contract.message_of(frame.step.data.decode()) == marker


@pytest.mark.parametrize(("timeout", "sent"), [("DEFAULT", None), ("None", 0), ("45_000", 45_000)])
def test_the_budget_is_left_to_the_server_unlimited_or_the_nodes(tmp_path: Path, timeout: str, sent: Any) -> None:
    frame, _ = _request(_run(_launch(tmp_path, [], {"path": "."}, timeout)))
    assert frame.timeout_ms == sent


def test_a_decision_step_names_its_choices_model_and_session(tmp_path: Path) -> None:
    steps = [_step("fix", "ok", {"summary": "fixed"})]
    frame, contract = _request(_run(_launch(tmp_path, steps, {"path": "."})))
    assert contract.node_path == "pick"
    assert contract.choices == ["ship", "hold"]
    assert contract.model == "scripted/picker:high"  # the node's model wins over the workflow's
    assert contract.session == "fresh"
    assert contract.validates is False
    assert '"route": "ship | hold"' in frame.step.data.decode()


def test_an_assistant_message_step_on_a_command_executor(tmp_path: Path) -> None:
    steps = [_step("fix", "ok", {"summary": "fixed"}), _step("pick", "ok", {"route": "hold"})]
    frame, contract = _request(_run(_launch(tmp_path, steps, {"path": "."})))
    assert contract.node_path == "hold"
    assert (contract.expected_output.kind, contract.expected_output.max_chars) == ("assistant-message", 200)
    assert (contract.executor.kind, contract.executor.argv) == ("command", ["my-agent", "-q"])
    assert frame.timeout_ms == 0
    step = frame.step.data.decode()  # the command reads it on stdin: no workflow tool there
    assert "printing your reply of at most 200 characters on standard output" in step and "workflow` tool" not in step


def test_an_interrupted_agent_attempt_continues_with_the_next_attempt_number(tmp_path: Path) -> None:
    steps = [{**_step("fix", "cancelled"), "interrupted": True}]
    _, contract = _request(_run(_launch(tmp_path, steps, {"path": "."})))
    assert contract.attempt_number == 2


@pytest.mark.parametrize(
    ("run_input", "error"),
    [({"explode": True}, "RuntimeError: no prompt today"), ({"not_text": True}, "returned dict, not text")],
)
def test_a_prompt_function_that_fails_fails_the_node(tmp_path: Path, run_input: Any, error: str) -> None:
    channel = _run(_launch(tmp_path, [], run_input))
    assert channel.kinds() == ["node.start", "node.finish"]
    finish = channel.requests[-1].model_dump()
    assert finish["outcome"] == "failed" and finish["end_status"] == "failed"
    assert error in finish["error"]["data"].decode()


def test_a_refused_request_ends_the_runner_too(tmp_path: Path) -> None:
    fenced = ScriptedChannel(**{"node.request_agent": Reply(outcome="claimLost", error="fenced")})
    assert _run(_launch(tmp_path, [], {"path": "."}), fenced).kinds() == ["node.start", "node.request_agent"]


# ---------------------------------------------------------------- after the step settled


@pytest.mark.parametrize(("route", "target"), [("ship", "ship"), ("hold", "hold")])
def test_a_settled_decision_routes_on_its_route(tmp_path: Path, route: str, target: str) -> None:
    steps = [_step("fix", "ok", {"summary": "fixed"}), _step("pick", "ok", {"route": route})]
    channel = _run(_launch(tmp_path, steps, {"path": "."}))
    start = channel.requests[0].model_dump()
    assert (start["node_path"], start["node_kind"]) == (target, "compute" if target == "ship" else "agent")


def test_an_accepted_agent_output_reaches_the_next_nodes(tmp_path: Path) -> None:
    steps = [_step("fix", "ok", {"summary": "fixed"}), _step("pick", "ok", {"route": "ship"})]
    channel = _run(_launch(tmp_path, steps, {"path": "."}))
    assert channel.kinds() == ["node.start", "node.finish"]
    assert channel.requests[-1].model_dump()["output"]["data"] == b'{"shipped":"fixed"}'


def test_the_last_agent_steps_output_completes_the_run(tmp_path: Path) -> None:
    steps = [_step("fix", "ok", {"summary": "x"}), _step("pick", "ok", {"route": "hold"})]
    steps.append(_step("hold", "ok", "because"))
    channel = _run(_launch(tmp_path, steps, {"path": "."}))
    (finish,) = channel.requests
    body = finish.model_dump()
    assert (finish.kind, body["end_status"], body["output"]["data"]) == ("run.finish", "completed", b'"because"')


@pytest.mark.parametrize(
    ("outcome", "code", "status"),
    [("timed_out", "agentTimeout", "timed_out"), ("failed", "missingSubmission", "failed")],
)
def test_an_agent_step_that_failed_or_timed_out_ends_the_run_so(
    tmp_path: Path, outcome: str, code: str, status: str
) -> None:
    error = "the step used its active time budget"
    steps = [_step("fix", outcome, error=error, error_code=code)]
    channel = _run(_launch(tmp_path, steps, {"path": "."}))
    (finish,) = channel.requests
    body = finish.model_dump()
    assert (finish.kind, body["end_status"], body["error_code"]) == ("run.finish", status, code)
    assert body["error"]["data"].decode() == f"node 'fix': {error}"


def test_a_failed_step_without_its_error_is_named_by_its_outcome(tmp_path: Path) -> None:
    (finish,) = _run(_launch(tmp_path, [_step("fix", "timed_out")], {"path": "."})).requests
    body = finish.model_dump()
    assert (body["end_status"], body["error_code"], body["error"]["data"]) == (
        "timed_out",
        "nodeFailed",
        b"node 'fix': timed out",
    )

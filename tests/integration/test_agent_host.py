"""The agent host (piworkflows/agents/host.py) driving the real Pi against the scripted model, with
this test as its supervisor (every report answered as the writer would) and a client.v1 socket
answering the workflow tool."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piworkflows import faults
from piworkflows.agents import session
from piworkflows.protocol import client_v1, frames, step_contract
from piworkflows.protocol.internal.agents import (
    HOST_EXIT_DONE,
    HOST_EXIT_FAILED,
    HOST_EXIT_PI_EXITED,
    HOST_EXIT_PI_UNAVAILABLE,
    AgentContract,
    AgentLaunch,
    AgentRecordFrame,
    ExpectedOutput,
    PendingStep,
    initial_step_key,
    message_id_of,
    request_id_of,
    session_id_of,
)
from piworkflows.testing.scripted_model import ScriptedModel
from stress.bench import agents as bench_agents
from tests.pi_util import PROVIDER, ClientServer, HostPeer, accept, agent_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ATTEMPT = "attempt-1"
REQUEST = request_id_of(ATTEMPT)
STEP = message_id_of(initial_step_key(REQUEST))
SEGMENT = "segment-1"
SUBMIT = {"name": "workflow", "arguments": {"action": "submit", "requestId": "${requestId}", "output": {"fixed": 3}}}
PROMPT = "Fix the failing tests in the project."

Answer = Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]


def writer_answer(frame: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What the writer answers each report when all goes well (agents_design.md)."""
    if frame["k"] == "agent.turn" and frame["b"]["phase"] == "ended":
        return "accepted", {"requestStatus": "accepted", "pending": []}
    return "accepted", {}


def contract(model_id: str, expected: ExpectedOutput) -> AgentContract:
    return AgentContract(
        workflow_name="fix-tests",
        node_path="fix",
        attempt_id=ATTEMPT,
        request_id=REQUEST,
        visit_number=1,
        attempt_number=1,
        prompt=PROMPT,
        expected_output=expected,
        model=f"{PROVIDER}/{model_id}",
    )


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Run a scripted model for the test; ``world(scripts)`` -> (model, agent dir, project)."""
    models: list[ScriptedModel] = []

    def start(scripts: dict[str, list[dict[str, Any]]]) -> tuple[ScriptedModel, Path]:
        model = ScriptedModel(scripts)
        models.append(model)
        agent = agent_dir(tmp_path / "agent", model)
        monkeypatch.setenv("PI_CODING_AGENT_DIR", str(agent))  # the host's Pi inherits it
        project = tmp_path / "project"
        project.mkdir(exist_ok=True)
        return model, project

    yield start
    for model in models:
        model.close()


def launch_of(
    agreed: AgentContract,
    project: Path,
    pi_command: list[str],
    socket_path: str,
    session_file: str | None = None,
    **settings: int,
) -> AgentLaunch:
    text = step_contract.initial(agreed, STEP)
    timing = {"sample_ms": 1000, "flush_ms": 50, "start_timeout_ms": 30_000, "abort_grace_ms": 5000}
    return AgentLaunch(
        segment_id=SEGMENT,
        run_id="run-1",
        attempt_id=ATTEMPT,
        request_id=REQUEST,
        session_id=session_id_of("run-1"),
        pi_session_file=session_file,
        project_path=str(project),
        contract=agreed,
        pending=[PendingStep(workflow_message_id=STEP, text=text)],
        steps=[STEP],
        pi_command=pi_command,
        socket_path=socket_path,
        coordinator_epoch=7,
        timeout_ms=0,
        elapsed_ms=0,
        retry_settle_ms=200,
        **{**timing, **settings},
    )


def drive(launch: AgentLaunch, answer: Answer = writer_answer) -> tuple[list[dict[str, Any]], HostPeer]:
    """Run the host to its end, answering every report (agent.branch: the launch's pending steps
    not found on the branch, as the writer lists them); the frames it sent, in order."""
    peer = HostPeer()
    peer.start(launch)
    sent: list[dict[str, Any]] = []
    try:
        while (frame := peer.receive()) is not None:
            sent.append(frame)
            if frame["k"] == "agent.branch":
                found = {step["workflow_message_id"] for step in frame["b"]["found"]}
                pending = [
                    {"workflowMessageId": step.workflow_message_id, "text": step.text}
                    for step in launch.pending
                    if step.workflow_message_id not in found
                ]
                peer.reply(frame, "accepted", {"pending": pending})
            else:
                peer.reply(frame, *answer(frame))
    finally:
        peer.close()
    return sent, peer


def kinds(sent: list[dict[str, Any]]) -> list[str]:
    return [frame["k"] + (":" + frame["b"]["phase"] if frame["k"] == "agent.turn" else "") for frame in sent]


def records(sent: list[dict[str, Any]]) -> list[AgentRecordFrame]:
    return [AgentRecordFrame.model_validate(frame["b"]) for frame in sent if frame["k"] == "agent.record"]


def test_a_step_submitted_through_the_workflow_tool_is_reported_in_order(world, pi_command, caplog):
    caplog.set_level(logging.INFO, logger="piworkflows.agents")
    model, project = world({"fixer": [{"text": "Submitting.", "tool_calls": [SUBMIT]}]})
    agreed = contract("fixer", ExpectedOutput(kind="description", description='{"fixed": <count>}'))
    with ClientServer() as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path))
    assert peer.status == HOST_EXIT_DONE and peer.host.pi is not None and peer.host.pi.proc.poll() is not None
    order = kinds(sent)
    assert order[:2] == ["agent.bind_session", "agent.branch"]
    assert order[-2:] == ["agent.turn:ended", "agent.close"]
    middle = order[2:-2]
    assert middle.count("agent.turn:started") == 1 and middle.count("agent.message_sent") == 1
    assert "agent.record" in middle[middle.index("agent.turn:started") :]
    assert set(middle) == {"agent.turn:started", "agent.message_sent", "agent.record"}

    # The submission: the tool spoke client.v1 (a canonical line) for this request and session.
    (submit,) = tool_server.requests
    assert submit.operation == "interaction.submit" and submit.idempotencyKey == submit.payload["submissionId"]
    assert submit.payload["submissionId"].startswith("submit-")
    assert {k: v for k, v in submit.payload.items() if k != "submissionId"} == {
        "targetSessionId": session_id_of("run-1"),
        "coordinatorEpoch": 7,
        "requestId": REQUEST,
        "value": {"output": {"fixed": 3}},
    }

    client_v1.InteractionSubmitPayload.model_validate(submit.payload)

    # The close line names the segment's start-up points (the agents benchmark reads them), in order.
    timing = bench_agents.host_timing(record.getMessage() for record in caplog.records)
    assert list(timing) == [SEGMENT]
    assert timing[SEGMENT]["launch"] <= timing[SEGMENT]["ready"] <= timing[SEGMENT]["prompt"]

    # C4 names the file Pi wrote; C6 names the step's user entry in it.
    bind = sent[0]["b"]
    lines = session.read_lines(bind["pi_session_file"])
    (sent_message,) = [frame["b"] for frame in sent if frame["k"] == "agent.message_sent"]
    user_entry = session.steps_on(session.active_branch(lines), {STEP})
    assert user_entry == [(STEP, sent_message["pi_entry_id"])]
    (started,) = [frame["b"] for frame in sent if kinds([frame]) == ["agent.turn:started"]]
    ended = sent[-2]["b"]
    assert started["workflow_turn_id"] == ended["workflow_turn_id"] == f"turn-{SEGMENT}-1"
    assert started["workflow_message_id"] == ended["workflow_message_id"] == STEP
    last_assistant = session.last_assistant(session.active_branch(lines))
    assert last_assistant is not None and ended["response_entry_id"] == last_assistant["id"]
    assert ended["stop_reason"] == "toolUse" and ended["reply"] is None  # the tool ended the turn

    # Events are compact (never text), entries are Pi's own lines, each once, with the links.
    captured = records(sent)
    assert [r.first_event_index for r in captured] == [
        sum(len(r.events) for r in captured[:i]) for i in range(len(captured))
    ]
    events = [event for r in captured for event in r.events]
    types = [event.event_type for event in events]
    assert types[0] == "prompt" and "agent_start" in types and "agent_end" in types
    assert "message_update" not in types and "tool_execution_update" not in types
    for event in events:
        for value in event.model_dump().values():
            assert not isinstance(value, str) or (
                PROMPT not in value and "Submitting" not in value and len(value) <= 64
            )
    assert {e.event_role for e in events if e.event_type == "tool_execution_end"} == {"workflow"}
    entries = [entry for r in captured for entry in r.entries]
    assert [entry.content.data.decode() for entry in entries] == [line.text for line in lines]
    assert [entry.entry_role for entry in entries] == [session.role_of(line.entry) for line in lines]
    links = [r.links for r in captured if r.links is not None]
    assert links[-1].prompt_entry_id == sent_message["pi_entry_id"]
    assert links[-1].response_entry_id == last_assistant["id"]


def test_active_time_is_sampled_while_the_turn_runs_and_an_assistant_reply_is_reported(world, pi_command):
    model, project = world({"slow": [{"stall_ms": 700, "text": "All 3 tests pass now."}]})
    agreed = contract("slow", ExpectedOutput(kind="assistant-message", max_chars=200))
    with ClientServer() as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path, sample_ms=50, flush_ms=1000))
    assert peer.status == HOST_EXIT_DONE
    samples = [r.sample.elapsed_ms for r in records(sent) if r.sample is not None]
    # every record of an open turn carries a sample: two in one millisecond repeat it, never lower it
    assert len(set(samples)) >= 6 and samples == sorted(samples)
    assert samples[-1] >= 600
    ended = sent[-2]["b"]
    assert ended["phase"] == "ended" and ended["stop_reason"] == "stop"
    assert ended["reply"]["data"] == b"All 3 tests pass now."
    assert ended["elapsed_ms"] >= samples[-1]
    assert tool_server.requests == []


def test_a_timed_out_budget_aborts_the_turn_and_closes_the_segment(world, pi_command):
    model, project = world({"stuck": [{"stall_ms": 20_000, "text": "too late"}]})
    agreed = contract("stuck", ExpectedOutput(kind="description", description="anything"))

    def time_out(frame: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        record = frame["k"] == "agent.record" and frame["b"]["sample"] is not None
        if record and frame["b"]["sample"]["elapsed_ms"] >= 200:
            return "accepted", {"timedOut": True}
        return writer_answer(frame)

    with ClientServer() as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path, sample_ms=50), time_out)
    assert peer.status == HOST_EXIT_DONE
    order = kinds(sent)
    assert order[-1] == "agent.close" and "agent.turn:ended" not in order
    assert records(sent)[-1].sample is not None and records(sent)[-1].sample.elapsed_ms >= 200
    assert sent[-1]["b"]["elapsed_ms"] >= 200
    assert peer.host.pi is not None and peer.host.pi.proc.poll() is not None


def test_a_resumed_session_finds_its_step_on_the_branch_and_sends_only_the_new_one(world, pi_command):
    model, project = world(
        {"first": [{"text": "I will look."}], "second": [{"tool_calls": [SUBMIT]}, {"text": "unused"}]}
    )
    agreed = contract("first", ExpectedOutput(kind="description", description="anything"))

    def pending_step(frame: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if frame["k"] == "agent.turn" and frame["b"]["phase"] == "ended":
            return "accepted", {"requestStatus": "pending", "pending": []}
        return writer_answer(frame)

    with ClientServer() as tool_server:
        first, _ = drive(launch_of(agreed, project, pi_command, tool_server.path), pending_step)
        session_file = first[0]["b"]["pi_session_file"]
        resumed = message_id_of(f"step:{REQUEST}:resumed:segment-2")
        text = step_contract.resumed(agreed, resumed, None)
        launch = launch_of(
            agreed.model_copy(update={"model": f"{PROVIDER}/second"}),
            project,
            pi_command,
            tool_server.path,
            session_file=session_file,
        )
        pending = [PendingStep(workflow_message_id=resumed, text=text)]
        launch = launch.model_copy(update={"segment_id": "segment-2", "steps": [STEP, resumed], "pending": pending})
        second, peer = drive(launch)
    assert peer.status == HOST_EXIT_DONE
    assert kinds(first)[-2:] == ["agent.turn:ended", "agent.close"]
    order = kinds(second)
    assert order[0] == "agent.branch" and "agent.bind_session" not in order  # the file is bound already
    first_entry = [frame["b"] for frame in first if frame["k"] == "agent.message_sent"][0]["pi_entry_id"]
    assert second[0]["b"]["found"] == [{"workflow_message_id": STEP, "pi_entry_id": first_entry}]
    (sent_message,) = [frame["b"] for frame in second if frame["k"] == "agent.message_sent"]
    assert sent_message["workflow_message_id"] == resumed
    assert second[-2]["b"]["workflow_turn_id"] == "turn-segment-2-1"
    # The second prompt carried the first turn; the tool submitted once.
    second_request = [r for r in model.requests if r["model"] == "second"][0]
    assert any("I will look." in json.dumps(message) for message in second_request["messages"])
    assert len(tool_server.requests) == 1
    lines = session.read_lines(session_file)
    assert [m for m, _ in session.steps_on(session.active_branch(lines), {STEP, resumed})] == [STEP, resumed]


def test_a_refused_report_kills_pi_and_ends_the_host_at_once(world, pi_command):
    model, project = world({"fixer": [{"stall_ms": 20_000, "text": "never"}]})
    agreed = contract("fixer", ExpectedOutput(kind="description", description="anything"))

    def claim_lost(frame: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if frame["k"] == "agent.turn":
            return "claimLost", {"code": "staleGeneration"}
        return writer_answer(frame)

    with ClientServer() as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path), claim_lost)
    assert peer.status == HOST_EXIT_FAILED and kinds(sent)[-1] == "agent.turn:started"
    assert peer.host.failure is not None and "claimLost" in peer.host.failure
    assert peer.host.pi is not None and peer.host.pi.wait(10) is not None


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["/nonexistent/pi"], "pi-workflows setup pi"),
        (["sh", "-c", "echo 'pi: broken install' >&2; exit 2", "pi"], "pi: broken install"),
        (["sh", "-c", "exit 127", "pi"], "Node.js >= 20.6"),
        (["sh", "-c", "sleep 30", "pi"], "did not answer within 300 ms"),
    ],
)
def test_pi_that_cannot_start_ends_the_host_as_unavailable_naming_the_fix(tmp_path, command, said):
    agreed = contract("any", ExpectedOutput(kind="description", description="anything"))
    sent, peer = drive(launch_of(agreed, tmp_path, command, str(tmp_path / "none.sock"), start_timeout_ms=300))
    assert peer.status == HOST_EXIT_PI_UNAVAILABLE and sent == []
    assert peer.host.failure is not None and said in peer.host.failure
    assert os.path.isdir(tmp_path)


def test_an_error_end_that_pi_retries_stays_one_turn(world, pi_command):
    # A model with no script left answers 400 "... model 'overloaded' ..."; Pi takes that for a
    # retryable error: agent_end (error), auto_retry_start, agent_start again, then the final failure.
    model, project = world({"overloaded": []})
    agent = Path(os.environ["PI_CODING_AGENT_DIR"])
    (agent / "settings.json").write_text(json.dumps({"retry": {"enabled": True, "maxRetries": 1, "baseDelayMs": 50}}))
    agreed = contract("overloaded", ExpectedOutput(kind="description", description="anything"))

    def still_pending(frame: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if frame["k"] == "agent.turn" and frame["b"]["phase"] == "ended":
            return "accepted", {"requestStatus": "pending", "pending": []}
        return writer_answer(frame)

    with ClientServer() as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path), still_pending)
    assert peer.status == HOST_EXIT_DONE and len(model.requests) == 2  # the first try and Pi's retry
    order = kinds(sent)
    assert order.count("agent.turn:started") == 1 and order.count("agent.turn:ended") == 1
    types = [event.event_type for r in records(sent) for event in r.events]
    assert types.count("agent_start") == 2 and "auto_retry_start" in types and "auto_retry_end" in types
    assert sent[-2]["b"]["stop_reason"] == "error" and order[-1] == "agent.close"


def test_the_workflow_tool_retries_a_lost_connection_and_the_model_sees_a_rejection(world, pi_command):
    bad = {"name": "workflow", "arguments": {"action": "submit", "requestId": "${requestId}", "output": {"fixed": -1}}}
    update = {
        "name": "workflow",
        "arguments": {
            "action": "update",
            "requestId": "${requestId}",
            "update": {"message": "half way", "progress": 0.5},
        },
    }
    model, project = world({"fixer": [{"tool_calls": [update]}, {"tool_calls": [bad]}, {"tool_calls": [SUBMIT]}]})
    agreed = contract("fixer", ExpectedOutput(kind="description", description='{"fixed": <count>}'))
    answers: list[str] = []

    def verdicts(request: client_v1.Request) -> client_v1.Response | None:
        if request.operation == "interaction.update":
            answers.append("update")
            return accept(request)
        output = request.payload["value"]["output"]
        if output == {"fixed": -1}:
            answers.append("rejected")
            receipt = {"code": "validationFailed"}
            return client_v1.Response(
                requestId=request.requestId, outcome="rejected", receipt=receipt, error="fixed must be >= 0."
            )
        if "dropped" not in answers:  # the first try of the good output: the connection is lost
            answers.append("dropped")
            return None
        answers.append("accepted")
        return accept(request)

    with ClientServer(verdicts) as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path))
    assert peer.status == HOST_EXIT_DONE and answers == ["update", "rejected", "dropped", "accepted"]
    update_request, rejected, dropped, accepted = tool_server.requests
    assert update_request.payload["update"] == {"message": "half way", "progress": 0.5}
    assert update_request.idempotencyKey.startswith("update-")
    # The retry is the same submission (same key, a new transport request id); the rejected one another.
    assert dropped.idempotencyKey == accepted.idempotencyKey != rejected.idempotencyKey
    assert dropped.requestId != accepted.requestId
    # What the model saw: progress recorded, then the validator's error and what to do.
    tool_results = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    said = [json.dumps(m["content"]) for m in tool_results]
    assert "Progress recorded." in said[0]
    assert "fixed must be >= 0. Fix the output and call the workflow tool again." in said[1]
    assert len(model.requests) == 3  # "Accepted" ended the turn without another model call
    assert kinds(sent).count("agent.turn:ended") == 1


def test_a_decided_or_stale_request_is_told_to_the_model(world, pi_command):
    model, project = world({"fixer": [{"tool_calls": [SUBMIT]}, {"tool_calls": [SUBMIT]}]})
    agreed = contract("fixer", ExpectedOutput(kind="description", description='{"fixed": <count>}'))
    refusals = [("claimLost", "staleGeneration", "the segment is gone."), ("conflict", "winnerDecided", "decided.")]

    def refuse(request: client_v1.Request) -> client_v1.Response:
        outcome, code, error = refusals[len(tool_server.requests) - 1]
        return client_v1.Response(requestId=request.requestId, outcome=outcome, receipt={"code": code}, error=error)

    with ClientServer(refuse) as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path))
    assert peer.status == HOST_EXIT_DONE and len(tool_server.requests) == 2
    said = [json.dumps(m["content"]) for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert said == [json.dumps("The workflow step is no longer waiting: the segment is gone.")]
    assert len(model.requests) == 2  # "already accepted" ended the turn
    ended = sent[-2]["b"]
    assert ended["phase"] == "ended" and ended["stop_reason"] == "toolUse"
    lines = session.read_lines(sent[0]["b"]["pi_session_file"])
    results = [line.entry["message"] for line in lines if session.role_of(line.entry) == "toolResult"]
    assert [(r["isError"], r["content"][0]["text"]) for r in results] == [
        (True, "The workflow step is no longer waiting: the segment is gone."),
        (False, "The step's output was already accepted."),
    ]


def test_the_host_process_tells_its_supervisor_why_and_ends_with_its_declared_status(tmp_path):
    agreed = contract("any", ExpectedOutput(kind="description", description="anything"))
    launch = launch_of(agreed, tmp_path, ["/nonexistent/pi"], str(tmp_path / "none.sock"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "piworkflows.agents"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # as the supervisor starts it: its own group
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(frames.encode(launch.kind, 0, launch.model_dump()))
    proc.stdin.flush()  # and left open, as the supervisor leaves it until the host ended
    proc.wait(timeout=60)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdin.close()
    # Its declared status, not SIGABRT after a second's wait for its stdin reader at interpreter shutdown.
    assert proc.returncode == HOST_EXIT_PI_UNAVAILABLE, err.decode()[-2000:]
    logged = [frame for frame in frames.FrameDecoder().feed(out)]
    assert [frame["k"] for frame in logged] == ["agent.failure"]  # its last word, for the park's detail
    assert "pi-workflows setup pi" in logged[0]["b"]["why"]


@pytest.mark.parametrize(
    ("point", "last"),
    [
        (faults.AGENT_BEFORE_PROMPT, "agent.branch"),
        (faults.AGENT_AFTER_TURN_STARTED, "agent.turn:started"),
        (faults.AGENT_BEFORE_CLOSE, "agent.turn:ended"),
    ],
)
def test_a_fault_point_of_the_host_stops_it_there(world, pi_command, point, last):
    model, project = world({"fixer": [{"tool_calls": [SUBMIT]}]})
    agreed = contract("fixer", ExpectedOutput(kind="description", description="anything"))
    faults.configure(f"{point}=raise")
    try:
        with ClientServer() as tool_server:
            sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path))
    finally:
        faults.configure("")
    assert peer.status == HOST_EXIT_FAILED and kinds(sent)[-1] == last
    assert peer.host.failure is not None and point in peer.host.failure
    assert peer.host.pi is not None and peer.host.pi.wait(10) is not None


def test_pi_killed_after_the_tool_sent_a_submission_ends_the_host(world, pi_command, monkeypatch):
    model, project = world({"fixer": [{"tool_calls": [SUBMIT]}]})
    monkeypatch.setenv("PIW_FAULTS", f"{faults.TOOL_AFTER_SUBMIT_SENT}=crash")  # read by the tool in Pi
    agreed = contract("fixer", ExpectedOutput(kind="description", description="anything"))
    with ClientServer() as tool_server:
        sent, peer = drive(launch_of(agreed, project, pi_command, tool_server.path))
    assert peer.status == HOST_EXIT_PI_EXITED and len(tool_server.requests) == 1
    assert peer.host.failure is not None and "Pi exited during the step (exit -9)" in peer.host.failure
    assert "agent.close" not in kinds(sent)  # the supervisor reports the end (agent.exited)

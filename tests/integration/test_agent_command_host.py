"""The agent host running a command step (agents/command.py) with this test as its supervisor
(every report answered as the writer would) and a client.v1 socket standing in for the server:
a real command (a small Python script) reads the step message on stdin and prints the output."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piworkflows.agents.command_output import entry_id
from piworkflows.protocol import client_v1, step_contract
from piworkflows.protocol.internal.agents import (
    HOST_EXIT_DONE,
    AgentContract,
    AgentLaunch,
    AgentRecordFrame,
    Executor,
    ExpectedOutput,
    PendingStep,
    initial_step_key,
    message_id_of,
    request_id_of,
    session_id_of,
)
from tests.pi_util import ClientServer, HostPeer, accept
from tests.server_util import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ATTEMPT = "attempt-1"
REQUEST = request_id_of(ATTEMPT)
STEP = message_id_of(initial_step_key(REQUEST))
SEGMENT = "segment-1"
SCHEMA = ExpectedOutput(kind="schema", json_schema={"type": "object"})

# Saves its pid, working directory and stdin next to itself (seen.json, whole), then does what its argv says.
AGENT = """
import json, os, sys, time
step = sys.stdin.read()
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "seen.tmp"), "w") as seen:
    json.dump({"pid": os.getpid(), "cwd": os.getcwd(), "stdin": step}, seen)
os.replace(os.path.join(here, "seen.tmp"), os.path.join(here, "seen.json"))
mode = sys.argv[1]
if mode == "json":
    print(json.dumps({"fixed": 3}))
elif mode == "reply":
    print("Fixed the import.")
elif mode == "sleep":
    time.sleep(60)
"""

Answer = Callable[[dict[str, Any]], dict[str, Any]]


def writer(frame: dict[str, Any]) -> dict[str, Any]:
    """The writer's receipt for each report when all goes well."""
    if frame["k"] == "agent.branch":
        return {"pending": [{"workflowMessageId": STEP, "text": "the step"}]}
    if frame["k"] == "agent.turn" and frame["b"]["phase"] == "ended":
        failed = frame["b"]["error_code"] is not None
        return {"requestStatus": "failed" if failed else "accepted", "pending": []}
    return {}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "agent" / "agent.py"
    path.parent.mkdir()
    path.write_text(AGENT)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def launch_of(
    project: Path, argv: list[str], socket_path: str, expected: ExpectedOutput = SCHEMA, **settings: int
) -> AgentLaunch:
    agreed = AgentContract(
        workflow_name="fix-tests",
        node_path="fix",
        attempt_id=ATTEMPT,
        request_id=REQUEST,
        visit_number=1,
        attempt_number=1,
        prompt="Fix the failing tests.",
        expected_output=expected,
        executor=Executor(kind="command", argv=argv),
    )
    timing = {"sample_ms": 1000, "flush_ms": 50, "start_timeout_ms": 30_000, "abort_grace_ms": 5000, "timeout_ms": 0}
    return AgentLaunch(
        segment_id=SEGMENT,
        run_id="run-1",
        attempt_id=ATTEMPT,
        request_id=REQUEST,
        session_id=session_id_of("run-1"),
        project_path=str(project),
        contract=agreed,
        pending=[PendingStep(workflow_message_id=STEP, text=step_contract.initial(agreed, STEP))],
        steps=[STEP],
        pi_command=[],
        socket_path=socket_path,
        coordinator_epoch=7,
        elapsed_ms=0,
        retry_settle_ms=200,
        **{**timing, **settings},
    )


def drive(launch: AgentLaunch, answer: Answer = writer) -> tuple[list[dict[str, Any]], HostPeer]:
    """Run the host to its end, answering every report; the frames it sent, in order."""
    peer = HostPeer()
    peer.start(launch)
    sent: list[dict[str, Any]] = []
    try:
        while (frame := peer.receive()) is not None:
            sent.append(frame)
            peer.reply(frame, "accepted", answer(frame))
    finally:
        peer.close()
    return sent, peer


def kinds(sent: list[dict[str, Any]]) -> list[str]:
    return [frame["k"] + (":" + frame["b"]["phase"] if frame["k"] == "agent.turn" else "") for frame in sent]


def records(sent: list[dict[str, Any]]) -> list[AgentRecordFrame]:
    return [AgentRecordFrame.model_validate(frame["b"]) for frame in sent if frame["k"] == "agent.record"]


def ended(sent: list[dict[str, Any]]) -> dict[str, Any]:
    (end,) = [frame["b"] for frame in sent if frame["k"] == "agent.turn" and frame["b"]["phase"] == "ended"]
    return end


def test_a_command_reads_its_step_and_its_json_output_is_submitted_like_the_tools(project, script):
    with ClientServer() as server:
        launch = launch_of(project, [sys.executable, str(script), "json"], server.path)
        sent, peer = drive(launch)
    assert peer.status == HOST_EXIT_DONE
    order = kinds(sent)
    assert order[:3] == ["agent.branch", "agent.turn:started", "agent.message_sent"]
    assert order[-2:] == ["agent.turn:ended", "agent.close"] and set(order[3:-2]) == {"agent.record"}
    seen = json.loads((script.parent / "seen.json").read_text())
    assert seen["stdin"] == "the step" and seen["cwd"] == str(project)  # the pending step, in the project
    assert sent[2]["b"] == {"workflow_message_id": STEP, "pi_entry_id": entry_id(SEGMENT, "prompt")}
    (request,) = server.requests  # canonical client.v1, as the server parses it
    assert request.operation == "interaction.submit" and request.idempotencyKey == "command-segment-1"
    assert request.payload == {
        "targetSessionId": session_id_of("run-1"),
        "coordinatorEpoch": 7,
        "requestId": REQUEST,
        "submissionId": "command-segment-1",
        "value": {"output": {"fixed": 3}},
    }
    batches = records(sent)
    entries = [entry for batch in batches for entry in batch.entries]
    assert [(e.pi_entry_id, e.entry_role) for e in entries] == [
        (entry_id(SEGMENT, "prompt"), "user"),
        (entry_id(SEGMENT, "output"), "assistant"),
    ]
    assert json.loads(entries[1].content.data)["message"]["content"][0]["text"] == '{"fixed": 3}\n'
    links = [batch.links for batch in batches if batch.links is not None]
    assert links[-1].prompt_entry_id == entry_id(SEGMENT, "prompt")
    assert links[-1].response_entry_id == entry_id(SEGMENT, "output")
    assert [event.event_type for batch in batches for event in batch.events] == ["prompt", "agent_start", "agent_end"]
    assert all(batch.sample is not None for batch in batches)
    end = ended(sent)
    assert (end["stop_reason"], end["error_code"], end["response_entry_id"]) == (
        "stop",
        None,
        entry_id(SEGMENT, "output"),
    )


def test_a_lost_connection_is_tried_again_under_the_same_key(project, script):
    answers: list[client_v1.Response | None] = [None]  # the first connection drops mid-request

    def flaky(request: client_v1.Request) -> client_v1.Response | None:
        return answers.pop(0) if answers else accept(request)

    with ClientServer(flaky) as server:
        sent, peer = drive(launch_of(project, [sys.executable, str(script), "json"], server.path))
    assert [r.idempotencyKey for r in server.requests] == ["command-segment-1", "command-segment-1"]
    assert server.requests[0].requestId != server.requests[1].requestId
    assert ended(sent)["error_code"] is None and peer.status == HOST_EXIT_DONE


def test_a_rejected_output_ends_the_turn_with_the_validators_error(project, script):
    def reject(request: client_v1.Request) -> client_v1.Response:
        receipt = {"code": "validationFailed"}
        return client_v1.Response(requestId=request.requestId, outcome="rejected", receipt=receipt, error="no 'x'")

    with ClientServer(reject) as server:
        sent, _ = drive(launch_of(project, [sys.executable, str(script), "json"], server.path))
    end = ended(sent)
    assert (end["stop_reason"], end["error_code"], end["error"]["data"]) == ("stop", "validationFailed", b"no 'x'")
    assert len(server.requests) == 1  # not run or submitted again


def test_a_command_that_cannot_start_fails_the_run_and_sends_nothing(project, tmp_path):
    with ClientServer() as server:
        sent, _ = drive(launch_of(project, [str(tmp_path / "no-such-agent")], server.path))
    assert kinds(sent) == ["agent.branch", "agent.turn:started", "agent.turn:ended", "agent.close"]
    end = ended(sent)
    assert end["error_code"] == "commandFailed" and end["stop_reason"] == "error"
    assert end["error"]["data"].decode().startswith("the command could not be started (")
    assert "No such file or directory" in end["error"]["data"].decode() and not server.requests


def test_an_assistant_message_reply_goes_with_the_turns_end(project, script):
    with ClientServer() as server:
        launch = launch_of(
            project, [sys.executable, str(script), "reply"], server.path, ExpectedOutput(kind="assistant-message")
        )
        sent, _ = drive(launch)
    end = ended(sent)
    assert end["reply"]["data"] == b"Fixed the import." and end["error_code"] is None and not server.requests


def test_a_spent_budget_kills_the_command_and_ends_the_turn_aborted(project, script):
    seen = script.parent / "seen.json"

    def timing_out(frame: dict[str, Any]) -> dict[str, Any]:
        sample = frame["b"].get("sample") if frame["k"] == "agent.record" else None
        if sample is not None and sample["elapsed_ms"] >= 300 and seen.exists():  # (once it runs for sure)
            return {"timedOut": True}
        return writer(frame)

    with ClientServer() as server:
        launch = launch_of(project, [sys.executable, str(script), "sleep"], server.path, timeout_ms=300, sample_ms=100)
        sent, peer = drive(launch, timing_out)
    pid = json.loads(seen.read_text())["pid"]
    assert not _alive(pid)  # SIGTERM, waited for
    end = ended(sent)
    assert (end["stop_reason"], end["aborted_by_server"], end["error_code"]) == ("aborted", True, None)
    assert end["elapsed_ms"] >= 300 and kinds(sent)[-1] == "agent.close" and peer.status == HOST_EXIT_DONE
    assert records(sent)[-1].sample.elapsed_ms >= 300 and not server.requests


def test_a_supervisor_gone_mid_run_ends_the_host_and_its_command(project, script):
    with ClientServer() as server:
        peer = HostPeer()
        peer.start(launch_of(project, [sys.executable, str(script), "sleep"], server.path))
        while (frame := peer.receive()) is not None and frame["k"] != "agent.record":
            peer.reply(frame, "accepted", writer(frame))
        seen = script.parent / "seen.json"
        wait_until(seen.exists, what="the command running")
        peer.close()  # end of file: the host returns, its command killed
    assert peer.status == HOST_EXIT_DONE
    pid = json.loads(seen.read_text())["pid"]
    wait_until(lambda: not _alive(pid), what="the command killed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

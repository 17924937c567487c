"""The agent oracles of the crash harness (stress/crash/agent_oracles.py) can fail: an agent step is
driven through the real writer (C2 to C12: its step sent as a Pi entry, one submission rejected,
one accepted) beside the Pi session file that step would leave; consistent, nothing is found, and
each doctored copy (the database, the session file, the model's requests) is reported in its class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from piworkflows.protocol.internal.agents import submission_id_of
from stress.crash import agent_oracles, oracles, snapshot
from tests.support_agents import AgentStep

pytestmark = pytest.mark.timeout(60)

USER, ASSISTANT, REJECTED, ASSISTANT_2, ACCEPTED = "0a1b2c3d", "1b2c3d4e", "2c3d4e5f", "3d4e5f60", "4e5f6071"
NOTHING = {"lost": [], "duplicated": [], "violations": [], "stuck": []}


def message(entry_id: str, parent: str | None, body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": "2026-12-03T00:00:00Z", "message": body}


def submit_call(request_id: str, ok: bool) -> dict[str, Any]:
    arguments = {"action": "submit", "requestId": request_id, "output": {"ok": ok}}
    return {
        "role": "assistant",
        "content": [{"type": "toolCall", "id": "call_0", "name": "workflow", "arguments": arguments}],
    }


def tool_result(text: str) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": "call_0",
        "toolName": "workflow",
        "content": [{"type": "text", "text": text}],
    }


def session_entries(step: AgentStep, marker: str) -> list[dict[str, Any]]:
    """What Pi writes for the step: its user entry, a rejected submission, an accepted one (call ids repeat)."""
    user = {"role": "user", "content": [{"type": "text", "text": f"Workflow step ...\npi-workflows-message: {marker}"}]}
    return [
        message(USER, None, user),
        message(ASSISTANT, USER, submit_call(step.request_id, ok=False)),
        message(REJECTED, ASSISTANT, tool_result("ok must be true. Fix the output and call the workflow tool again.")),
        message(ASSISTANT_2, REJECTED, submit_call(step.request_id, ok=True)),
        message(ACCEPTED, ASSISTANT_2, tool_result("Accepted")),
    ]


def write_session(path: Path, entries: list[dict[str, Any]]) -> None:
    header = {"type": "session", "version": 3, "id": "pi-session-1", "cwd": "/projects/p1"}
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *entries]))


@pytest.fixture
def step(executor, tmp_path):
    """A run whose agent step ended: sent as USER, a submission rejected, one accepted, the segment
    closed, the run completed (as its runner would finish it)."""
    step = AgentStep(executor)
    step.start()
    step.open()
    step.host("agent.bind_session", pi_session_file=str(tmp_path / "session.jsonl"), pi_session_id="pi-session-1")
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id=USER)
    step.turn("started", "turn-segment-1-1")
    step.submit({"ok": False}, key="submit-1")
    step.settle(submission_id_of(step.request_id, "submit-1"), error="ok must be true")
    step.submit({"ok": True}, key="submit-2")
    step.settle(submission_id_of(step.request_id, "submit-2"), output={"ok": True})
    step.turn("ended", "turn-segment-1-1", stop_reason="toolUse", elapsed_ms=10)
    assert step.host("agent.close").outcome == "accepted"
    executor.conn.execute("UPDATE runs SET status = 'completed', finished_at = 1 WHERE run_id = 'run-1'")
    executor.conn.execute("UPDATE run_queue SET queue_status = 'done' WHERE run_id = 'run-1'")
    write_session(tmp_path / "session.jsonl", session_entries(step, step.initial_id))
    return step


def judge(paths, tmp_path, **doctored):
    sessions = {str(tmp_path / "session.jsonl"): agent_oracles.read_session(tmp_path / "session.jsonl")}
    found = {"sessions": sessions, "modelRequests": [], "leftovers": [], **doctored}
    return agent_oracles.judge(found, snapshot.read(paths.database, 10), "demo")


def test_a_consistent_agent_step_passes(step, paths, tmp_path):
    assert judge(paths, tmp_path) == NOTHING
    state = snapshot.read(paths.database, 10)
    assert state.requests[step.request_id]["status"] == "accepted"
    assert [s["outcome"] for s in state.submissions] == ["rejected", "accepted"]
    assert state.messages[step.initial_id] == {
        "runId": "run-1",
        "requestId": step.request_id,
        "state": "sent",
        "entry": USER,
        "sentEvents": 1,
    }
    assert state.session_files == {"run-1": {str(tmp_path / "session.jsonl")}}


def test_an_acceptance_the_tool_reported_but_the_database_lacks_is_lost(step, paths, tmp_path, executor):
    entries = session_entries(step, step.initial_id)
    entries[2] = message(REJECTED, ASSISTANT, tool_result("Accepted"))  # the tool said so of the rejected one
    write_session(tmp_path / "session.jsonl", entries)
    assert judge(paths, tmp_path)["lost"] == []  # its request is accepted all the same
    executor.conn.execute(
        "UPDATE interactive_requests SET request_status = 'failed', accepted_submission_id = NULL, "
        "revision = revision + 1"
    )
    executor.conn.execute("UPDATE interactive_submissions SET outcome = 'rejected'")
    found = judge(paths, tmp_path)["lost"]
    assert len(found) == 2 and all(f"Accepted for {step.request_id}, which is failed" in line for line in found)


def test_a_second_accepted_submission_is_duplicated(step, paths, tmp_path, executor):
    executor.conn.execute("UPDATE interactive_submissions SET outcome = 'accepted'")
    first, second = (submission_id_of(step.request_id, key) for key in ("submit-1", "submit-2"))
    assert judge(paths, tmp_path)["duplicated"] == [
        f"request {step.request_id} is accepted with accepted submissions {[first, second]}"
    ]


def test_a_step_message_sent_twice_is_duplicated(step, paths, tmp_path, executor):
    executor.conn.execute(
        "INSERT INTO events (resource_id, resource_revision, event_type, actor_class, committed_at) "
        "VALUES (?, 99, 'workflow_message.sent', 'runner', 5)",
        (step.initial_id,),
    )
    assert judge(paths, tmp_path)["duplicated"] == [f"step message {step.initial_id} was sent 2 times"]


def test_a_step_twice_on_the_branch_or_in_one_model_request_is_duplicated(step, paths, tmp_path):
    entries = session_entries(step, step.initial_id)
    again = {**entries[0], "id": "5f607182", "parentId": ACCEPTED}  # the step shown again on the branch
    write_session(tmp_path / "session.jsonl", [*entries, again])
    found = judge(paths, tmp_path)["duplicated"]
    assert found == [f"{tmp_path / 'session.jsonl'}: step message {step.initial_id} is 2 times on the branch"]
    write_session(tmp_path / "session.jsonl", [*entries, {**again, "parentId": None}])  # on another branch
    assert judge(paths, tmp_path)["duplicated"] == []
    write_session(tmp_path / "session.jsonl", entries)
    user = entries[0]["message"]
    asked = [{"model": "submit", "messages": [user, {"role": "assistant", "content": "..."}, user]}]
    assert judge(paths, tmp_path, modelRequests=asked)["duplicated"] == [
        f"model request 1: step message {step.initial_id} shown 2 times"
    ]


def test_a_sent_step_whose_entry_is_not_in_its_session_is_a_violation(step, paths, tmp_path):
    write_session(tmp_path / "session.jsonl", session_entries(step, "wm-" + "0" * 32))  # another step's marker
    assert judge(paths, tmp_path)["violations"] == [
        f"step message {step.initial_id} was sent as entry {USER}, not in its session"
    ]


def test_a_host_or_pi_left_behind_is_a_violation(step, paths, tmp_path):
    assert judge(paths, tmp_path, leftovers=["pid 7: node pi --mode rpc"])["violations"] == [
        "left behind: pid 7: node pi --mode rpc"
    ]


def test_an_agent_run_that_did_not_end_is_stuck(step, paths, tmp_path, executor):
    executor.conn.execute("UPDATE runs SET status = 'waiting', finished_at = NULL, paused = 1 WHERE run_id = 'run-1'")
    assert judge(paths, tmp_path)["stuck"] == ["agent run run-1 is waiting (paused True, park None)"]


def test_the_harness_judge_adds_the_agent_findings_for_agent_loads(step, paths, tmp_path):
    found = {"sent": [], "acks": [], "ledger": [], "checks": [], "leftovers": ["pid 7: pi"]}
    state = snapshot.read(paths.database, 10)
    assert oracles.judge(found, state, frozenset())["violations"] == []  # no agent load: not judged
    assert "left behind: pid 7: pi" in oracles.judge(found, state, frozenset(), "demo")["violations"]

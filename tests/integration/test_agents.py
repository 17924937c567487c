"""Agent steps end to end: a real server runs workflows whose agent nodes run on the real Pi against
the scripted model (no network, no API key), and the state they leave verifies clean."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from piworkflows.testing.scripted_model import ScriptedModel
from tests.engine_util import start, view, wait_status, write
from tests.pi_util import agent_env, submit
from tests.server_util import ServerProcess, query, serving, wait_until

pytestmark = pytest.mark.timeout(180)

TWO_STEPS = """
from piworkflows.workflows import agent, compute, define_workflow, edge

workflow = define_workflow(
    name="two-steps",
    start_at="plan",
    nodes={
        "plan": agent(
            prompt="Plan the change.",
            expected_output={"type": "object", "required": ["steps"], "properties": {"steps": {"type": "integer"}}},
        ),
        "fix": agent(prompt=lambda ctx: f"Carry out the {ctx.outputs['plan']['steps']} steps.",
                     expected_output="a summary of what you changed"),
        "done": compute(run=lambda ctx: {"plan": ctx.outputs["plan"], "fix": ctx.outputs["fix"]}),
    },
    edges=[edge("plan", "fix"), edge("fix", "done")],
)
"""


@pytest.fixture
def scripted(request: pytest.FixtureRequest) -> Iterator[ScriptedModel]:
    """The scripted model of the test's ``scripts`` mark."""
    with ScriptedModel(request.node.get_closest_marker("scripts").args[0]) as model:
        yield model


@pytest.fixture
def agent_server(tmp_path: Path, pi_command: list[str], scripted: ScriptedModel) -> Iterator[ServerProcess]:
    """A server whose agent steps run the real Pi on the scripted model of the test's ``scripts`` mark."""
    with serving(tmp_path / "s", agent_env(tmp_path, pi_command, scripted)) as proc:
        proc.model = scripted  # type: ignore[attr-defined]
        yield proc


@pytest.mark.scripts({"two": [submit({"steps": 3}), submit({"summary": "changed three files"})]})
def test_two_agent_steps_share_the_run_session_and_the_run_completes(agent_server, project):
    write(project, "two-steps", TWO_STEPS)
    run_id = start(agent_server, project, "two-steps")
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "completed", done
    assert done["state"].get("finalOutput") == {"plan": {"steps": 3}, "fix": {"summary": "changed three files"}}
    asked = agent_server.model.requests  # type: ignore[attr-defined]
    assert len(asked) == 2
    first, second = ([m for m in r["messages"] if m["role"] != "system"] for r in asked)
    assert second[: len(first)] == first  # the second prompt's request carries the first turn
    assert "Carry out the 3 steps." in _text(second[-1])
    sessions = query(agent_server, "SELECT DISTINCT session_id FROM session_segments WHERE run_id = ?", run_id)
    assert len(sessions) == 1  # both steps ran in the run's one Pi session
    sent = query(
        agent_server, "SELECT message_state, pi_entry_id FROM workflow_messages WHERE run_id = ? ORDER BY 1", run_id
    )
    assert [state for state, _ in sent] == ["sent", "sent"] and all(entry for _, entry in sent)
    accepted = query(
        agent_server,
        "SELECT count(*) FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
        "WHERE r.run_id = ? AND s.outcome = 'accepted'",
        run_id,
    )
    assert accepted == [(2,)]
    assert view(agent_server, run_id)["display"]["status"] == "completed"
    ((session_file,),) = query(
        agent_server, "SELECT DISTINCT pi_session_file FROM session_segments WHERE run_id = ?", run_id
    )
    written = [json.loads(line) for line in Path(session_file).read_text().splitlines()]
    captured = query(agent_server, "SELECT pi_entry_id FROM session_entries WHERE run_id = ?", run_id)
    # each entry Pi wrote captured once: each segment's Pi ended (killed when idle) after its last entry
    assert sorted(entry for (entry,) in captured) == sorted(e["id"] for e in written if e["type"] != "session")


def _ended(run_view: dict[str, Any]) -> dict[str, Any] | None:
    return run_view if run_view["display"]["status"] in ("completed", "failed", "timed_out", "cancelled") else None


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


FRESH = """
from piworkflows.workflows import agent, define_workflow, edge

workflow = define_workflow(
    name="fresh",
    start_at="first",
    nodes={
        "first": agent(prompt="First step.", expected_output="anything"),
        "second": agent(prompt="Second step, on a clean slate.", expected_output="anything", session="fresh"),
    },
    edges=[edge("first", "second")],
)
"""


@pytest.mark.scripts({"fresh": [submit({"n": 1}), submit({"n": 2})]})
def test_a_fresh_session_starts_without_the_runs_conversation(agent_server, project):
    write(project, "fresh", FRESH)
    run_id = start(agent_server, project, "fresh")
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "completed", done
    first, second = ([m for m in r["messages"] if m["role"] != "system"] for r in agent_server.model.requests)
    assert [m["role"] for m in second] == ["user"] and "First step." not in _text(second[0])
    sessions = query(agent_server, "SELECT DISTINCT session_id FROM session_segments WHERE run_id = ?", run_id)
    assert len(sessions) == 2


ASSISTANT = """
from piworkflows.workflows import agent, assistant_message, define_workflow

workflow = define_workflow(
    name="reply",
    start_at="answer",
    nodes={"answer": agent(prompt="Say what 6 times 7 is.", expected_output=assistant_message(max_chars=100))},
    edges=[],
)
"""


@pytest.mark.scripts({"reply": [{"text": "6 times 7 is 42."}]})
def test_an_assistant_message_step_takes_the_reply_as_its_output(agent_server, project):
    write(project, "reply", ASSISTANT)
    run_id = start(agent_server, project, "reply")
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "completed", done
    assert done["state"].get("finalOutput") == "6 times 7 is 42."
    (receipt,) = query(
        agent_server,
        "SELECT b.bytes FROM node_attempts a JOIN blobs b ON b.digest = a.receipt_digest WHERE a.run_id = ?",
        run_id,
    )
    assert b'"maxChars":100' in receipt[0] and b'"adopted":false' in receipt[0]


SCHEMA = """
from piworkflows.workflows import agent, define_workflow

workflow = define_workflow(
    name="count",
    start_at="count",
    nodes={
        "count": agent(
            prompt="Count the steps.",
            expected_output={"type": "object", "required": ["steps"], "properties": {"steps": {"type": "integer"}}},
        )
    },
    edges=[],
)
"""


@pytest.mark.scripts({"count": [submit({"steps": "three"}), submit({"steps": 3})]})
def test_a_wrong_submission_is_refused_with_the_error_and_the_corrected_one_accepted(agent_server, project):
    write(project, "count", SCHEMA)
    run_id = start(agent_server, project, "count")
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "completed", done
    assert done["state"].get("finalOutput") == {"steps": 3}
    retry = agent_server.model.requests[1]["messages"]
    told = [m for m in retry if m["role"] == "tool"]
    assert told and "steps" in _text(told[-1]) and "integer" in _text(told[-1])  # the model saw the error
    outcomes = query(
        agent_server,
        "SELECT s.outcome FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
        "WHERE r.run_id = ? ORDER BY s.created_at",
        run_id,
    )
    assert outcomes == [("rejected",), ("accepted",)]


@pytest.mark.scripts({"count": [{"text": "Thinking."}, {"text": "Still thinking."}, {"text": "Done thinking."}]})
def test_three_turns_without_a_submission_get_two_reminders_then_fail_missing_submission(agent_server, project):
    write(project, "count", SCHEMA)
    run_id = start(agent_server, project, "count")
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "failed", done
    assert query(agent_server, "SELECT error_code FROM node_attempts WHERE run_id = ?", run_id) == [
        ("missingSubmission",)
    ]
    reminders = [_text(r["messages"][-1]) for r in agent_server.model.requests[1:]]
    assert [text.startswith(f"Reminder ({n} of 2)") for n, text in enumerate(reminders, 1)] == [True, True]
    steps = query(agent_server, "SELECT source_kind, message_state FROM workflow_messages WHERE run_id = ?", run_id)
    assert sorted(steps) == [("interactive_request", "sent"), ("workflow_turn", "sent"), ("workflow_turn", "sent")]


def _open_turn(server: ServerProcess, run_id: str, turns: int) -> bool:
    """The run's ``turns``-th model turn is open (its turns so far counted, the last one open)."""
    rows = query(server, "SELECT turn_state FROM workflow_turns WHERE run_id = ? ORDER BY started_at", run_id)
    return len(rows) == turns and rows[-1][0] == "open"


def _working_host(server: Any) -> int | None:
    """The agent host running a step: Pi is its child (a ready host waits for its launch without)."""
    for pid in server.child_pids("agent host"):
        try:
            if psutil.Process(pid).children():
                return pid
        except psutil.Error:
            continue
    return None


def _pi_of(host_pid: int) -> int:
    (pi,) = [p for p in psutil.Process(host_pid).children() if "node" in p.name() or "pi" in p.name()]
    return pi.pid


@pytest.mark.parametrize("target", ["agent host", "pi"])
@pytest.mark.scripts(
    {"count": [{"text": "Working on it."}, {"stall_ms": 60_000, "text": "lost"}, submit({"steps": 3})]}
)
def test_kill_9_mid_turn_keeps_the_attempt_and_resumes_it_once(agent_server, project, target):
    """The first turn ends without a result (a reminder is sent), the second is killed mid-turn: the
    next host finds both steps on the session's branch, sends one `resumed` step, and the run
    completes on the same attempt; no step reached the model twice."""
    write(project, "count", SCHEMA)
    run_id = start(agent_server, project, "count")
    wait_until(
        lambda: _open_turn(agent_server, run_id, 2) and len(agent_server.model.requests) == 2,
        timeout=60,
        what="the second turn open, its model request stalled",
    )
    host = wait_until(lambda: _working_host(agent_server), what="the host running the step")
    os.kill(host if target == "agent host" else _pi_of(host), signal.SIGKILL)
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "completed", done
    assert len(query(agent_server, "SELECT attempt_id FROM node_attempts WHERE run_id = ?", run_id)) == 1
    turns = query(agent_server, "SELECT turn_state FROM workflow_turns WHERE run_id = ? ORDER BY started_at", run_id)
    assert [state for (state,) in turns] == ["ended", "lost", "ended"]
    kinds = query(agent_server, "SELECT idempotency_key, message_state FROM workflow_messages WHERE run_id = ?", run_id)
    assert sorted(key.split(":")[2] for key, _ in kinds) == ["initial", "reminder", "resumed"]
    assert all(state == "sent" for _, state in kinds)
    last = [_text(m) for m in agent_server.model.requests[-1]["messages"] if m["role"] == "user"]
    markers = [text.rstrip().rsplit("\n", 1)[-1] for text in last]
    assert len(markers) == len(set(markers)) == 3  # each step message reached the model once


@pytest.mark.scripts({"count": [submit({"steps": 3}), submit({"steps": 3})]})
def test_a_validator_that_dies_rejects_the_submission_and_the_model_submits_again(
    tmp_path, pi_command, scripted, project
):
    env = {**agent_env(tmp_path, pi_command, scripted), "PIW_FAULTS": "validator.before_verdict=crash@1"}
    write(project, "count", SCHEMA)
    with serving(tmp_path / "s", env) as server:
        run_id = start(server, project, "count")
        done = wait_status(server, run_id, "completed", "failed", "timed_out", "cancelled")
        assert done["display"]["status"] == "completed", done
        outcomes = query(
            server,
            "SELECT s.outcome, b.bytes FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
            "LEFT JOIN blobs b ON b.digest = s.receipt_digest WHERE r.run_id = ? ORDER BY s.created_at",
            run_id,
        )
    assert [outcome for outcome, _ in outcomes] == ["rejected", "accepted"]
    assert b"validatorFailed" in outcomes[0][1]
    told = [m for m in scripted.requests[1]["messages"] if m["role"] == "tool"]
    assert "Call the workflow tool again." in _text(told[-1])  # the model was told to submit again


@pytest.mark.scripts({"count": [submit({"steps": 3})]})
def test_the_server_killed_while_a_submission_validates_judges_it_at_its_next_start(
    tmp_path, pi_command, scripted, project
):
    env = agent_env(tmp_path, pi_command, scripted)
    write(project, "count", SCHEMA)
    server = ServerProcess(tmp_path / "s", env={**env, "PIW_FAULTS": "supervisor.after_submission_recorded=crash"})
    server.start()
    run_id = start(server, project, "count")
    assert server.popen is not None
    server.popen.wait(timeout=60)  # the supervisor killed itself with the submission recorded, not judged
    assert query(server, "SELECT request_status FROM interactive_requests WHERE run_id = ?", run_id) == [
        ("validating",)
    ]
    with serving(server.state_dir, env) as again:
        done = wait_status(again, run_id, "completed", "failed", "timed_out", "cancelled")
        assert done["display"]["status"] == "completed", done
        assert done["state"].get("finalOutput") == {"steps": 3}
    assert len(scripted.requests) == 1  # judged again at the start: the model was not asked again


AGENT_FAULTS = [
    "agent.after_open",
    "agent.before_prompt",
    "agent.after_prompt",
    "agent.after_message_sent",
    "agent.after_turn_started",
    "agent.before_turn_end",
    "agent.after_record",
    "agent.before_close",
    "tool.after_submit_sent",
]


@pytest.mark.parametrize("point", AGENT_FAULTS)
@pytest.mark.scripts({"count": [submit({"steps": 3})] * 3})
def test_a_crash_at_each_agent_fault_point_loses_nothing(tmp_path, pi_command, scripted, project, point):
    """The host (or Pi, for the tool's point) dies there once: the step goes on in the same attempt
    (a host that died before committing anything parks the run agentNoProgress; resume retries), the
    run completes with one accepted submission, and the state verifies clean."""
    env = {**agent_env(tmp_path, pi_command, scripted), "PIW_FAULTS": f"{point}=crash@1"}
    write(project, "count", SCHEMA)
    with serving(tmp_path / "s", env) as server:
        run_id = start(server, project, "count")
        done = wait_until(
            lambda: (
                _ended(v := view(server, run_id))
                or (v if v["piworkflows"]["parkReason"] == "agentNoProgress" else None)
            ),
            timeout=60,
            what="the run ended or parked",
        )
        if done["piworkflows"]["parkReason"] == "agentNoProgress":  # the host died before it made progress
            with server.client() as client:
                assert client.request("run.resume", {}, run_id=run_id).outcome == "accepted"
            done = wait_status(server, run_id, "completed", "failed", "timed_out", "cancelled")
        assert done["display"]["status"] == "completed", done
        assert done["state"].get("finalOutput") == {"steps": 3}
        assert len(query(server, "SELECT 1 FROM node_attempts WHERE run_id = ?", run_id)) == 1
        accepted = query(
            server,
            "SELECT count(*) FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
            "WHERE r.run_id = ? AND s.outcome = 'accepted'",
            run_id,
        )
        assert accepted == [(1,)]
        sent = query(
            server, "SELECT pi_entry_id FROM workflow_messages WHERE run_id = ? AND pi_entry_id IS NOT NULL", run_id
        )
        assert len(sent) == len(set(sent))  # no entry holds two step messages


BUDGET = """
from piworkflows.workflows import agent, define_workflow

workflow = define_workflow(
    name="budget",
    start_at="slow",
    nodes={"slow": agent(prompt="Take your time.", expected_output="anything", timeout_ms=1500)},
    edges=[],
)
"""


def _intervals(server: ServerProcess, run_id: str) -> list[tuple[int, int | None, int, str | None]]:
    return query(
        server,
        "SELECT i.started_at, i.ended_at, i.elapsed_ms, i.end_cause FROM attempt_active_intervals i "
        "JOIN node_attempts a USING (attempt_id) WHERE a.run_id = ? ORDER BY i.interval_number",
        run_id,
    )


@pytest.mark.scripts({"slow": [{"stall_ms": 60_000, "text": "x"}, {"stall_ms": 60_000, "text": "y"}]})
def test_the_active_time_budget_times_the_step_out_and_a_pause_inside_is_not_counted(agent_server, project):
    write(project, "budget", BUDGET)
    run_id = start(agent_server, project, "budget")
    wait_until(lambda: (i := _intervals(agent_server, run_id)) and i[0][2] >= 500, timeout=60, what="500 ms spent")
    with agent_server.client() as client:
        assert client.request("run.pause", {}, run_id=run_id).outcome == "accepted"
        wait_until(lambda: _working_host(agent_server) is None, what="the host stopped")
        assert client.request("run.resume", {}, run_id=run_id).outcome == "accepted"
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "timed_out", done
    assert query(agent_server, "SELECT attempt_status, error_code FROM node_attempts WHERE run_id = ?", run_id) == [
        ("timed_out", "agentTimeout")
    ]
    intervals = _intervals(agent_server, run_id)
    assert [cause for *_, cause in intervals][0] == "pause" and len(intervals) >= 2
    spent = sum(elapsed for _, _, elapsed, _ in intervals)
    assert 1500 <= spent <= 1500 + 100 + 50  # within one sample (100 ms) of the budget
    paused_for = intervals[1][0] - intervals[0][1]
    span = intervals[-1][1] - intervals[0][0]
    assert spent <= span - paused_for + 100  # the pause is not counted

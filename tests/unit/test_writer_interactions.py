"""Submissions and their verdicts (C10, C11), progress updates, and what run control and a
run's end do to an agent step's rows; the retention blockers see every live agent row."""

from __future__ import annotations

import pytest

from piworkflows.protocol.internal.agents import submission_id_of
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import prune
from tests.support import claim_run, run_group, run_state
from tests.support_agents import RUNNER, AgentStep, assistant_message, consistent, run_claim

pytestmark = pytest.mark.timeout(60)

CLIENT = {"actor_class": "client"}


@pytest.fixture
def opened(executor):
    """A run waiting at its agent step, a host recording it (segment-1), its turn open."""
    step = AgentStep(executor)
    step.start()
    step.open()
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="0a1b2c3d")
    step.turn("started", "turn-segment-1-1")
    return step


def refused(reply, outcome, code):
    assert (reply.outcome, reply.receipt["code"]) == (outcome, code), reply


def test_a_submission_validates_then_its_acceptance_completes_the_step(opened, executor):
    step = opened
    reply = step.submit({"summary": "fixed"})
    submission_id = submission_id_of(step.request_id, "submit-1")
    assert reply.outcome == "accepted" and reply.receipt["status"] == "validating"
    assert reply.receipt["submissionId"] == submission_id and reply.receipt["attemptId"] == step.attempt_id
    assert step.request_status() == "validating"
    again = step.submit({"summary": "fixed"})  # the tool retried: the same key adopts
    assert again.outcome == "accepted" and again.receipt["status"] == "validating"
    refused(step.submit({"summary": "other"}), "conflict", "idempotencyKeyReused")
    refused(step.submit({"summary": "x"}, key="submit-2"), "conflict", "validationInProgress")
    settled = step.settle(submission_id, output={"summary": "fixed"})
    assert settled.receipt == {"submissionId": submission_id, "requestId": step.request_id, "status": "accepted"}
    assert step.request_status() == "accepted" and step.attempt() == ("completed", "ok", None)
    assert step.row("SELECT accepted_submission_id FROM interactive_requests") == (submission_id,)
    assert step.row("SELECT end_cause FROM attempt_active_intervals") == ("settlement",)
    assert run_state(executor) == (("queued", "queued", False, False), None)
    assert step.settle(submission_id, output={"summary": "fixed"}).outcome == "accepted"  # a repeat adopts
    refused(step.settle(submission_id, error="late"), "conflict", "winnerDecided")
    refused(step.submit({"summary": "y"}, key="submit-3"), "conflict", "winnerDecided")
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="stop", elapsed_ms=10)  # the tool ended the turn
    assert ended.receipt["requestStatus"] == "accepted" and ended.receipt["pending"] == []
    consistent(executor)


def test_a_rejected_submission_puts_the_request_back_to_pending(opened, executor):
    step = opened
    first = step.submit({"summary": 1})
    rejected = step.settle(first.receipt["submissionId"], error="summary must be a string")
    assert rejected.receipt["status"] == "rejected" and rejected.receipt["error"] == "summary must be a string"
    assert step.request_status() == "pending"
    repeat = step.submit({"summary": 1})  # the same key answers its verdict
    assert repeat.receipt["status"] == "rejected" and repeat.receipt["errorCode"] == "validationFailed"
    fixed = step.submit({"summary": "ok"}, key="submit-2")
    step.settle(fixed.receipt["submissionId"], output={"summary": "ok"})
    outcomes = step.rows("SELECT idempotency_key, outcome FROM interactive_submissions ORDER BY created_at, rowid")
    assert outcomes == [("submit-1", "rejected"), ("submit-2", "accepted")]
    consistent(executor)


def test_a_submission_is_refused_outside_its_epoch_session_or_kind(opened, executor):
    step = opened
    refused(step.submit({"summary": "x"}, epoch=2), "claimLost", "staleGeneration")
    refused(step.submit({"summary": "x"}, session="pis-other"), "notFound", "resourceNotFound")
    session, step.request_id = step.session_id, "request-missing"
    refused(step.submit({"summary": "x"}, session=session), "notFound", "resourceNotFound")
    consistent(executor)


def test_a_submission_is_refused_while_paused_or_without_a_host(opened, executor):
    step = opened
    step.send("run.pause", {"actor": CLIENT, "run_id": "run-1"})
    refused(step.submit({"summary": "x"}), "conflict", "runPaused")
    step.host("agent.close")
    refused(step.submit({"summary": "x"}), "claimLost", "notClaimed")
    consistent(executor)


def test_an_assistant_message_step_takes_no_submission(executor):
    step = AgentStep(executor)
    step.start(expected=assistant_message())
    step.open()
    refused(step.submit({"summary": "x"}), "rejected", "wrongRequestKind")
    consistent(executor)


def test_a_progress_update_is_a_workflow_update(opened, executor):
    step = opened
    body = {
        "actor": {"actor_class": "model"},
        "request_id": step.request_id,
        "target_session_id": step.session_id,
        "coordinator_epoch": 1,
        "message": "running the tests",
        "progress": 0.5,
    }
    reply = step.send("interaction.update", body)
    assert reply.outcome == "accepted" and reply.receipt == {"requestId": step.request_id, "updateSeq": 1}
    stored = step.row("SELECT u.update_kind, b.bytes FROM workflow_updates u JOIN blobs b ON b.digest = u.body_digest")
    assert stored == ("progress", b'{"message":"running the tests","progress":0.5}')
    refused(step.send("interaction.update", {**body, "coordinator_epoch": 3}), "claimLost", "staleGeneration")
    consistent(executor)


def test_pause_closes_the_interval_and_cancels_pending_steps(opened, executor):
    step = opened
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="stop", elapsed_ms=30)
    reminder = ended.receipt["pending"][0]["workflowMessageId"]
    step.turn("started", "turn-segment-1-2", message_id=reminder)
    paused = step.send("run.pause", {"actor": CLIENT, "run_id": "run-1"})
    assert paused.receipt == {"runId": "run-1", "status": "waiting", "paused": True}
    assert step.rows("SELECT end_cause FROM attempt_active_intervals ORDER BY interval_number") == [
        ("turn_end",),
        ("pause",),
    ]
    assert step.row(
        "SELECT message_state, recovery_stop FROM workflow_messages WHERE workflow_message_id = ?", reminder
    ) == ("cancelled", "interruption")
    assert step.request_status() == "pending"  # a paused run keeps its waiting request
    aborted = step.turn("ended", "turn-segment-1-2", message_id=reminder, stop_reason="aborted", aborted_by_server=True)
    assert aborted.receipt["paused"] is True and aborted.receipt["pending"] == []
    consistent(executor)


def test_cancel_stops_every_agent_row(opened, executor):
    step = opened
    step.submit({"summary": "x"})
    cancelled = step.send("run.cancel", {"actor": CLIENT, "run_id": "run-1"})
    assert cancelled.outcome == "accepted"
    assert step.row("SELECT turn_state FROM workflow_turns") == ("lost",)
    assert step.request_status() == "cancelled"
    assert step.row("SELECT outcome FROM interactive_submissions") == ("rejected",)
    assert step.row("SELECT segment_status FROM session_segments") == ("closed",)
    assert step.row("SELECT owner_id FROM leases WHERE resource_id = 'segment-1'") == (None,)
    assert step.row("SELECT count(*) FROM attempt_active_intervals WHERE ended_at IS NULL") == (0,)
    refused(step.host("agent.record", first_event_index=0), "claimLost", "notClaimed")  # the host stops
    consistent(executor)


def test_cancel_gives_pending_steps_their_cancellation(executor):
    step = AgentStep(executor)
    step.start()
    step.send("run.cancel", {"actor": CLIENT, "run_id": "run-1"})
    assert step.row("SELECT message_state, recovery_stop FROM workflow_messages") == ("cancelled", "cancellation")
    consistent(executor)


def test_a_runs_end_closes_a_segment_whose_host_hung(opened, executor):
    step = opened
    submission = step.submit({"summary": "done"})
    step.settle(submission.receipt["submissionId"], output={"summary": "done"})
    (waits,) = run_group(executor, claim_run(token="tok-2"))  # its host still records: no runner yet
    assert waits.outcome == "rejected"
    executor.clock.advance(60_000)  # the host hung: its segment's claim expired
    (claimed,) = run_group(executor, claim_run(token="tok-2"))  # the next runner, while the host lingers
    finish = {
        "actor": RUNNER,
        "run_id": "run-1",
        "claim": run_claim(generation=2, token="tok-2"),
        "expected_revision": claimed.revision,
        "end_status": "completed",
        "output": BlobValue.of_json({"summary": "done"}).model_dump(),
    }
    assert step.send("run.finish", finish).outcome == "accepted"
    assert step.row("SELECT status FROM runs") == ("completed",)
    assert step.row("SELECT segment_status FROM session_segments") == ("closed",)
    assert step.row("SELECT turn_state FROM workflow_turns") == ("lost",)
    refused(step.host("agent.close"), "claimLost", "notClaimed")
    consistent(executor)


def test_a_restarted_headless_run_gets_its_own_session(executor):
    step = AgentStep(executor)
    step.start()
    cancelled = step.send("run.cancel", {"actor": CLIENT, "run_id": "run-1"})
    body = {"actor": CLIENT, "run_id": "run-1", "child_run_id": "run-2", "expected_revision": cancelled.revision}
    restarted = step.send("run.restart", body)
    assert restarted.outcome == "accepted", restarted
    assert step.row("SELECT origin_session_id FROM runs WHERE run_id = 'run-2'") == (None,)
    consistent(executor)


@pytest.mark.parametrize(
    "blocker", ["pendingWorkflowMessage", "openTurn", "pendingInteraction", "recordingSegment", "activeLease"]
)
def test_each_agent_blocker_sees_the_rows_the_handlers_write(executor, blocker):
    step = AgentStep(executor)
    step.start()  # the initial step stays pending
    step.open()
    step.turn("started", "turn-segment-1-1")
    now = executor.clock.now_ms()
    assert step.row("SELECT owner_id FROM leases WHERE resource_id = 'run-1'") == (None,)  # only the segment's
    params = {"root": "run-1", "cutoff": now, "now": now}
    assert executor.conn.execute(prune.BLOCKERS[blocker], params).fetchone() is not None

"""The writer's agent-step commands, C2 to C9 and C12 (AGENTS.md), on the real writer in-process.

Each scenario ends with ``state verify`` clean (tests/support_agents.consistent).
"""

from __future__ import annotations

import pytest

from piworkflows.protocol.internal.agents import (
    Executor,
    initial_step_key,
    message_id_of,
    reminder_step_key,
    resumed_step_key,
    session_id_of,
)
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import agent_steps
from tests.support import run_state
from tests.support_agents import AgentStep, assistant_message, consistent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def step(executor):
    return AgentStep(executor)


@pytest.fixture
def opened(step):
    """A run waiting at its agent step with a recording segment (segment-1)."""
    step.start()
    assert step.open().outcome == "accepted"
    return step


def refused(reply, outcome, code):
    assert (reply.outcome, reply.receipt["code"]) == (outcome, code), reply


# --- C2 ---------------------------------------------------------------------------------------


def test_a_request_parks_the_run_waiting_with_its_request_and_initial_step(step, executor):
    reply = step.start(timeout_ms=60_000)
    assert reply.outcome == "accepted"
    assert reply.receipt == {"attemptId": step.attempt_id, "requestId": step.request_id, "runStatus": "waiting"}
    assert run_state(executor) == (("waiting", "parked", False, False), None)
    assert step.row("SELECT attempt_status, timeout_ms FROM node_attempts") == ("waiting", 60_000)
    assert step.row("SELECT origin_session_id FROM runs") == (session_id_of("run-1"),)
    assert step.row("SELECT request_status, target_session_id, revision FROM interactive_requests") == (
        "pending",
        session_id_of("run-1"),
        1,
    )
    message = step.row(
        "SELECT workflow_message_id, message_kind, source_kind, source_id, idempotency_key, session_order, "
        "message_state FROM workflow_messages"
    )
    key = initial_step_key(step.request_id)
    assert message == (message_id_of(key), "step", "interactive_request", step.request_id, key, 1, "pending")
    assert step.row("SELECT revision FROM resources WHERE resource_id = ?", message_id_of(key)) == (1,)
    consistent(executor)


def test_a_fresh_session_is_the_attempts_own(step, executor):
    step.start(session="fresh")
    assert step.session_id == session_id_of(step.attempt_id)
    assert step.row("SELECT origin_session_id FROM runs") == (None,)
    consistent(executor)


def test_a_request_is_refused_for_another_node_kind_attempt_or_marker(step, executor):
    step.begin(kind="compute")
    refused(step.request_agent(), "rejected", "invalidTransition")
    other = AgentStep(executor, run_id="run-2")
    other.begin(epoch=False)
    stranger = other.contract.model_copy(update={"attempt_id": step.attempt_id})
    body = {"contract": BlobValue.of_json(stranger.model_dump(mode="json")).model_dump()}
    refused(other.request_agent(**body), "rejected", "validationFailed")  # names another attempt
    refused(other.request_agent(step=BlobValue.of_text("no marker").model_dump()), "rejected", "validationFailed")
    refused(other.request_agent(contract=BlobValue.of_json({"prompt": 1}).model_dump()), "rejected", "validationFailed")
    accepted = other.request_agent()
    assert accepted.outcome == "accepted"
    other.revision = accepted.revision
    refused(other.request_agent(), "claimLost", "notClaimed")  # the run's claim went with the wait
    consistent(executor)


# --- C3 ---------------------------------------------------------------------------------------


def test_claimable_lists_pending_requests_without_a_live_segment(step, executor, clock):
    step.start()
    assert step.claimable() == [{"requestId": step.request_id, "runId": "run-1"}]
    assert step.claimable(exclude=[step.request_id]) == []
    step.open()
    assert step.claimable() == []  # a live host records it
    clock.advance(10_001)
    assert step.claimable() == [{"requestId": step.request_id, "runId": "run-1"}]  # its claim expired
    consistent(executor)


def test_open_leases_a_segment_and_answers_the_launch(step, executor):
    step.start(timeout_ms=5_000)
    reply = step.open()
    assert reply.outcome == "accepted"
    receipt = reply.receipt
    assert receipt["segmentId"] == "segment-1" and receipt["leaseGeneration"] == 1
    assert receipt["pending"] == [{"workflowMessageId": step.initial_id, "text": receipt["pending"][0]["text"]}]
    assert receipt["pending"][0]["text"].endswith("pi-workflows-message: " + step.initial_id)
    assert (receipt["steps"], receipt["timeoutMs"], receipt["elapsedMs"]) == ([step.initial_id], 5_000, 0)
    assert receipt["contract"]["request_id"] == step.request_id and receipt["projectPath"] == "/projects/p1"
    assert (receipt["sessionId"], receipt["piSessionFile"]) == (session_id_of("run-1"), None)
    assert step.row("SELECT segment_status, session_id FROM session_segments") == (
        "recording",
        session_id_of("run-1"),
    )
    again = step.open()  # its reply was lost: the same segment adopts
    assert again.outcome == "accepted" and again.receipt == receipt and again.revision == reply.revision
    refused(step.open("segment-2"), "conflict", "leaseHeld")
    refused(step.open("segment-1", token="another"), "rejected", "resourceExists")
    refused(step.open("segment-3", epoch=7), "claimLost", "staleServerEpoch")
    step.request_id = "request-missing"
    refused(step.open("segment-4"), "notFound", "resourceNotFound")
    consistent(executor)


def test_open_is_refused_for_a_paused_run_or_a_settled_request(step, executor):
    step.start()
    assert step.send("run.pause", {"actor": {"actor_class": "client"}, "run_id": "run-1"}).outcome == "accepted"
    refused(step.open(), "conflict", "runPaused")
    assert step.claimable() == []
    step.send("run.cancel", {"actor": {"actor_class": "client"}, "run_id": "run-1"})
    refused(step.open(), "conflict", "notWaiting")
    consistent(executor)


def test_open_closes_a_dead_segment_at_its_last_observation(opened, executor, clock):
    step = opened
    assert step.turn("started", "turn-segment-1-1").outcome == "accepted"
    step.host("agent.record", first_event_index=0, sample={"elapsed_ms": 400})
    observed = clock.now_ms()
    clock.advance(10_001)  # the host died: its claim expired
    reply = step.open("segment-2")
    assert reply.outcome == "accepted" and reply.receipt["leaseGeneration"] == 2  # the coordinator epoch rises
    assert reply.receipt["elapsedMs"] == 400
    assert step.rows("SELECT segment_id, segment_status FROM session_segments ORDER BY started_at, segment_id") == [
        ("segment-1", "closed"),
        ("segment-2", "recording"),
    ]
    assert step.row("SELECT turn_state FROM workflow_turns") == ("lost",)
    assert step.row("SELECT ended_at, elapsed_ms, end_cause FROM attempt_active_intervals") == (
        observed,
        400,
        "recovery",
    )
    refused(step.host("agent.close"), "claimLost", "notClaimed")  # the old host's claim is gone
    consistent(executor)


def test_open_times_out_a_spent_budget_instead(opened, executor):
    step = opened
    executor.conn.execute("UPDATE node_attempts SET timeout_ms = 1000")
    step.turn("started", "turn-segment-1-1")
    assert step.host("agent.close", elapsed_ms=1_000).outcome == "accepted"  # e.g. a shutdown at the budget
    reply = step.open("segment-2")
    assert reply.outcome == "accepted" and reply.receipt["timedOut"] is True
    assert step.attempt() == ("timed_out", "timed_out", "agentTimeout")
    assert step.request_status() == "failed"
    assert run_state(executor) == (("queued", "queued", False, False), None)
    assert step.row("SELECT count(*) FROM session_segments") == (1,)  # no segment for a timed-out step
    consistent(executor)


# --- C4, C5, C6 -------------------------------------------------------------------------------


def test_bind_session_takes_the_first_file_and_adopts_it_again(opened, executor):
    step = opened
    first = step.host("agent.bind_session", pi_session_file="/s/a.jsonl", pi_session_id="pi-a")
    assert first.outcome == "accepted"
    again = step.host("agent.bind_session", pi_session_file="/s/a.jsonl", pi_session_id="pi-a")
    assert again.outcome == "accepted" and again.revision == first.revision  # adopted: nothing written
    refused(
        step.host("agent.bind_session", pi_session_file="/s/b.jsonl", pi_session_id="pi-b"),
        "rejected",
        "invalidTransition",
    )
    step.host("agent.close")
    assert step.open("segment-2").receipt["piSessionFile"] == "/s/a.jsonl"  # the next host resumes that file
    consistent(executor)


def test_a_step_on_the_branch_is_sent_and_a_resumed_step_follows(opened, executor):
    step = opened
    found = [{"workflow_message_id": step.initial_id, "pi_entry_id": "0a1b2c3d"}]
    reply = step.host("agent.branch", found=found)
    assert reply.outcome == "accepted"
    resumed = message_id_of(resumed_step_key(step.request_id, "segment-1"))
    assert [p["workflowMessageId"] for p in reply.receipt["pending"]] == [resumed]
    assert reply.receipt["pending"][0]["text"].startswith("Resumed: ")
    assert (reply.receipt["requestStatus"], reply.receipt["paused"]) == ("pending", False)
    assert step.row(
        "SELECT message_state, pi_entry_id FROM workflow_messages WHERE workflow_message_id = ?", step.initial_id
    ) == ("sent", "0a1b2c3d")
    again = step.host("agent.branch", found=found)  # the same report: no second resumed step
    assert [p["workflowMessageId"] for p in again.receipt["pending"]] == [resumed]
    other = [{"workflow_message_id": step.initial_id, "pi_entry_id": "ffffffff"}]
    refused(step.host("agent.branch", found=other), "conflict", "entryMismatch")
    stranger = [{"workflow_message_id": "wm-" + "0" * 32, "pi_entry_id": "0a1b2c3d"}]
    refused(step.host("agent.branch", found=stranger), "rejected", "invalidTransition")
    consistent(executor)


def test_a_first_branch_report_sends_the_initial_step(opened, executor):
    reply = opened.host("agent.branch", found=[])
    assert [p["workflowMessageId"] for p in reply.receipt["pending"]] == [opened.initial_id]
    consistent(executor)


def test_the_resumed_step_names_the_last_rejection(opened, executor):
    step = opened
    submitted = step.submit({"summary": 1})
    step.settle(submitted.receipt["submissionId"], error="summary must be a string")
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="0a1b2c3d")
    reply = step.host("agent.branch", found=[])
    assert "Your last submission was rejected: summary must be a string" in reply.receipt["pending"][0]["text"]
    consistent(executor)


def test_a_settled_reply_on_the_branch_is_adopted(step, executor):
    step.start(expected=assistant_message(max_chars=40))
    step.open()
    reply = {
        "workflow_message_id": step.initial_id,
        "pi_entry_id": "cafe0001",
        "text": BlobValue.of_text("All green.").model_dump(),
    }
    found = [{"workflow_message_id": step.initial_id, "pi_entry_id": "cafe0000"}]
    answer = step.host("agent.branch", found=found, settled_reply=reply)
    assert answer.receipt["requestStatus"] == "accepted" and answer.receipt["pending"] == []
    assert step.attempt() == ("completed", "ok", None)
    receipt = step.row("SELECT b.bytes FROM node_attempts a JOIN blobs b ON b.digest = a.receipt_digest")[0]
    assert b'"adopted":true' in receipt and b'"piEntryId":"cafe0001"' in receipt
    assert run_state(executor) == (("queued", "queued", False, False), None)
    consistent(executor)


def test_message_sent_marks_the_step_and_adopts_the_same_entry(opened, executor):
    step = opened
    first = step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="0a1b2c3d")
    assert first.outcome == "accepted"
    again = step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="0a1b2c3d")
    assert again.outcome == "accepted" and again.revision == first.revision
    refused(
        step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="0a1b2c3e"),
        "conflict",
        "entryMismatch",
    )
    refused(
        step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="NOT-HEX!"),
        "rejected",
        "validationFailed",
    )
    consistent(executor)


def test_host_commands_need_the_segments_live_claim(opened, executor, clock):
    step = opened
    step.segments["segment-1"] = 5
    refused(step.host("agent.branch", found=[]), "claimLost", "staleGeneration")
    step.segments["segment-1"] = 1
    refused(step.host("agent.record", segment_id="segment-9", first_event_index=0), "claimLost", "notClaimed")
    clock.advance(10_001)
    refused(step.host("agent.branch", found=[]), "claimLost", "claimExpired")
    consistent(executor)


# --- C7, C9 -----------------------------------------------------------------------------------


def test_a_turn_opens_once_and_alone(opened, executor):
    step = opened
    started = step.turn("started", "turn-segment-1-1")
    assert started.outcome == "accepted" and started.receipt["intervalNumber"] == 1
    again = step.turn("started", "turn-segment-1-1")
    assert again.outcome == "accepted" and again.revision == started.revision
    refused(step.turn("started", "turn-segment-1-2"), "conflict", "turnOpen")
    resumed = step.host("agent.branch", found=[])  # (no resumed step: the initial one is pending)
    assert resumed.receipt["pending"][0]["workflowMessageId"] == step.initial_id
    other = step.turn("started", "turn-segment-1-1", message_id="wm-" + "1" * 32)
    refused(other, "conflict", "idempotencyKeyReused")  # the same turn id for another message
    assert step.row("SELECT count(*) FROM attempt_active_intervals WHERE ended_at IS NULL") == (1,)
    consistent(executor)


def test_a_turn_is_refused_for_a_paused_run(opened, executor):
    opened.send("run.pause", {"actor": {"actor_class": "client"}, "run_id": "run-1"})
    refused(opened.turn("started", "turn-segment-1-1"), "conflict", "runPaused")
    consistent(executor)


def test_two_reminders_then_missing_submission(opened, executor):
    step = opened
    texts = []
    for number in (1, 2, 3):
        turn = f"turn-segment-1-{number}"
        message = (
            step.initial_id
            if number == 1
            else message_id_of(reminder_step_key(step.request_id, f"turn-segment-1-{number - 1}"))
        )
        step.host("agent.message_sent", workflow_message_id=message, pi_entry_id=f"0000000{number}")
        assert step.turn("started", turn, message_id=message).outcome == "accepted"
        ended = step.turn("ended", turn, message_id=message, stop_reason="stop", elapsed_ms=100 * number)
        assert ended.outcome == "accepted", ended
        texts.append(ended.receipt["pending"])
    assert texts[0][0]["text"].startswith("Reminder (1 of 2)") and texts[1][0]["text"].startswith("Reminder (2 of 2)")
    assert texts[2] == [] and step.request_status() == "failed"
    assert step.attempt() == ("failed", "failed", "missingSubmission")
    assert step.row("SELECT count(*) FROM workflow_messages WHERE source_kind = 'workflow_turn'") == (2,)
    assert step.rows("SELECT elapsed_ms, end_cause FROM attempt_active_intervals ORDER BY interval_number") == [
        (100, "turn_end"),
        (200, "turn_end"),
        (300, "turn_end"),
    ]
    assert run_state(executor) == (("queued", "queued", False, False), None)
    late = step.turn("ended", "turn-segment-1-3", message_id=message, stop_reason="stop", elapsed_ms=300)
    assert late.outcome == "accepted" and late.receipt["turnState"] == "ended"  # adopts the saved end
    other = step.turn("ended", "turn-segment-1-3", message_id=message, stop_reason="aborted", elapsed_ms=300)
    refused(other, "conflict", "idempotencyKeyReused")
    consistent(executor)


def test_an_assistant_message_reply_is_accepted_at_the_turns_end(step, executor):
    step.start(expected=assistant_message(max_chars=20))
    step.open()
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="aaaaaaa0")
    step.turn("started", "turn-segment-1-1")
    too_long = BlobValue.of_text("x" * 21).model_dump()
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="stop", reply=too_long, response_entry_id="aaaaaaa1")
    assert ended.receipt["pending"][0]["text"].startswith("Reminder (1 of 2)")  # over the limit: unproductive
    reminder = ended.receipt["pending"][0]["workflowMessageId"]
    step.turn("started", "turn-segment-1-2", message_id=reminder)
    reply = BlobValue.of_text("Fixed the import.").model_dump()
    done = step.turn(
        "ended", "turn-segment-1-2", message_id=reminder, stop_reason="stop", reply=reply, response_entry_id="aaaaaaa2"
    )
    assert done.receipt["requestStatus"] == "accepted" and done.receipt["pending"] == []
    assert step.attempt() == ("completed", "ok", None)
    output, receipt = step.row(
        "SELECT o.bytes, r.bytes FROM node_attempts a JOIN blobs o ON o.digest = a.output_digest "
        "JOIN blobs r ON r.digest = a.receipt_digest"
    )
    assert output == b'"Fixed the import."'
    assert b'"adopted":false' in receipt and b'"maxChars":20' in receipt and b'"piEntryId":"aaaaaaa2"' in receipt
    submission = step.row("SELECT idempotency_key, outcome FROM interactive_submissions")
    assert submission == ("assistant:turn-segment-1-2", "accepted")
    consistent(executor)


def test_a_person_aborting_the_turn_pauses_the_run(opened, executor):
    step = opened
    step.turn("started", "turn-segment-1-1")
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="aborted", elapsed_ms=50)
    assert ended.receipt["paused"] is True and ended.receipt["requestStatus"] == "pending"
    assert step.row("SELECT paused, status FROM runs") == (1, "waiting")
    assert step.row("SELECT message_state, recovery_stop FROM workflow_messages") == ("cancelled", "interruption")
    assert step.claimable() == []
    resumed = step.send("run.resume", {"actor": {"actor_class": "client"}, "run_id": "run-1"})
    assert resumed.receipt["status"] == "waiting" and step.claimable() == []  # its host has not closed yet
    step.host("agent.close")
    assert step.claimable() == [{"requestId": step.request_id, "runId": "run-1"}]
    again = step.open("segment-2").receipt  # the next host resumes the step
    assert again["pending"] == [] and again["steps"] == [step.initial_id]
    branch = step.host("agent.branch", "segment-2", found=[])
    assert branch.receipt["pending"][0]["text"].startswith("Resumed: ")
    consistent(executor)


def test_an_abort_by_the_server_neither_pauses_nor_reminds(opened, executor):
    step = opened
    step.turn("started", "turn-segment-1-1")
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="aborted", aborted_by_server=True)
    assert [p["workflowMessageId"] for p in ended.receipt["pending"]] == [step.initial_id]  # nothing new
    assert step.row("SELECT paused FROM runs") == (0,)
    assert step.row("SELECT count(*) FROM workflow_messages") == (1,)
    consistent(executor)


def test_a_turn_ending_past_the_budget_times_out(step, executor):
    step.start(timeout_ms=1_000)
    step.open()
    step.turn("started", "turn-segment-1-1")
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="stop", elapsed_ms=1_000)
    assert ended.receipt["timedOut"] is True and ended.receipt["requestStatus"] == "failed"
    assert step.attempt() == ("timed_out", "timed_out", "agentTimeout")
    consistent(executor)


# --- a command step's run (executor=command(argv)): one turn, never reminded --------------------

COMMAND = Executor(kind="command", argv=["my-agent", "--print"])


def command_turn(step, **end):
    """The run's one turn of a command step: the step sent as its prompt entry, started, ended."""
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="c0000001")
    assert step.turn("started", "turn-segment-1-1").outcome == "accepted"
    return step.turn("ended", "turn-segment-1-1", elapsed_ms=120, **end)


@pytest.mark.parametrize(
    ("code", "stop"), [("commandFailed", "error"), ("validationFailed", "stop"), ("validatorFailed", "stop")]
)
def test_a_command_run_that_failed_fails_its_attempt_with_its_code(step, executor, code, stop):
    step.start(executor=COMMAND)
    step.open()
    error = BlobValue.of_text("the command exited with status 3: the build is broken").model_dump()
    ended = command_turn(step, stop_reason=stop, error_code=code, error=error)
    assert ended.outcome == "accepted" and ended.receipt["requestStatus"] == "failed" and ended.receipt["pending"] == []
    assert step.attempt() == ("failed", "failed", code)
    (saved,) = step.row("SELECT b.bytes FROM node_attempts a JOIN blobs b ON b.digest = a.error_digest")
    assert saved == b"the command exited with status 3: the build is broken"
    assert step.row("SELECT count(*) FROM workflow_messages") == (1,)  # no reminder for a command
    assert step.rows("SELECT elapsed_ms, end_cause FROM attempt_active_intervals") == [(120, "turn_end")]
    assert run_state(executor) == (("queued", "queued", False, False), None)
    assert step.row("SELECT event_type FROM events WHERE resource_id = 'run-1' ORDER BY resource_revision DESC") == (
        "agent.failed",
    )
    consistent(executor)


def test_a_command_reply_over_its_limit_fails_the_attempt_and_one_within_is_accepted(step, executor):
    step.start(expected=assistant_message(max_chars=10), executor=COMMAND)
    step.open()
    ended = command_turn(step, stop_reason="stop", reply=BlobValue.of_text("x" * 11).model_dump())
    assert ended.receipt["requestStatus"] == "failed" and ended.receipt["pending"] == []
    assert step.attempt() == ("failed", "failed", "validationFailed")
    (error,) = step.row("SELECT b.bytes FROM node_attempts a JOIN blobs b ON b.digest = a.error_digest")
    assert (
        error.decode() == "the command's output was not accepted: the reply has 11 characters, more than the step's 10"
    )
    consistent(executor)


def test_a_command_turn_ending_after_its_output_was_accepted_changes_nothing(step, executor):
    step.start(executor=COMMAND)
    step.open()
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="c0000001")
    step.turn("started", "turn-segment-1-1")
    submitted = step.submit({"summary": "done"}, key="command-segment-1")
    step.settle(submitted.receipt["submissionId"], {"summary": "done"})
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="stop", elapsed_ms=80)
    assert ended.receipt["requestStatus"] == "accepted" and step.attempt() == ("completed", "ok", None)
    consistent(executor)


def test_only_a_command_steps_turn_ends_with_an_error(opened, executor):
    opened.turn("started", "turn-segment-1-1")
    error = BlobValue.of_text("no").model_dump()
    ended = opened.turn("ended", "turn-segment-1-1", stop_reason="stop", error_code="commandFailed", error=error)
    refused(ended, "rejected", "invalidTransition")
    assert opened.request_status() == "pending"
    consistent(executor)


# --- C8 ---------------------------------------------------------------------------------------


def events(count, kind="message_update"):
    return [{"event_type": kind, "event_status": "streaming"} for _ in range(count)]


def test_record_journals_a_batch_without_an_event_row(opened, executor):
    step = opened
    before = step.row("SELECT count(*), (SELECT revision FROM resources WHERE resource_id = 'segment-1') FROM events")
    entry = {
        "pi_entry_id": "0a1b2c3d",
        "entry_role": "user",
        "content": BlobValue.of_json({"id": "0a1b2c3d"}).model_dump(),
    }
    reply = step.host(
        "agent.record", first_event_index=0, events=events(3), entries=[entry], links={"prompt_entry_id": "0a1b2c3d"}
    )
    assert reply.outcome == "accepted" and reply.receipt == {"eventCount": 3} and reply.revision is None
    assert (
        step.row("SELECT count(*), (SELECT revision FROM resources WHERE resource_id = 'segment-1') FROM events")
        == before
    )
    assert step.rows("SELECT run_seq FROM session_events ORDER BY run_seq") == [(1,), (2,), (3,)]
    refused(step.host("agent.record", first_event_index=0, events=events(1)), "conflict", "staleRevision")
    again = step.host("agent.record", first_event_index=3, events=events(1), entries=[entry])  # entry known: skipped
    assert again.receipt == {"eventCount": 4}
    assert step.row("SELECT count(*) FROM session_entries") == (1,)
    assert step.row("SELECT prompt_seq, first_seq, last_seq FROM attempt_entries") == (1, 1, 1)
    refused(
        step.host("agent.record", first_event_index=4, links={"response_entry_id": "99999999"}),
        "rejected",
        "validationFailed",
    )
    consistent(executor)


def test_record_numbers_events_run_wide_and_checkpoints_every_256(opened, executor, clock):
    step = opened
    index = 0
    for _ in range(3):  # 192 events
        assert step.host("agent.record", first_event_index=index, events=events(64)).outcome == "accepted"
        index += 64
    step.host("agent.close")
    step.open("segment-2")  # a new segment continues the run's sequence
    step.turn("started", "turn-segment-2-1", segment_id="segment-2")
    first = step.host("agent.record", "segment-2", first_event_index=0, events=events(64))  # run_seq 193..256
    assert first.receipt == {"eventCount": 64}
    assert step.row("SELECT max(run_seq) FROM session_events") == (256,)
    checkpoint = step.row(
        "SELECT c.run_seq, b.bytes FROM viewer_session_checkpoints c JOIN blobs b ON b.digest = c.state_digest"
    )
    assert checkpoint[0] == 256 and b'"openTurn":"turn-segment-2-1"' in checkpoint[1]
    state = BlobValue.of_json({"openTurn": "turn-segment-2-1", "openTools": ["bash"]})
    for index in (64, 128, 192, 256):  # run_seq 257..512: the host's own state at 512
        batch = step.host(
            "agent.record", "segment-2", first_event_index=index, events=events(64), checkpoint=state.model_dump()
        )
        assert batch.outcome == "accepted"
    seqs = step.rows("SELECT run_seq, state_digest = ? FROM viewer_session_checkpoints ORDER BY run_seq", state.digest)
    assert seqs == [(256, 0), (512, 1)]
    consistent(executor)


def test_a_sample_only_raises_the_elapsed_time_and_times_out_at_the_budget(step, executor, clock):
    step.start(timeout_ms=1_000)
    step.open()
    step.turn("started", "turn-segment-1-1")
    submission = step.submit({"summary": "done"})  # validating while the budget runs out
    step.host("agent.record", first_event_index=0, sample={"elapsed_ms": 600})
    clock.advance(50)
    step.host("agent.record", first_event_index=0, sample={"elapsed_ms": 500})  # a smaller reading changes nothing
    assert step.row("SELECT elapsed_ms, last_observed_at FROM attempt_active_intervals") == (600, clock.now_ms())
    spent = step.host("agent.record", first_event_index=0, sample={"elapsed_ms": 1_000})
    assert spent.receipt == {"eventCount": 0, "timedOut": True}
    assert step.attempt() == ("timed_out", "timed_out", "agentTimeout")
    assert step.request_status() == "failed"
    assert step.row(
        "SELECT outcome FROM interactive_submissions WHERE submission_id = ?", submission.receipt["submissionId"]
    ) == ("rejected",)
    assert step.row("SELECT end_cause, elapsed_ms FROM attempt_active_intervals") == ("settlement", 1_000)
    assert run_state(executor) == (("queued", "queued", False, False), None)
    assert step.row("SELECT event_type FROM events WHERE resource_id = 'run-1' ORDER BY event_id DESC") == (
        "agent.timed_out",
    )
    late = step.turn("ended", "turn-segment-1-1", stop_reason="aborted", aborted_by_server=True, elapsed_ms=1_000)
    assert late.receipt["requestStatus"] == "failed" and late.receipt["pending"] == []
    consistent(executor)


# --- C12 and the host's end -------------------------------------------------------------------


def test_close_ends_the_segment_turn_and_interval(opened, executor):
    step = opened
    step.turn("started", "turn-segment-1-1")
    closed = step.host("agent.close", elapsed_ms=250)
    assert closed.receipt == {"segmentId": "segment-1", "placement": "closed"}
    assert step.row("SELECT segment_status FROM session_segments") == ("closed",)
    assert step.row("SELECT owner_id FROM leases WHERE resource_id = 'segment-1'") == (None,)
    assert step.row("SELECT turn_state FROM workflow_turns") == ("lost",)
    assert step.row("SELECT elapsed_ms, end_cause FROM attempt_active_intervals") == (250, "disconnect")
    refused(step.host("agent.close"), "claimLost", "notClaimed")
    exited = step.send("agent.exited", {"actor": {"actor_class": "server"}, "segment_id": "segment-1"})
    assert exited.receipt == {"segmentId": "segment-1", "placement": "closed"}  # the host closed it first
    consistent(executor)


def exited(step, segment_id="segment-1", **body):
    return step.send("agent.exited", {"actor": {"actor_class": "server"}, "segment_id": segment_id, **body})


def test_a_host_that_did_nothing_parks_the_run_until_resumed(opened, executor):
    step = opened
    detail = BlobValue.of_text("pi: command not found; set PI_WORKFLOWS_PI_COMMAND")
    reply = exited(step, detail=detail.model_dump())
    assert reply.receipt == {"segmentId": "segment-1", "placement": "parked", "parkReason": "agentNoProgress"}
    assert run_state(executor) == (("waiting", "parked", False, False), "agentNoProgress")
    assert step.row("SELECT update_kind, body_digest FROM workflow_updates") == ("notification", detail.digest)
    assert step.row("SELECT owner_id FROM leases WHERE resource_id = 'segment-1'") == (None,)
    assert step.claimable() == []
    resumed = step.send("run.resume", {"actor": {"actor_class": "client"}, "run_id": "run-1"})
    assert resumed.outcome == "accepted" and resumed.receipt["status"] == "waiting"
    assert run_state(executor) == (("waiting", "parked", False, False), None)
    assert step.claimable() == [{"requestId": step.request_id, "runId": "run-1"}]
    consistent(executor)


def test_a_host_that_made_progress_or_was_stopped_only_closes(step, executor):
    step.start()
    step.open()
    stopped = exited(step, stopped_by_server=True)
    assert stopped.receipt["placement"] == "closed"
    step.open("segment-2")
    step.host("agent.bind_session", "segment-2", pi_session_file="/s/a.jsonl", pi_session_id="pi-a")
    step.turn("started", "turn-segment-2-1", segment_id="segment-2")
    step.host("agent.record", "segment-2", first_event_index=0, sample={"elapsed_ms": 70})
    crashed = exited(step, "segment-2")
    assert crashed.receipt["placement"] == "closed" and step.row("SELECT park_reason FROM runs") == (None,)
    assert step.row("SELECT turn_state FROM workflow_turns") == ("lost",)
    assert step.row("SELECT elapsed_ms, end_cause FROM attempt_active_intervals") == (70, "disconnect")
    consistent(executor)


def test_live_and_dead_recording_segments_partition_them(opened, executor, clock):
    """agent_steps.recording_segments: live and dead are the two halves of every recording segment."""
    conn, now = executor.conn, executor.clock.now_ms()
    everything = agent_steps.recording_segments(conn, "run-1", now)
    live = agent_steps.recording_segments(conn, "run-1", now, live=True)
    dead = agent_steps.recording_segments(conn, "run-1", now, live=False)
    assert [s.segment_id for s in everything] == ["segment-1"] and live == everything and dead == []
    clock.advance(10_001)
    assert agent_steps.recording_segments(conn, "run-1", clock.now_ms(), live=False) == everything

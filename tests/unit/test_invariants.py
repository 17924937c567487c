"""Each invariant is detected when planted, and not reported in the allowed states."""

from __future__ import annotations

import pytest

from piworkflows.writer import invariants
from tests.support import claim_run, run_create, run_group, take_epoch

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def conn(executor):
    run_group(executor, take_epoch(), run_create("run-1"))
    return executor.conn


def test_a_fresh_queued_run_is_consistent(conn, clock):
    assert invariants.violations(conn, clock.now_ms()) == {}
    assert invariants.integrity(conn) == []


def test_admission_is_not_a_contradiction(executor, conn, clock):
    run_group(executor, claim_run())  # running/starting with claim and runner: the admission window
    assert invariants.violations(conn, clock.now_ms()) == {}


@pytest.mark.parametrize(
    "name, plant",
    [
        ("terminalQueueMismatch", ["UPDATE runs SET status = 'completed', finished_at = 1"]),
        ("settledQueueOfLiveRun", ["UPDATE run_queue SET queue_status = 'done'"]),
        (
            "waitingRunWithoutResponse",
            ["UPDATE runs SET status = 'waiting'", "UPDATE run_queue SET queue_status = 'parked'"],
        ),
        (
            "runningQueueWithoutRunner",
            ["UPDATE runs SET status = 'running'", "UPDATE run_queue SET queue_status = 'running'"],
        ),
        ("claimOrRunnerOfIdleRun", ["INSERT INTO leases VALUES ('run-1', 1, 'o', zeroblob(32), 0, 0, 9e15)"]),
    ],
)
def test_each_planted_violation_is_reported_with_its_run(conn, clock, name, plant):
    for statement in plant:
        conn.execute(statement)
    assert invariants.violations(conn, clock.now_ms()) == {name: ["run-1"]}


# A finished attempt of run-1 the rows below hang from (foreign keys are off while planting:
# each test plants exactly the contradiction it names, nothing else).
FINISHED_ATTEMPT = (
    "INSERT INTO node_attempts (attempt_id, run_id, node_path, node_kind, visit_number, attempt_number, "
    "attempt_status, outcome, lease_generation, started_at, finished_at) "
    "VALUES ('att-1', 'run-1', 'a', 'agent', 1, 1, 'completed', 'ok', 1, 1, 2)"
)
PLANTED_DEEPER = {
    "pendingRequestOnInactiveAttempt": [
        FINISHED_ATTEMPT,
        "INSERT INTO interactive_requests (request_id, run_id, attempt_id, target_session_id, contract_digest, "
        "request_status, revision, created_at, updated_at) VALUES ('req-1', 'run-1', 'att-1', 's', zeroblob(32), "
        "'pending', 1, 1, 1)",
    ],
    "missingAcceptedSubmission": [
        FINISHED_ATTEMPT,
        "INSERT INTO interactive_requests (request_id, run_id, attempt_id, target_session_id, contract_digest, "
        "request_status, accepted_submission_id, revision, created_at, updated_at) VALUES ('req-1', 'run-1', "
        "'att-1', 's', zeroblob(32), 'accepted', 'sub-missing', 1, 1, 1)",
    ],
    "invalidActiveClock": [
        FINISHED_ATTEMPT,
        "INSERT INTO attempt_active_intervals (attempt_id, interval_number, started_at, last_observed_at) "
        "VALUES ('att-1', 1, 5, 6)",  # still open on a finished attempt
    ],
    "conflictingPiTurn": [
        "UPDATE runs SET status = 'completed', finished_at = 1",
        "UPDATE run_queue SET queue_status = 'done'",
        "INSERT INTO workflow_turns (workflow_turn_id, workflow_message_id, run_id, target_session_id, turn_state, "
        "started_at) VALUES ('turn-1', 'msg-1', 'run-1', 's', 'open', 1)",
    ],
    "recordingSegmentOfFinishedRun": [
        "UPDATE runs SET status = 'completed', finished_at = 1",
        "UPDATE run_queue SET queue_status = 'done'",
        "INSERT INTO session_segments (segment_id, run_id, attempt_id, session_id, segment_status, started_at) "
        "VALUES ('segment-1', 'run-1', 'att-1', 's', 'recording', 1)",
    ],
    "pendingStepOfSettledRequest": [
        FINISHED_ATTEMPT,
        "INSERT INTO interactive_requests (request_id, run_id, attempt_id, target_session_id, contract_digest, "
        "request_status, revision, created_at, updated_at) VALUES ('req-1', 'run-1', 'att-1', 's', zeroblob(32), "
        "'failed', 1, 1, 1)",
        "INSERT INTO workflow_messages (workflow_message_id, run_id, request_id, target_session_id, message_kind, "
        "source_kind, source_id, idempotency_key, content_digest, session_order, message_state, created_at, "
        "updated_at) VALUES ('wm-1', 'run-1', 'req-1', 's', 'step', 'interactive_request', 'req-1', 'k', "
        "zeroblob(32), 1, 'pending', 1, 1)",
    ],
    "staleGenerationWrite": [  # written under generation 5, then accepted from generation 4
        "INSERT INTO events (resource_id, resource_revision, event_type, actor_class, lease_generation, committed_at) "
        "VALUES ('run-1', 2, 'node.started', 'runner', 5, 2), ('run-1', 3, 'node.finished', 'runner', 4, 3)",
    ],
    "eventOfAnotherAttempt": [  # names an attempt the run does not have
        "INSERT INTO events (resource_id, resource_revision, event_type, actor_class, attempt_id, committed_at) "
        "VALUES ('run-1', 2, 'node.started', 'runner', 'att-9', 2)",
    ],
}


@pytest.mark.parametrize("name", sorted(PLANTED_DEEPER))
def test_each_deeper_violation_is_reported_with_its_run(conn, clock, name):
    conn.execute("PRAGMA foreign_keys = OFF")
    for statement in PLANTED_DEEPER[name]:
        conn.execute(statement)
    assert invariants.violations(conn, clock.now_ms()) == {name: ["run-1"]}


def test_an_expired_claim_is_a_recovery_fact_not_a_violation(conn, clock):
    conn.execute("INSERT INTO leases VALUES ('run-1', 1, 'o', zeroblob(32), 0, 0, ?)", (clock.now_ms() - 1,))
    assert invariants.violations(conn, clock.now_ms()) == {}


def test_a_pending_settlement_effect_explains_an_unsettled_terminal_queue(executor, conn, clock):
    conn.execute("UPDATE runs SET status = 'completed', finished_at = 1")
    conn.execute("INSERT INTO resources VALUES ('effect-settle', 'effect', 1, NULL, 0, 0)")
    conn.execute(
        "INSERT INTO effects (effect_id, source_resource_id, source_revision, effect_type, idempotency_key, "
        "request_fingerprint, payload_digest, effect_class, performer, recovery_policy, owner_scope, run_id, "
        "effect_status, available_at, max_attempts, created_at, updated_at) SELECT 'effect-settle', 'run-1', 1, "
        "'run.settle_queue', 'run-1:settle', zeroblob(32), input_digest, 'local', 'writer', 'idempotent', 'run', "
        "'run-1', 'pending', 0, 1, 0, 0 "
        "FROM runs"
    )
    assert invariants.violations(conn, clock.now_ms()) == {}

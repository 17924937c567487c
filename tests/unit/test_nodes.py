"""Node transitions under the run's claim: start, finish, end of run; dedup and fencing."""

from __future__ import annotations

import hashlib

import pytest

from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import records
from piworkflows.writer.invariants import violations
from tests.support import claim_run, run_create, run_group, run_state, runner_exited, submitted, take_epoch, token_hash

pytestmark = pytest.mark.timeout(60)

RUNNER = {"actor_class": "runner"}


def run_claim(generation=1, token="tok"):
    return {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": token_hash(token),
        "lease_generation": generation,
        "ttl_ms": 10_000,
    }


def start(revision, node="greet", visit=1, generation=1, message=None):
    body = {
        "actor": RUNNER,
        "run_id": "run-1",
        "claim": run_claim(generation),
        "expected_revision": revision,
        "node_path": node,
        "node_kind": "compute",
        "visit_number": visit,
    }
    if message:
        body["worker_message"] = message
    return submitted("node.start", body)


def finish(revision, attempt_id, outcome="ok", output=None, next_node=None, end=None, error=None):
    body = {
        "actor": RUNNER,
        "run_id": "run-1",
        "claim": run_claim(),
        "expected_revision": revision,
        "attempt_id": attempt_id,
        "outcome": outcome,
    }
    if output is not None:
        body["output"] = BlobValue.of_json(output).model_dump()
    if error is not None:
        body["error"] = BlobValue.of_text(error).model_dump()
    if next_node:
        body["next_node"] = next_node
    if end:
        body["end_status"] = end
    return submitted("node.finish", body)


@pytest.fixture
def claimed(executor):
    run_group(executor, take_epoch(), run_create("run-1"), claim_run())
    return executor  # the run is at revision 2


def test_a_run_walks_its_nodes_to_completion(claimed):
    (started,) = run_group(claimed, start(2))
    assert started.outcome == "accepted" and started.receipt["stepIndex"] == 0 and started.revision == 3
    assert run_state(claimed) == (("running", "running", True, True), None)
    first = started.receipt["attemptId"]
    (done,) = run_group(claimed, finish(3, first, output={"greeting": "hi"}, next_node="progress"))
    assert done.receipt == {"attemptId": first, "nextNode": "progress"}
    (second,) = run_group(claimed, start(4, node="progress"))
    (last,) = run_group(claimed, finish(5, second.receipt["attemptId"], output={"final": 1}, end="completed"))
    assert last.receipt["runStatus"] == "completed"
    conn = claimed.conn
    assert conn.execute("SELECT status, finished_at IS NOT NULL, output_digest FROM runs").fetchone() == (
        "completed",
        1,
        hashlib.sha256(b'{"final":1}').digest(),
    )
    assert conn.execute("SELECT owner_id FROM leases").fetchone() == (None,)  # claim released with the end
    attempts = conn.execute("SELECT node_path, attempt_status, outcome FROM node_attempts ORDER BY node_path")
    assert attempts.fetchall() == [("greet", "completed", "ok"), ("progress", "completed", "ok")]
    assert conn.execute("SELECT step_index FROM run_steps ORDER BY 1").fetchall() == [(0,), (1,)]
    # one revision per command, and one for the queue settled by the local effect after the last
    assert conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone() == (7,)
    assert run_state(claimed) == (("completed", "done", False, False), None)
    assert conn.execute("SELECT outcome FROM run_workers").fetchall() == [("exited",)]
    (late,) = run_group(claimed, runner_exited(1))  # the runner record ended with the run
    assert late.outcome == "rejected" and run_state(claimed)[0][0] == "completed"


def test_a_failed_node_fails_the_run_with_its_error(claimed):
    (started,) = run_group(claimed, start(2))
    (failed,) = run_group(
        claimed, finish(3, started.receipt["attemptId"], outcome="failed", error="boom", end="failed")
    )
    assert failed.receipt["runStatus"] == "failed"
    assert run_state(claimed) == (("failed", "failed", False, False), None)
    assert claimed.conn.execute("SELECT status, error_digest FROM runs").fetchone() == (
        "failed",
        hashlib.sha256(b"boom").digest(),
    )


def test_node_transitions_are_fenced(claimed, clock):
    (stale,) = run_group(claimed, start(1))
    assert stale.outcome == "conflict" and stale.receipt["code"] == "staleRevision"
    (old,) = run_group(claimed, start(2, generation=7))
    assert old.outcome == "claimLost" and old.receipt["code"] == "staleGeneration"
    (started,) = run_group(claimed, start(2))
    (second,) = run_group(claimed, start(3, node="progress"))
    assert second.outcome == "rejected" and second.receipt["code"] == "invalidTransition"
    clock.advance(10_001)
    (expired,) = run_group(claimed, finish(3, started.receipt["attemptId"], output=1, end="completed"))
    assert expired.outcome == "claimLost" and expired.receipt["code"] == "claimExpired"


def test_a_repeated_runner_message_is_harmless(claimed):
    key = {
        "sender_scope": "run-1",
        "message_id": "greet:1:start",
        "fingerprint": token_hash("greet:1:start"),
        "message_kind": "node.start",
        "run_id": "run-1",
    }
    (first,) = run_group(claimed, start(2, message=key))
    (again,) = run_group(claimed, start(2, message=key))
    assert (first.outcome, again.outcome) == ("accepted", "adopted") and first.receipt == again.receipt
    assert claimed.conn.execute("SELECT count(*) FROM node_attempts").fetchone() == (1,)


def test_max_steps_bounds_executed_nodes(claimed):
    claimed.conn.execute("UPDATE runs SET max_steps = 1")
    (started,) = run_group(claimed, start(2))
    run_group(claimed, finish(3, started.receipt["attemptId"], output=1, next_node="progress"))
    (ended,) = run_group(claimed, start(4, node="progress"))  # no step left: the run fails instead
    assert ended.outcome == "accepted" and ended.receipt == {"runStatus": "failed", "errorCode": "maxStepsExceeded"}
    assert claimed.conn.execute("SELECT status, error_code FROM runs").fetchone() == ("failed", "maxStepsExceeded")
    assert claimed.conn.execute("SELECT count(*) FROM node_attempts").fetchone() == (1,)
    assert run_state(claimed) == (("failed", "failed", False, False), None)


def test_a_finish_names_next_node_or_end_never_both(claimed):
    (started,) = run_group(claimed, start(2))
    (both,) = run_group(claimed, finish(3, started.receipt["attemptId"], output=1, next_node="x", end="completed"))
    assert both.outcome == "rejected" and both.receipt["code"] == "validationFailed"


def test_cancel_settles_everything_in_one_commit(claimed):
    """Attempts cancelled, pending effects cancelled, applying ones ambiguous, claim and runner released."""
    from tests.support import claim_effect, effect_request

    (started,) = run_group(claimed, start(2))
    # Two effects of the run: one stays pending, one is being applied by a worker.
    effects = [effect_request("k-pending"), effect_request("k-applying")]
    body = {
        "actor": RUNNER,
        "source_resource_id": "run-1",
        "expected_revision": 3,
        "claim": run_claim(),
        "effects": effects,
    }
    reserve = submitted("effect.reserve", body)
    (reserved,) = run_group(claimed, reserve)
    pending_id, applying_id = reserved.receipt["effectIds"]
    (taken,) = run_group(claimed, claim_effect("worker-token", applying_id))
    assert taken.outcome == "accepted"
    claimed.conn.execute("UPDATE effects SET run_id = 'run-1'")  # owned by the run (the runner's reserve sets it)
    cancel = submitted("run.cancel", {"actor": {"actor_class": "client"}, "run_id": "run-1"})
    (reply,) = run_group(claimed, cancel)
    assert reply.outcome == "accepted" and reply.receipt == {"runId": "run-1", "status": "cancelled"}
    conn = claimed.conn
    statuses = dict(conn.execute("SELECT effect_id, effect_status FROM effects WHERE effect_class = 'external'"))
    assert statuses == {pending_id: "cancelled", applying_id: "ambiguous"}
    assert conn.execute(
        "SELECT attempt_status FROM effect_attempts WHERE effect_id = ?", (applying_id,)
    ).fetchall() == [("ambiguous",)]
    # the queue settlement: a local effect the writer applied right after the cancel's commit
    assert conn.execute(
        "SELECT effect_type, effect_status, attempt_count FROM effects WHERE effect_class = 'local'"
    ).fetchall() == [("run.settle_queue", "applied", 1)]
    assert conn.execute(
        "SELECT attempt_status, outcome FROM node_attempts WHERE attempt_id = ?", (started.receipt["attemptId"],)
    ).fetchone() == ("cancelled", "cancelled")
    assert run_state(claimed) == (("cancelled", "cancelled", False, False), None)
    (late,) = run_group(claimed, cancel)
    assert late.outcome == "conflict" and late.receipt["code"] == "winnerDecided"


def test_queue_settlement_is_a_local_effect_applied_right_after_the_commit(claimed):
    """Between the two commits the spec's window holds: a terminal run whose settlement is pending."""
    (started,) = run_group(claimed, start(2))
    replies, _ = claimed.run([finish(3, started.receipt["attemptId"], output={"x": 1}, end="completed")])
    assert replies[0][1].outcome == "accepted"
    conn = claimed.conn
    assert conn.execute("SELECT r.status, q.queue_status FROM runs r JOIN run_queue q USING (run_id)").fetchone() == (
        "completed",
        "running",
    )
    assert conn.execute("SELECT effect_type, effect_status FROM effects").fetchall() == [
        ("run.settle_queue", "pending")
    ]
    assert violations(conn, 0) == {}  # a pending settlement explains the unsettled queue
    assert claimed.apply_local_effects() == 1
    assert conn.execute("SELECT queue_status FROM run_queue").fetchone() == ("done",)
    assert conn.execute("SELECT effect_status, attempt_count, settled_at IS NOT NULL FROM effects").fetchone() == (
        "applied",
        1,
        True,
    )
    assert conn.execute("SELECT attempt_status FROM effect_attempts").fetchall() == [("applied",)]
    lease = conn.execute("SELECT owner_id FROM leases WHERE resource_id IN (SELECT effect_id FROM effects)")
    assert lease.fetchall() == [(None,)]  # the writer's own claim, released with the settlement
    assert claimed.apply_local_effects() == 0  # nothing is applied twice


def finish_and_start(revision, attempt_id, next_node, visit=1):
    item = finish(revision, attempt_id, output={"ok": 1}, next_node=next_node)
    item.body["start_next"] = {"node_kind": "compute", "visit_number": visit}
    return item


def test_a_finish_starts_the_next_attempt_in_the_same_commit(claimed):
    (started,) = run_group(claimed, start(2))
    (done,) = run_group(claimed, finish_and_start(3, started.receipt["attemptId"], "progress"))
    assert done.outcome == "accepted" and done.revision == 4
    assert done.receipt == {
        "attemptId": started.receipt["attemptId"],
        "nextNode": "progress",
        "nextAttemptId": done.receipt["nextAttemptId"],
        "stepIndex": 1,
    }
    attempts = claimed.conn.execute(
        "SELECT node_path, attempt_status FROM node_attempts ORDER BY started_at, node_path"
    )
    assert sorted(attempts.fetchall()) == [("greet", "completed"), ("progress", "running")]
    (last,) = run_group(claimed, finish(4, done.receipt["nextAttemptId"], output={"final": 1}, end="completed"))
    assert last.receipt["runStatus"] == "completed"
    assert violations(claimed.conn, 0) == {}


def test_a_finish_with_no_step_left_for_the_next_node_ends_the_run(claimed):
    claimed.conn.execute("UPDATE runs SET max_steps = 1")
    (started,) = run_group(claimed, start(2))
    (ended,) = run_group(claimed, finish_and_start(3, started.receipt["attemptId"], "progress"))
    assert ended.outcome == "accepted"
    assert ended.receipt == {
        "attemptId": started.receipt["attemptId"],
        "runStatus": "failed",
        "errorCode": "maxStepsExceeded",
    }
    assert claimed.conn.execute("SELECT status, error_code FROM runs").fetchone() == ("failed", "maxStepsExceeded")
    assert claimed.conn.execute("SELECT count(*) FROM node_attempts").fetchone() == (1,)
    assert run_state(claimed) == (("failed", "failed", False, False), None)


def run_finish(revision, end="failed", code="loadFailed", text="the module failed", output=None, generation=1):
    body = {
        "actor": RUNNER,
        "run_id": "run-1",
        "claim": run_claim(generation),
        "expected_revision": revision,
        "end_status": end,
    }
    if end == "completed":
        body["output"] = BlobValue.of_json(output).model_dump()
    else:
        body.update(error=BlobValue.of_text(text).model_dump(), error_code=code)
    return submitted("run.finish", body)


def test_run_finish_ends_a_run_where_no_node_is_active(claimed):
    """A module that fails to load in the runner: failed, the claim released, the queue settled."""
    (ended,) = run_group(claimed, run_finish(2))
    assert ended.outcome == "accepted" and ended.receipt == {"runStatus": "failed", "errorCode": "loadFailed"}
    conn = claimed.conn
    assert conn.execute("SELECT status, error_code, error_digest, output_digest FROM runs").fetchone() == (
        "failed",
        "loadFailed",
        hashlib.sha256(b"the module failed").digest(),
        None,
    )
    assert run_state(claimed) == (("failed", "failed", False, False), None)
    assert conn.execute("SELECT outcome FROM run_workers").fetchall() == [("exited",)]
    events = conn.execute(
        "SELECT event_type, actor_class FROM events WHERE resource_id = 'run-1' ORDER BY resource_revision DESC LIMIT 1"
    ).fetchall()
    assert events == [("run.finished", "runner")]
    assert violations(conn, 0) == {}


def test_run_finish_completes_an_answered_checkpoint_that_ends_the_workflow(claimed):
    (started,) = run_group(claimed, start(2, node="ask"))
    claimed.conn.execute("UPDATE node_attempts SET attempt_status = 'completed', outcome = 'ok', finished_at = 1")
    (ended,) = run_group(claimed, run_finish(3, end="completed", output={"answer": 1}))
    assert ended.outcome == "accepted" and ended.receipt == {"runStatus": "completed"}
    assert claimed.conn.execute("SELECT status, output_digest FROM runs").fetchone() == (
        "completed",
        hashlib.sha256(b'{"answer":1}').digest(),
    )
    assert run_state(claimed) == (("completed", "done", False, False), None)


def test_run_finish_is_refused_while_a_node_is_active_or_without_the_claim(claimed, clock):
    (stale,) = run_group(claimed, run_finish(2, generation=7))
    assert stale.outcome == "claimLost" and stale.receipt["code"] == "staleGeneration"
    (started,) = run_group(claimed, start(2))
    (active,) = run_group(claimed, run_finish(3))
    assert active.outcome == "rejected" and active.receipt["code"] == "invalidTransition"
    (shapeless,) = run_group(claimed, run_finish(3, code=None))  # a failed run names its error code
    assert shapeless.outcome == "rejected" and shapeless.receipt["code"] == "validationFailed"
    assert run_state(claimed) == (("running", "running", True, True), None)


def test_a_failed_node_that_ends_the_run_gives_the_run_an_error_naming_it(claimed):
    (started,) = run_group(claimed, start(2))
    body = finish(3, started.receipt["attemptId"], outcome="failed", error="boom", end="failed")
    body.body["run_error"] = BlobValue.of_text("node 'greet': boom").model_dump()
    (failed,) = run_group(claimed, body)
    assert failed.outcome == "accepted" and failed.receipt["runStatus"] == "failed"
    conn = claimed.conn
    assert conn.execute("SELECT error_digest FROM runs").fetchone() == (hashlib.sha256(b"node 'greet': boom").digest(),)
    assert conn.execute("SELECT error_digest FROM node_attempts").fetchone() == (hashlib.sha256(b"boom").digest(),)


def test_a_successful_node_carries_no_error_only_its_run_does(claimed):
    (started,) = run_group(claimed, start(2))
    attempt = started.receipt["attemptId"]
    (refused,) = run_group(claimed, finish(3, attempt, output=1, end="failed", error="no route"))
    assert refused.outcome == "rejected" and refused.receipt["code"] == "validationFailed"
    routed = finish(3, attempt, output=1, end="failed")
    routed.body.update(error_code="routingError", run_error=BlobValue.of_text("node 'greet': no route").model_dump())
    (failed,) = run_group(claimed, routed)
    assert failed.outcome == "accepted"
    assert claimed.conn.execute("SELECT error_code, error_digest FROM runs").fetchone() == (
        "routingError",
        hashlib.sha256(b"node 'greet': no route").digest(),
    )
    assert claimed.conn.execute("SELECT attempt_status, error_digest FROM node_attempts").fetchone() == (
        "completed",
        None,
    )


def _finish_run(revision, end_status, error, code):
    body = {
        "actor": RUNNER,
        "run_id": "run-1",
        "claim": run_claim(),
        "expected_revision": revision,
        "end_status": end_status,
        "error": BlobValue.of_text(error).model_dump(),
        "error_code": code,
    }
    return submitted("run.finish", body)


def test_resume_state_carries_a_failed_steps_error_and_a_runner_may_end_the_run_timed_out(claimed):
    """A step the next runner ends the run with (an agent step the writer settled as timed out)."""
    (started,) = run_group(claimed, start(2))
    text = "the step used its budget"
    error = BlobValue.of_text(text)
    records.put_blob(claimed.conn, error, 1)
    claimed.conn.execute(  # as the writer's agent timeout leaves the attempt
        "UPDATE node_attempts SET attempt_status = 'timed_out', outcome = 'timed_out', finished_at = 1, "
        "error_code = 'agentTimeout', error_digest = ? WHERE attempt_id = ?",
        (error.digest, started.receipt["attemptId"]),
    )
    read = {"actor": {"actor_class": "server"}, "run_id": "run-1"}
    (state,) = run_group(claimed, submitted("run.resume_state", read))
    (step,) = state.receipt["steps"]
    assert (step["outcome"], step["error"], step["errorCode"]) == ("timed_out", text, "agentTimeout")
    (ended,) = run_group(claimed, _finish_run(3, "timed_out", f"node 'greet': {text}", "agentTimeout"))
    assert ended.receipt["runStatus"] == "timed_out"
    assert run_state(claimed) == (("timed_out", "failed", False, False), None)
    assert claimed.conn.execute("SELECT error_code FROM runs").fetchone() == ("agentTimeout",)

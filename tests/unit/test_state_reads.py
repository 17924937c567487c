"""state.status and state.verify at the writer: sizes, safe counts, invariants; nothing repaired."""

from __future__ import annotations

import pytest

from piworkflows.protocol import client_v1
from tests.support import claim_run, run_create, run_group, submitted, take_epoch

pytestmark = pytest.mark.timeout(60)
CLIENT = {"actor_class": "client", "actor_id": "client-1"}


@pytest.fixture
def executor_with_runs(executor):
    run_group(executor, take_epoch(), run_create("run-1"), run_create("run-2"))
    run_group(executor, claim_run(run_id="run-2"))
    return executor


def read(executor, kind: str) -> dict:
    (reply,) = run_group(executor, submitted(kind, {"actor": CLIENT}))
    assert reply.outcome == "accepted", reply
    return reply.receipt


def test_status_reports_sizes_safe_counts_and_no_violation(executor_with_runs, paths):
    status = read(executor_with_runs, "state.status")
    client_v1.StateStatusReceipt.model_validate(status)  # the documented shape, nothing more
    assert status["fileBytes"] == paths.database.stat().st_size and status["walBytes"] > 0
    assert status["pageCount"] >= 1 and status["pageSize"] == 4096 and status["freelistCount"] >= 0
    counts = status["counts"]
    assert counts["runs"] == {"queued": 1, "running": 1}
    assert counts["activeLeases"] == 1  # run-2's claim (the epoch claim lives in workflow_host_state)
    assert (counts["expiredClaims"], counts["unsettledEffects"], counts["ambiguousEffects"]) == (0, 0, 0)
    assert counts["resources"] >= 3
    assert status["violations"] == {} and status["maintenance"] is None


def test_status_and_verify_name_a_violated_invariant_with_its_run_and_repair_nothing(executor_with_runs):
    conn = executor_with_runs.conn
    conn.execute("UPDATE run_queue SET queue_status = 'done' WHERE run_id = 'run-1'")  # planted: a live run's
    before = conn.execute("SELECT * FROM run_queue ORDER BY run_id").fetchall()  # queue settled
    assert read(executor_with_runs, "state.status")["violations"] == {"settledQueueOfLiveRun": ["run-1"]}
    verified = read(executor_with_runs, "state.verify")
    client_v1.StateVerifyReceipt.model_validate(verified)
    assert verified == {"ok": False, "integrity": [], "violations": {"settledQueueOfLiveRun": ["run-1"]}}
    assert conn.execute("SELECT * FROM run_queue ORDER BY run_id").fetchall() == before


def test_verify_reports_a_broken_foreign_key(executor_with_runs):
    conn = executor_with_runs.conn
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("UPDATE run_sources SET run_id = 'run-gone' WHERE run_id = 'run-1'")
    conn.execute("PRAGMA foreign_keys = ON")
    verified = read(executor_with_runs, "state.verify")
    assert not verified["ok"] and any(p.startswith("foreign key: run_sources") for p in verified["integrity"])


def test_a_consistent_state_verifies_ok(executor_with_runs):
    assert read(executor_with_runs, "state.verify") == {"ok": True, "integrity": [], "violations": {}}


def test_runners_and_workers_may_not_read_state(executor_with_runs):
    (reply,) = run_group(executor_with_runs, submitted("state.status", {"actor": {"actor_class": "runner"}}))
    assert reply.outcome == "rejected" and reply.receipt["code"] == "actorNotAllowed"

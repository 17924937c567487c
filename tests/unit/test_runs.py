"""run.create: a new run commits queued, with its queue row, view revision and receipt."""

from __future__ import annotations

import pytest

from tests.support import client_receipt, run_create, run_group

pytestmark = pytest.mark.timeout(60)


def test_a_new_run_is_queued_with_no_claim_and_no_runner(executor):
    (reply,) = run_group(executor, run_create("run-1"))
    assert reply.outcome == "accepted" and reply.revision == 1
    assert reply.receipt["runId"] == "run-1" and reply.receipt["status"] == "queued"
    assert reply.receipt["definitionDigest"].startswith("sha256:")
    conn = executor.conn
    assert conn.execute("SELECT status, paused, lineage, root_run_id, finished_at FROM runs").fetchall() == [
        ("queued", 0, "root", "run-1", None)
    ]
    assert conn.execute("SELECT queue_status FROM run_queue").fetchall() == [("queued",)]
    assert conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM run_workers").fetchone() == (0,)
    assert conn.execute("SELECT presentation_revision, retained_revision_floor FROM viewer_runs").fetchall() == [(1, 1)]
    assert conn.execute("SELECT resource_kind, revision FROM resources WHERE resource_id = 'run-1'").fetchall() == [
        ("run", 1)
    ]
    assert conn.execute("SELECT event_type, resource_revision, payload_digest FROM events").fetchall() == [
        ("run.queued", 1, None)  # no copy of the input in the trace
    ]
    project = conn.execute("SELECT canonical_path FROM projects").fetchall()
    assert project == [("/projects/p1",)]
    assert conn.execute("SELECT builtin_id, builtin_revision FROM run_sources").fetchall() == [("builtin:demo", "2")]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_runs_share_their_project_and_definition(executor):
    run_group(executor, run_create("run-1"), run_create("run-2"), run_create("run-3", project="/projects/p2"))
    conn = executor.conn
    assert conn.execute("SELECT count(*) FROM projects").fetchone() == (2,)
    assert conn.execute("SELECT count(*) FROM workflow_definitions").fetchone() == (1,)
    assert conn.execute("SELECT count(DISTINCT project_id) FROM runs").fetchone() == (2,)


def test_a_repeated_start_adopts_the_same_run(executor):
    first = run_create("run-1", receipt=client_receipt("start-1", "run.start demo"))
    repeat = run_create("run-1", receipt=client_receipt("start-1", "run.start demo"))
    (a,) = run_group(executor, first)
    (b,) = run_group(executor, repeat)
    assert (a.outcome, b.outcome) == ("accepted", "adopted") and a.receipt == b.receipt
    other = run_create("run-2", receipt=client_receipt("start-1", "another start"))
    (c,) = run_group(executor, other)
    assert c.outcome == "conflict" and c.receipt["code"] == "idempotencyKeyReused"
    assert executor.conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_a_run_id_is_taken_once(executor):
    (a,) = run_group(executor, run_create("run-1"))
    (b,) = run_group(executor, run_create("run-1", input_value={"other": True}))
    assert a.outcome == "accepted"
    assert b.outcome == "rejected" and b.receipt["code"] == "resourceExists"


def test_one_unfinished_interactive_run_per_session(executor):
    r1, r2, r3 = run_group(
        executor,
        run_create("run-1", mode="interactive", session="session-a"),
        run_create("run-2", mode="interactive", session="session-a"),
        run_create("run-3", mode="interactive", session="session-b"),
    )
    assert (r1.outcome, r3.outcome) == ("accepted", "accepted")
    assert r2.outcome == "conflict" and r2.receipt == {"code": "sessionReserved", "runId": "run-1"}
    assert executor.conn.execute("SELECT run_id FROM runs ORDER BY 1").fetchall() == [("run-1",), ("run-3",)]


def test_invalid_run_requests_change_nothing(executor):
    interactive_without_session = run_create("run-1", mode="interactive")
    relative_project = run_create("run-2", project="relative/path")
    replies = run_group(executor, interactive_without_session, relative_project)
    assert [r.receipt["code"] for r in replies] == ["validationFailed", "validationFailed"]
    assert executor.conn.execute("SELECT count(*) FROM resources").fetchone() == (0,)

"""Prune selection and deletion at the writer: complete terminal root-run trees, blockers, blobs."""

from __future__ import annotations

import sqlite3

import pytest

from piworkflows.writer import invariants, prune
from tests.support import run_create, run_group, submitted, take_epoch

pytestmark = pytest.mark.timeout(60)
CLIENT = {"actor_class": "client", "actor_id": "client-1"}


def finish(conn, run_id: str, at: int) -> None:
    """A terminal run with a settled queue (what the engine leaves behind)."""
    conn.execute("UPDATE runs SET status = 'completed', finished_at = ? WHERE run_id = ?", (at, run_id))
    conn.execute("UPDATE run_queue SET queue_status = 'done' WHERE run_id = ?", (run_id,))


@pytest.fixture
def conn(executor):
    run_group(executor, take_epoch(), run_create("run-old", input_value={"only": "old"}), run_create("run-new"),
              run_create("run-live"))  # fmt: skip
    conn = executor.conn
    finish(conn, "run-old", 1_000)
    finish(conn, "run-new", 9_000)
    return conn


def test_selection_lists_old_complete_trees_and_blocks_the_rest(conn, clock):
    assert prune.select(conn, 5_000, clock.now_ms()) == {"eligible": ["run-old"], "blocked": []}
    assert prune.select(conn, 10_000, clock.now_ms()) == {"eligible": ["run-old", "run-new"], "blocked": []}


@pytest.mark.parametrize(
    "name, plant",
    [
        ("liveQueue", "UPDATE run_queue SET queue_status = 'parked' WHERE run_id = 'run-old'"),
        ("recentRun", "INSERT INTO runs SELECT 'run-child', project_id, workflow_name, definition_digest, "
                      "'completed', 0, NULL, execution_mode, NULL, NULL, input_digest, NULL, NULL, NULL, NULL, "
                      "max_steps, 'restart', 'run-old', 'run-old', NULL, 1, NULL, NULL, 1, NULL, 8000, 1 "
                      "FROM runs WHERE run_id = 'run-old'"),
        ("activeLease", "INSERT INTO leases VALUES ('run-old', 1, 'o', zeroblob(32), 0, 0, 9e15)"),
    ],
)  # fmt: skip
def test_a_blocker_keeps_the_tree(conn, clock, name, plant):
    if name == "recentRun":
        conn.execute("INSERT INTO resources VALUES ('run-child', 'run', 1, NULL, 0, 0)")
    conn.execute(plant)
    blocked = [{"rootRunId": "run-old", "blocker": name}]
    assert prune.select(conn, 5_000, clock.now_ms()) == {"eligible": [], "blocked": blocked}


def test_deleting_a_tree_removes_its_rows_resources_and_unreferenced_blobs_only(conn, clock):
    (own_input,) = conn.execute("SELECT input_digest FROM runs WHERE run_id = 'run-old'").fetchone()
    (shared_input,) = conn.execute("SELECT input_digest FROM runs WHERE run_id = 'run-new'").fetchone()
    blobs_before = conn.execute("SELECT count(*) FROM blobs").fetchone()[0]
    conn.execute("BEGIN")
    assert prune.delete_tree(conn, "run-old") == 1
    assert prune.delete_unreferenced_blobs(conn) == 1  # run-old's own input; the definition is shared
    conn.execute("COMMIT")
    assert conn.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall() == [("run-live",), ("run-new",)]
    assert conn.execute("SELECT count(*) FROM resources WHERE resource_id = 'run-old'").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM events WHERE resource_id = 'run-old'").fetchone() == (0,)
    blobs = {row[0] for row in conn.execute("SELECT digest FROM blobs")}
    assert own_input not in blobs and shared_input in blobs and len(blobs) == blobs_before - 1
    with pytest.raises(sqlite3.IntegrityError, match="deleted only by retention"):  # and only by it
        conn.execute("DELETE FROM events WHERE resource_id = 'run-new'")
    assert invariants.integrity(conn) == [] and invariants.violations(conn, clock.now_ms()) == {}


def test_a_dry_run_through_the_writer_changes_nothing(executor, conn):
    before = conn.execute("SELECT count(*) FROM runs").fetchone()
    (reply,) = run_group(executor, submitted("state.prune", {"actor": CLIENT, "before_ms": 5_000}))
    assert reply.outcome == "accepted"
    assert reply.receipt == {"applied": False, "eligible": ["run-old"], "blocked": []}
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == before


def test_an_apply_without_a_backup_is_refused(executor, conn):
    (reply,) = run_group(executor, submitted("state.prune", {"actor": CLIENT, "before_ms": 5_000, "apply": True}))
    assert reply.outcome == "rejected" and "--backup" in reply.error
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (3,)

"""Prune selection and deletion at the writer: complete terminal root-run trees, blockers, blobs."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from piworkflows.writer import invariants, prune
from tests.support import effect_request, reserve, run_create, run_group, submitted, take_epoch

pytestmark = pytest.mark.timeout(60)
CLIENT = {"actor_class": "client", "actor_id": "client-1"}


def revision(conn, resource_id: str) -> int:
    return conn.execute("SELECT revision FROM resources WHERE resource_id = ?", (resource_id,)).fetchone()[0]


def finish(conn, run_id: str, at: int) -> None:
    """A terminal run with a settled queue (what the engine leaves behind)."""
    conn.execute("UPDATE runs SET status = 'completed', finished_at = ? WHERE run_id = ?", (at, run_id))
    conn.execute("UPDATE run_queue SET queue_status = 'done' WHERE run_id = ?", (run_id,))


@pytest.fixture
def conn(executor):
    run_group(
        executor,
        take_epoch(),
        run_create("run-old", input_value={"only": "old"}),
        run_create("run-new"),
        run_create("run-live"),
    )
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
        (
            "recentRun",
            "INSERT INTO runs SELECT 'run-child', project_id, workflow_name, definition_digest, "
            "'completed', 0, NULL, execution_mode, NULL, NULL, input_digest, NULL, NULL, NULL, NULL, "
            "max_steps, 'restart', 'run-old', 'run-old', NULL, 1, NULL, NULL, 1, NULL, 8000, 1 "
            "FROM runs WHERE run_id = 'run-old'",
        ),
        ("activeLease", "INSERT INTO leases VALUES ('run-old', 1, 'o', zeroblob(32), 0, 0, 9e15)"),
    ],
)
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
    # run-old's own input goes; the definition is shared
    assert prune.delete_trees(conn, ["run-old"]) == {"trees": 1, "runs": 1, "blobs": 1}
    conn.execute("COMMIT")
    assert conn.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall() == [("run-live",), ("run-new",)]
    assert conn.execute("SELECT count(*) FROM resources WHERE resource_id = 'run-old'").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM events WHERE resource_id = 'run-old'").fetchone() == (0,)
    blobs = {row[0] for row in conn.execute("SELECT digest FROM blobs")}
    assert own_input not in blobs and shared_input in blobs and len(blobs) == blobs_before - 1
    with pytest.raises(sqlite3.IntegrityError, match="deleted only by retention"):  # and only by it
        conn.execute("DELETE FROM events WHERE resource_id = 'run-new'")
    assert invariants.integrity(conn) == [] and invariants.violations(conn, clock.now_ms()) == {}


def test_blobs_referenced_through_a_cascade_go_and_a_blob_nothing_deleted_referenced_stays(conn, clock):
    """Only the digests of deleted rows are looked at: a node's output (its row goes with the run)
    is freed; a blob written for a command still on its way (referenced by nothing yet) is kept."""
    output, waiting = hashlib.sha256(b"output").digest(), hashlib.sha256(b"waiting").digest()
    for digest in (output, waiting):
        conn.execute("INSERT INTO blobs VALUES (?, 'application/json', 2, X'7B7D', 1)", (digest,))
    conn.execute(
        "INSERT INTO node_attempts (attempt_id, run_id, node_path, node_kind, visit_number, attempt_number, "
        "attempt_status, outcome, lease_generation, output_digest, started_at, finished_at) VALUES "
        "('a-1', 'run-old', 'n', 'compute', 1, 1, 'completed', 'ok', 1, ?, 1, 2)",
        (output,),
    )
    conn.execute("BEGIN")
    assert prune.delete_trees(conn, ["run-old"]) == {"trees": 1, "runs": 1, "blobs": 2}  # its input and the output
    conn.execute("COMMIT")
    blobs = {row[0] for row in conn.execute("SELECT digest FROM blobs")}
    assert output not in blobs and waiting in blobs
    # outside retention a delete notes nothing (the temporary triggers stay on the connection)
    conn.execute("DELETE FROM node_attempts WHERE run_id = 'run-new'")
    assert conn.execute(f"SELECT count(*) FROM temp.{prune.FREED}").fetchone() == (0,)


def test_the_sweep_cursor_passes_a_blocked_tree_once(conn, clock):
    conn.execute("UPDATE run_queue SET queue_status = 'parked' WHERE run_id = 'run-old'")  # blocked: liveQueue
    root, cursor = prune.next_eligible(conn, 10_000, clock.now_ms(), None)
    assert root == "run-new" and cursor == (9_000, "run-new")  # run-old passed
    assert prune.next_eligible(conn, 10_000, clock.now_ms(), cursor) == (None, None)


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


def test_apply_removes_exactly_the_eligible_trees_and_their_blobs(executor, clock, paths):
    """Old completed (goes), old failed with a restart still running, old with an unsettled effect,
    recent, waiting (all stay); a dry run first changes no byte of the database."""
    conn = executor.conn
    runs = {name: f"run-{name}" for name in ("done", "failed", "effect", "recent", "waiting")}
    run_group(executor, take_epoch(), *[run_create(run_id, input_value={"for": name}) for name, run_id in runs.items()])
    finish(conn, runs["done"], 1_000)
    finish(conn, runs["failed"], 1_000)
    conn.execute("UPDATE runs SET status = 'failed' WHERE run_id = 'run-failed'")
    run_group(executor, run_create("run-child"))  # its restart, still running
    conn.execute(
        "UPDATE runs SET lineage = 'restart', root_run_id = 'run-failed', parent_run_id = 'run-failed', "
        "restart_number = 1 WHERE run_id = 'run-child'"
    )
    finish(conn, runs["effect"], 1_000)
    run_group(
        executor,
        reserve(revision(conn, "run-effect"), effect_request("k", performer="http.request"), source="run-effect"),
    )
    conn.execute("UPDATE effects SET run_id = 'run-effect', owner_scope = 'run'")
    finish(conn, runs["recent"], 9_000)
    conn.execute("UPDATE runs SET status = 'waiting' WHERE run_id = 'run-waiting'")
    conn.execute("UPDATE run_queue SET queue_status = 'parked' WHERE run_id = 'run-waiting'")
    conn.execute(
        "INSERT INTO node_attempts (attempt_id, run_id, node_path, node_kind, visit_number, attempt_number, "
        "attempt_status, lease_generation, started_at) VALUES ('a-wait', 'run-waiting', 'ask', "
        "'checkpoint', 1, 1, 'waiting', 1, 1)"
    )
    inputs = dict(conn.execute("SELECT run_id, input_digest FROM runs").fetchall())

    def files() -> tuple[bytes, bytes]:
        return paths.database.read_bytes(), paths.wal.read_bytes()

    conn.execute("DELETE FROM temp.viewer_touched")  # the setup wrote rows directly, outside any command
    before = files()
    (dry,) = run_group(executor, submitted("state.prune", {"actor": CLIENT, "before_ms": 5_000}))
    assert files() == before  # no byte changed
    blocked = {b["rootRunId"]: b["blocker"] for b in dry.receipt["blocked"]}
    assert dry.receipt["eligible"] == ["run-done"]
    assert blocked == {"run-failed": "unfinishedRun", "run-effect": "unsettledEffect"}

    deltas_only = conn.execute(  # run-done's view patches that no other run's delta holds
        "SELECT DISTINCT patch_digest FROM viewer_deltas WHERE run_id = 'run-done' AND patch_digest NOT IN "
        "(SELECT patch_digest FROM viewer_deltas WHERE run_id != 'run-done')"
    ).fetchall()
    done = {"destination": "/backups/b.sqlite", "bytes": 1, "pages": 1}  # what the writer loop made first
    (applied,) = run_group(
        executor,
        submitted(
            "state.prune",
            {
                "actor": CLIENT,
                "before_ms": 5_000,
                "apply": True,
                "backup_path": "/backups/b.sqlite",
                "performed_backup": done,
            },
        ),
    )
    assert applied.outcome == "accepted", applied
    # its input, and its view's patches (they name the run: no other run holds them)
    assert applied.receipt["deleted"]["trees"] == 1 and applied.receipt["deleted"]["runs"] == 1
    assert applied.receipt["deleted"]["blobs"] == 1 + len(deltas_only)
    left = {row[0] for row in conn.execute("SELECT run_id FROM runs")}
    assert left == set(runs.values()) - {"run-done"} | {"run-child"}
    blobs = {row[0] for row in conn.execute("SELECT digest FROM blobs")}
    assert inputs["run-done"] not in blobs
    assert all(inputs[run_id] in blobs for run_id in left)  # every referenced blob kept
    assert invariants.integrity(conn) == []

"""Selection and deletion of complete terminal root-run trees (spec, Automatic retention).

A tree is a root run and every run whose ``root_run_id`` names it (restarts,
child runs). It is a candidate when its root finished before the cutoff; it
is eligible only when no blocker holds for any of its runs. Manual prune and
automatic retention use these same functions: prune selects every candidate and
deletes the eligible trees at once; retention walks the candidates oldest first
with a cursor and deletes one tree per transaction.

Deleting a tree, in the caller's transaction: the runs (their rows in every
run-scoped table go with them: ``ON DELETE CASCADE``), then the resources of
the runs and of what they owned (effects, settings scopes, follow-ups,
segments, decisions, messages; events and leases go with them), then every
blob that a deleted row referenced and no foreign key references any more (only
those are looked at: a blob written for a command still on its way is never
touched).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from typing import Any

from piworkflows.writer import schema

TREE = "SELECT run_id FROM runs WHERE root_run_id = :root"
FREED = "piw_freed_digests"  # temp table: the digests the rows deleted by this call referenced
_deleting = False  # see retention_deleting()

# blocker -> a query that returns a row when the tree (:root) must be kept
BLOCKERS: dict[str, str] = {
    "unfinishedRun": f"SELECT 1 FROM runs WHERE run_id IN ({TREE}) AND finished_at IS NULL",
    "recentRun": f"SELECT 1 FROM runs WHERE run_id IN ({TREE}) AND finished_at >= :cutoff",
    "liveQueue": f"SELECT 1 FROM run_queue WHERE run_id IN ({TREE}) "
    "AND queue_status NOT IN ('done', 'failed', 'cancelled')",
    "activeRunner": f"SELECT 1 FROM run_workers WHERE run_id IN ({TREE}) AND ended_at IS NULL",
    "pendingWorkflowMessage": f"SELECT 1 FROM workflow_messages WHERE run_id IN ({TREE}) AND message_state = 'pending'",
    "openTurn": f"SELECT 1 FROM workflow_turns WHERE run_id IN ({TREE}) AND turn_state = 'open'",
    "pendingInteraction": f"SELECT 1 FROM interactive_requests WHERE run_id IN ({TREE}) "
    "AND request_status IN ('pending', 'validating')",
    "pendingDecision": f"SELECT 1 FROM human_decisions d WHERE d.run_id IN ({TREE}) "
    "AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)",
    "recordingSegment": f"SELECT 1 FROM session_segments WHERE run_id IN ({TREE}) AND segment_status = 'recording'",
    "queuedFollowUp": f"SELECT 1 FROM workflow_follow_ups WHERE run_id IN ({TREE}) AND follow_up_status = 'queued'",
    "activeLease": f"SELECT 1 FROM leases l WHERE l.owner_id IS NOT NULL AND l.expires_at > :now AND "
    f"(l.resource_id IN ({TREE}) OR l.resource_id IN (SELECT effect_id FROM effects WHERE run_id IN ({TREE})) "
    f"OR l.resource_id IN (SELECT segment_id FROM session_segments WHERE run_id IN ({TREE})))",
    "unsettledEffect": f"SELECT 1 FROM effects WHERE run_id IN ({TREE}) "
    "AND effect_status IN ('pending', 'applying', 'ambiguous')",
    "controllerOwnership": f"SELECT 1 FROM controller_workflows WHERE run_id IN ({TREE})",
    # one indexed lookup per lineage column (an OR across them would scan every run)
    "outsideReference": " UNION ALL ".join(
        f"SELECT 1 FROM runs o WHERE o.{column} IS NOT NULL AND o.{column} IN ({within}) AND o.root_run_id != :root"
        for column, within in (
            ("parent_run_id", TREE),
            ("recovery_root_run_id", TREE),
            ("parent_attempt_id", f"SELECT attempt_id FROM node_attempts WHERE run_id IN ({TREE})"),
        )
    ),
    "outsideEffectSource": f"SELECT 1 FROM effects e WHERE e.source_resource_id IN ({TREE}) "
    f"AND (e.run_id IS NULL OR e.run_id NOT IN ({TREE}))",
}

# What each blocker means, for a refusal a person reads.
BLOCKER_TEXT: dict[str, str] = {
    "unfinishedRun": "a run of its tree has not finished",
    "recentRun": "a run of its tree finished after the cutoff",
    "liveQueue": "a run of its tree still has queue work",
    "activeRunner": "a runner still serves a run of its tree",
    "pendingWorkflowMessage": "a workflow message of its tree is still pending",
    "openTurn": "a Pi turn of its tree is still open",
    "pendingInteraction": "an interaction of its tree still waits for an answer",
    "pendingDecision": "a human decision of its tree is not resolved",
    "recordingSegment": "a session segment of its tree is still recording",
    "queuedFollowUp": "a follow-up of its tree is still queued",
    "activeLease": "a claim on a run of its tree, one of their effects or session segments is live",
    "unsettledEffect": "an effect of its tree is unsettled or ambiguous (see 'pi-workflows effects')",
    "controllerOwnership": "a managed resource owns a run of its tree",
    "outsideReference": "a run outside its tree refers to it",
    "outsideEffectSource": "an effect outside its tree was caused by it",
}
assert set(BLOCKER_TEXT) == set(BLOCKERS)

# The resources a tree owns besides its runs (their domain rows cascade from the runs).
OWNED_RESOURCES = (
    "SELECT effect_id FROM effects WHERE run_id IN ({tree})",
    "SELECT scope_id FROM workflow_settings WHERE run_id IN ({tree})",
    "SELECT follow_up_id FROM workflow_follow_ups WHERE run_id IN ({tree})",
    "SELECT segment_id FROM session_segments WHERE run_id IN ({tree})",
    "SELECT decision_id FROM human_decisions WHERE run_id IN ({tree})",
    "SELECT workflow_message_id FROM workflow_messages WHERE run_id IN ({tree})",
)


def candidates(
    conn: sqlite3.Connection, cutoff_ms: int, after: tuple[int, str] | None = None
) -> Iterator[tuple[int, str]]:
    """Root runs that finished before the cutoff, oldest first, as ``(finished_at, root)``, read
    lazily; ``after`` resumes a walk past the candidates already seen."""
    low = after if after is not None else (-1, "")
    yield from conn.execute(  # repeats runs_finished_roots' condition, so SQLite walks that index
        "SELECT finished_at, run_id FROM runs WHERE run_id = root_run_id AND finished_at IS NOT NULL "
        "AND finished_at < ? AND (finished_at, run_id) > (?, ?) ORDER BY finished_at, run_id",
        (cutoff_ms, *low),
    )


def blocker(conn: sqlite3.Connection, root: str, cutoff_ms: int, now_ms: int) -> str | None:
    """The first blocker that keeps this candidate tree, None when it may go."""
    params = {"root": root, "cutoff": cutoff_ms, "now": now_ms}
    return next((name for name, query in BLOCKERS.items() if conn.execute(query, params).fetchone()), None)


def select(conn: sqlite3.Connection, cutoff_ms: int, now_ms: int) -> dict[str, Any]:
    """Every candidate tree: the eligible roots, and the blocked ones with their first blocker.
    Reads only."""
    eligible, blocked = [], []
    for _, root in list(candidates(conn, cutoff_ms)):
        found = blocker(conn, root, cutoff_ms, now_ms)
        if found is None:
            eligible.append(root)
        else:
            blocked.append({"rootRunId": root, "blocker": found})
    return {"eligible": eligible, "blocked": blocked}


def next_eligible(
    conn: sqlite3.Connection, cutoff_ms: int, now_ms: int, after: tuple[int, str] | None
) -> tuple[str | None, tuple[int, str] | None]:
    """The oldest eligible tree after ``after``, and the cursor past it (blocked trees passed on the
    way are skipped for the rest of this walk). ``(None, None)`` when none is left."""
    for finished_at, root in candidates(conn, cutoff_ms, after):
        if blocker(conn, root, cutoff_ms, now_ms) is None:
            return root, (finished_at, root)
    return None, None


def delete_trees(conn: sqlite3.Connection, roots: list[str]) -> dict[str, int]:
    """Delete eligible trees in the caller's transaction, then the blobs they alone referenced."""
    global _deleting
    _note_freed_digests(conn)
    conn.execute(f"DELETE FROM temp.{FREED}")
    _deleting = True
    try:
        runs = sum(_delete_tree(conn, root) for root in roots)
    finally:
        _deleting = False
    blobs = conn.execute(f"DELETE FROM blobs WHERE digest IN (SELECT digest FROM temp.{FREED}) AND {_unreferenced()}")
    conn.execute(f"DELETE FROM temp.{FREED}")
    return {"trees": len(roots), "runs": runs, "blobs": blobs.rowcount}


def delete_unreferenced(conn: sqlite3.Connection, digests: list[bytes]) -> int:
    """Of these blobs, delete those no row references any more (in the caller's transaction; one
    statement)."""
    if not digests:
        return 0
    marks = ", ".join("?" for _ in digests)
    return conn.execute(f"DELETE FROM blobs WHERE digest IN ({marks}) AND {_unreferenced()}", digests).rowcount


@functools.cache
def _unreferenced() -> str:
    """SQL: no row of any table with a foreign key to blobs references ``blobs.digest`` (the view
    patches first: retention frees them most often, so most candidates stop there)."""
    references = sorted(_blob_references().items(), key=lambda item: item[0] != "viewer_deltas")
    return " AND ".join(
        f"NOT EXISTS (SELECT 1 FROM {t} WHERE {t}.{c} = blobs.digest)" for t, columns in references for c in columns
    )


def retention_deleting() -> int:
    """The SQL function ``piw_retention_deleting()`` (registered by writer/db.py): 1 only while
    delete_trees deletes. The events delete trigger refuses every other delete."""
    return int(_deleting)


def _delete_tree(conn: sqlite3.Connection, root: str) -> int:
    runs = [row[0] for row in conn.execute(TREE, {"root": root})]
    marks = ", ".join("?" for _ in runs)
    owned = [row[0] for query in OWNED_RESOURCES for row in conn.execute(query.format(tree=marks), runs)]
    conn.execute("PRAGMA defer_foreign_keys = ON")  # a tree's runs reference each other (lineage)
    conn.execute(f"DELETE FROM runs WHERE run_id IN ({marks})", runs)
    for ids in (owned, runs):  # events go with their resources (only here: the schema.sql trigger)
        if ids:
            conn.execute(f"DELETE FROM resources WHERE resource_id IN ({', '.join('?' for _ in ids)})", ids)
    return len(runs)


@functools.cache
def _blob_references() -> dict[str, list[str]]:
    """Every table with a foreign key to blobs, and those columns, read from the DDL itself (the
    writer verifies that the database has exactly this schema)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(schema.DDL_PATH.read_text(encoding="utf-8"))
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")]
        found = {
            table: [fk[3] for fk in conn.execute(f"PRAGMA foreign_key_list({table})") if fk[2] == "blobs"]
            for table in tables
        }
    finally:
        conn.close()
    return {table: columns for table, columns in found.items() if columns}


def _note_freed_digests(conn: sqlite3.Connection) -> None:
    """Temporary triggers (the connection's temp schema; the main schema and its version are
    untouched) note in FREED every digest a row deleted by delete_trees referenced, directly or
    through a cascade: only those blobs can have become unreferenced. Made once per connection."""
    references = _blob_references()
    made = conn.execute("SELECT count(*) FROM sqlite_temp_schema WHERE type = 'trigger' AND name LIKE 'piw_freed_%'")
    if made.fetchone()[0] == len(references):
        return
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {FREED} (digest BLOB PRIMARY KEY)")
    for table, columns in references.items():
        note = f"INSERT OR IGNORE INTO {FREED} VALUES {', '.join(f'(OLD.{column})' for column in columns)}"
        conn.execute(
            f"CREATE TEMP TRIGGER IF NOT EXISTS piw_freed_{table} AFTER DELETE ON main.{table} "
            f"WHEN piw_retention_deleting() BEGIN {note}; END"
        )

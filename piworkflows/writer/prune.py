"""Selection and deletion of complete terminal root-run trees (spec, Automatic retention).

A tree is a root run and every run whose ``root_run_id`` names it (restarts,
child runs). It is a candidate when its root finished before the cutoff; it
is eligible only when no blocker holds for any of its runs. Manual prune and
(later) automatic retention use these same functions.

Deleting a tree, in the caller's transaction: the runs (their rows in every
run-scoped table go with them: ``ON DELETE CASCADE``), then the resources of
the runs and of what they owned (effects, settings scopes, follow-ups,
segments, decisions, messages; events and leases go with them), then every
blob no foreign key references any more.
"""

from __future__ import annotations

import sqlite3
from typing import Any

TREE = "SELECT run_id FROM runs WHERE root_run_id = :root"
RETENTION_FUNCTION = "piw_retention_deleting"  # what the events delete trigger asks (writer/db.py registers 0)

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
    f"(l.resource_id IN ({TREE}) OR l.resource_id IN (SELECT effect_id FROM effects WHERE run_id IN ({TREE})))",
    "unsettledEffect": f"SELECT 1 FROM effects WHERE run_id IN ({TREE}) "
    "AND effect_status IN ('pending', 'applying', 'ambiguous')",
    "controllerOwnership": f"SELECT 1 FROM controller_workflows WHERE run_id IN ({TREE})",
    "outsideReference": f"SELECT 1 FROM runs o WHERE o.root_run_id != :root AND (o.parent_run_id IN ({TREE}) "
    f"OR o.recovery_root_run_id IN ({TREE}) OR o.parent_attempt_id IN "
    f"(SELECT attempt_id FROM node_attempts WHERE run_id IN ({TREE})))",
    "outsideEffectSource": f"SELECT 1 FROM effects e WHERE e.source_resource_id IN ({TREE}) "
    f"AND (e.run_id IS NULL OR e.run_id NOT IN ({TREE}))",
}

# The resources a tree owns besides its runs (their domain rows cascade from the runs).
OWNED_RESOURCES = (
    "SELECT effect_id FROM effects WHERE run_id IN ({tree})",
    "SELECT scope_id FROM workflow_settings WHERE run_id IN ({tree})",
    "SELECT follow_up_id FROM workflow_follow_ups WHERE run_id IN ({tree})",
    "SELECT segment_id FROM session_segments WHERE run_id IN ({tree})",
    "SELECT decision_id FROM human_decisions WHERE run_id IN ({tree})",
    "SELECT workflow_message_id FROM workflow_messages WHERE run_id IN ({tree})",
)


def select(conn: sqlite3.Connection, cutoff_ms: int, now_ms: int) -> dict[str, Any]:
    """Candidate trees (root finished before the cutoff): eligible roots, and the blocked ones
    with their first blocker. Reads only."""
    roots = [row[0] for row in conn.execute(
        "SELECT run_id FROM runs WHERE run_id = root_run_id AND finished_at IS NOT NULL AND finished_at < ? "
        "ORDER BY finished_at, run_id", (cutoff_ms,))]  # fmt: skip
    eligible, blocked = [], []
    for root in roots:
        params = {"root": root, "cutoff": cutoff_ms, "now": now_ms}
        blocker = next((name for name, query in BLOCKERS.items() if conn.execute(query, params).fetchone()), None)
        if blocker is None:
            eligible.append(root)
        else:
            blocked.append({"rootRunId": root, "blocker": blocker})
    return {"eligible": eligible, "blocked": blocked}


def delete_tree(conn: sqlite3.Connection, root: str) -> int:
    """Delete one eligible tree in the caller's transaction. Returns how many runs it had."""
    runs = [row[0] for row in conn.execute(TREE, {"root": root})]
    marks = ", ".join("?" for _ in runs)
    owned = [row[0] for query in OWNED_RESOURCES for row in conn.execute(query.format(tree=marks), runs)]
    conn.execute("PRAGMA defer_foreign_keys = ON")  # a tree's runs reference each other (lineage)
    conn.execute(f"DELETE FROM runs WHERE run_id IN ({marks})", runs)
    # Events are immutable; only retention deletes them, with their resources (schema.sql trigger).
    conn.create_function(RETENTION_FUNCTION, 0, lambda: 1)
    try:
        for ids in (owned, runs):
            if ids:
                conn.execute(f"DELETE FROM resources WHERE resource_id IN ({', '.join('?' for _ in ids)})", ids)
    finally:
        conn.create_function(RETENTION_FUNCTION, 0, lambda: 0)
    return len(runs)


def _blob_references(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """Every (table, column) with a foreign key to blobs, read from the schema itself."""
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")]
    return [(table, fk[3]) for table in tables for fk in conn.execute(f"PRAGMA foreign_key_list({table})")
            if fk[2] == "blobs"]  # fmt: skip


def delete_unreferenced_blobs(conn: sqlite3.Connection) -> int:
    """Blobs no foreign key references (in the caller's transaction). Returns how many."""
    clauses = " AND ".join(f"NOT EXISTS (SELECT 1 FROM {t} WHERE {t}.{c} = blobs.digest)"
                           for t, c in _blob_references(conn))  # fmt: skip
    return conn.execute(f"DELETE FROM blobs WHERE {clauses}").rowcount

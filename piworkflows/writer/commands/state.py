"""State maintenance reads: ``state.status`` and ``state.verify`` (spec, State verification).

Both are reads on the writer's connection, between write groups. Neither
repairs anything. ``state.status`` gives sizes, privacy-safe counts (no
actor ids, channel references, payloads or credentials) and the invariant
violations with the affected run ids; ``state.verify`` runs SQLite's
``integrity_check`` and ``foreign_key_check`` and then the same invariants
(``writer/invariants.py`` owns their queries).
"""

from __future__ import annotations

import os
from typing import Any

from piworkflows.protocol.internal import StateStatus, StateVerify
from piworkflows.writer import invariants
from piworkflows.writer.contract import Handler, Result, Tx

MAINTAINERS = frozenset({"client", "operator", "server", "maintenance"})

# name -> a query returning one count (every one on an indexed or small table)
COUNTS: dict[str, str] = {
    "resources": "SELECT count(*) FROM resources",
    "controllers": "SELECT count(*) FROM controller_resources",
    "decisions": "SELECT count(*) FROM human_decisions",
    "settingsScopes": "SELECT count(*) FROM workflow_settings",
    "pendingInteractions": (
        "SELECT count(*) FROM interactive_requests WHERE request_status IN ('pending', 'validating')"
    ),
    "pendingFollowUps": "SELECT count(*) FROM workflow_follow_ups WHERE follow_up_status = 'queued'",
    "activeLeases": "SELECT count(*) FROM leases WHERE owner_id IS NOT NULL AND expires_at > :now",
    "expiredClaims": "SELECT count(*) FROM leases WHERE owner_id IS NOT NULL AND expires_at <= :now",
    "unsettledEffects": "SELECT count(*) FROM effects WHERE effect_status IN ('pending', 'applying')",
    "ambiguousEffects": "SELECT count(*) FROM effects WHERE effect_status = 'ambiguous'",
}


def _database_bytes(tx: Tx) -> dict[str, int]:
    """The main database file and its WAL, in bytes (the connection names the file)."""
    path = next(row[2] for row in tx.conn.execute("PRAGMA database_list") if row[1] == "main")
    sizes = {}
    for name, file in (("fileBytes", path), ("walBytes", path + "-wal")):
        try:
            sizes[name] = os.stat(file).st_size
        except OSError:
            sizes[name] = 0
    return sizes


class Status(Handler[StateStatus]):
    kind = StateStatus.kind
    model = StateStatus
    actors = MAINTAINERS
    read_only = True

    def execute(self, tx: Tx, cmd: StateStatus) -> Result:
        conn = tx.conn
        counts: dict[str, Any] = {name: conn.execute(q, {"now": tx.now}).fetchone()[0] for name, q in COUNTS.items()}
        counts["runs"] = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        return Result(
            receipt={
                **_database_bytes(tx),
                "pageSize": conn.execute("PRAGMA page_size").fetchone()[0],
                "pageCount": conn.execute("PRAGMA page_count").fetchone()[0],
                "freelistCount": conn.execute("PRAGMA freelist_count").fetchone()[0],
                "counts": counts,
                "violations": invariants.violations(conn, tx.now),
                "maintenance": None,  # a running backup or prune reports its progress here
            }
        )


class Verify(Handler[StateVerify]):
    kind = StateVerify.kind
    model = StateVerify
    actors = MAINTAINERS
    read_only = True

    def execute(self, tx: Tx, cmd: StateVerify) -> Result:
        problems = invariants.integrity(tx.conn)
        found = invariants.violations(tx.conn, tx.now)
        return Result(receipt={"ok": not problems and not found, "integrity": problems, "violations": found})


HANDLERS = (Status(), Verify())

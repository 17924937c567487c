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
import sqlite3
from pathlib import Path
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.state import (
    RunDelete,
    StateBackup,
    StateCompact,
    StatePrune,
    StateRetain,
    StateStatus,
    StateVerify,
)
from piworkflows.writer import backup, invariants, prune, records
from piworkflows.writer.contract import Handler, Result, Tx

MAINTAINERS = frozenset({"client", "operator", "server", "maintenance"})
# The running backup's progress, set by the writer loop between its steps: {operation, done, total}.
MAINTENANCE: dict[str, Any] | None = None

# name -> a query returning one count (every one on an indexed or small table)
COUNTS: dict[str, str] = {
    "resources": "SELECT count(*) FROM resources",
    "controllers": "SELECT count(*) FROM controller_resources",
    "decisions": "SELECT count(*) FROM human_decisions",
    "pendingDecisions": (
        "SELECT count(*) FROM human_decisions d WHERE NOT EXISTS "
        "(SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)"
    ),
    "settingsScopes": "SELECT count(*) FROM workflow_settings",
    "pendingInteractions": (
        "SELECT count(*) FROM interactive_requests WHERE request_status IN ('pending', 'validating')"
    ),
    "pendingFollowUps": "SELECT count(*) FROM workflow_follow_ups WHERE follow_up_status = 'queued'",
    "activeLeases": "SELECT count(*) FROM leases WHERE owner_id IS NOT NULL AND expires_at > :now",
    "expiredClaims": "SELECT count(*) FROM leases WHERE owner_id IS NOT NULL AND expires_at <= :now",
    "unsettledEffects": "SELECT count(*) FROM effects WHERE effect_status IN ('pending', 'applying')",
    "ambiguousEffects": "SELECT count(*) FROM effects WHERE effect_status = 'ambiguous'",
    "ambiguousEffectsOfEndedRuns": records.AMBIGUOUS_OF_ENDED_RUNS,
}


def count(conn: sqlite3.Connection, name: str, now: int) -> int:
    """One of the safe counts (server.status reports some of them too)."""
    found: int = conn.execute(COUNTS[name], {"now": now}).fetchone()[0]
    return found


def _database_bytes(tx: Tx) -> dict[str, int]:
    """The main database file and its WAL, in bytes."""
    path = str(_active_database(tx))
    sizes = {}
    for name, file in (("fileBytes", path), ("walBytes", path + "-wal")):
        try:
            sizes[name] = os.stat(file).st_size
        except OSError:
            sizes[name] = 0
    return sizes


class Status(Handler[StateStatus]):
    model = StateStatus
    actors = MAINTAINERS
    read_only = True

    def execute(self, tx: Tx, cmd: StateStatus) -> Result:
        conn = tx.conn
        counts: dict[str, Any] = {name: count(conn, name, tx.now) for name in COUNTS}
        counts["runs"] = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        counts["channelEffects"] = dict(  # the Telegram channel's messages, by status
            conn.execute(
                "SELECT effect_status, count(*) FROM effects WHERE channel_id IS NOT NULL GROUP BY effect_status"
            ).fetchall()
        )
        return Result(
            receipt={
                **_database_bytes(tx),
                "pageSize": conn.execute("PRAGMA page_size").fetchone()[0],
                "pageCount": conn.execute("PRAGMA page_count").fetchone()[0],
                "freelistCount": conn.execute("PRAGMA freelist_count").fetchone()[0],
                "counts": counts,
                "violations": invariants.violations(conn, tx.now),
                "maintenance": MAINTENANCE,
            }
        )


class Verify(Handler[StateVerify]):
    model = StateVerify
    actors = MAINTAINERS
    read_only = True

    def execute(self, tx: Tx, cmd: StateVerify) -> Result:
        report, damaged = invariants.verify(tx.conn, tx.now)
        return Result(receipt=report, damage=damaged[0] if damaged else None)


class Backup(Handler[StateBackup]):
    """The receipt of a backup the writer loop made and verified (``performed``); a request the
    loop found invalid is refused here, with the same words, and not stored."""

    model = StateBackup
    actors = MAINTAINERS
    stores_refusals = False  # they depend on the filesystem at that moment (a directory made private, a file gone)

    def execute(self, tx: Tx, cmd: StateBackup) -> Result:
        if cmd.performed is None:
            backup.check_destination(cmd.destination, _active_database(tx))  # raises the refusal
            raise CommandError("notAvailable", "a backup is made by the writer loop, not inside a group")
        return Result(receipt={**cmd.performed.model_dump(), "verified": True})


class Prune(Handler[StatePrune]):
    """A dry run selects and changes nothing; an apply (after the loop made and verified its
    backup) rechecks the selection and deletes the eligible trees and unreferenced blobs."""

    model = StatePrune
    actors = MAINTAINERS
    stores_refusals = False  # its backup path's refusals depend on the filesystem at that moment

    def execute(self, tx: Tx, cmd: StatePrune) -> Result:
        if cmd.apply and cmd.performed_backup is None:
            if cmd.backup_path is None:
                raise CommandError("validationFailed", "prune --apply needs --backup with a new absolute path")
            backup.check_destination(cmd.backup_path, _active_database(tx))  # raises the refusal
            raise CommandError("notAvailable", "a prune is applied by the writer loop, after its backup")
        selection = prune.select(tx.conn, cmd.before_ms, tx.now)
        if not cmd.apply:
            return Result(receipt={"applied": False, **selection})
        deleted = prune.delete_trees(tx.conn, selection["eligible"])
        assert cmd.performed_backup is not None
        return Result(
            receipt={"applied": True, **selection, "deleted": deleted, "backup": cmd.performed_backup.destination}
        )


class Retain(Handler[StateRetain]):
    """One tree per transaction: the oldest eligible one after the sweep's cursor, rechecked now;
    the caller yields between and passes the receipt's cursor on."""

    model = StateRetain
    actors = frozenset({"server"})

    def execute(self, tx: Tx, cmd: StateRetain) -> Result:
        root, cursor = prune.next_eligible(tx.conn, cmd.cutoff_ms, tx.now, cmd.after)
        if root is None:
            return Result(receipt={"deleted": None, "cursor": None})
        return Result(receipt={"deleted": root, "cursor": cursor, **prune.delete_trees(tx.conn, [root])})


class Compact(Handler[StateCompact]):
    """Never inside a group: the writer loop checkpoints and vacuums between groups."""

    model = StateCompact
    actors = frozenset({"server"})

    def execute(self, tx: Tx, cmd: StateCompact) -> Result:
        raise CommandError("notAvailable", "compaction runs in the writer loop, outside any transaction")


class DeleteRun(Handler[RunDelete]):
    """The narrow deletion control: one terminal root-run tree, named by its root, deleted with
    prune's own blockers (any finish time counts) and deletion path; refused naming the blocker."""

    model = RunDelete
    actors = frozenset({"client", "operator"})

    def execute(self, tx: Tx, cmd: RunDelete) -> Result:
        row = tx.conn.execute("SELECT root_run_id FROM runs WHERE run_id = ?", (cmd.run_id,)).fetchone()
        if row is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        if row[0] != cmd.run_id:
            raise CommandError(
                "invalidTransition",
                f"run {cmd.run_id} belongs to the tree of run {row[0]}; a tree is deleted whole, by its root run",
                runId=cmd.run_id,
                rootRunId=row[0],
            )
        found = prune.blocker(tx.conn, cmd.run_id, tx.now + 1, tx.now)  # no cutoff: every finished run counts
        if found is not None:
            raise CommandError(
                "deletionBlocked",
                f"run {cmd.run_id} is kept: {prune.BLOCKER_TEXT[found]}",
                runId=cmd.run_id,
                blocker=found,
            )
        return Result(receipt={"runId": cmd.run_id, "deleted": prune.delete_trees(tx.conn, [cmd.run_id])})


def _active_database(tx: Tx) -> Path:
    """The file the writer's connection has open."""
    return Path(next(row[2] for row in tx.conn.execute("PRAGMA database_list") if row[1] == "main"))


HANDLERS = (Status(), Verify(), Backup(), Prune(), Retain(), Compact(), DeleteRun())

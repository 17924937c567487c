"""The writer's connection and its group commit loop.

::

    commands already waiting (bounded by count and by time)
        │ decode + validate (pydantic; blob digests verified here, outside the transaction;
        │   a blob.put_part joins its upload, writer/uploads.py: the last part hashes the whole)
        ▼
    BEGIN IMMEDIATE ── schema cookie unchanged? ──┐
        │  per command: SAVEPOINT                 │ any error that ends the whole
        │     stored answer? adopt / conflict     │ transaction (FULL, IOERR, NOMEM,
        │     handler.run (the write contract)    │ a failed COMMIT, in_transaction
        │     accepted: the view ops it caused    │
        │       (writer/views/projection.py)      │
        │     refused: ROLLBACK TO, store answer  │ lost): ROLLBACK, every command of
        │       (unless stores_refusals is False) │ the group gets ``unavailable``
        │  RELEASE                                │
    COMMIT ───────────────────────────────────────┘
        ▼
    replies (only now) ── notices

Group commit refines the spec's per-command BEGIN IMMEDIATE ... COMMIT; see
docs/design/group-commit.md for why each command keeps its guarantees.
"""

from __future__ import annotations

import atexit
import json
import logging
import sqlite3
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from piworkflows import faults
from piworkflows.clock import Clock
from piworkflows.errors import CommandError, describe_invalid_fields
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal import COMMAND_MODELS
from piworkflows.protocol.internal.content import BlobPutPart
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.writer import local_effects, prune, records, schema, viewer_notify
from piworkflows.writer.commands import REGISTRY
from piworkflows.writer.contract import Handler, Tx
from piworkflows.writer.health import condition_of
from piworkflows.writer.uploads import Uploads
from piworkflows.writer.views import projection

log = logging.getLogger(__name__)

# SQLite primary result codes after which the transaction cannot be trusted.
_GROUP_FATAL_CODES = {
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_CORRUPT,
    sqlite3.SQLITE_NOTADB,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
}


def connect(paths: StatePaths, settings: Settings) -> sqlite3.Connection:
    """Open the one writer connection with the spec's pragmas (schema verified before)."""
    # More distinct statements than the default cache of 128 (a miss prepares the statement again).
    conn = sqlite3.connect(paths.database, isolation_level=None, check_same_thread=False, cached_statements=512)
    conn.execute("PRAGMA foreign_keys = ON")
    if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
        conn.close()
        raise RuntimeError("SQLite refused WAL mode for the state database")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA busy_timeout = {settings.busy_timeout_ms}")
    conn.execute(f"PRAGMA wal_autocheckpoint = {settings.wal_autocheckpoint_pages}")
    conn.execute(f"PRAGMA journal_size_limit = {settings.journal_size_limit_bytes}")
    conn.create_function("piw_retention_deleting", 0, prune.retention_deleting)
    if settings.sql_trace_path:  # benchmarks only: buffered (a write per statement would be measured too)
        trace = open(settings.sql_trace_path, "a", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115
        atexit.register(trace.close)  # the writer exits normally when the benchmark stops the server
        conn.set_trace_callback(lambda statement: trace.write(json.dumps(statement) + "\n"))
    return conn


def open_database(paths: StatePaths, settings: Settings, clock: Clock) -> sqlite3.Connection:
    """Create or verify (raises StateIncompatible, files untouched), then connect."""
    schema.ensure_database(paths, clock.now_ms())
    return connect(paths, settings)


@dataclass(frozen=True)
class Submitted:
    """One command frame as it arrived: correlation id, kind, raw body."""

    corr_id: int
    kind: str
    body: dict[str, Any]


class GroupFailed(Exception):
    """The whole transaction ended; nothing of the group was acknowledged. ``condition``: what it
    says about the disk or the file (``condition_of``), if anything."""

    def __init__(self, message: str, condition: str | None = None) -> None:
        super().__init__(message)
        self.condition = condition


def _is_group_fatal(conn: sqlite3.Connection, exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return not conn.in_transaction or (code is not None and (code & 0xFF) in _GROUP_FATAL_CODES)


class GroupExecutor:
    """Runs groups of commands on one connection; replies only after COMMIT."""

    def __init__(self, conn: sqlite3.Connection, settings: Settings, clock: Clock) -> None:
        self.conn = conn
        self.settings = settings
        self.clock = clock
        self.schema_cookie = self._schema_cookie()
        self.groups_committed = 0
        self.damage: str | None = None  # what a read found damaged (Result.damage), once
        self.uploads = Uploads(settings.blob_upload_max_bytes, settings.blob_upload_idle_ms)  # blob.put_part
        self.projection = projection.Projection()  # each accepted command's view ops (views/projection.py)
        projection.install(conn)
        viewer_notify.install(conn)

    def _schema_cookie(self) -> int:
        cookie: int = self.conn.execute("PRAGMA schema_version").fetchone()[0]
        return cookie

    def run(self, batch: list[Submitted]) -> tuple[list[tuple[int, Reply]], list[Submitted]]:
        """Execute the commands that fit in one group.

        Returns the replies (to send now: the group committed) and the
        commands left for the next group (the time bound was reached).
        Raises GroupFailed when nothing of the group may be acknowledged.
        """
        replies: list[tuple[int, Reply]] = []
        decoded: list[tuple[Submitted, Handler[Any], Any]] = []
        for item in batch[: self.settings.group_max_commands]:
            handler = REGISTRY.get(item.kind)
            if handler is None:
                replies.append(
                    (item.corr_id, refusal_reply(CommandError("unknownCommand", f"no command {item.kind!r}")))
                )
                continue
            try:
                cmd = COMMAND_MODELS[item.kind].model_validate(item.body)
            except ValidationError as exc:
                refusal = CommandError("validationFailed", "command has " + describe_invalid_fields(exc.errors()))
                replies.append((item.corr_id, refusal_reply(refusal)))
                continue
            if isinstance(cmd, BlobPutPart):  # joins its upload here: the part that completes it is hashed
                cmd._received = self.uploads.receive(cmd.part, self.clock.monotonic_ms())  # outside the transaction
            decoded.append((item, handler, cmd))
        leftover = list(batch[self.settings.group_max_commands :])
        if not decoded:
            return replies, leftover

        started = self.clock.monotonic_ms()
        done: list[tuple[int, Reply]] = []
        writes = any(not handler.read_only for _, handler, _ in decoded)
        self.conn.execute("BEGIN IMMEDIATE" if writes else "BEGIN")
        try:
            if self._schema_cookie() != self.schema_cookie:
                raise GroupFailed("the database schema changed under the writer")
            for index, (item, handler, cmd) in enumerate(decoded):
                if index and self.clock.monotonic_ms() - started >= self.settings.group_max_ms:
                    leftover = [it for it, _, _ in decoded[index:]] + leftover
                    break
                done.append((item.corr_id, self._run_one(handler, cmd)))
            if writes:
                faults.hit(faults.WRITER_BEFORE_COMMIT)
                self.conn.execute("COMMIT")
                self.projection.end(committed=True)
            else:
                self._end_reads()
        except (sqlite3.Error, GroupFailed, faults.FaultInjected, OSError) as exc:
            self.projection.end(committed=False)
            condition = exc.condition if isinstance(exc, GroupFailed) else condition_of(exc)
            try:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the connection is reopened (or refused) by the loop
            log.error("group of %d commands not committed: %s", len(decoded), condition or type(exc).__name__)
            raise GroupFailed(str(exc), condition) from exc
        if writes:
            self.groups_committed += 1
            faults.hit(faults.WRITER_AFTER_COMMIT)
        return replies + done, leftover

    def _end_reads(self) -> None:
        """End a group of reads. Nothing is committed, so a failing COMMIT loses nothing: the reads
        are answered (after a statement met damage, SQLite fails the COMMIT with it too)."""
        try:
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if condition_of(exc) == "databaseCorrupt":
                self.damage = self.damage or str(exc)

    def vacuum(self) -> None:
        """VACUUM between groups. It rebuilds the file and bumps SQLite's schema cookie without
        changing the schema, so the cookie the next group compares with is read again here."""
        self.conn.execute("VACUUM")
        self.schema_cookie = self._schema_cookie()

    def apply_local_effects(self) -> int:
        """The follow-up transaction of local effects (writer/local_effects.py); after the replies were sent."""
        return local_effects.apply_pending(self.conn, self.clock.now_ms(), self.projection)

    def _run_one(self, handler: Handler[Any], cmd: Any) -> Reply:
        conn = self.conn
        tx = Tx(conn, self.clock.now_ms(), cmd.actor)
        key = None if handler.read_only else (cmd.client_receipt or cmd.worker_message)
        if key is not None:
            try:
                stored = records.find_answer(conn, key)
            except CommandError as exc:  # the key names another request
                return refusal_reply(exc)
            if stored is not None:
                outcome = "adopted" if stored.outcome == "accepted" else stored.outcome
                return Reply(outcome=outcome, revision=stored.revision, receipt=stored.receipt, error=stored.error)
        conn.execute("SAVEPOINT command")
        try:
            result = handler.run(tx, cmd)
            if not handler.read_only:  # a read touches no row: nothing to project
                self.projection.project(conn, tx.now)
            answer = records.StoredAnswer("accepted", result.revision, result.receipt, None)
            self.damage = self.damage or result.damage
        except CommandError as exc:
            answer = records.StoredAnswer(exc.outcome, None, exc.receipt(), exc.message)
        except sqlite3.IntegrityError as exc:
            if _is_group_fatal(conn, exc):
                raise
            log.error("%s violated a constraint: %s", handler.kind, exc)
            refusal = CommandError("constraintViolation", "the command would break a database constraint")
            answer = records.StoredAnswer(refusal.outcome, None, refusal.receipt(), refusal.message)
        except sqlite3.Error:
            raise  # the executor decides whether the whole group is lost
        except Exception as exc:  # a handler bug answers this command only; not stored, so a fix can retry
            conn.execute("ROLLBACK TO command")
            conn.execute("RELEASE command")
            self.projection.settle(kept=False)
            log.error("%s failed inside the writer: %s", handler.kind, type(exc).__name__)
            return refusal_reply(CommandError("internalError", "the server failed on this command"))
        if answer.outcome != "accepted":
            conn.execute("ROLLBACK TO command")
        if key is not None and (answer.outcome == "accepted" or handler.stores_refusals):
            records.store_answer(conn, key, answer, tx.now)
        conn.execute("RELEASE command")
        self.projection.settle(kept=answer.outcome == "accepted")
        return Reply(outcome=answer.outcome, revision=answer.revision, receipt=answer.receipt, error=answer.error)


def refusal_reply(exc: CommandError) -> Reply:
    return Reply(outcome=exc.outcome, receipt=exc.receipt(), error=exc.message)


__all__ = ["GroupExecutor", "GroupFailed", "Submitted", "connect", "open_database", "refusal_reply"]

"""The writer process: the only process that opens state.sqlite.

::

    spawner (supervisor, tests, bench)          writer process
      spawn() ── socketpair + Popen ──────────> main(): create or verify schema
              <── "ready" | "fatal" ───────────  (nothing is answered before)
      Link.request ── command frames ─────────> drain all waiting frames
                                                GroupExecutor.run: one transaction
              <── "reply" frames ──────────────  only after COMMIT
              <── "viewer.advanced" ───────────  the runs whose views the commits changed

The writer exits when its pipe reaches EOF or when the process that spawned
it is gone (its psutil identity no longer matches), so it never outlives
its supervisor.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pydantic import ValidationError

from piworkflows import faults
from piworkflows.clock import Clock, SystemClock
from piworkflows.errors import CommandError, StateCorrupt, StateIncompatible, StatePathRefused
from piworkflows.paths import StatePaths
from piworkflows.protocol import domain, frames
from piworkflows.protocol.internal.state import StateBackup, StateCompact, StatePrune
from piworkflows.protocol.internal.writer import (
    Fatal,
    LogRecord,
    Ready,
    Reply,
    ViewerAdvanced,
    ViewerWatched,
    WriterHealth,
)
from piworkflows.protocol.link import AsyncLink, Link
from piworkflows.settings import Settings
from piworkflows.writer import backup, health, invariants, records, schema, viewer_notify
from piworkflows.writer.commands import REGISTRY
from piworkflows.writer.commands import state as state_commands
from piworkflows.writer.db import GroupExecutor, GroupFailed, Submitted, connect, open_database, refusal_reply
from piworkflows.writer.health import condition_of
from piworkflows.writer.reads import VIEW_READS, Reader

log = logging.getLogger("piworkflows.writer")

EXIT_INCOMPATIBLE = 3
EXIT_PARENT_GONE = 4
EXIT_DATABASE_LOST = 5
EXIT_BAD_FRAME = 6
_RECV_BYTES = 1 << 20
# Maintenance the loop runs one at a time, between write groups (never inside one).
MAINTENANCE_KINDS = frozenset({StateBackup.kind, StatePrune.kind, StateCompact.kind})
VACUUM_MIN_FREE = 0.2  # retention vacuums only when this share of the pages is free (and enough bytes)


class SharedSocket:
    """The writer's end of the link, shared by its threads (the loop, the reader, logging): each
    ``sendall`` (one frame, or the replies of a group) goes out whole."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def sendall(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)

    def recv(self, size: int, flags: int = 0) -> bytes:
        return self.sock.recv(size, flags)

    def fileno(self) -> int:
        return self.sock.fileno()


class PipeLogHandler(logging.Handler):
    """Sends log records to the supervisor, which writes the one bounded server log."""

    def __init__(self, sock: SharedSocket) -> None:
        super().__init__()
        self.sock = sock

    def emit(self, record: logging.LogRecord) -> None:
        try:
            body = LogRecord(level=record.levelno, message=domain.text(self.format(record))[:4096]).model_dump()
            frames.send(self.sock, LogRecord.kind, 0, body)
        except Exception:
            self.handleError(record)


class WriterLoop:
    def __init__(
        self,
        sock: SharedSocket,
        paths: StatePaths,
        settings: Settings,
        clock: Clock,
        parent: tuple[int, float] | None,
    ) -> None:
        self.sock = sock
        self.paths = paths
        self.settings = settings
        self.clock = clock
        self.parent = parent
        self.executor = GroupExecutor(open_database(paths, settings, clock), settings, clock)
        self.reader = Reader(paths, settings, clock, self._send_reply)  # clients' view reads (writer/reads.py)
        self.queue: collections.deque[Submitted] = collections.deque()
        self.decoder = frames.FrameDecoder()
        self.backups: collections.deque[Submitted] = collections.deque()  # state.backup, one at a time
        self.backing_up = False
        # What the writer can do now, as last told to the supervisor (HEALTH frames): None (commit),
        # diskFull or ioError (each write group fails until one commits), databaseCorrupt (every
        # write refused for the life of this writer: an operator restores or moves the file).
        self.health = WriterHealth(code=None)

    def serve(self) -> int:
        self._apply_local_effects()
        while True:
            if self.reader.damage is not None and self.health.code != "databaseCorrupt":
                self._tell_health("databaseCorrupt", self.reader.damage)  # a view read met a damaged file
            self.reader.ensure_alive()
            if not self.queue:
                readable, _, _ = select.select([self.sock], [], [], self.settings.parent_check_ms / 1000)
                if not readable:
                    if not self._parent_alive():
                        log.warning("the supervisor is gone; the writer exits")
                        return EXIT_PARENT_GONE
                    continue
            try:
                if not self._drain():
                    return 0
            except frames.FrameError as exc:
                log.error("malformed frame from the supervisor (%s); the writer exits", exc)
                return EXIT_BAD_FRAME
            if self.queue:
                try:
                    self._run_group()
                except OSError:
                    log.warning("the supervisor is gone; the writer exits")
                    return EXIT_PARENT_GONE
                except frames.FrameError as exc:  # read between the steps of a backup
                    log.error("malformed frame from the supervisor (%s); the writer exits", exc)
                    return EXIT_BAD_FRAME

    def _drain(self) -> bool:
        """Move every frame already waiting into the queue; False at EOF."""
        while True:
            try:
                data = self.sock.recv(_RECV_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            if not data:
                return False
            for frame in self.decoder.feed(data):
                body = frame["b"] if isinstance(frame.get("b"), dict) else {}
                item = Submitted(frame["id"], frame["k"], body)
                if item.kind == ViewerWatched.kind:  # a message: the projection's watched runs, no reply
                    self.executor.projection.watched = frozenset(ViewerWatched.model_validate(body).runs)
                elif item.kind in VIEW_READS:
                    self.reader.submit(item)
                else:
                    self.queue.append(item)
            if len(data) < _RECV_BYTES:
                return True  # a short read: nothing more was waiting

    def _run_group(self) -> None:
        batch = [item for item in self.queue if item.kind not in MAINTENANCE_KINDS]
        self.backups.extend(item for item in self.queue if item.kind in MAINTENANCE_KINDS)
        self.queue.clear()
        if batch:
            self._run_batch(batch)
        if self.backups and not self.backing_up:
            self.backing_up = True
            try:
                item = self.backups.popleft()
                if self.health.code == "databaseCorrupt":
                    self.sock.sendall(_encode_reply(item.corr_id, self._refusal("databaseCorrupt")))
                elif item.kind == StateBackup.kind:
                    self._backup(item)
                elif item.kind == StatePrune.kind:
                    self._prune(item)
                else:
                    reply = Reply(outcome="accepted", receipt=self._compact(vacuum_if_worth_it=True))
                    self.sock.sendall(_encode_reply(item.corr_id, reply))
            finally:
                self.backing_up = False
                state_commands.MAINTENANCE = None
        self._tell_viewer()

    def close(self) -> None:
        """The reader's connection first, then the writer's: the last one to close checkpoints the
        WAL and removes it (a read-only connection cannot)."""
        self.reader.stop()
        try:
            self.executor.conn.close()
        except sqlite3.Error as exc:  # a full disk: the WAL keeps every commit for the next open
            log.warning("the state database did not close cleanly: %s", condition_of(exc) or type(exc).__name__)

    def _send_reply(self, corr_id: int, reply: Reply) -> None:
        """A view read's reply: text an older build stored outside the domain shows as U+FFFD."""
        self.sock.sendall(_encode_reply(corr_id, reply, shown=True))

    def _tell_viewer(self) -> None:
        """The runs whose views the commits since the last call changed (writer/viewer_notify.py),
        with the ops they recorded for the watched runs."""
        patches = self.executor.projection.take()
        try:
            runs = viewer_notify.take(self.executor.conn)
        except sqlite3.Error as exc:  # the connection is being replaced: its watchers catch up later
            log.error("changed run views not read: %s", type(exc).__name__)
            return
        if runs:
            # the ops as the projection recorded them (RunOps fields): validated once, by the receiver
            try:
                frames.send(self.sock, ViewerAdvanced.kind, 0, {"runs": runs, "patches": patches})
            except frames.Unencodable as exc:  # a value an older build stored: the watchers resync
                log.error("the ops of changed run views could not be encoded (%s); their watchers resync", exc)
                frames.send(self.sock, ViewerAdvanced.kind, 0, {"runs": runs, "patches": {}})

    def _run_batch(self, batch: list[Submitted]) -> None:
        refused: list[tuple[int, Reply]] = []
        if self.health.code == "databaseCorrupt":  # reads still answered; no write is tried
            refused = [(item.corr_id, self._refusal("databaseCorrupt")) for item in batch if _writes(item)]
            batch = [item for item in batch if not _writes(item)]
        committed = self.executor.groups_committed
        try:
            replies, leftover = self.executor.run(batch) if batch else ([], [])
        except GroupFailed as failed:
            group = batch[: self.settings.group_max_commands]
            self._after_failure(failed)
            replies = [(item.corr_id, self._refusal(failed.condition)) for item in group]
            leftover = batch[len(group) :]
        else:
            if self.executor.damage is not None and self.health.code != "databaseCorrupt":
                self._tell_health("databaseCorrupt", self.executor.damage)
            elif self.executor.groups_committed != committed and self.health.code is not None:
                self._tell_health(None)  # a write group committed: the disk takes writes again
        self.queue.extendleft(reversed(leftover))
        self.sock.sendall(b"".join(_encode_reply(corr_id, reply) for corr_id, reply in refused + replies))
        faults.hit(faults.WRITER_AFTER_REPLY)
        self._apply_local_effects()

    def _tell_health(self, code: str | None, finding: str | None = None) -> None:
        """Record what the writer can do now and tell the supervisor when it changed (one log line)."""
        now = health.health(code, self.paths, finding)
        changed = now.code != self.health.code
        self.health = now  # unchanged: the newest free bytes, no new line
        if not changed:
            return
        if code == "databaseCorrupt":
            log.error("the state database is damaged (%s): every write is refused from now on", finding)
        elif code is not None:
            log.error("writes fail: %s", code)
        else:
            log.info("writes commit again")
        frames.send(self.sock, now.kind, 0, now.model_dump())

    def _refusal(self, code: str | None) -> Reply:
        return health.refusal(code, self.health.free_bytes)

    def _after_failure(self, failed: GroupFailed) -> None:
        """A group that did not commit: what it says of the disk or the file; a new connection
        unless the file is damaged (then the writer stays, refusing every write)."""
        if failed.condition is not None:
            self._tell_health(failed.condition)
        if self.health.code != "databaseCorrupt":
            self._reopen()

    def _backup(self, item: Submitted) -> None:
        """state.backup (writer/backup.py): groups keep running between the copy's steps; the
        receipt commits after the copy verified. A stored answer is adopted without a copy."""
        destination = self._new_copy(item, StateBackup, lambda cmd: cmd.destination)
        if destination is None:
            self._run_batch([item])  # adopted, or refused (not stored: a repeat is checked again)
            return
        done = self._copy(item, destination)
        if done is not None:
            self._run_batch([Submitted(item.corr_id, item.kind, {**item.body, "performed": done})])

    def _prune(self, item: Submitted) -> None:
        """state.prune: a dry run is one read; an apply makes and verifies its backup first (groups
        keep running between the copy's steps), then rechecks and deletes in a group of its own,
        then checkpoints the WAL, vacuums and checks integrity before it answers."""
        destination = self._new_copy(item, StatePrune, lambda cmd: cmd.backup_path if cmd.apply else None)
        if destination is None:
            self._run_batch([item])  # a dry run; adopted; or refused (not stored)
            return
        done = self._copy(item, destination)
        if done is None:
            return
        state_commands.MAINTENANCE = {"operation": "prune", "done": 0, "total": 1}
        item = Submitted(item.corr_id, item.kind, {**item.body, "performed_backup": done})
        try:
            [(corr_id, reply)], _ = self.executor.run([item])
        except GroupFailed as failed:
            self._after_failure(failed)
            self.sock.sendall(_encode_reply(item.corr_id, self._refusal(failed.condition)))
            return
        if reply.outcome == "accepted" and reply.receipt is not None:
            reply = reply.model_copy(update={"receipt": {**reply.receipt, **self._compact()}})
        self.sock.sendall(_encode_reply(corr_id, reply))
        self._apply_local_effects()

    def _new_copy(self, item: Submitted, model: type[Any], target: Callable[[Any], str | None]) -> Path | None:
        """Where a maintenance request wants its new copy, or None when the executor answers the
        request as it is: invalid (refused there, not stored), answered before (adopted), or
        one that copies nothing (a dry run)."""
        try:
            cmd = model.model_validate(item.body)
            path = target(cmd)
            if path is None:
                return None
            if cmd.client_receipt is not None and records.find_answer(self.executor.conn, cmd.client_receipt):
                return None
            checked: Path = backup.check_destination(path, self.paths.database)
            return checked
        except (ValidationError, CommandError):
            return None

    def _copy(self, item: Submitted, destination: Path) -> dict[str, Any] | None:
        """The verified copy (writer/backup.py), or None after answering unavailable: a failed copy is
        removed and not stored, so a retry with the same key copies again."""
        try:
            return backup.make_backup(
                self.executor.conn,
                destination,
                self.paths.database,
                self.clock.now_ms(),
                self.settings.backup_step_pages,
                self._between_backup_steps,
            )
        except (CommandError, sqlite3.Error, OSError) as exc:
            why = condition_of(exc) or type(exc).__name__
            log.error("a backup failed: %s", why)
            reply = health.unavailable(f"the backup failed ({why}); retry with the same key")
            self.sock.sendall(_encode_reply(item.corr_id, reply))
            return None

    def _compact(self, vacuum_if_worth_it: bool = False) -> dict[str, object]:
        """After a committed prune (or a retention sweep, while idle): truncate the WAL, measure,
        VACUUM (retention: only when at least 64 MiB and 20 percent of the pages are free), then
        integrity and foreign keys. A skipped or failed VACUUM undoes nothing: free pages are reused."""
        conn = self.executor.conn
        vacuumed = False
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages, free, size = (
                conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "freelist_count", "page_size")
            )
            worth_it = free * size >= self.settings.retention_vacuum_min_bytes and free >= VACUUM_MIN_FREE * pages
            if not vacuum_if_worth_it or worth_it:
                self.executor.vacuum()
                vacuumed = True
        except sqlite3.Error as exc:
            log.error("compacting the database failed: %s", type(exc).__name__)
        return {
            "vacuumed": vacuumed,
            "integrity": invariants.integrity(conn),
            "pageCount": conn.execute("PRAGMA page_count").fetchone()[0],
            "freelistCount": conn.execute("PRAGMA freelist_count").fetchone()[0],
            "pageSize": conn.execute("PRAGMA page_size").fetchone()[0],
        }

    def _between_backup_steps(self, done: int, total: int) -> None:
        """Between two steps of the copy: its progress for state.status, and the groups waiting."""
        state_commands.MAINTENANCE = {"operation": "backup", "done": done, "total": total}
        faults.hit(faults.WRITER_BACKUP_STEP)
        if not self._drain():
            raise OSError("the supervisor closed the pipe")
        while any(item.kind not in MAINTENANCE_KINDS for item in self.queue):
            self._run_group()

    def _apply_local_effects(self) -> None:
        """Right after the commit that created them (and at open: a crash may have come between)."""
        if self.health.code == "databaseCorrupt":
            return
        try:
            self.executor.apply_local_effects()
        except (sqlite3.Error, OSError) as exc:
            log.error("local effects not applied (they stay pending): %s", type(exc).__name__)
            if condition_of(exc) == "databaseCorrupt":
                self._tell_health("databaseCorrupt", str(exc))
            else:
                self._reopen()

    def _reopen(self) -> None:
        """After a failed transaction: close, reopen and verify the schema on the new connection (the
        file was verified when this writer started; no copy is made, so a full disk does not stop it)."""
        try:
            self.executor.conn.close()
        except sqlite3.Error:
            pass  # its last checkpoint may fail on a full disk; the WAL keeps every commit
        try:
            conn = connect(self.paths, self.settings)
            schema.check_open(self.paths, conn)
            self.executor = GroupExecutor(conn, self.settings, self.clock)
        except Exception as exc:
            log.error("the writer cannot reopen the state database: %s", condition_of(exc) or type(exc).__name__)
            raise SystemExit(EXIT_DATABASE_LOST) from None

    def _parent_alive(self) -> bool:
        if self.parent is None:
            return True
        pid, started_at = self.parent
        try:
            return psutil.Process(pid).create_time() == started_at
        except psutil.Error:
            return False


def _writes(item: Submitted) -> bool:
    """A command that would write (maintenance included); an unknown kind is refused by the executor."""
    handler = REGISTRY.get(item.kind)
    return item.kind in MAINTENANCE_KINDS or (handler is not None and not handler.read_only)


def _encode_reply(corr_id: int, reply: Reply, shown: bool = False) -> bytes:
    """The reply's frame. One that cannot be a frame fails that one request, never the writer: too
    large (``responseTooLarge``), or unencodable (``internalError``, its cause in the log: a value
    outside the protocol's domain that an older build stored, or a bug). A reply only ``shown`` to
    people (a view read) is sent with each lone surrogate as U+FFFD instead; a value that code
    would go on with (a runner's launch) is never changed."""
    body = reply.model_dump()
    try:
        return frames.encode(Reply.kind, corr_id, body)
    except frames.FrameTooLarge:
        log.error("a reply did not fit one frame")
        failed = CommandError("responseTooLarge", "the answer is larger than one message; ask for less")
    except frames.Unencodable as exc:
        log.error("a reply could not be encoded (%s)%s", exc, "; sent with U+FFFD for its text" if shown else "")
        if shown:
            try:
                return frames.encode(Reply.kind, corr_id, domain.texts(body))
            except frames.FrameError:
                pass
        failed = CommandError("internalError", "the server could not encode this answer; server.log says why")
    return frames.encode(Reply.kind, corr_id, refusal_reply(failed).model_dump())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m piworkflows.writer")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--parent-started-at", type=float)
    args = parser.parse_args(argv)
    # A terminal's Ctrl-C reaches the whole process group; the supervisor
    # decides when the writer stops (it closes the pipe, the writer finishes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = SharedSocket(socket.socket(fileno=args.fd))
    root = logging.getLogger("piworkflows")
    root.setLevel(logging.INFO)
    root.addHandler(PipeLogHandler(sock))
    paths = StatePaths.resolve(args.state_dir)
    parent = (args.parent_pid, args.parent_started_at) if args.parent_pid else None
    try:
        loop = WriterLoop(sock, paths, Settings.from_env(), SystemClock(), parent)
    except (StateIncompatible, StateCorrupt, StatePathRefused, OSError, sqlite3.Error) as exc:
        fatal = health.fatal(exc, paths)
        log.error(
            "the state database cannot be used: %s", exc.reason if isinstance(exc, StateIncompatible) else fatal.message
        )
        frames.send(sock, fatal.kind, 0, fatal.model_dump())
        return EXIT_INCOMPATIBLE
    ready = Ready(
        pid=os.getpid(),
        schema_name=schema.SCHEMA_NAME,
        schema_version=schema.SCHEMA_VERSION,
        ddl_sha256=schema.ddl_sha256(),
    )
    frames.send(sock, ready.kind, 0, ready.model_dump())
    try:
        return loop.serve()
    finally:
        loop.close()


class WriterStartError(RuntimeError):
    """The writer did not start. ``code``: the writer's reason (``Fatal.code``) when it gave one."""

    def __init__(self, message: str, code: str | None = None, free_bytes: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.free_bytes = free_bytes


@dataclass
class WriterProcess:
    """The spawner's handle: the child process and the link to it."""

    popen: subprocess.Popen[bytes]
    link: Link | AsyncLink
    ready: Ready

    def stop(self, timeout: float = 10.0) -> int:
        """Close the pipe (the writer finishes its group and exits), then reap it.
        (An AsyncLink must be closed on its loop first; then call ``reap``.)"""
        self.link.close()
        return self.reap(timeout)

    def reap(self, timeout: float = 10.0) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()


def spawn(
    state_dir: Path,
    settings: Settings,
    extra_env: dict[str, str] | None = None,
    event_loop_link: bool = False,
    on_started: Callable[[int], None] | None = None,
    on_health: Callable[[WriterHealth], None] | None = None,
    on_viewer: Callable[[ViewerAdvanced], None] | None = None,
) -> WriterProcess:
    """Start a writer and wait until it verified the schema (or refused it).

    ``on_started(pid)`` runs as soon as the process exists, before the
    handshake (the supervisor records the child's identity there).
    ``on_health`` gets what the writer can do whenever that changes, ``on_viewer`` the runs whose
    views its commits changed, with the ops of the watched runs (ignored without it). The link
    is a thread-read ``Link``, or with ``event_loop_link`` an ``AsyncLink``
    that the caller starts on its event loop.
    """
    ours, theirs = socket.socketpair()
    me = psutil.Process()
    env = {**os.environ, **settings.to_env(), **(extra_env or {})}
    popen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "piworkflows.writer",
            "--state-dir",
            str(state_dir),
            "--fd",
            str(theirs.fileno()),
            "--parent-pid",
            str(me.pid),
            "--parent-started-at",
            repr(me.create_time()),
        ],
        pass_fds=[theirs.fileno()],
        env=env,
    )
    theirs.close()
    decoder = frames.FrameDecoder()
    try:
        if on_started is not None:
            on_started(popen.pid)
        first = _handshake(ours, decoder, settings.child_ready_timeout_ms / 1000)
    except BaseException:
        ours.close()
        popen.kill()
        popen.wait()
        raise
    if first["k"] == Fatal.kind:
        ours.close()
        popen.wait()
        fatal = Fatal.model_validate(first["b"])
        if fatal.code == "stateIncompatible":
            raise StateIncompatible("reported by the writer")
        raise WriterStartError(fatal.message, fatal.code, fatal.free_bytes)

    def on_frame(frame: dict[str, Any]) -> None:
        if frame["k"] == WriterHealth.kind:
            if on_health is not None:
                on_health(WriterHealth.model_validate(frame["b"]))
        elif frame["k"] == ViewerAdvanced.kind:
            if on_viewer is not None:
                on_viewer(ViewerAdvanced.model_validate(frame["b"]))
        else:
            _relay_log(frame)

    link = (AsyncLink if event_loop_link else Link)(ours, on_frame=on_frame, decoder=decoder)
    return WriterProcess(popen, link, Ready.model_validate(first["b"]))


def _handshake(sock: socket.socket, decoder: frames.FrameDecoder, timeout: float) -> dict[str, Any]:
    """Wait for the ready or fatal frame, relaying the log records that come before it."""
    sock.settimeout(timeout)
    try:
        while True:
            received = frames.recv_frames(sock, decoder)
            if received is None:
                raise WriterStartError("the writer exited before it was ready")
            for index, frame in enumerate(received):
                if frame["k"] == LogRecord.kind:
                    _relay_log(frame)
                elif frame["k"] in (Ready.kind, Fatal.kind):
                    for later in received[index + 1 :]:
                        _relay_log(later)
                    return frame
                else:
                    raise WriterStartError("the writer's first frame was not a handshake")
    except TimeoutError as exc:
        raise WriterStartError("the writer did not become ready in time") from exc
    finally:
        sock.settimeout(None)


def _relay_log(frame: dict[str, Any]) -> None:
    """Write a writer's log record to this process's log (the server log)."""
    if frame["k"] == LogRecord.kind:
        record = LogRecord.model_validate(frame["b"])
        log.log(record.level, "writer: %s", record.message)

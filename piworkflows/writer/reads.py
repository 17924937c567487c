"""The writer process's reader: the reads of clients' views on a read-only connection of their own,
in a thread, so that a write group never waits for a view and a view never waits for a group.

::

    WriterLoop._drain ── kind in VIEW_READS ──> Reader.submit ── queue ──> reader thread
      its own connection (mode=ro, query_only): each read in its own read transaction, which sees
      the last commit (WAL); its reply frame sent whole on the shared link (``send``)
    a read that met a damaged file sets ``damage``: the loop tells the supervisor (health)

Only the operations of clients' views go here (run views and lists, logs, transcripts, content);
the reads of the server's own loops (the scheduler's, the agents') stay in the write groups, in
the order they were sent with its writes.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from urllib.parse import quote

from pydantic import ValidationError

from piworkflows.clock import Clock
from piworkflows.errors import CommandError, describe_invalid_fields
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal import COMMAND_MODELS
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.writer.commands import REGISTRY
from piworkflows.writer.contract import Tx
from piworkflows.writer.db import Submitted, refusal_reply
from piworkflows.writer.health import condition_of

log = logging.getLogger("piworkflows.writer")

VIEW_READS = frozenset(
    {
        "run.get",
        "run.list",
        "view.page",
        "view.patches",
        "view.session.get",
        "run.logs",
        "run.transcript",
        "run.content",
        "view.content",
    }
)
assert all(REGISTRY[kind].read_only for kind in VIEW_READS), "a view read never writes"


def connect_read_only(paths: StatePaths, settings: Settings) -> sqlite3.Connection:
    conn = sqlite3.connect(
        "file:" + quote(str(paths.database)) + "?mode=ro", uri=True, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA query_only = ON")
    conn.execute(f"PRAGMA busy_timeout = {settings.busy_timeout_ms}")
    return conn


class Reader:
    def __init__(self, paths: StatePaths, settings: Settings, clock: Clock, send: Callable[[int, Reply], None]) -> None:
        self.conn = connect_read_only(paths, settings)
        self.clock = clock
        self.send = send  # one reply frame, sent whole on the shared link
        self.damage: str | None = None  # what a read found damaged, for the loop to tell
        self.items: queue.Queue[Submitted | None] = queue.Queue()
        self.restarts = 0  # how often ensure_alive found the thread ended
        self.thread = self._start()

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._serve, name="writer-reader", daemon=True)
        thread.start()
        return thread

    def ensure_alive(self) -> bool:
        """The writer's loop asks before each wait: a thread that ended (a bug it could not answer)
        is started again on the same queue, so no read waits for ever. True when it had ended."""
        if self.thread.is_alive():
            return False
        self.restarts += 1
        log.error("the reader thread had ended; started again (restart %d)", self.restarts)
        self.thread = self._start()
        return True

    def submit(self, item: Submitted) -> None:
        self.items.put(item)

    def stop(self) -> None:
        """Answer what was submitted, then end the thread."""
        self.items.put(None)
        self.thread.join()
        self.conn.close()

    def _serve(self) -> None:
        try:
            self._serve_items()
        except BaseException as exc:
            log.error("the reader thread failed: %s: %s", type(exc).__name__, exc)
            raise

    def _serve_items(self) -> None:
        while (item := self.items.get()) is not None:
            try:
                reply = self.answer(item)
            except Exception as exc:  # a bug answers this read only
                log.error("%s failed in the reader: %s", item.kind, type(exc).__name__)
                reply = refusal_reply(CommandError("internalError", "the server failed on this read"))
            try:
                self.send(item.corr_id, reply)
            except OSError:
                return  # the supervisor is gone; the loop exits too

    def answer(self, item: Submitted) -> Reply:
        handler = REGISTRY[item.kind]
        try:
            cmd = COMMAND_MODELS[item.kind].model_validate(item.body)
        except ValidationError as exc:
            return refusal_reply(
                CommandError("validationFailed", "command has " + describe_invalid_fields(exc.errors()))
            )
        self.conn.execute("BEGIN")
        try:
            result = handler.run(Tx(self.conn, self.clock.now_ms(), cmd.actor), cmd)
            self.damage = self.damage or result.damage
            return Reply(outcome="accepted", revision=result.revision, receipt=result.receipt)
        except CommandError as exc:
            return refusal_reply(exc)
        except sqlite3.Error as exc:
            if condition_of(exc) == "databaseCorrupt":
                self.damage = self.damage or str(exc)
            log.error("%s could not be read: %s", item.kind, condition_of(exc) or type(exc).__name__)
            return refusal_reply(CommandError("unavailable", "the read failed; retry"))
        finally:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")  # nothing to keep: a read transaction

"""Frames of the writer's link (writer/process.py, protocol/link.py): its handshake, replies, log
records and health.

::

    writer ── ready Ready | fatal Fatal ──> supervisor      (the handshake: one of the two, first)
    writer ── reply Reply ──> supervisor                     (each command's answer, after its commit)
    writer ── log LogRecord ──> supervisor                   (written to the server log)
    writer ── health WriterHealth ──> supervisor             (its ability to commit changed)
    writer ── viewer.advanced ViewerAdvanced ──> supervisor  (run views a commit changed, after it,
                                                              with the ops of the watched runs)
    supervisor ── viewer.watched ViewerWatched ──> writer    (the runs whose ops it wants; no reply)

``Reply`` is also the body of every ``reply`` frame a supervisor sends a child
(a runner's or an outbox worker's request, relayed or answered).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import Frame, Model
from piworkflows.protocol.internal.values import Outcome, WriterHealthCode, WriterStartFailure


class Reply(Frame):
    """The writer's answer, sent only after the command's transaction committed."""

    kind: ClassVar[str] = "reply"
    outcome: Outcome
    revision: int | None = None
    receipt: dict[str, Any] | None = None
    error: str | None = None


class Ready(Frame):
    """The writer verified the schema and answers commands from now on."""

    kind: ClassVar[str] = "ready"
    pid: int
    schema_name: str
    schema_version: int
    ddl_sha256: bytes


class Fatal(Frame):
    """Why a writer cannot open the state database: ``stateIncompatible``, ``databaseCorrupt``,
    ``statePathRefused``, ``diskFull`` (with the free bytes it saw), ``ioError``, ``cannotOpen``."""

    kind: ClassVar[str] = "fatal"
    code: WriterStartFailure
    message: str
    free_bytes: int | None = None


class WriterHealth(Frame):
    """What the writer can do now, sent when it changes: commit (``code`` None); ``diskFull`` or
    ``ioError`` (each write group fails until one commits again); ``databaseCorrupt`` (every write
    refused, reads still answered). ``message`` is for server status and the log."""

    kind: ClassVar[str] = "health"
    code: WriterHealthCode | None
    message: str | None = None
    free_bytes: int | None = None


class LogRecord(Frame):
    """A child's log record, written to the server log by the supervisor."""

    kind: ClassVar[str] = "log"
    level: int
    message: str = Field(max_length=4096)


class RunOps(Model):
    """One committed presentation revision of a watched run (views/projection.py): its ops in order
    as canonical JSON (an array of ``{op, path, value}``), encoded once, by the writer."""

    run_id: str
    revision: int
    run_revision: int
    ops: bytes


class ViewerAdvanced(Frame):
    """Runs whose views the last commits changed (created, advanced or deleted), sent after the
    commit (writer/viewer_notify.py); the supervisor refreshes their watchers. ``patches``: the
    revisions those commits recorded for the runs last named by ``viewer.watched``, in commit order."""

    kind: ClassVar[str] = "viewer.advanced"
    runs: list[str]
    patches: list[RunOps] = []


class ViewerWatched(Frame):
    """The runs whose ops the supervisor wants in ``viewer.advanced`` from now on (it has patch
    watchers of them): the whole set each time. A message, not a command: no reply."""

    kind: ClassVar[str] = "viewer.watched"
    runs: list[str]

"""Frames of the writer's link (writer/process.py, protocol/link.py): its handshake, replies, log records and health."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from piworkflows.protocol.internal.base import Model
from piworkflows.protocol.internal.values import Outcome, WriterHealthCode, WriterStartFailure

READY = "ready"
FATAL = "fatal"
REPLY = "reply"
LOG = "log"  # a child's log record, written to the server log by the supervisor
HEALTH = "health"  # the writer's ability to commit changed (WriterHealth)


class Reply(Model):
    """The writer's answer, sent only after the command's transaction committed."""

    outcome: Outcome
    revision: int | None = None
    receipt: dict[str, Any] | None = None
    error: str | None = None


class Ready(Model):
    pid: int
    schema_name: str
    schema_version: int
    ddl_sha256: bytes


class Fatal(Model):
    """Why a writer cannot open the state database: ``stateIncompatible``, ``databaseCorrupt``,
    ``statePathRefused``, ``diskFull`` (with the free bytes it saw), ``ioError``, ``cannotOpen``."""

    code: WriterStartFailure
    message: str
    free_bytes: int | None = None


class WriterHealth(Model):
    """What the writer can do now, sent when it changes: commit (``code`` None); ``diskFull`` or
    ``ioError`` (each write group fails until one commits again); ``databaseCorrupt`` (every write
    refused, reads still answered). ``message`` is for server status and the log."""

    code: WriterHealthCode | None
    message: str | None = None
    free_bytes: int | None = None


class LogRecord(Model):
    level: int
    message: str = Field(max_length=4096)

"""The server log: ``host/server.log``, bounded and rotated, 0600.

Log lines name operations, outcomes, codes and process ids; never payloads,
receipts, tokens or frames. The file is opened without following a link and
only if it is this user's (``paths.open_private``). A line that cannot be
written (a full or failing disk) is dropped, never raised and never printed
as a traceback; the next line that can be written first says how many were
lost. Lines any client can cause go through a ``RateLimit`` per kind, so no
client can rotate the startup lines out. Children's own log records arrive as
LOG frames and are written with the child's role and pid (``relay_child_log``).
"""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from piworkflows import faults
from piworkflows.paths import StatePaths, open_private
from piworkflows.protocol.internal.writer import LogRecord
from piworkflows.settings import Settings

FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.lost = 0  # lines dropped since the last line written
        self.lost_reason = ""
        self._error: BaseException | None = None

    def _open(self):  # type: ignore[no-untyped-def]
        fd = open_private(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND, create=True)
        return os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")

    def emit(self, record: logging.LogRecord) -> None:
        """Write the line, after a note of the lines lost before it; count it when it cannot be."""
        if self.lost:
            note = logging.LogRecord(
                record.name,
                logging.WARNING,
                __file__,
                0,
                "%d log lines were lost (%s)",
                (self.lost, self.lost_reason),
                None,
            )
            if self._write(note):
                self.lost = 0
        if self.lost or not self._write(record):
            self.lost += 1

    def _write(self, record: logging.LogRecord) -> bool:
        self._error = None
        try:
            faults.hit(faults.SUPERVISOR_LOG_WRITE)
            super().emit(record)  # a failed write reaches handleError, not here
        except Exception as exc:
            self._error = exc
        if self._error is None:
            return True
        error = self._error
        self.lost_reason = os.strerror(error.errno) if isinstance(error, OSError) and error.errno else "write failed"
        if isinstance(error, OSError):
            try:  # reopened by the next line (a full disk may leave a half-written buffer behind)
                self.close()
            except Exception:
                pass
        return False

    def handleError(self, record: logging.LogRecord) -> None:
        """Never raised or printed with a traceback: ``_write`` counts the line as lost."""
        self._error = sys.exc_info()[1] or RuntimeError("write failed")


def configure(paths: StatePaths, settings: Settings, to_stderr: bool) -> None:
    root = logging.getLogger("piworkflows")
    root.setLevel(logging.INFO)
    root.handlers.clear()
    file_handler = PrivateRotatingFileHandler(
        paths.log, maxBytes=settings.log_max_bytes, backupCount=settings.log_backups
    )
    file_handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(file_handler)
    if to_stderr:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(stream)


def relay_child_log(role: str, pid: int, body: Any) -> None:
    """A child's own log record (a LOG frame: protocol/child_log.py) into server.log, with the
    child's role and pid; the record is the child's package code's, never workflow data."""
    logger = logging.getLogger("piworkflows." + role.split()[0])
    try:
        record = LogRecord.model_validate(body)
    except ValidationError:
        logger.warning("%s %d sent a malformed log record", role, pid)
        return
    logger.log(min(max(record.level, logging.DEBUG), logging.CRITICAL), "%s %d: %s", role, pid, record.message)


def log_failure(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """An unexpected failure: the exception type and where it happened, never its
    message (a message may quote client input)."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("%s: %s\n%s", what, type(exc).__name__, frames.rstrip())


class RateLimit:
    """At most ``lines`` log lines of each kind per ``interval`` seconds (asyncio loop time).

    ``allow(kind)`` says whether the caller may write its line; a refused one is counted, and when
    its interval ends one line says how many lines of that kind were suppressed.
    """

    def __init__(self, logger: logging.Logger, lines: int, interval: float) -> None:
        self.logger = logger
        self.lines = lines
        self.interval = interval
        self._windows: dict[str, _Window] = {}

    def allow(self, kind: str) -> bool:
        loop = asyncio.get_running_loop()
        now = loop.time()
        window = self._windows.get(kind)
        if window is not None and now >= window.start + self.interval:
            self._end(kind, window)
            window = None
        if window is None:
            window = self._windows[kind] = _Window(now)
        if window.written < self.lines:
            window.written += 1
            return True
        window.suppressed += 1
        if window.suppressed == 1:
            loop.call_at(window.start + self.interval, self._end, kind, window)
        return False

    def _end(self, kind: str, window: _Window) -> None:
        if self._windows.get(kind) is not window:
            return  # already ended
        del self._windows[kind]
        if window.suppressed:
            self.logger.warning("suppressed %d similar lines (%s)", window.suppressed, kind)


@dataclass
class _Window:
    start: float
    written: int = 0
    suppressed: int = 0

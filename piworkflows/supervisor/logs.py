"""The server log: ``host/server.log``, bounded and rotated, 0600.

Log lines name operations, outcomes, codes and process ids; never payloads,
receipts, tokens or frames. Lines any client can cause go through a
``RateLimit`` per kind, so no client can rotate the startup lines out.
"""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import os
import sys
import traceback
from dataclasses import dataclass

from piworkflows.paths import FILE_MODE, StatePaths
from piworkflows.settings import Settings

FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    def _open(self):  # type: ignore[no-untyped-def]
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        return os.fdopen(fd, "a", encoding="utf-8")


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

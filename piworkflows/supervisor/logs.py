"""The server log: ``host/server.log``, bounded and rotated, 0600.

Log lines name operations, outcomes, codes and process ids; never payloads,
receipts, tokens or frames.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import traceback

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

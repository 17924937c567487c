"""A child's own log records, sent to its supervisor as log frames (LogRecord) on its frame channel.

::

    runner, resolver, outbox worker child
      logging.getLogger("piworkflows.…") ── FrameLogHandler ── LOG {level, message} (id 0)
        on stdout, between its other frames ──> supervisor ── server.log:
        "<role> <pid>: <message>" (supervisor/logs.py relay_child_log)

Only the package's own loggers are relayed (``piworkflows``, INFO and up); their
records name ids, codes and exception types, never payloads, tokens or request
bodies. Workflow code's prints, tracebacks and logging go to stderr instead, of
which the supervisor keeps only the last lines (supervisor/stderr.py). The
writer relays its records the same way over its socketpair (writer/process.py).
"""

from __future__ import annotations

import logging
from typing import BinaryIO

from piworkflows.protocol import frames
from piworkflows.protocol.internal.writer import LogRecord

MAX_MESSAGE_CHARS = 4096  # LogRecord.message's bound


class FrameLogHandler(logging.Handler):
    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            body = LogRecord(level=record.levelno, message=self.format(record)[:MAX_MESSAGE_CHARS]).model_dump()
            # One write per frame: a buffered stream writes it whole, never interleaved with a frame
            # another thread writes.
            self.stream.write(frames.encode(LogRecord.kind, 0, body))
            self.stream.flush()
        except Exception:
            self.handleError(record)


def relay_logs(stream: BinaryIO) -> None:
    """Send this child's package log records (INFO and up) to its supervisor on ``stream``."""
    logger = logging.getLogger("piworkflows")
    logger.setLevel(logging.INFO)
    logger.addHandler(FrameLogHandler(stream))
    logger.propagate = False  # not to stderr as well (a root handler that workflow code set up)

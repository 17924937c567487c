"""A child's own log records become LOG frames on its frame channel (protocol/child_log.py)."""

from __future__ import annotations

import io
import logging

import pytest

from piworkflows.protocol import frames
from piworkflows.protocol.child_log import MAX_MESSAGE_CHARS, FrameLogHandler
from piworkflows.protocol.internal.writer import LogRecord

pytestmark = pytest.mark.timeout(30)


def test_each_record_is_one_bounded_log_frame():
    channel = io.BytesIO()
    logger = logging.getLogger("piworkflows.tests.child_log")
    logger.propagate = False
    handler = FrameLogHandler(channel)  # type: ignore[arg-type]
    logger.addHandler(handler)
    try:
        logger.warning("effect %s: the %s performer failed (%s)", "effect-1", "shell.exec", "ValueError")
        logger.error("x" * (MAX_MESSAGE_CHARS + 100))
    finally:
        logger.removeHandler(handler)
    sent = frames.FrameDecoder().feed(channel.getvalue())
    assert [(frame["k"], frame["id"]) for frame in sent] == [(LogRecord.kind, 0), (LogRecord.kind, 0)]
    first, second = (LogRecord.model_validate(frame["b"]) for frame in sent)
    assert (first.level, first.message) == (
        logging.WARNING,
        "effect effect-1: the shell.exec performer failed (ValueError)",
    )
    assert (second.level, second.message) == (logging.ERROR, "x" * MAX_MESSAGE_CHARS)

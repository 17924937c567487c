"""A database that already holds a value outside the protocol's domain (an older build let a lone
surrogate in) is served: a reply that cannot be a frame fails that one request, never the writer;
a view read shows the text with U+FFFD; ``state verify`` names the value; a reader thread that
ended is started again."""

from __future__ import annotations

import hashlib
import threading

import pytest

from piworkflows.protocol import frames
from piworkflows.protocol.internal.writer import Reply
from piworkflows.states import MEDIA_JSON
from piworkflows.writer import invariants
from piworkflows.writer.db import Submitted
from piworkflows.writer.process import _encode_reply
from piworkflows.writer.reads import Reader
from tests.support import run_create, run_group, take_epoch

pytestmark = pytest.mark.timeout(60)

POISON = b'{"continue":"\\ud800"}'


def decoded(data: bytes) -> Reply:
    (frame,) = frames.FrameDecoder().feed(data)
    return Reply.model_validate(frame["b"])


def test_a_reply_that_cannot_be_encoded_fails_that_request_with_internal_error():
    reply = Reply(outcome="accepted", receipt={"answer": {"continue": "\ud800"}})
    failed = decoded(_encode_reply(7, reply))
    assert failed.outcome == "rejected" and failed.receipt == {"code": "internalError"}
    assert "server.log" in (failed.error or "")


def test_a_view_read_shows_such_text_with_the_replacement_character():
    reply = Reply(outcome="accepted", receipt={"answer": {"continue": "\ud800"}})
    shown = decoded(_encode_reply(7, reply, shown=True))
    assert shown.outcome == "accepted" and shown.receipt == {"answer": {"continue": "\ufffd"}}


def test_state_verify_names_each_value_outside_the_domain(executor, clock):
    run_group(executor, take_epoch(), run_create("run-1"))
    conn = executor.conn
    literal = b'{"text":"\\\\ud800"}'  # a backslash and "ud800": plain text, in the domain
    for data in (POISON, literal):
        conn.execute(
            "INSERT INTO blobs (digest, media_type, byte_length, bytes, created_at) VALUES (?, ?, ?, ?, 0)",
            (hashlib.sha256(data).digest(), MEDIA_JSON, len(data), data),
        )
    report, damaged = invariants.verify(conn, clock.now_ms())
    assert damaged == [] and not report["ok"]
    assert report["violations"] == {"valueOutsideDomain": ["sha256:" + hashlib.sha256(POISON).hexdigest()]}
    assert invariants.violations(conn, clock.now_ms()) == {}  # not part of state.status: it reads every value


def test_a_reader_thread_that_ended_is_started_again_and_answers(paths, settings, clock, executor):
    answered = threading.Event()
    reader = Reader(paths, settings, clock, lambda corr_id, reply: answered.set())
    try:
        reader.items.put(None)  # ends the thread as a failure would
        reader.thread.join(timeout=10)
        assert not reader.thread.is_alive()
        assert reader.ensure_alive() and reader.restarts == 1
        assert not reader.ensure_alive()
        reader.submit(Submitted(1, "run.list", {"actor": {"actor_class": "client"}}))
        assert answered.wait(10)
    finally:
        reader.stop()

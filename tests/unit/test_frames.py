"""Internal frames: length-prefixed msgpack, bounded, refused when malformed."""

from __future__ import annotations

import struct

import msgpack
import pytest

from piworkflows.protocol import frames
from piworkflows.protocol.internal.base import MAX_FRAME_BYTES
from piworkflows.protocol.internal.writer import Reply
from piworkflows.writer.process import _encode_reply

pytestmark = pytest.mark.timeout(30)


def test_frames_round_trip_in_any_chunking():
    data = b"".join(frames.encode("k", n, {"n": n, "blob": b"\x00" * n}) for n in range(50))
    for step in (1, 7, 4096, len(data)):
        decoder = frames.FrameDecoder()
        got = [f for i in range(0, len(data), step) for f in decoder.feed(data[i : i + step])]
        assert [f["id"] for f in got] == list(range(50)) and got[49]["b"]["blob"] == b"\x00" * 49
        assert decoder.pending_bytes == 0


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack(">I", MAX_FRAME_BYTES + 1),  # announced oversize
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",  # not msgpack
        struct.pack(">I", len(msgpack.packb([1]))) + msgpack.packb([1]),  # not a map
        struct.pack(">I", len(msgpack.packb({"k": 1, "id": 1}))) + msgpack.packb({"k": 1, "id": 1}),  # k not a str
    ],
)
def test_malformed_frames_are_refused(raw):
    with pytest.raises(frames.FrameError):
        frames.FrameDecoder().feed(raw)


def test_an_oversized_frame_is_not_encoded():
    with pytest.raises(frames.FrameError):
        frames.encode("k", 1, {"data": b"x" * MAX_FRAME_BYTES})


def test_a_reply_larger_than_one_frame_becomes_a_refusal():
    (frame,) = frames.FrameDecoder().feed(_encode_reply(7, Reply(outcome="accepted", receipt={"d": b"x" * 2_000_000})))
    assert frame["id"] == 7
    assert frame["b"]["outcome"] == "rejected" and frame["b"]["receipt"] == {"code": "responseTooLarge"}

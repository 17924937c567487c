"""Length-prefixed msgpack frames over a stream socket between processes.

A frame is ``4-byte big-endian length + msgpack {"k": kind, "id": n, "b": body}``,
at most ``MAX_FRAME_BYTES``. ``FrameDecoder`` turns received bytes into
frames and refuses oversized or malformed ones (the connection is then
closed by its owner).
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Protocol

import msgpack

from piworkflows.protocol.internal.base import MAX_FRAME_BYTES

_HEADER = struct.Struct(">I")


class FrameError(Exception):
    """A peer sent something that is not a valid frame, or a body cannot be one."""


class FrameTooLarge(FrameError):
    """A body that encodes to more than one frame holds."""


class Unencodable(FrameError):
    """A body msgpack cannot encode: a lone surrogate in a string, nesting past msgpack's limit,
    an integer past 64 bits, an object that is not data. Raised before anything is sent."""


def encode(kind: str, corr_id: int, body: Any) -> bytes:
    try:
        payload = msgpack.packb({"k": kind, "id": corr_id, "b": body}, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        raise Unencodable(f"a {kind} body cannot be encoded: {type(exc).__name__}: {exc}"[:500]) from None
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(payload)) + payload


class Sender(Protocol):
    def sendall(self, data: bytes, /) -> Any: ...


def send(sock: Sender, kind: str, corr_id: int, body: Any) -> None:
    sock.sendall(encode(kind, corr_id, body))


class FrameDecoder:
    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME_BYTES:
                raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            if len(self._buffer) < _HEADER.size + length:
                break
            payload = bytes(self._buffer[_HEADER.size : _HEADER.size + length])
            del self._buffer[: _HEADER.size + length]
            try:
                frame = msgpack.unpackb(payload, raw=False, strict_map_key=True)
            except Exception as exc:  # msgpack raises several unrelated types
                raise FrameError("undecodable frame") from exc
            if (
                not isinstance(frame, dict)
                or not isinstance(frame.get("k"), str)
                or not isinstance(frame.get("id"), int)
            ):
                raise FrameError("a frame is a map with a string 'k' and an integer 'id'")
            frames.append(frame)
        return frames

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)


def recv_frames(sock: socket.socket, decoder: FrameDecoder, bufsize: int = 1 << 16) -> list[dict[str, Any]] | None:
    """Read what is available (the socket may be blocking); None at EOF."""
    data = sock.recv(bufsize)
    if not data:
        return None
    return decoder.feed(data)

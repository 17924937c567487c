"""Request/reply over one frame socket to a child process.

::

    request(kind, body) ─> frame id=n ─────────────> child process
    Future n  <── resolved by the reader <── frame "reply" id=n

Two readers share one correlation core: ``Link`` reads in a thread (tests,
tools, any thread may submit) and ``AsyncLink`` reads on an asyncio event
loop (the supervisor). When the peer dies or the link closes, every request
still waiting gets an ``unavailable`` reply: an in-flight command may or may
not have committed, so the caller retries with the same idempotency key,
never a guess.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from piworkflows.protocol import frames
from piworkflows.protocol.internal.writer import Reply

log = logging.getLogger("piworkflows.link")

LOST = Reply(outcome="unavailable", receipt={"code": "writerRestarting"}, error="the writer is not available")


def unsent(exc: frames.Unencodable) -> Reply:
    """The answer to a request whose body could not be a frame: nothing was sent, so nothing was
    done; the cause goes to the sender's log, never to the client."""
    log.error("a request was not sent (%s)", exc)
    return Reply(
        outcome="rejected", receipt={"code": "internalError"}, error="the server could not pass this request on"
    )


FrameCallback = Callable[[dict[str, Any]], None]


class _Correlator:
    """Pending requests by correlation id; the reply, or LOST for all once closed."""

    def __init__(self, on_frame: FrameCallback | None, decoder: frames.FrameDecoder | None) -> None:
        self._on_frame = on_frame  # non-reply frames (log records, notices) go here
        self._decoder = decoder or frames.FrameDecoder()  # may hold bytes read by a handshake
        self._ids = itertools.count(1)
        self._pending: dict[int, Any] = {}  # Future (either kind)
        self._lock = threading.Lock()
        self._closed = False

    def _register(self, future: Any) -> int | None:
        with self._lock:
            if self._closed:
                return None
            corr_id = next(self._ids)
            self._pending[corr_id] = future
            return corr_id

    def _encode(self, kind: str, corr_id: int, body: dict[str, Any], future: Any) -> bytes | None:
        """The request's frame; None when its body cannot be one (nothing is sent: ``future`` is
        answered with the refusal and forgotten)."""
        try:
            return frames.encode(kind, corr_id, body)
        except frames.Unencodable as exc:
            with self._lock:
                self._pending.pop(corr_id, None)
            future.set_result(unsent(exc))
            return None

    def _received(self, data: bytes) -> None:
        """Resolve the futures of the replies in ``data``; raises FrameError."""
        for frame in self._decoder.feed(data):
            if frame["k"] == Reply.kind:
                with self._lock:
                    future = self._pending.pop(frame["id"], None)
                if future is not None and not future.done():
                    future.set_result(Reply.model_validate(frame["b"]))
            elif self._on_frame is not None:
                self._on_frame(frame)

    def _fail_all(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_result(LOST)

    @property
    def closed(self) -> bool:
        return self._closed


class Link(_Correlator):
    """Read by its own thread; any thread may submit."""

    def __init__(
        self, sock: socket.socket, on_frame: FrameCallback | None = None, decoder: frames.FrameDecoder | None = None
    ) -> None:
        super().__init__(on_frame, decoder)
        self._sock = sock
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="link-reader", daemon=True)
        self._reader.start()

    def submit(self, kind: str, body: dict[str, Any]) -> Future[Reply]:
        future: Future[Reply] = Future()
        corr_id = self._register(future)
        if corr_id is None:
            future.set_result(LOST)
            return future
        data = self._encode(kind, corr_id, body, future)
        if data is None:
            return future
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError:
            self._fail_all()
        return future

    def request(self, kind: str, body: dict[str, Any], timeout: float | None = None) -> Reply:
        return self.submit(kind, body).result(timeout)

    def tell(self, kind: str, body: dict[str, Any]) -> None:
        """A message that gets no reply (correlation id 0), in order with the requests around it."""
        try:
            with self._send_lock:
                self._sock.sendall(frames.encode(kind, 0, body))
        except OSError:
            self._fail_all()

    def _read_loop(self) -> None:
        try:
            while data := self._sock.recv(1 << 16):
                self._received(data)
        except (OSError, frames.FrameError):
            pass
        finally:
            self._fail_all()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=5)
        self._fail_all()


class AsyncLink(_Correlator):
    """Read by an asyncio event loop itself; submit from that loop only.

    Replies resolve futures on the loop directly, without a reader thread and
    a thread hop per reply. Commands submitted in one turn of the loop leave
    in one write, so the writer finds them waiting together and commits them
    as one group.
    """

    def __init__(
        self, sock: socket.socket, on_frame: FrameCallback | None = None, decoder: frames.FrameDecoder | None = None
    ) -> None:
        super().__init__(on_frame, decoder)
        self._sock = sock
        self._transport: asyncio.Transport | None = None
        self._outgoing: list[bytes] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.connect_accepted_socket(lambda: _LinkProtocol(self), sock=self._sock)

    def submit(self, kind: str, body: dict[str, Any]) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        corr_id = self._register(future) if self._transport is not None else None
        if corr_id is None:
            future.set_result(LOST)
            return future
        data = self._encode(kind, corr_id, body, future)
        if data is None:
            return future
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(data)
        return future

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        return await self.submit(kind, body)

    def tell(self, kind: str, body: dict[str, Any]) -> None:
        """A message that gets no reply (correlation id 0), in order with the requests around it."""
        if self._transport is None or self._closed:
            return
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(frames.encode(kind, 0, body))

    def _flush(self) -> None:
        data, self._outgoing = b"".join(self._outgoing), []
        if self._transport is not None and not self._closed:
            self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        else:
            self._sock.close()
        self._fail_all()


class _LinkProtocol(asyncio.Protocol):
    def __init__(self, link: AsyncLink) -> None:
        self.link = link

    def data_received(self, data: bytes) -> None:
        try:
            self.link._received(data)
        except frames.FrameError:
            self.link.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._fail_all()

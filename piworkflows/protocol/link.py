"""Request/reply over one frame socket, shared by many threads.

::

    thread A ─┐ request(kind, body) ─> frame id=n ─┐
    thread B ─┘   waits on its Future              ├─> child process
                reader thread <─ frame "reply" id=n ┘   resolves Future n

When the peer dies or the link closes, every request still waiting gets an
``unavailable`` reply: an in-flight command may or may not have committed,
so the caller retries with the same idempotency key, never a guess.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from piworkflows.protocol import frames
from piworkflows.protocol.internal import REPLY, Reply

LOST = Reply(outcome="unavailable", receipt={"code": "writerRestarting"}, error="the writer is not available")


class Link:
    def __init__(
        self,
        sock: socket.socket,
        on_frame: Callable[[dict[str, Any]], None] | None = None,
        decoder: frames.FrameDecoder | None = None,
    ) -> None:
        self._sock = sock
        self._decoder = decoder or frames.FrameDecoder()  # may hold bytes read by a handshake
        self._on_frame = on_frame  # non-reply frames (notices) go here
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Reply]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name="link-reader", daemon=True)
        self._reader.start()

    def submit(self, kind: str, body: dict[str, Any]) -> Future[Reply]:
        future: Future[Reply] = Future()
        with self._lock:
            if self._closed:
                future.set_result(LOST)
                return future
            corr_id = next(self._ids)
            self._pending[corr_id] = future
        data = frames.encode(kind, corr_id, body)
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError:
            self._fail_all()
        return future

    def request(self, kind: str, body: dict[str, Any], timeout: float | None = None) -> Reply:
        return self.submit(kind, body).result(timeout)

    def _read_loop(self) -> None:
        try:
            while True:
                received = frames.recv_frames(self._sock, self._decoder)
                if received is None:
                    break
                for frame in received:
                    if frame["k"] == REPLY:
                        with self._lock:
                            future = self._pending.pop(frame["id"], None)
                        if future is not None:
                            future.set_result(Reply.model_validate(frame["b"]))
                    elif self._on_frame is not None:
                        self._on_frame(frame)
        except (OSError, frames.FrameError):
            pass
        finally:
            self._fail_all()

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

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=5)
        self._fail_all()

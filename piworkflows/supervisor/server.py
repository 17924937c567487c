"""The client socket: ``host/host.sock``, protocol ``pi-workflows.client.v1``.

::

    accept ── peer uid check (SO_PEERCRED) ── hello ──┐
    readline (<= 1 MiB) ── parse_request ─────────────┤ malformed: close this
         │                                            │ connection only
         └─> task: router.handle(request) ─> response (canonical line)
    unsent output above the bound: the slow client is dropped, others go on

Each connection handles up to ``client_max_in_flight`` requests at once;
responses may come back in another order than the requests (``requestId``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from piworkflows import __version__, faults
from piworkflows.errors import CommandError
from piworkflows.paths import FILE_MODE, SOCKET_PATH_LIMIT
from piworkflows.protocol import client_v1
from piworkflows.settings import Settings
from piworkflows.supervisor.logs import log_failure

log = logging.getLogger("piworkflows.supervisor")

PeerCheck = Callable[[int], bool]
Handler = Callable[[client_v1.Request], Awaitable[client_v1.Response]]


class SocketPathTooLong(Exception):
    pass


def same_user(uid: int) -> bool:
    return uid == os.getuid()


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def check_socket_path(path: Path) -> None:
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_LIMIT:
        raise SocketPathTooLong(
            f"the socket path {path} is {size} bytes; the platform limit is {SOCKET_PATH_LIMIT} bytes. "
            "Choose a shorter state dir (--state-dir or PI_WORKFLOWS_STATE_DIR)."
        )


class ClientServer:
    def __init__(self, path: Path, settings: Settings, handler: Handler, peer_check: PeerCheck = same_user) -> None:
        self.path = path
        self.settings = settings
        self.handler = handler
        self.peer_check = peer_check
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections: set[Connection] = set()

    async def start(self) -> None:
        check_socket_path(self.path)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # stale: we hold the lock, so no live server owns it
        old_umask = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._accept, path=str(self.path), limit=client_v1.MAX_MESSAGE_BYTES
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.path, FILE_MODE)

    async def close(self) -> None:
        """Stop accepting, let in-flight requests finish, then drop the connections."""
        if self._server is not None:
            self._server.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.settings.stop_grace_ms / 1000)
        for connection in list(self.connections):
            connection.writer.close()  # flushes what was already written
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        faults.hit(faults.SUPERVISOR_SOCKET_CLOSED)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            if not self.peer_check(peer_uid(sock)):
                log.warning("refused a connection from another user")
                writer.close()
                return
            await Connection(self, reader, writer).serve()
        except Exception as exc:  # one connection's failure never reaches the server
            log_failure(log, "a connection failed", exc)
        finally:
            writer.close()


class Connection:
    def __init__(self, server: ClientServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.id = "conn-" + uuid.uuid4().hex
        self.in_flight: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(server.settings.client_max_in_flight)
        self.closed = False

    def send(self, envelope: client_v1.Envelope) -> None:
        if self.closed:
            return
        self.writer.write(client_v1.encode(envelope))
        if self.writer.transport.get_write_buffer_size() > self.server.settings.client_output_buffer_bytes:
            log.warning("dropped a client that does not read its responses")
            self.close()

    def close(self) -> None:
        self.closed = True
        self.writer.transport.abort()

    async def serve(self) -> None:
        self.server.connections.add(self)
        try:
            self.send(client_v1.Hello(connectionId=self.id, packageVersion=__version__))
            while not self.closed:
                try:
                    line = await self.reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    log.info("closed a connection: message exceeds 1 MiB")
                    return
                if not line:  # EOF (perhaps a half-close): answer what was asked, then close
                    if self.tasks:
                        await asyncio.wait(self.tasks)
                    return
                try:
                    request = client_v1.parse_request(line)
                except client_v1.MalformedFrame as exc:
                    log.info("closed a connection: %s", exc)  # never the frame itself
                    return
                if request.requestId in self.in_flight:
                    refusal = CommandError("requestInFlight", "this requestId is still in flight on this connection")
                    self.send(response(request, refusal))
                    continue
                await self.slots.acquire()
                self.in_flight.add(request.requestId)
                task = asyncio.create_task(self._handle(request))
                for owner in (self.server._tasks, self.tasks):
                    owner.add(task)
                    task.add_done_callback(owner.discard)
        finally:
            self.server.connections.discard(self)
            self.closed = True

    async def _handle(self, request: client_v1.Request) -> None:
        try:
            self.send(await self.server.handler(request))
        except Exception as exc:
            log_failure(log, f"{request.operation} failed", exc)
            self.send(response(request, CommandError("unavailable", "the server could not answer; retry")))
        finally:
            self.in_flight.discard(request.requestId)
            self.slots.release()


def response(request: client_v1.Request, refusal: CommandError) -> client_v1.Response:
    return client_v1.Response(
        requestId=request.requestId, outcome=refusal.outcome, receipt=refusal.receipt(), error=refusal.message
    )

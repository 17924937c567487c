"""The client socket: ``host/host.sock``, protocol ``pi-workflows.client.v1``.

::

    accept ── peer uid check (SO_PEERCRED) ── at the connection bound: one refused line, close
      └─ hello ── read chunks ── complete lines (<= 1 MiB) ── parse_request ──┐ malformed: close
                      │                                                       │ this connection only
                      │ the rest (a partial frame) counts against client_partial_bytes_max of all
                      │ connections and must complete within frame_timeout_ms; nothing pending
                      │ and no byte for idle_timeout_ms: close
                      └─> task: router.handle(request) ─> response (canonical line)
    unsent output above the bound: the slow client is dropped, others go on
    live-view watches (supervisor/views.py): events past EVENT_BUFFER_BYTES unsent wait; a closed
    connection's watches end (``on_close``)

Each connection handles up to ``client_max_in_flight`` requests at once;
responses may come back in another order than the requests (``requestId``).
What a client can cause is logged as one line without a traceback (a failing
request handler keeps its traceback), at most ``connection_log_lines`` of each
kind per interval (``logs.RateLimit``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
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
from piworkflows.supervisor.logs import RateLimit, log_failure
from piworkflows.supervisor.views import EVENT_BUFFER_BYTES, subscriber

log = logging.getLogger("piworkflows.supervisor")

PeerCheck = Callable[[int], bool]
Handler = Callable[[client_v1.Request], Awaitable[client_v1.Response]]

# File descriptors the server keeps beyond its client connections: stdio, the log, the lock, the
# listening socket, the event loop and the transient pipes of a spawn; and the pipes of each child.
FD_RESERVE = 64
FDS_PER_CHILD = 4
# One read from a connection; also the stream's limit, which bounds the unread input of a
# connection whose request slots are all taken (the transport pauses at twice the limit).
READ_CHUNK = 64 * 1024
TOO_MANY_CONNECTIONS = "the server has too many open connections; retry later"


class SocketPathTooLong(Exception):
    pass


def same_user(uid: int) -> bool:
    return uid == os.getuid()


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def check_socket_path(path: Path) -> None:
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_LIMIT:
        raise SocketPathTooLong(
            f"the socket path {path} is {size} bytes; the platform limit is {SOCKET_PATH_LIMIT} bytes. "
            "Choose a shorter state dir (--state-dir or PI_WORKFLOWS_STATE_DIR)."
        )


def fd_limit() -> int | None:
    """This process's soft RLIMIT_NOFILE (None: unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_bound(settings: Settings, fd_limit: int | None) -> int:
    """max_connections, or fewer so that the connections leave the server the descriptors it needs."""
    if fd_limit is None:
        return settings.max_connections
    children = 1 + settings.resolvers + settings.outbox_workers + settings.max_runners  # 1: the writer
    return max(1, min(settings.max_connections, fd_limit - FD_RESERVE - FDS_PER_CHILD * children))


class ClientServer:
    def __init__(
        self,
        path: Path,
        settings: Settings,
        handler: Handler,
        peer_check: PeerCheck = same_user,
        on_close: Callable[[Connection], None] | None = None,
    ) -> None:
        self.path = path
        self.on_close = on_close  # a connection ended (its watches end with it)
        self.settings = settings
        self.handler = handler
        self.peer_check = peer_check
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections: set[Connection] = set()
        self.partial_bytes = 0  # buffered for partial frames, all connections together
        self.fd_limit = fd_limit()
        self.max_connections = connection_bound(settings, self.fd_limit)
        self.log_limit = RateLimit(log, settings.connection_log_lines, settings.connection_log_interval_ms / 1000)

    def log_line(self, kind: str, level: int, message: str, *args: object) -> None:
        """A line a client can cause: never its input, at most connection_log_lines per kind and interval."""
        if self.log_limit.allow(kind):
            log.log(level, message, *args)

    async def start(self) -> None:
        check_socket_path(self.path)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # stale: we hold the lock, so no live server owns it
        old_umask = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._accept, path=str(self.path), limit=READ_CHUNK)
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
                self.log_line("refused peer", logging.WARNING, "refused a connection from another user")
                return
            if len(self.connections) >= self.max_connections:
                writer.write(client_v1.encode(client_v1.Refused(code="tooManyConnections", error=TOO_MANY_CONNECTIONS)))
                self.log_line(
                    "too many connections",
                    logging.WARNING,
                    "refused a connection: %d connections are open",
                    len(self.connections),
                )
                return
            await Connection(self, reader, writer).serve()
        except (ConnectionResetError, BrokenPipeError):
            pass  # the client went away without reading its answers: a close, not a failure
        except Exception as exc:  # one connection's failure never reaches the server; its message may quote input
            self.log_line("connection failure", logging.ERROR, "a connection failed: %s", type(exc).__name__)
        finally:
            writer.close()  # flushes what was written (a refusal line)


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
        self.loop = asyncio.get_running_loop()
        self.partial = bytearray()  # received bytes of a frame whose newline has not come yet
        self.frame_started: float | None = None  # when the server began to wait for the rest of it
        self.last_activity = self.loop.time()  # the last byte received or request answered
        self._timer: asyncio.TimerHandle | None = None
        self.watches: set[str] = set()  # its live-view subscription ids (supervisor/views.py keeps them)

    def pending(self) -> bool:
        """Whether the client waits for something: a request in flight or a watch."""
        return bool(self.in_flight or self.watches)

    def send_event(self, line: bytes) -> bool:
        """An event line, unless EVENT_BUFFER_BYTES are unsent already (False: not sent)."""
        if self.closed or self.writer.transport.get_write_buffer_size() > EVENT_BUFFER_BYTES:
            return False
        self.writer.write(line)
        return True

    async def drained(self) -> None:
        """Until the client has read its unsent output down (the transport's low-water mark)."""
        await self.writer.drain()

    def send(self, envelope: client_v1.Envelope) -> None:
        if self.closed:
            return
        self.writer.write(client_v1.encode(envelope))
        if self.writer.transport.get_write_buffer_size() > self.server.settings.client_output_buffer_bytes:
            self.drop("slow reader", "dropped a client that does not read its responses", level=logging.WARNING)

    def close(self) -> None:
        self.closed = True
        self.writer.transport.abort()

    def drop(self, kind: str, message: str, *args: object, level: int = logging.INFO) -> None:
        self.server.log_line(kind, level, message, *args)
        self.close()

    async def serve(self) -> None:
        self.server.connections.add(self)
        try:
            self.send(client_v1.Hello(connectionId=self.id, packageVersion=__version__))
            while not self.closed:
                if self.partial and self.frame_started is None:
                    self.frame_started = self.loop.time()  # its first byte, past our own waits for a slot
                self._arm()
                chunk = await self.reader.read(READ_CHUNK)
                if self.closed:
                    return
                if not chunk:  # EOF (perhaps a half-close): answer what was asked, then close
                    if self.partial:
                        self.drop("malformed frame", "closed a connection: message is not terminated by a newline")
                    elif self.tasks:
                        await asyncio.wait(self.tasks)
                    return
                self.last_activity = self.loop.time()
                for line in self._receive(chunk):
                    if not await self._dispatch(line):
                        return
        finally:
            self.server.connections.discard(self)
            if self.server.on_close is not None:
                self.server.on_close(self)
            self.server.partial_bytes -= len(self.partial)
            self.partial = bytearray()
            if self._timer is not None:
                self._timer.cancel()
            self.closed = True

    def _receive(self, chunk: bytes) -> list[bytes]:
        """The complete lines of the partial frame and *chunk*; what follows the last newline is the
        new partial frame. If that could never be a frame or would cross the bound of all
        connections, the connection is closed instead (no lines)."""
        end = chunk.rfind(b"\n") + 1
        rest = len(chunk) - end if end else len(self.partial) + len(chunk)
        if rest >= client_v1.MAX_MESSAGE_BYTES:
            self.drop("malformed frame", "closed a connection: message exceeds 1 MiB")
            return []
        total = self.server.partial_bytes - len(self.partial) + rest
        if total > self.server.settings.client_partial_bytes_max:
            self.drop(
                "partial frames",
                "closed a connection: partial frames of all connections would exceed %d bytes",
                self.server.settings.client_partial_bytes_max,
                level=logging.WARNING,
            )
            return []
        self.server.partial_bytes = total
        if not end:
            self.partial += chunk
            return []
        text = bytes(self.partial) + chunk[:end]
        self.partial = bytearray(chunk[end:])
        self.frame_started = None
        return [line + b"\n" for line in text[:-1].split(b"\n")]

    async def _dispatch(self, line: bytes) -> bool:
        """Start handling one line; False if the connection is closed. An empty line between frames
        is skipped (upstream's clients may send one); every other line is a frame."""
        if line == b"\n":
            return True
        try:
            request = client_v1.parse_request(line)
        except client_v1.MalformedFrame as exc:
            self.drop("malformed frame", "closed a connection: %s", exc)  # never the frame itself
            return False
        outside = client_v1.outside_domain(line, request)
        if outside is not None:  # well framed, so answered: nothing of it is stored or passed on
            self.send(response(request, CommandError("invalidRequest", str(outside))))
            return not self.closed
        if request.requestId in self.in_flight:
            refusal = CommandError("requestInFlight", "this requestId is still in flight on this connection")
            self.send(response(request, refusal))
            return not self.closed
        await self.slots.acquire()
        if self.closed:
            self.slots.release()
            return False
        self.in_flight.add(request.requestId)
        task = asyncio.create_task(self._handle(request))
        for owner in (self.server._tasks, self.tasks):
            owner.add(task)
            task.add_done_callback(owner.discard)
        return True

    async def _handle(self, request: client_v1.Request) -> None:
        subscriber.set(self)  # this task's context: a watch request subscribes this connection
        try:
            self.send(await self.server.handler(request))
        except Exception as exc:
            if self.server.log_limit.allow("request failure"):
                log_failure(log, f"{request.operation} failed", exc)
            self.send(response(request, CommandError("unavailable", "the server could not answer; retry")))
        finally:
            self.in_flight.discard(request.requestId)
            self.slots.release()
            self.last_activity = self.loop.time()
            self._arm()

    # --- deadlines: a frame's, else (nothing pending) the idle one ------------------------------

    def _deadline(self) -> float | None:
        settings = self.server.settings
        if self.frame_started is not None:
            return self.frame_started + settings.frame_timeout_ms / 1000
        if self.pending():
            return None
        return self.last_activity + settings.idle_timeout_ms / 1000

    def _arm(self) -> None:
        """Schedule the check of the current deadline, replacing the one scheduled before."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._deadline()
        if deadline is not None and not self.closed:
            self._timer = self.loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        deadline = self._deadline()
        if self.closed or deadline is None:
            return
        if self.loop.time() < deadline:  # timers may run early by the clock's resolution
            self._arm()
        elif self.frame_started is not None:
            self.drop(
                "frame timeout",
                "closed a connection: a frame did not complete within %d ms",
                self.server.settings.frame_timeout_ms,
            )
        else:
            self.drop("idle", "closed a connection idle for %d ms", self.server.settings.idle_timeout_ms)


def response(request: client_v1.Request, refusal: CommandError) -> client_v1.Response:
    return client_v1.Response(
        requestId=request.requestId, outcome=refusal.outcome, receipt=refusal.receipt(), error=refusal.message
    )

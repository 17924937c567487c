"""``piworkflows.client``: the one way live clients talk to the server.

::

    WorkflowClient.request(op, payload) ── connect (hello) ── request line ──> server
        <── response with the same requestId (events in between are skipped)
    lost connection, ``unavailable`` or a refused connection (``tooManyConnections``):
    reconnect, new requestId, SAME idempotencyKey, until the retry deadline; the server
    answers the one true outcome (``adopted`` if the first attempt committed).

It never opens SQLite. ``ensure_running`` starts a server on demand.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from piworkflows import canonical
from piworkflows.paths import StatePaths
from piworkflows.protocol import envelope


class ClientError(Exception):
    pass


class ServerNotRunning(ClientError):
    pass


class StartFailed(ClientError):
    pass


class ServerRefused(ClientError):
    """The server runs but refused this connection (its one ``refused`` line), e.g. too many are open."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class StopTimedOut(ClientError):
    """The server's recorded processes still live after the stop's timeout."""


class WorkflowClient:
    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        client_id: str | None = None,
        timeout: float = 30.0,
        retry_for: float = 30.0,
    ) -> None:
        self.paths = StatePaths.resolve(state_dir)
        self.client_id = client_id or "client-" + uuid.uuid4().hex
        self.timeout = timeout  # for one response
        self.retry_for = retry_for  # for reconnects and unavailable answers
        self.connection_id: str | None = None
        self.package_version: str | None = None
        self._sock: socket.socket | None = None
        self._file: Any = None

    # --- connection ---------------------------------------------------------

    def connect(self) -> None:
        self.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.paths.socket))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise ServerNotRunning(f"no Pi Workflows server is running for {self.paths.state_dir}") from exc
        self._sock, self._file = sock, sock.makefile("rb")
        hello = self._read_message()
        if hello.get("type") == "refused":
            self.close()
            raise ServerRefused(str(hello.get("code")), str(hello.get("error") or "the server refused the connection"))
        if hello.get("type") != "hello" or hello.get("schema") != envelope.SCHEMA:
            self.close()
            raise ClientError("the server did not greet with pi-workflows.client.v1")
        self.connection_id = hello["connectionId"]
        self.package_version = hello["packageVersion"]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def __enter__(self) -> WorkflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stream(self) -> None:
        """This connection from now on carries a watch: reads wait as long as it lasts."""
        assert self._sock is not None
        self._sock.settimeout(None)

    def send(self, line: bytes) -> None:
        """One request line (``envelope.request_line``), its answer not awaited (a watch reads its
        messages itself)."""
        assert self._sock is not None
        self._sock.sendall(line)

    def shutdown(self) -> None:
        """End the connection now, also for a thread blocked reading it."""
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.close()

    def read_message(self) -> dict[str, Any]:
        """The next message of the connection (ConnectionError at its end)."""
        return self._read_message()

    def _read_message(self) -> dict[str, Any]:
        line = self._file.readline(envelope.MAX_MESSAGE_BYTES + 1)
        if not line.endswith(b"\n"):
            raise ConnectionError("the server closed the connection")
        # The server's lines are canonical: the C reader, numbers read as JavaScript reads them.
        message: dict[str, Any] = json.loads(line, parse_int=canonical.parse_int)
        return message

    # --- requests -----------------------------------------------------------

    def request(
        self,
        operation: str,
        payload: Any = None,
        run_id: str | None = None,
        expected_revision: int | None = None,
        idempotency_key: str | None = None,
    ) -> envelope.Response:
        """Send one request; retry transport loss and ``unavailable`` with the same key."""
        key = idempotency_key or "key-" + uuid.uuid4().hex
        deadline = time.monotonic() + self.retry_for
        delay = 0.05
        while True:
            try:
                if self._sock is None:
                    self.connect()
                response = self._exchange(operation, {} if payload is None else payload, run_id, expected_revision, key)
                if response.outcome != "unavailable" or time.monotonic() >= deadline:
                    return response
            except (OSError, ConnectionError, ServerNotRunning, ServerRefused):
                self.close()
                if time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _exchange(
        self, operation: str, payload: Any, run_id: str | None, expected_revision: int | None, key: str
    ) -> envelope.Response:
        request_id = "req-" + uuid.uuid4().hex
        line = envelope.request_line(
            request_id=request_id,
            client_id=self.client_id,
            operation=operation,
            idempotency_key=key,
            payload=payload,
            run_id=run_id,
            expected_revision=expected_revision,
        )
        assert self._sock is not None
        self._sock.sendall(line)
        while True:
            message = self._read_message()
            if message.get("type") == "response" and message.get("requestId") == request_id:
                return envelope.response_of(message)

    def read_content(self, run_id: str, reference: dict[str, Any]) -> bytes:
        """The whole content a run view's reference (``{"$artifact": {path, bytes, sha256, ...}}``)
        names, read chunk by chunk with ``view.content`` and verified against its length and sha256."""
        from piworkflows.protocol import client_v1  # the chunk's model: only commands that read content

        artifact = reference["$artifact"]
        data = bytearray()
        while True:
            response = self.request("view.content", {"path": artifact["path"], "offset": len(data)}, run_id=run_id)
            if response.outcome != "accepted" or not isinstance(response.receipt, dict):
                raise ClientError(f"view.content {artifact['path']}: {response.outcome} ({response.error})")
            chunk = client_v1.ContentChunkReceipt.model_validate(response.receipt)
            if chunk.path != artifact["path"] or chunk.offset != len(data) or chunk.sha256 != artifact["sha256"]:
                raise ClientError(f"view.content {artifact['path']}: the server answered another chunk")
            data += base64.b64decode(chunk.data, validate=True)
            if len(data) != chunk.nextOffset or len(data) > chunk.bytes:
                raise ClientError(f"view.content {artifact['path']}: a chunk's length does not match its offsets")
            if chunk.complete:
                break
            if chunk.nextOffset == chunk.offset:
                raise ClientError(f"view.content {artifact['path']}: an incomplete chunk without bytes")
        if len(data) != artifact["bytes"] or hashlib.sha256(data).hexdigest() != artifact["sha256"]:
            raise ClientError(f"view.content {artifact['path']}: the content does not match its sha256")
        return bytes(data)

    # --- lifecycle ----------------------------------------------------------

    def running(self) -> bool:
        try:
            self.connect()
            return True
        except ServerRefused:
            return True  # it answered: it runs
        except (ServerNotRunning, OSError, ConnectionError):
            return False

    def ensure_running(self) -> None:
        """Connect, starting a server first if none is running."""
        if not self.running():
            start_server(self.paths, join=True)  # losing a race to start it: the winner serves
            self.connect()


def start_server(paths: StatePaths, timeout: float = 60.0, join: bool = False) -> None:
    """Start a detached server and wait for its ready handshake. When another server holds the
    lock (a start that raced this one), ``join`` waits until that one serves; without, it is
    StartFailed ("already running": ``server start``'s answer)."""
    read_fd, write_fd = os.pipe()
    try:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "piworkflows.supervisor",
                "--state-dir",
                str(paths.state_dir),
                "--ready-fd",
                str(write_fd),
            ],
            pass_fds=[write_fd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(write_fd)
    # Reap it if it exits while this process still lives (no zombie); it outlives us otherwise.
    threading.Thread(target=server.wait, name="server-reaper", daemon=True).start()
    deadline = time.monotonic() + timeout
    with os.fdopen(read_fd, "rb") as ready:
        line = _read_line_with_timeout(ready, timeout)
    if line.startswith("running: ") and join:  # another start won the lock: that server is the one to use
        _wait_serving(paths, deadline, line.removeprefix("running: "))
    elif line != "ready":
        why = line.removeprefix("error: ").removeprefix("running: ")
        raise StartFailed(why if line else "the server exited before it was ready")


def _wait_serving(paths: StatePaths, deadline: float, why: str) -> None:
    """Until the server that holds the lock answers on its socket (it may still be starting)."""
    probe = WorkflowClient(paths.state_dir, retry_for=0)
    try:
        while not probe.running():
            if time.monotonic() > deadline:
                raise StartFailed(f"{why} (it did not answer in time)")
            time.sleep(0.05)
    finally:
        probe.close()


def _read_line_with_timeout(stream: Any, timeout: float) -> str:
    import select

    readable, _, _ = select.select([stream], [], [], timeout)
    if not readable:
        raise StartFailed("the server did not become ready in time")
    return stream.readline().decode("utf-8", "replace").strip()


def stop_server(paths: StatePaths, timeout: float = 60.0) -> bool:
    """Ask the server to stop and wait until none of the processes host.json records lives
    (then the lock is released).

    Returns False if no server was running: the socket does not answer and no
    recorded process lives (one that lives without an answering socket is
    stopping already and is waited for). Raises ClientError if the stop was
    refused, ``StopTimedOut`` if its processes still live after ``timeout`` seconds.
    """
    from piworkflows.supervisor import registry  # host.json: the identities of the server's processes

    client = WorkflowClient(paths.state_dir, retry_for=0)
    try:
        response: envelope.Response | None = client.request("server.stop")
    except (ServerNotRunning, OSError, ConnectionError):
        response = None
    finally:
        client.close()
    if response is None and not registry.live(paths.registry):
        return False
    if response is not None and response.outcome not in ("accepted", "adopted"):
        raise ClientError(f"server.stop answered {response.outcome}: {response.error}")
    deadline = time.monotonic() + timeout
    # Stopped means every recorded process is gone (lock released), not just the socket closed.
    while registry.live(paths.registry) or client.running():
        client.close()
        if time.monotonic() > deadline:
            raise StopTimedOut(f"the server did not stop within {timeout:g} s")
        time.sleep(0.05)
    client.close()
    return True

"""Raw client connections to a real server's socket: every byte under the test's control.

The protocol and hostile-client tests build request lines and envelopes here, send them over a
``Conn`` and read the server's lines back.
"""

from __future__ import annotations

import json
import socket
import uuid
from typing import Any

from piworkflows import canonical
from piworkflows.paths import StatePaths
from piworkflows.protocol import client_v1
from tests.server_util import ServerProcess

IO_TIMEOUT = 15.0
MIB = client_v1.MAX_MESSAGE_BYTES


def socket_path(proc: ServerProcess) -> str:
    return str(StatePaths.resolve(proc.state_dir).socket)


def request_line(
    operation: str = "server.status",
    payload: Any = None,
    request_id: str | None = None,
    client_id: str = "client-test",
    key: str | None = None,
    run_id: str | None = None,
    expected_revision: int | None = None,
) -> bytes:
    return client_v1.encode(
        client_v1.Request(
            requestId=request_id or "req-" + uuid.uuid4().hex,
            clientId=client_id,
            operation=operation,
            idempotencyKey=key or "key-" + uuid.uuid4().hex,
            payload={} if payload is None else payload,
            runId=run_id,
            expectedRevision=expected_revision,
        )
    )


def envelope(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "clientId": "client-test",
        "idempotencyKey": "key-1",
        "operation": "server.status",
        "payload": {},
        "requestId": "req-1",
        "schema": client_v1.SCHEMA,
        "type": "request",
    }
    data.update(overrides)
    return data


def canonical_line(data: Any) -> bytes:
    return canonical.dumps_bytes(data) + b"\n"


def is_canonical(line: bytes) -> bool:
    return line.endswith(b"\n") and canonical.dumps_bytes(json.loads(line[:-1])) + b"\n" == line


class Conn:
    """A raw client connection: every byte under the test's control."""

    def __init__(self, path: str, timeout: float = IO_TIMEOUT, read_hello: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.hello_line = self.read_line() if read_hello else None

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    @property
    def hello(self) -> dict[str, Any]:
        assert self.hello_line is not None
        hello: dict[str, Any] = json.loads(self.hello_line)
        return hello

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_ignoring_close(self, data: bytes) -> None:
        """Send; the server may close while we are still sending."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def read_line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the server closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"

    def read_message(self) -> dict[str, Any]:
        line = self.read_line()
        assert is_canonical(line), line
        message: dict[str, Any] = json.loads(line)
        return message

    def read_until_closed(self) -> bytes:
        """Everything the server sends until it closes (raises socket.timeout if it never does)."""
        data, self.buf = self.buf, b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def request(self, operation: str = "server.status", **kwargs: Any) -> dict[str, Any]:
        request_id = kwargs.pop("request_id", None) or "req-" + uuid.uuid4().hex
        self.send(request_line(operation, request_id=request_id, **kwargs))
        message = self.read_message()
        assert message["type"] == "response" and message["requestId"] == request_id, message
        return message


def assert_status_ok(conn: Conn) -> dict[str, Any]:
    response = conn.request("server.status")
    assert response["outcome"] == "accepted", response
    return response


def assert_refusal(response: dict[str, Any], outcome: str, code: str) -> None:
    assert response["outcome"] == outcome, response
    assert response["receipt"]["code"] == code, response
    assert isinstance(response["error"], str) and response["error"].strip(), response


def padded(total: int, operation: str = "resourceManager.apply") -> bytes:
    """A request line of exactly ``total`` bytes, newline included (its payload padded)."""
    base = request_line(operation, payload={"pad": ""}, request_id="req-pad", key="key-pad")
    line = base.replace(b'"pad":""', b'"pad":"' + b"x" * (total - len(base)) + b'"')
    assert len(line) == total
    return line

"""ClientServer in process: peer uid check, hello, socket mode and path limit, failure lines, the connection bound."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from piworkflows import __version__, canonical
from piworkflows.paths import SOCKET_PATH_LIMIT
from piworkflows.protocol import client_v1
from piworkflows.settings import Settings
from piworkflows.supervisor.server import (
    FD_RESERVE,
    FDS_PER_CHILD,
    ClientServer,
    SocketPathTooLong,
    check_socket_path,
    connection_bound,
)

pytestmark = pytest.mark.timeout(60)

IO_TIMEOUT = 10.0


async def answer(request: client_v1.Request) -> client_v1.Response:
    return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt={"echo": request.operation})


def status_request(request_id: str = "req-1") -> bytes:
    return client_v1.encode(
        client_v1.Request(requestId=request_id, clientId="c", operation="server.status", idempotencyKey="k", payload={})
    )


async def serve(path: Path, peer_check, handler=answer) -> ClientServer:
    server = ClientServer(path, Settings(), handler, peer_check=peer_check)
    await server.start()
    return server


def test_refused_uid_gets_no_hello_and_is_closed(tmp_path: Path) -> None:
    seen: list[int] = []

    def refuse(uid: int) -> bool:
        seen.append(uid)
        return False

    handled: list[client_v1.Request] = []

    async def handler(request: client_v1.Request) -> client_v1.Response:
        handled.append(request)
        return await answer(request)

    async def main() -> None:
        server = await serve(tmp_path / "s.sock", refuse, handler)
        try:
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "s.sock"))
            try:
                writer.write(status_request())
                try:
                    await writer.drain()
                except ConnectionError:
                    pass
                try:
                    data = await asyncio.wait_for(reader.read(), IO_TIMEOUT)  # until EOF
                except ConnectionResetError:
                    data = b""
                assert data == b""
            finally:
                writer.close()
        finally:
            await server.close()

    asyncio.run(main())
    assert seen == [os.getuid()]
    assert handled == []


def test_same_uid_gets_hello_and_answers(tmp_path: Path) -> None:
    seen: list[int] = []

    def same(uid: int) -> bool:
        seen.append(uid)
        return uid == os.getuid()

    async def main() -> None:
        path = tmp_path / "s.sock"
        server = await serve(path, same)
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            try:
                hello_line = await asyncio.wait_for(reader.readline(), IO_TIMEOUT)
                hello = json.loads(hello_line)
                assert canonical.dumps_bytes(hello) + b"\n" == hello_line
                assert hello["type"] == "hello" and hello["schema"] == client_v1.SCHEMA
                assert hello["packageVersion"] == __version__
                assert hello["connectionId"]
                writer.write(status_request("req-7"))
                await writer.drain()
                response = json.loads(await asyncio.wait_for(reader.readline(), IO_TIMEOUT))
                assert response["type"] == "response" and response["requestId"] == "req-7"
                assert response["outcome"] == "accepted" and response["receipt"] == {"echo": "server.status"}
            finally:
                writer.close()
        finally:
            await server.close()
        assert not path.exists()  # close removes the socket

    asyncio.run(main())
    assert seen == [os.getuid()]


def test_a_refused_peer_does_not_disturb_an_accepted_one(tmp_path: Path) -> None:
    verdicts = iter([True, False])

    async def main() -> None:
        path = tmp_path / "s.sock"
        server = await serve(path, lambda uid: next(verdicts))
        try:
            good_r, good_w = await asyncio.open_unix_connection(str(path))
            assert json.loads(await asyncio.wait_for(good_r.readline(), IO_TIMEOUT))["type"] == "hello"
            bad_r, bad_w = await asyncio.open_unix_connection(str(path))
            assert await asyncio.wait_for(bad_r.read(), IO_TIMEOUT) == b""
            bad_w.close()
            good_w.write(status_request("after"))
            await good_w.drain()
            response = json.loads(await asyncio.wait_for(good_r.readline(), IO_TIMEOUT))
            assert response["requestId"] == "after" and response["outcome"] == "accepted"
            good_w.close()
        finally:
            await server.close()

    asyncio.run(main())


def test_socket_mode_is_0600_and_umask_is_restored(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "s.sock"
        path.write_text("stale")  # a stale file is replaced
        before = os.umask(0o022)
        os.umask(before)
        server = await serve(path, lambda uid: True)
        try:
            mode = path.stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600
            after = os.umask(0o022)
            os.umask(after)
            assert after == before
        finally:
            await server.close()

    asyncio.run(main())


def _path_of_length(base: Path, size: int) -> Path:
    """A socket path of exactly ``size`` bytes under ``base``."""
    room = size - len(os.fsencode(base / "d" / "x.sock")) + 1
    assert room >= 1, "tmp_path is too long for this test"
    path = base / ("d" * room) / "x.sock"
    assert len(os.fsencode(path)) == size
    path.parent.mkdir()
    return path


def test_socket_path_over_107_bytes_is_refused(tmp_path: Path) -> None:
    assert SOCKET_PATH_LIMIT == 107
    path = _path_of_length(tmp_path, 108)

    async def main() -> None:
        server = ClientServer(path, Settings(), answer, peer_check=lambda uid: True)
        with pytest.raises(SocketPathTooLong, match="107"):
            await server.start()

    asyncio.run(main())
    assert not path.exists()
    with pytest.raises(SocketPathTooLong, match="107"):
        check_socket_path(tmp_path / ("x" * 200))


def test_socket_path_of_exactly_107_bytes_works(tmp_path: Path) -> None:
    path = _path_of_length(tmp_path, 107)
    check_socket_path(path)

    async def main() -> None:
        server = await serve(path, lambda uid: True)
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            assert json.loads(await asyncio.wait_for(reader.readline(), IO_TIMEOUT))["type"] == "hello"
            writer.close()
        finally:
            await server.close()

    asyncio.run(main())


def test_a_failing_handler_answers_unavailable(tmp_path: Path) -> None:
    async def broken(request: client_v1.Request) -> client_v1.Response:
        raise RuntimeError("secret-token-123 in a stack trace")

    async def main() -> None:
        path = tmp_path / "s.sock"
        server = await serve(path, lambda uid: True, broken)
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            await asyncio.wait_for(reader.readline(), IO_TIMEOUT)
            writer.write(status_request("boom"))
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), IO_TIMEOUT)
            response = json.loads(line)
            assert response["requestId"] == "boom" and response["outcome"] == "unavailable"
            assert response["receipt"]["code"] == "unavailable" and response["error"]
            assert b"secret-token" not in line and b"Traceback" not in line
            writer.close()
        finally:
            await server.close()

    asyncio.run(main())


def test_a_failing_connection_logs_one_line_without_traceback_or_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The exception's message may quote client input; its traceback floods the log (issue 13, item 5)."""

    def broken(uid: int) -> bool:
        raise RuntimeError("secret-token-123 from the client")

    async def main() -> None:
        path = tmp_path / "s.sock"
        server = await serve(path, broken)
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            assert await asyncio.wait_for(reader.read(), IO_TIMEOUT) == b""  # closed, nothing sent
            writer.close()
        finally:
            await server.close()

    caplog.set_level(logging.INFO, logger="piworkflows")
    asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["a connection failed: RuntimeError"]
    assert all(r.exc_info is None and r.exc_text is None for r in caplog.records)


@pytest.mark.parametrize(
    ("max_connections", "fd_limit", "bound"),
    [
        (1024, None, 1024),  # no fd limit
        (1024, 20_000, 1024),
        (1024, 1024, 1024 - FD_RESERVE - FDS_PER_CHILD * 11),  # writer + 4 resolvers + 2 outbox workers + 4 runners
        (5, 1024, 5),
        (1024, 10, 1),  # it still serves one
    ],
)
def test_the_connection_bound_leaves_the_server_its_descriptors(
    max_connections: int, fd_limit: int | None, bound: int
) -> None:
    assert connection_bound(Settings(max_connections=max_connections), fd_limit) == bound

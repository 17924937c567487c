"""Hostile or broken clients against a real server process (issue 13, items 5 and 6).

Deep nesting is closed at a fixed limit without a traceback; what clients cause
is logged rate-limited; partial frames must complete within frame_timeout_ms;
idle connections close, busy ones do not; partial bytes of all connections are
bounded; beyond max_connections a connection gets one refusal line. A normal
client is served throughout. Raw sockets (``Conn``) control every byte.
"""

from __future__ import annotations

import fcntl
import json
import re
import select
import struct
import termios
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from piworkflows.client import ServerRefused, WorkflowClient
from piworkflows.paths import StatePaths
from piworkflows.protocol import client_v1
from piworkflows.supervisor.server import TOO_MANY_CONNECTIONS
from tests.engine_util import write
from tests.server_util import ServerProcess, make_server, wait_until
from tests.socket_util import (
    MIB,
    Conn,
    assert_refusal,
    assert_status_ok,
    canonical_line,
    envelope,
    is_canonical,
    padded,
    request_line,
    socket_path,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


def server_log(proc: ServerProcess) -> str:
    host = StatePaths.resolve(proc.state_dir).host_dir
    return "".join(p.read_text(errors="replace") for p in sorted(host.glob("server.log*")))


def closed_by_server(conn: Conn) -> bool:
    """True once the server closed *conn* (EOF or reset) without sending anything more."""
    readable, _, _ = select.select([conn.sock], [], [], 0)
    if not readable:
        return False
    try:
        data = conn.sock.recv(65536)
    except ConnectionResetError:
        return True
    assert data == b"", data
    return True


def unread_by_server(conn: Conn) -> int:
    """Bytes *conn* sent that the server has not read from its socket yet (TIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(conn.sock, termios.TIOCOUTQ, b"\0" * 4))[0])


def nested_line(depth: int, leaf: bytes = b"1.5") -> bytes:
    """A canonical server.status request whose payload makes the frame ``depth`` levels deep."""
    head, tail = canonical_line(envelope(payload=0)).split(b'"payload":0')
    return head + b'"payload":' + b"[" * (depth - 1) + leaf + b"]" * (depth - 1) + tail


@pytest.fixture
def stopped_cleanly():
    """Servers a test starts; each must stop with exit code 0."""
    servers: list[ServerProcess] = []
    yield servers.append
    for proc in servers:
        assert proc.stop() == 0, proc.output()


def start(stopped_cleanly, tmp_path: Path, **env: str) -> tuple[ServerProcess, str]:
    proc = make_server(tmp_path / "s", **env)
    stopped_cleanly(proc)
    proc.start()
    return proc, socket_path(proc)


# --- item 5: deep nesting and the log -------------------------------------------------------


def test_512_levels_are_answered_513_are_closed_without_a_traceback(stopped_cleanly, tmp_path: Path) -> None:
    proc, path = start(stopped_cleanly, tmp_path)
    with Conn(path) as witness:
        for leaf in (b"1", b"1.5"):  # a float took the exact encoder, which recursed twice per level
            with Conn(path) as conn:
                conn.send(nested_line(client_v1.MAX_NESTING, leaf))
                response = conn.read_message()
                assert response["requestId"] == "req-1"
                assert_refusal(response, "rejected", "invalidRequest")  # parsed; deeper than a value a run keeps
                assert_status_ok(conn)
        for depth in (client_v1.MAX_NESTING + 1, 5_000, 100_000):
            with Conn(path) as deep:
                deep.send_ignoring_close(nested_line(depth))
                assert deep.read_until_closed() == b""
        assert_status_ok(witness)
    text = server_log(proc)
    assert text.count("closed a connection: message nests deeper than 512 levels") == 3
    assert "Traceback" not in text and 'File "' not in text


@pytest.mark.timeout(180)
def test_thousands_of_malformed_connections_leave_the_startup_line_in_a_small_log(
    stopped_cleanly, tmp_path: Path
) -> None:
    proc, path = start(
        stopped_cleanly,
        tmp_path,
        PI_WORKFLOWS_LOG_MAX_BYTES="16384",
        PI_WORKFLOWS_LOG_BACKUPS="1",
        PI_WORKFLOWS_CONNECTION_LOG_INTERVAL_MS="1000",
    )
    frames = [b"[]\n", b"[" * 5_000 + b"\n"]  # not an object; nested too deep (a RecursionError before)
    count = 2_000
    with Conn(path) as witness:
        for i in range(count):
            with Conn(path) as bad:
                bad.send_ignoring_close(frames[i % 2])
                assert bad.read_until_closed() == b""
        assert_status_ok(witness)

    def written_and_suppressed() -> tuple[int, int]:
        text = server_log(proc)
        suppressed = re.findall(r"suppressed (\d+) similar lines \(malformed frame\)", text)
        return text.count("closed a connection:"), sum(map(int, suppressed))

    current = (StatePaths.resolve(proc.state_dir).host_dir / "server.log").read_text()
    assert "serving on" in current  # not rotated away
    assert "Traceback" not in server_log(proc)
    # every malformed connection is either logged or counted, once its interval has ended
    wait_until(lambda: sum(written_and_suppressed()) == count, what="all intervals reported")
    written, suppressed = written_and_suppressed()
    assert written < count // 10 and suppressed > count // 2, (written, suppressed)
    print(f"server.log after {count} malformed connections: {len(current)} bytes, {written} connection lines")


# --- item 6: partial frames, idle connections, bounds ---------------------------------------


def test_a_trickling_partial_frame_is_closed_after_frame_timeout_while_others_are_served(
    stopped_cleanly, tmp_path: Path
) -> None:
    proc, path = start(stopped_cleanly, tmp_path, PI_WORKFLOWS_FRAME_TIMEOUT_MS="500")
    frame = padded(4096)
    with Conn(path) as slow, Conn(path) as witness:
        sent = 0

        def trickle_until_closed() -> bool:
            nonlocal sent
            assert_status_ok(witness)  # served throughout
            try:
                slow.sock.sendall(frame[sent : sent + 1])  # one more byte each round: the frame never ends
            except (BrokenPipeError, ConnectionResetError):
                return True
            sent += 1
            return closed_by_server(slow)

        wait_until(trickle_until_closed, what="the trickling connection closed")
        assert 0 < sent < len(frame) - 1
        assert_status_ok(witness)
    wait_until(lambda: "closed a connection: a frame did not complete within 500 ms" in server_log(proc))


def test_1_mib_without_a_newline_is_closed_by_the_frame_timeout(stopped_cleanly, tmp_path: Path) -> None:
    proc, path = start(stopped_cleanly, tmp_path, PI_WORKFLOWS_FRAME_TIMEOUT_MS="500")
    with Conn(path) as big, Conn(path) as witness:
        big.send(padded(MIB)[: MIB - 8])  # could still become a valid frame: kept until the timeout
        assert big.read_until_closed() == b""
        assert_status_ok(witness)
    assert "closed a connection: a frame did not complete within 500 ms" in server_log(proc)


def test_the_partial_bytes_of_all_connections_are_bounded(stopped_cleanly, tmp_path: Path) -> None:
    proc, path = start(
        stopped_cleanly, tmp_path, PI_WORKFLOWS_CLIENT_PARTIAL_BYTES_MAX=str(MIB), PI_WORKFLOWS_FRAME_TIMEOUT_MS="60000"
    )
    frame, part = padded(700 * 1024), 600 * 1024
    with Conn(path) as first, Conn(path) as second, Conn(path) as witness:
        first.send(frame[:part])
        wait_until(lambda: unread_by_server(first) == 0, what="the server holds the first partial frame")
        second.send_ignoring_close(frame[:part])  # 1.2 MB of partial frames together: over the bound
        assert second.read_until_closed() == b""
        assert_status_ok(witness)
        first.send(frame[part:])  # the first one was kept and completes its frame
        response = first.read_message()
        assert response["requestId"] == "req-pad"
        assert_refusal(response, "rejected", "notAvailable")
        assert_status_ok(first)
    assert "partial frames of all connections would exceed 1048576 bytes" in server_log(proc)


SLOW_TO_LOAD = """
import os, time
from piworkflows.workflows import compute, define_workflow
deadline = time.monotonic() + 60
while not os.path.exists({flag!r}):  # loading waits for the test's flag: run.start stays in flight
    if time.monotonic() > deadline:
        raise TimeoutError("no flag")
    time.sleep(0.02)
workflow = define_workflow("slowload", "only", {{"only": compute(lambda ctx: {{}})}})
"""


def test_an_idle_connection_is_closed_and_one_with_a_request_in_flight_is_not(
    stopped_cleanly, tmp_path: Path, project: Path
) -> None:
    flag = tmp_path / "flag"
    write(project, "slowload", SLOW_TO_LOAD.format(flag=str(flag)))
    proc, path = start(stopped_cleanly, tmp_path, PI_WORKFLOWS_IDLE_TIMEOUT_MS="500", PI_WORKFLOWS_MAX_RUNNERS="0")
    with Conn(path) as busy:
        busy.send(
            request_line(
                "run.start", payload={"projectPath": str(project), "workflowName": "slowload"}, request_id="slow"
            )
        )
        for _ in range(2):  # the second idle one opened after the first closed: busy was silent longer
            with Conn(path) as idle:
                assert idle.read_until_closed() == b""
        assert not closed_by_server(busy)  # its deadline came before the idle ones': timers run in order
        flag.touch()
        response = busy.read_message()
        assert response["requestId"] == "slow" and response["outcome"] == "accepted", response
        assert busy.read_until_closed() == b""  # answered, nothing pending: idle now
    assert "closed a connection idle for 500 ms" in server_log(proc)


def test_a_normal_client_is_served_while_hundreds_of_hostile_connections_are_held(
    stopped_cleanly, tmp_path: Path
) -> None:
    hostile_count = 300
    proc, path = start(stopped_cleanly, tmp_path, PI_WORKFLOWS_FRAME_TIMEOUT_MS="120000")
    frame = padded(4096)
    hostile = []
    try:
        for _ in range(hostile_count):
            hostile.append(Conn(path))
        with Conn(path) as normal:
            for sent in range(64):  # partial frames trickle, one byte per connection and round
                for conn in hostile:
                    conn.send(frame[sent : sent + 1])
                receipt = assert_status_ok(normal)["receipt"]
                assert receipt["connections"] == hostile_count + 1
                assert receipt["maxConnections"] > hostile_count
            assert_status_ok(normal)
        assert not any(closed_by_server(conn) for conn in hostile)  # held, not refused or timed out
        assert proc.popen is not None
        rss = psutil.Process(proc.popen.pid).memory_info().rss
        print(f"supervisor RSS with {hostile_count} hostile connections: {rss / 2**20:.1f} MiB")
    finally:
        for conn in hostile:
            conn.close()


def test_beyond_max_connections_one_refusal_line_then_close(stopped_cleanly, tmp_path: Path) -> None:
    proc, path = start(stopped_cleanly, tmp_path, PI_WORKFLOWS_MAX_CONNECTIONS="5")
    opened = [Conn(path)]
    try:
        # the readiness probes of start() are gone once the server counts this connection alone
        wait_until(lambda: assert_status_ok(opened[0])["receipt"]["connections"] == 1, what="probes closed")
        assert assert_status_ok(opened[0])["receipt"]["maxConnections"] == 5
        opened += [Conn(path) for _ in range(4)]
        with Conn(path, read_hello=False) as sixth:
            line = sixth.read_line()
            assert is_canonical(line)
            assert json.loads(line) == {
                "code": "tooManyConnections",
                "error": TOO_MANY_CONNECTIONS,
                "schema": client_v1.SCHEMA,
                "type": "refused",
            }
            assert sixth.read_until_closed() == b""
        wait_until(lambda: "refused a connection: 5 connections are open" in server_log(proc))
        assert server_log(proc).count("refused a connection") == 1

        with pytest.raises(ServerRefused, match="too many open connections") as refused:
            WorkflowClient(proc.state_dir, retry_for=0).connect()
        assert refused.value.code == "tooManyConnections"
        for conn in opened:
            assert_status_ok(conn)  # the five are served

        # a request retries a refusal like a lost connection, until one of the five closes
        answers: list[Any] = []
        retrying = threading.Thread(target=lambda: answers.append(proc.client(retry_for=60).request("server.status")))
        retrying.start()
        wait_until(lambda: server_log(proc).count("refused a connection") >= 3, what="the client retried")
        opened.pop().close()
        retrying.join(60)
        assert [a.outcome for a in answers] == ["accepted"]
    finally:
        for conn in opened:
            conn.close()

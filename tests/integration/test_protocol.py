"""The client protocol over a real socket of a real server process.

Frame-level tests use raw ``AF_UNIX`` sockets so they control every byte.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from piworkflows import __version__, canonical
from piworkflows.paths import StatePaths
from piworkflows.protocol import client_v1
from piworkflows.settings import Settings
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("p")
    proc = make_server(base / "s").start()
    try:
        yield proc
    finally:
        code = proc.stop()
    assert code == 0, proc.output()


@pytest.fixture
def path(server: ServerProcess) -> str:
    assert server.popen is not None and server.popen.poll() is None, server.output()
    return socket_path(server)


@pytest.fixture
def witness(path: str) -> Iterator[Conn]:
    """A second, already-open connection that must keep working."""
    with Conn(path) as conn:
        assert_status_ok(conn)
        yield conn


# --- hello ------------------------------------------------------------------------------


def test_hello_is_first_canonical_and_distinct_per_connection(path: str) -> None:
    ids = set()
    for _ in range(5):
        with Conn(path) as conn:
            line = conn.hello_line
            assert line is not None and is_canonical(line)
            hello = conn.hello
            assert set(hello) == {"schema", "type", "connectionId", "packageVersion"}
            assert hello["schema"] == client_v1.SCHEMA and hello["type"] == "hello"
            assert hello["packageVersion"] == __version__
            assert client_v1.Hello.model_validate(hello)
            ids.add(hello["connectionId"])
    assert len(ids) == 5


def test_hello_comes_first_even_when_the_client_speaks_first(path: str) -> None:
    with Conn(path, read_hello=False) as conn:
        conn.send(request_line(request_id="early"))
        first = conn.read_message()
        assert first["type"] == "hello"
        second = conn.read_message()
        assert second["type"] == "response" and second["requestId"] == "early" and second["outcome"] == "accepted"


# --- malformed frames: only that connection closes ------------------------------------------


VALID = canonical_line(envelope())

INVALID_FRAMES: list[tuple[str, bytes, bool]] = [
    # (label, bytes, half-close after sending)
    (
        "envelope keys not sorted",
        json.dumps({"type": "request", **envelope()}, separators=(",", ":")).encode() + b"\n",
        False,
    ),
    ("whitespace", VALID.replace(b'"type":', b'"type": '), False),
    ("trailing CR", VALID[:-1] + b"\r\n", False),
    ("1e+20", canonical_line(envelope(payload={"n": 0})).replace(b'"n":0', b'"n":1e+20'), False),
    ("expectedRevision 1.0", VALID.replace(b'"operation"', b'"expectedRevision":1.0,"operation"'), False),
    ("unknown envelope field", canonical_line(envelope(zzz=1)), False),
    ("unknown operation", canonical_line(envelope(operation="run.explode")), False),
    ("wrong schema version", canonical_line(envelope(schema="pi-workflows.client.v2")), False),
    ("negative expectedRevision", canonical_line(envelope(expectedRevision=-1)), False),
    ("runId of 258 bytes", canonical_line(envelope(runId="é" * 129)), False),
    ("invalid UTF-8", VALID.replace(b'"req-1"', b'"req-\xff"'), False),
    ("duplicate key", VALID.replace(b'"clientId":"client-test",', b'"clientId":"a","clientId":"b",'), False),
    ("NaN", canonical_line(envelope(payload={"n": 0})).replace(b'"n":0', b'"n":NaN'), False),
    (
        "index key not first in payload",
        canonical_line(envelope(payload={})).replace(b'"payload":{}', b'"payload":{"a":1,"1":2}'),
        False,
    ),
    ("not JSON", b"hello server\n", False),
    ("JSON array", b"[]\n", False),
    ("JSON string", b'"request"\n', False),
    ("response envelope", client_v1.encode(client_v1.Response(requestId="r", outcome="accepted")), False),
    ("hello envelope", client_v1.encode(client_v1.Hello(connectionId="c", packageVersion="1")), False),
    ("event envelope", client_v1.encode(client_v1.Event(subscriptionId="s", event="runs", payload={})), False),
    ("valid frame without newline, then EOF", VALID[:-1], True),
    ("half a frame, then EOF", VALID[:20], True),
    ("1 MiB + 1 byte with newline", padded(MIB + 1), False),
    ("2 MiB with newline", padded(2 * MIB), False),
    ("over 1 MiB without newline", b"x" * (MIB + 1), False),
    ("2 MiB without newline", b'{"' + b"x" * (2 * MIB), False),
]


@pytest.mark.parametrize(("label", "data", "half_close"), INVALID_FRAMES, ids=[f[0] for f in INVALID_FRAMES])
def test_invalid_frame_closes_only_its_connection(
    server: ServerProcess, path: str, witness: Conn, label: str, data: bytes, half_close: bool
) -> None:
    with Conn(path) as bad:
        bad.send_ignoring_close(data)
        if half_close:
            bad.sock.shutdown(socket.SHUT_WR)
        # the server closes this connection (recv returns b'' or a reset) and answers nothing
        assert bad.read_until_closed() == b""
    assert_status_ok(witness)
    with Conn(path) as fresh:
        assert_status_ok(fresh)
    assert server.popen is not None and server.popen.poll() is None


def test_a_valid_frame_after_a_bad_one_in_the_same_write_is_not_answered(path: str, witness: Conn) -> None:
    with Conn(path) as bad:
        bad.send_ignoring_close(b"[]\n" + request_line(request_id="never"))
        assert bad.read_until_closed() == b""
    assert_status_ok(witness)


def test_exactly_1_mib_frame_is_accepted(path: str, witness: Conn) -> None:
    with Conn(path) as conn:
        conn.send(padded(MIB))
        response = conn.read_message()
        assert response["requestId"] == "req-pad"
        assert_refusal(response, "rejected", "notAvailable")  # parsed, then not served
        assert_status_ok(conn)
    assert_status_ok(witness)


def test_half_closed_client_still_gets_its_responses(path: str) -> None:
    # A round is answered anyway only if the client was descheduled between sendall and shutdown for
    # longer than a writer round trip (about 3% of rounds here); five rounds make an XPASS negligible.
    for round_ in range(5):
        with Conn(path) as conn:
            ids = [f"half-{round_}-{i}" for i in range(5)]
            conn.send(b"".join(request_line(request_id=i) for i in ids))
            conn.sock.shutdown(socket.SHUT_WR)
            data = conn.read_until_closed()
        answered = {json.loads(line)["requestId"] for line in data.splitlines()}
        assert answered == set(ids), f"round {round_}: answered {len(answered)} of {len(ids)}"


# --- served and unserved operations -------------------------------------------------------


def test_server_status_receipt(path: str) -> None:
    with Conn(path) as conn:
        response = assert_status_ok(conn)
    assert set(response) == {"schema", "type", "requestId", "outcome", "receipt"}
    receipt = response["receipt"]
    assert set(receipt) == set(client_v1.ServerStatusReceipt.model_fields)
    client_v1.ServerStatusReceipt.model_validate(receipt)
    assert receipt["state"] == "running" and receipt["socketAvailable"] is True and receipt["reason"] is None
    assert isinstance(receipt["epoch"], int) and receipt["epoch"] >= 1
    for name, value in receipt.items():
        if name not in ("state", "socketAvailable", "reason"):
            assert type(value) is int and value >= 0, (name, value)
        assert not (isinstance(value, str) and "/" in value), (name, value)
    # this connection at least; the bound below the process's fd limit (FAST_ENV sets none lower)
    assert receipt["connections"] >= 1
    assert 1 <= receipt["maxConnections"] <= Settings().max_connections
    assert receipt["maxConnections"] < receipt["fdLimit"]
    # a fresh state dir has nothing in it
    facts = ("state", "socketAvailable", "epoch", "reason", "connections", "maxConnections", "fdLimit")
    counts = {k: v for k, v in receipt.items() if k not in facts}
    assert set(counts.values()) == {0}


def test_protocol_schema_is_served(path: str) -> None:
    with Conn(path) as conn:
        response = conn.request("protocol.schema")
    assert response["outcome"] == "accepted"
    assert response["receipt"] == json.loads(canonical.dumps(client_v1.schema_document()))


@pytest.mark.parametrize(
    ("operation", "payload"),
    [
        ("server.status", {"x": "secret-value"}),
        ("server.status", ["secret-value"]),
        ("server.status", "secret-value"),
        ("protocol.schema", {"x": "secret-value"}),
        ("protocol.schema", [1]),
    ],
)
def test_invalid_payload_for_a_served_operation_is_rejected(
    path: str, witness: Conn, operation: str, payload: Any
) -> None:
    with Conn(path) as conn:
        response = conn.request(operation, payload=payload)
        assert_refusal(response, "rejected", "validationFailed")
        assert "secret-value" not in response["error"]  # names fields, never echoes values
        assert_status_ok(conn)  # the connection stays open
    assert_status_ok(witness)


def test_payload_null_for_a_served_operation_is_rejected(path: str) -> None:
    with Conn(path) as conn:
        conn.send(canonical_line(envelope(payload=None, requestId="null-payload")))
        response = conn.read_message()
        assert response["requestId"] == "null-payload"
        assert_refusal(response, "rejected", "validationFailed")
        assert_status_ok(conn)


def test_every_unserved_operation_is_rejected_not_available_and_not_stored(server: ServerProcess, path: str) -> None:
    """Listed operations not served yet and upstream's operations this server never serves (its
    older and newer lists): rejected notAvailable, nothing stored, the connection stays open."""
    not_yet = [op for op in client_v1.OPERATIONS if op not in client_v1.OPERATION_SHAPES]
    assert not_yet == client_v1.schema_document()["notYetServed"]
    assert list(client_v1.UPSTREAM_UNSERVED) == client_v1.schema_document()["upstreamNotServed"]
    assert {"host.status", "notification.claim", "view.session.window"} <= set(client_v1.UPSTREAM_UNSERVED)
    unserved = not_yet + list(client_v1.UPSTREAM_UNSERVED)
    client_id = "client-unserved-" + uuid.uuid4().hex
    with Conn(path) as conn:
        for op in unserved:
            response = conn.request(op, payload={"b": 1, "a": [2]}, client_id=client_id, key=f"k-{op}", run_id="run-1")
            assert_refusal(response, "rejected", "notAvailable")
            assert op in response["error"]
            assert set(response) == {"schema", "type", "requestId", "outcome", "receipt", "error"}
        # same keys, other requests: still notAvailable, never conflict (nothing was stored)
        for op in unserved:
            response = conn.request(op, payload=None, client_id=client_id, key=f"k-{op}", expected_revision=3)
            assert_refusal(response, "rejected", "notAvailable")
        assert_status_ok(conn)
    db = sqlite3.connect(f"file:{StatePaths.resolve(server.state_dir).database}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT count(*) FROM host_commands WHERE client_id = ?", (client_id,)).fetchone()[0]
    finally:
        db.close()
    assert rows == 0


def test_empty_lines_between_frames_are_skipped(path: str) -> None:
    """Upstream's clients may send an empty line: it is skipped, and the frames around it are
    answered on the same connection (a line with only a CR is still malformed)."""
    with Conn(path) as conn:
        conn.send(b"\n" + request_line(request_id="first") + b"\n\n" + request_line(request_id="second") + b"\n")
        assert sorted(conn.read_message()["requestId"] for _ in range(2)) == ["first", "second"]
        assert_status_ok(conn)
    with Conn(path) as bad:
        bad.send_ignoring_close(b"\r\n")
        assert bad.read_until_closed() == b""


def test_sender_payload_order_is_accepted_over_the_socket(path: str) -> None:
    with Conn(path) as conn:
        line = canonical_line(envelope(operation="resourceManager.apply", requestId="order")).replace(
            b'"payload":{}', b'"payload":{"b":1,"a":{"z":1,"y":2},"1x":0}'
        )
        conn.send(line)
        response = conn.read_message()
        assert response["requestId"] == "order"
        assert_refusal(response, "rejected", "notAvailable")


# --- requestIds on one connection -------------------------------------------------------


def test_pipelined_requests_are_all_answered_by_request_id(path: str) -> None:
    with Conn(path) as conn:
        conn.send(
            request_line(request_id="one")
            + request_line("protocol.schema", request_id="two")
            + request_line("resourceManager.list", request_id="three")
        )
        responses = {m["requestId"]: m for m in (conn.read_message() for _ in range(3))}
    assert set(responses) == {"one", "two", "three"}
    assert responses["one"]["outcome"] == "accepted"
    assert responses["two"]["outcome"] == "accepted"
    assert_refusal(responses["three"], "rejected", "notAvailable")


def test_request_id_reused_while_in_flight_is_a_conflict(path: str) -> None:
    """Both lines arrive in one write, so the second is parsed before the first task runs."""
    with Conn(path) as conn:
        conn.send(request_line(request_id="dup") + request_line(request_id="dup"))
        first, second = conn.read_message(), conn.read_message()
        assert first["requestId"] == second["requestId"] == "dup"
        outcomes = sorted([first["outcome"], second["outcome"]])
        assert outcomes == ["accepted", "conflict"], (first, second)
        refusal = first if first["outcome"] == "conflict" else second
        assert_refusal(refusal, "conflict", "requestInFlight")
        # once answered, the requestId may be used again
        assert conn.request("server.status", request_id="dup")["outcome"] == "accepted"


def test_eight_clients_interleave(path: str) -> None:
    errors: list[BaseException] = []
    results: dict[int, dict[str, str]] = {}

    def client(n: int) -> None:
        try:
            with Conn(path) as conn:
                ids = [f"t{n}-r{i}" for i in range(50)]
                conn.send(b"".join(request_line(request_id=i, client_id=f"client-{n}") for i in ids))
                got = {}
                for _ in ids:
                    message = conn.read_message()
                    assert message["type"] == "response"
                    got[message["requestId"]] = message["outcome"]
                assert set(got) == set(ids)
                results[n] = got
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert len(results) == 8
    outcomes = [o for got in results.values() for o in got.values()]
    assert len(outcomes) == 400 and set(outcomes) == {"accepted"}


# --- fuzz ------------------------------------------------------------------------------------

FUZZ_BASE = request_line(request_id="fuzz", key="fuzz-key")[:-1]


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    line = bytearray(FUZZ_BASE)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "replace"]))
        if kind == "insert":
            pos = draw(st.integers(min_value=0, max_value=len(line)))
            line[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif line:
            pos = draw(st.integers(min_value=0, max_value=len(line) - 1))
            if kind == "flip":
                line[pos] ^= 1 << draw(st.integers(min_value=0, max_value=7))
            elif kind == "delete":
                del line[pos]
            else:
                line[pos] = draw(st.sampled_from(b' \t\n"\\{}[],:0e.-\x00\xff\xc3'))
    return bytes(line)


FUZZ_INPUTS = st.one_of(st.binary(max_size=600), mutated_frames())


def test_fuzz_frames(server: ServerProcess, path: str) -> None:
    started = time.monotonic()
    with Conn(path) as witness:

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(data=FUZZ_INPUTS)
        def one(data: bytes) -> None:
            # a canonical frame naming server.stop must contain these exact bytes
            assume(b'"server.stop"' not in data)
            assume(data.replace(b"\n", b"") != b"")  # empty lines only: skipped, nothing to answer
            with Conn(path, timeout=10) as conn:
                conn.send_ignoring_close(data + b"\n")
                try:
                    line = conn.read_line()  # a response, if the bytes happened to form a request
                except (EOFError, ConnectionResetError):
                    pass
                else:
                    message = json.loads(line)
                    assert message["type"] == "response" and is_canonical(line)
            assert server.popen is not None and server.popen.poll() is None, server.output()
            assert_status_ok(witness)

        one()
    assert time.monotonic() - started < 90


# --- slow client ----------------------------------------------------------------------------


def test_a_client_that_never_reads_is_dropped(tmp_path: Path) -> None:
    proc = make_server(tmp_path / "s", PI_WORKFLOWS_CLIENT_OUTPUT_BUFFER_BYTES="65536").start()
    sender: threading.Thread | None = None
    slow: socket.socket | None = None
    try:
        path = socket_path(proc)
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.settimeout(60)
        slow.connect(path)  # never reads: not even the hello
        outcome: dict[str, Any] = {}

        def flood() -> None:
            sent = 0
            chunk = b"".join(request_line(request_id=f"slow-{i}", client_id="slow", key="k") for i in range(500))
            try:
                for _ in range(400):  # 200,000 requests
                    slow.sendall(chunk)
                    sent += 500
                outcome["result"] = "all sent"
            except (BrokenPipeError, ConnectionResetError) as exc:
                outcome["result"] = type(exc).__name__
            except OSError as exc:  # timeout: the server stopped reading
                outcome["result"] = repr(exc)
            outcome["sent"] = sent

        sender = threading.Thread(target=flood, name="slow-client")
        sender.start()
        with Conn(path, timeout=10) as other:
            latencies = []
            while sender.is_alive():
                t0 = time.monotonic()
                assert_status_ok(other)
                latencies.append(time.monotonic() - t0)
                sender.join(0.002)
            assert_status_ok(other)
        assert outcome["result"] in ("BrokenPipeError", "ConnectionResetError"), outcome
        assert outcome["sent"] < 200_000
        assert latencies and max(latencies) < 5.0, max(latencies)
        wait_until(lambda: "dropped a client that does not read" in proc.output(), what="drop logged")
        assert proc.popen is not None and proc.popen.poll() is None
    finally:
        if slow is not None:
            slow.close()
        if sender is not None:
            sender.join(60)
        code = proc.stop()
    assert code == 0, proc.output()


def test_a_stalled_client_under_the_bound_is_kept_and_gets_every_answer(tmp_path: Path) -> None:
    """Below client_output_buffer_bytes (8 MiB default) a client that reads late loses nothing."""
    proc = make_server(tmp_path / "s").start()
    try:
        path = socket_path(proc)
        count = 3000  # about 1 MB of responses: more than the kernel buffers, far below 8 MiB
        with Conn(path) as stalled, Conn(path, timeout=10) as other:
            ids = [f"stalled-{i}" for i in range(count)]
            stalled.send(b"".join(request_line(request_id=i) for i in ids))
            # while it does not read, another client is answered promptly
            for _ in range(20):
                t0 = time.monotonic()
                assert_status_ok(other)
                assert time.monotonic() - t0 < 5.0
            answered = {stalled.read_message()["requestId"] for _ in ids}
            assert answered == set(ids)
            assert_status_ok(stalled)
        assert "dropped a client" not in proc.output()
    finally:
        code = proc.stop()
    assert code == 0, proc.output()


# --- idempotency of server.stop ----------------------------------------------------------------


def test_server_stop_idempotency_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "s"
    client, key = "client-stopper", "stop-key"
    first = make_server(state).start()
    try:
        with Conn(socket_path(first)) as conn:
            epoch = assert_status_ok(conn)["receipt"]["epoch"]
            assert epoch >= 1
            # an invalid payload is refused by the model before anything is stored; no stop
            assert_refusal(
                conn.request("server.stop", payload={"reason": "x"}, client_id=client, key=key),
                "rejected",
                "validationFailed",
            )
            assert_status_ok(conn)
            stop = conn.request("server.stop", client_id=client, key=key)
            assert stop["outcome"] == "accepted", stop
            assert stop["receipt"] == {"stopping": True, "serverEpoch": epoch}
            client_v1.ServerStopReceipt.model_validate(stop["receipt"])
            assert "error" not in stop
        assert first.popen is not None and first.popen.wait(30) == 0, first.output()
        assert not Path(socket_path(first)).exists()
    finally:
        first.stop()

    second = make_server(state).start()
    try:
        path = socket_path(second)
        with Conn(path) as conn:
            assert assert_status_ok(conn)["receipt"]["epoch"] == epoch + 1
            # (2) the same request again, new requestId: the stored answer, and no stop
            adopted = conn.request("server.stop", client_id=client, key=key, request_id="retry-1")
            assert adopted["outcome"] == "adopted", adopted
            assert adopted["receipt"] == {"stopping": True, "serverEpoch": epoch}
            with Conn(path) as fresh:
                status = assert_status_ok(fresh)["receipt"]
                assert status["state"] == "running" and status["epoch"] == epoch + 1
            assert_status_ok(conn)
            # (3) same key, another request (the fingerprint covers runId and expectedRevision)
            for variant in ({"expected_revision": 5}, {"run_id": "run-x"}, {"expected_revision": 0}):
                conflict = conn.request("server.stop", client_id=client, key=key, **variant)
                assert_refusal(conflict, "conflict", "idempotencyKeyReused")
            # a different payload cannot reach the receipt lookup: server.stop's model forbids every
            # member, so the router answers validationFailed before the writer sees the key
            refused = conn.request("server.stop", payload={"reason": "x"}, client_id=client, key=key)
            assert_refusal(refused, "rejected", "validationFailed")
            # none of that stored anything or stopped the server
            again = conn.request("server.stop", client_id=client, key=key)
            assert again["outcome"] == "adopted" and again["receipt"] == {"stopping": True, "serverEpoch": epoch}
            with Conn(path) as fresh:
                assert_status_ok(fresh)
            assert second.popen is not None and second.popen.poll() is None
            # the key is scoped by clientId: another client with the same key is a new command
            other = conn.request("server.stop", client_id="client-other", key=key)
            assert other["outcome"] == "accepted", other
            assert other["receipt"] == {"stopping": True, "serverEpoch": epoch + 1}
        assert second.popen.wait(30) == 0, second.output()
    finally:
        second.stop()

    db = sqlite3.connect(f"file:{StatePaths.resolve(state).database}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT client_id, idempotency_key, operation, outcome FROM host_commands ORDER BY created_at, client_id"
        ).fetchall()
    finally:
        db.close()
    assert rows == [(client, key, "server.stop", "accepted"), ("client-other", key, "server.stop", "accepted")]


def test_a_stop_request_is_answered_before_the_server_exits(tmp_path: Path) -> None:
    proc = make_server(tmp_path / "s").start()
    try:
        path = socket_path(proc)
        with Conn(path) as watcher, Conn(path) as conn:
            assert_status_ok(watcher)
            stop = conn.request("server.stop")
            assert stop["outcome"] == "accepted"
            # the other connection is closed by the shutdown, not left hanging
            assert watcher.read_until_closed() == b""
        assert proc.popen is not None and proc.popen.wait(30) == 0, proc.output()
    finally:
        proc.stop()

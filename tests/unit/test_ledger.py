"""stress.ledger: the scripted HTTP ledger used by the http performer tests and the stress harness."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stress.ledger import LedgerServer

pytestmark = pytest.mark.timeout(30)


def call(url: str, path: str, key: str | None = None, method: str = "POST", body: bytes = b"{}", timeout: float = 10):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Idempotency-Key": key} if key else {})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


def test_scripted_sequence_last_action_repeats() -> None:
    with LedgerServer({"/pay": ["500", "500", "200"]}) as ledger:
        statuses = [call(ledger.url, "/pay", "k1")[0] for _ in range(4)]
        assert statuses == [500, 500, 200, 200]
        assert ledger.keys() == ["k1"] * 4
        assert ledger.count("k1") == 4
        assert ledger.count("other") == 0


def test_answer_body_and_unscripted_default() -> None:
    with LedgerServer({"/a": ["404"]}) as ledger:
        status, content_type, body = call(ledger.url, "/a", "key-a")
        assert (status, content_type, json.loads(body)) == (
            404,
            "application/json",
            {"ok": False, "key": "key-a", "n": 1},
        )
        status, _, body = call(ledger.url, "/elsewhere?x=1", "key-b")
        assert (status, json.loads(body)) == (200, {"ok": True, "key": "key-b", "n": 1})
        status, _, body = call(ledger.url, "/elsewhere", "key-b")
        assert json.loads(body)["n"] == 2


def test_requests_are_recorded() -> None:
    with LedgerServer() as ledger:
        call(ledger.url, "/r?q=1", "k", method="PUT", body=b'{"amount": 5}')
        call(ledger.url, "/r", None, method="GET", body=b"")
        first, second = ledger.requests
        assert first["method"] == "PUT" and first["path"] == "/r?q=1"
        assert first["idempotencyKey"] == "k" and first["headers"]["idempotency-key"] == "k"
        assert first["body"] == '{"amount": 5}'
        assert second["idempotencyKey"] is None and second["body"] == ""
        assert ledger.keys() == ["k"]


def test_set_script_at_runtime() -> None:
    with LedgerServer() as ledger:
        assert call(ledger.url, "/x", "k")[0] == 200
        ledger.set_script("/x", ["503", "201"])
        assert [call(ledger.url, "/x", "k")[0] for _ in range(3)] == [503, 201, 201]


def test_echo_reflects_the_request_headers_in_the_body_and_the_answer_headers() -> None:
    with LedgerServer({"/e": ["echo:201", "echo-text:502"]}) as ledger:
        host, port = ledger.url.removeprefix("http://").split(":")
        for status, media in ((201, "application/json"), (502, "text/plain; charset=utf-8")):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                conn.request("POST", "/e", body=b"{}", headers={"Idempotency-Key": "k", "X-Token": "t-1"})
                response = conn.getresponse()
                body = response.read()
                assert (response.status, response.getheader("Content-Type")) == (status, media)
                assert response.getheader("X-Echo-x-token") == "t-1"
            finally:
                conn.close()
            if status == 201:
                assert json.loads(body)["headers"]["x-token"] == "t-1" and json.loads(body)["key"] == "k"
            else:
                assert "x-token: t-1\n" in body.decode()
        assert [r["answer"] for r in ledger.requests] == ["echo:201", "echo-text:502"]
        assert call(ledger.url, "/e")[0] == 502  # the last action repeats
        ledger.set_script("/bad", ["echo:abc"])
        with pytest.raises(http.client.RemoteDisconnected):
            call(ledger.url, "/bad")


def test_ledger_file_lines(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    with LedgerServer({"/p": ["500", "200"]}, ledger_path=path) as ledger:
        call(ledger.url, "/p", "k1", body=b"one")
        call(ledger.url, "/p", "k1", body=b"two")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["idempotencyKey"], line["body"], line["method"], line["path"]) for line in lines] == [
        ("k1", "one", "POST", "/p"),
        ("k1", "two", "POST", "/p"),
    ]
    assert lines == ledger.requests


def test_close_answers_nothing_but_records() -> None:
    with LedgerServer({"/c": ["close", "200"]}) as ledger:
        with pytest.raises(http.client.RemoteDisconnected):
            call(ledger.url, "/c", "k")
        assert ledger.count("k") == 1
        assert call(ledger.url, "/c", "k")[0] == 200


class _Notifying(LedgerServer):
    """Tells when a request was recorded (so a test never polls)."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        super().__init__(script)
        self.recorded = threading.Event()

    def _record(self, record, path):  # type: ignore[no-untyped-def]
        result = super()._record(record, path)
        self.recorded.set()
        return result


def test_stop_is_prompt_while_a_request_hangs() -> None:
    ledger = _Notifying({"/h": ["hang"]})
    ledger.start()
    failures: list[BaseException] = []

    def client() -> None:
        try:
            call(ledger.url, "/h", "k", timeout=20)
        except BaseException as exc:  # the connection closes without an answer
            failures.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    assert ledger.recorded.wait(10)  # recorded before it hangs
    started = time.monotonic()
    ledger.stop()
    assert time.monotonic() - started < 2
    thread.join(10)
    assert not thread.is_alive()
    assert failures and isinstance(failures[0], http.client.RemoteDisconnected)


def test_runs_as_a_process(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stress.ledger", "--ledger", str(path), "--script", '{"/s": ["201"]}'],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready http://127.0.0.1:")
        url = line.split()[1]
        assert call(url, "/s", "pk")[0] == 201
        assert json.loads(path.read_text())["idempotencyKey"] == "pk"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

"""The http.request performer: payload validation and how each attempt settles."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from piworkflows import paths
from piworkflows.performers import Outcome
from piworkflows.performers.http import MAX_BODY_BYTES, PERFORMER, HttpPerformer, check_static_request, payload
from stress.ledger import LedgerServer

pytestmark = pytest.mark.timeout(30)

SECRET = "Bearer tok-9f8e7d-never-shown"
KEY = "wf-run-1:node-a:0"


def never_spawned(pid: int) -> bool:
    raise AssertionError("the http performer starts no process")


def perform(request: dict[str, Any], policy: str = "idempotent", timeout_ms: int = 5000, key: str = KEY) -> Outcome:
    return HttpPerformer().perform(payload(request, timeout_ms), key, policy, never_spawned)


@pytest.fixture
def ledger() -> Iterator[LedgerServer]:
    with LedgerServer() as server:
        yield server


@pytest.fixture
def credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv(paths.CONFIG_DIR_ENV, str(directory))
    path = directory / "credentials.json"
    path.write_text(json.dumps({"secrets": {"TOKEN": SECRET}}))
    os.chmod(path, 0o600)
    return path


# --- payload -------------------------------------------------------------------------------------------------


def test_payload_normalizes() -> None:
    value = payload({"method": "post", "url": "https://api.example.com/v1/pay?x=1", "body": {"amount": 5}}, 3000)
    assert value == {
        "performer": PERFORMER,
        "method": "POST",
        "url": "https://api.example.com/v1/pay?x=1",
        "headers": {"Content-Type": "application/json"},
        "body": {"amount": 5},
        "timeoutMs": 3000,
    }


def test_payload_content_types() -> None:
    assert payload({"method": "PUT", "url": "http://h/", "body": "hi"}, 1)["headers"] == {
        "Content-Type": "text/plain;charset=utf-8"
    }
    given = payload({"method": "PUT", "url": "http://h/", "headers": {"content-type": "text/csv"}, "body": [1]}, 1)
    assert given["headers"] == {"content-type": "text/csv"}
    no_body = payload({"method": "GET", "url": "http://h"}, 1)
    assert no_body["headers"] == {} and "body" not in no_body


def test_payload_keeps_secret_references() -> None:
    request = {"method": "GET", "url": "http://h/", "headers": {"Authorization": {"secret": "TOKEN"}, "X-A": "b"}}
    value = payload(request, 10)
    assert value["headers"] == {"Authorization": {"secret": "TOKEN"}, "X-A": "b"}
    check_static_request(request)


@pytest.mark.parametrize("name", ["Authorization", "authorization", "AUTHORIZATION", "aUtHoRiZaTiOn"])
def test_literal_authorization_is_refused(name: str) -> None:
    request = {"method": "GET", "url": "http://h/", "headers": {name: "Bearer x"}}
    message = 'a literal Authorization header is refused: name a secret instead, {"secret": "NAME"}'
    with pytest.raises(ValueError) as info:
        payload(request, 10)
    assert str(info.value) == message
    with pytest.raises(ValueError, match="literal Authorization"):
        check_static_request(request)


@pytest.mark.parametrize("name", ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"])
def test_idempotency_key_header_is_refused(name: str) -> None:
    request = {"method": "POST", "url": "http://h/", "headers": {name: "mine"}}
    with pytest.raises(ValueError, match="the performer sets it"):
        payload(request, 10)
    with pytest.raises(ValueError, match="the performer sets it"):
        check_static_request(request)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ("GET http://h/", r"request must return \{method, url, headers\?, body\?\}"),
        ({"method": "GET", "url": "http://h/", "json": {}}, r"unknown fields: \['json'\]"),
        ({"method": "TRACE", "url": "http://h/"}, "method must be one of GET, HEAD, POST, PUT, PATCH, DELETE"),
        ({"method": 1, "url": "http://h/"}, "method must be one of"),
        ({"url": "http://h/"}, "method must be one of"),
        ({"method": "GET"}, "url must be a string"),
        ({"method": "GET", "url": "ftp://h/"}, "url must be http:// or https:// with a host"),
        ({"method": "GET", "url": "http:///path"}, "url must be http:// or https:// with a host"),
        ({"method": "GET", "url": "h/path"}, "url must be http:// or https:// with a host"),
        ({"method": "GET", "url": "http://h/a b"}, "without spaces or control characters"),
        ({"method": "GET", "url": "http://h:99999/"}, "invalid port"),
        ({"method": "GET", "url": "http://u:p@h/"}, "credentials in the request url are refused"),
        ({"method": "GET", "url": "http://h/", "headers": [["A", "b"]]}, "headers must be an object"),
        ({"method": "GET", "url": "http://h/", "headers": {"A": 1}}, "must be a string or"),
        ({"method": "GET", "url": "http://h/", "headers": {"Bad Name": "x"}}, "invalid header name"),
        ({"method": "GET", "url": "http://h/", "headers": {"A": "x\r\nB: y"}}, "control character"),
        ({"method": "GET", "url": "http://h/", "headers": {"A": "x", "a": "y"}}, "given twice"),
        ({"method": "GET", "url": "http://h/", "headers": {"A": {"secret": "1bad"}}}, "secret reference"),
        ({"method": "GET", "url": "http://h/", "headers": {"A": {"secret": "T", "x": 1}}}, "secret reference"),
        ({"method": "GET", "url": "http://h/", "headers": {"Content-Length": "3"}}, "the performer sets it"),
        ({"method": "POST", "url": "http://h/", "body": {1, 2}}, "body must be a JSON value"),
        ({"method": "POST", "url": "http://h/", "body": float("nan")}, "body must be a JSON value"),
    ],
)
def test_payload_refusals(request_: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        payload(request_, 10)


@pytest.mark.parametrize("timeout_ms", [0, -1, 1.5, True, "10"])
def test_payload_timeout_must_be_positive_int(timeout_ms: Any) -> None:
    with pytest.raises(ValueError, match="timeoutMs must be a positive integer"):
        payload({"method": "GET", "url": "http://h/"}, timeout_ms)


# --- perform -------------------------------------------------------------------------------------------------


def test_2xx_json_body_is_parsed_and_key_sent(ledger: LedgerServer) -> None:
    ledger.set_script("/pay", ["201"])
    outcome = perform({"method": "POST", "url": ledger.url + "/pay?q=1", "body": {"amount": 5}})
    assert outcome.settlement == "applied" and outcome.error is None
    output = outcome.result["output"]
    assert outcome.result["nodeOutcome"] == "ok"
    assert output["status"] == 201
    assert output["body"] == {"ok": True, "key": KEY, "n": 1}
    assert output["headers"]["content-type"] == "application/json"
    assert all(name == name.lower() for name in output["headers"])
    (seen,) = ledger.requests
    assert (seen["method"], seen["path"], seen["idempotencyKey"]) == ("POST", "/pay?q=1", KEY)
    assert seen["headers"]["content-type"] == "application/json"
    assert json.loads(seen["body"]) == {"amount": 5}


def test_text_request_body(ledger: LedgerServer) -> None:
    outcome = perform({"method": "PUT", "url": ledger.url + "/t", "body": "héllo"})
    assert outcome.settlement == "applied"
    assert ledger.requests[0]["body"] == "héllo"
    assert ledger.requests[0]["headers"]["content-type"] == "text/plain;charset=utf-8"


class _TextHandler(BaseHTTPRequestHandler):
    """Answers text: ``/big`` with more than 1 MiB, anything else with a short line."""

    def do_GET(self) -> None:
        body = b"x" * (MAX_BODY_BYTES + 10) if self.path == "/big" else "plain héllo".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Twice", "a")
        self.send_header("x-twice", "b")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server in a thread answering with ``handler``; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def text_server() -> Iterator[str]:
    yield from _serving(_TextHandler)


def test_text_answer(text_server: str) -> None:
    outcome = perform({"method": "GET", "url": text_server + "/t"}, "manual")
    output = outcome.result["output"]
    assert (outcome.settlement, output["status"], output["body"]) == ("applied", 200, "plain héllo")
    assert output["headers"]["x-twice"] == "a, b"
    assert "bodyTruncated" not in output


def test_answer_past_the_limit_is_truncated(text_server: str) -> None:
    output = perform({"method": "GET", "url": text_server + "/big"}).result["output"]
    assert len(output["body"]) == MAX_BODY_BYTES and output["bodyTruncated"] is True


def test_text_and_empty_answers(ledger: LedgerServer) -> None:
    from piworkflows.performers.http import _decode

    assert _decode(b"plain \xff text", "text/plain") == "plain \ufffd text"
    assert _decode(b'{"a": 1}', "application/problem+json; charset=utf-8") == {"a": 1}
    assert _decode(b"{not json", "application/json") == "{not json"
    assert _decode(b"", "application/json") is None
    head = perform({"method": "HEAD", "url": ledger.url + "/h"})
    assert head.settlement == "applied" and head.result["output"]["body"] is None


def test_4xx_is_rejected(ledger: LedgerServer) -> None:
    ledger.set_script("/missing", ["404"])
    for policy in ("idempotent", "manual"):
        outcome = perform({"method": "GET", "url": ledger.url + "/missing"}, policy)
        assert (outcome.settlement, outcome.error_code) == ("rejected", "httpClientError")
        assert outcome.error.startswith("HTTP 404 Not Found: {")


def test_5xx_idempotent_retries(ledger: LedgerServer) -> None:
    ledger.set_script("/flaky", ["500"])
    outcome = perform({"method": "POST", "url": ledger.url + "/flaky", "body": {"secretish": "body-text"}})
    assert (outcome.settlement, outcome.error_code) == ("retry", "httpServerError")
    assert outcome.error.startswith("HTTP 500 Internal Server Error")
    assert "body-text" not in repr(outcome)


def test_5xx_manual_is_rejected(ledger: LedgerServer) -> None:
    ledger.set_script("/flaky", ["503"])
    outcome = perform({"method": "POST", "url": ledger.url + "/flaky"}, "manual")
    assert (outcome.settlement, outcome.error_code) == ("rejected", "httpServerError")


def test_3xx_is_unexpected(ledger: LedgerServer) -> None:
    ledger.set_script("/moved", ["302"])
    outcome = perform({"method": "GET", "url": ledger.url + "/moved"})
    assert (outcome.settlement, outcome.error_code) == ("rejected", "httpUnexpectedStatus")
    assert "redirects are not followed" in outcome.error
    assert len(ledger.requests) == 1


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("policy", "settlement"), [("idempotent", "retry"), ("manual", "rejected")])
def test_connection_refused(policy: str, settlement: str) -> None:
    outcome = perform({"method": "POST", "url": f"http://127.0.0.1:{closed_port()}/x"}, policy)
    assert (outcome.settlement, outcome.error_code) == (settlement, "connectionFailed")
    assert "could not connect" in outcome.error


@pytest.mark.parametrize(("policy", "settlement"), [("idempotent", "retry"), ("manual", "ambiguous")])
def test_no_answer_before_timeout(ledger: LedgerServer, policy: str, settlement: str) -> None:
    ledger.set_script("/slow", ["hang"])
    outcome = perform({"method": "POST", "url": ledger.url + "/slow"}, policy, timeout_ms=300)
    assert (outcome.settlement, outcome.error_code) == (settlement, "noAnswer")
    assert "timed out" in outcome.error
    assert ledger.keys() == [KEY]


@pytest.mark.parametrize(("policy", "settlement"), [("idempotent", "retry"), ("manual", "ambiguous")])
def test_connection_closed_without_answer(ledger: LedgerServer, policy: str, settlement: str) -> None:
    ledger.set_script("/drop", ["close"])
    outcome = perform({"method": "DELETE", "url": ledger.url + "/drop"}, policy)
    assert (outcome.settlement, outcome.error_code) == (settlement, "noAnswer")
    assert ledger.keys() == [KEY]


def test_secret_header_reaches_server_only(ledger: LedgerServer, credentials: Path) -> None:
    ledger.set_script("/auth", ["200"])
    request = {"method": "GET", "url": ledger.url + "/auth", "headers": {"Authorization": {"secret": "TOKEN"}}}
    value = payload(request, 5000)
    assert SECRET not in json.dumps(value)
    outcome = HttpPerformer().perform(value, KEY, "idempotent", never_spawned)
    assert outcome.settlement == "applied"
    assert ledger.requests[0]["headers"]["authorization"] == SECRET
    assert SECRET not in repr(outcome)
    ledger.set_script("/auth", ["404"])
    failed = HttpPerformer().perform(value, KEY, "manual", never_spawned)
    assert failed.settlement == "rejected" and SECRET not in repr(failed)


def auth_request(ledger: LedgerServer, name: str = "TOKEN") -> dict[str, Any]:
    return {"method": "POST", "url": ledger.url + "/auth", "headers": {"Authorization": {"secret": name}}}


def assert_secret_unavailable(outcome: Outcome, ledger: LedgerServer) -> None:
    assert (outcome.settlement, outcome.error_code) == ("rejected", "secretUnavailable")
    assert SECRET not in repr(outcome)
    assert ledger.requests == []


def test_missing_credentials_file(ledger: LedgerServer, credentials: Path) -> None:
    credentials.unlink()
    assert_secret_unavailable(perform(auth_request(ledger), "manual"), ledger)


def test_credentials_file_readable_by_others(ledger: LedgerServer, credentials: Path) -> None:
    os.chmod(credentials, 0o644)
    outcome = perform(auth_request(ledger))
    assert_secret_unavailable(outcome, ledger)
    assert "chmod 600" in outcome.error


def test_unknown_secret(ledger: LedgerServer, credentials: Path) -> None:
    outcome = perform(auth_request(ledger, "OTHER"))
    assert_secret_unavailable(outcome, ledger)
    assert "OTHER" in outcome.error


def test_secret_that_is_not_a_header_value(ledger: LedgerServer, credentials: Path) -> None:
    credentials.write_text(json.dumps({"secrets": {"TOKEN": SECRET + "\r\nX-Evil: 1"}}))
    assert_secret_unavailable(perform(auth_request(ledger)), ledger)


# --- a remote that echoes the secret ----------------------------------------------------------------------


MARK = "[secret:TOKEN]"


def echo_request(ledger: LedgerServer, path: str) -> dict[str, Any]:
    headers = {"Authorization": {"secret": "TOKEN"}, "X-Short": {"secret": "SHORT"}, "X-Plain": "visible"}
    return {"method": "POST", "url": ledger.url + path, "headers": headers, "body": {"n": 1}}


@pytest.fixture
def two_secrets(credentials: Path) -> None:
    """TOKEN, and SHORT: a part of TOKEN's value (the longer one is replaced first)."""
    credentials.write_text(json.dumps({"secrets": {"TOKEN": SECRET, "SHORT": "tok-9f8e7d"}}))


@pytest.mark.parametrize(
    ("action", "policy", "settlement", "error_code"),
    [
        ("echo:200", "idempotent", "applied", None),
        ("echo-text:201", "manual", "applied", None),
        ("echo:404", "idempotent", "rejected", "httpClientError"),
        ("echo-text:400", "manual", "rejected", "httpClientError"),
        ("echo:500", "idempotent", "retry", "httpServerError"),
        ("echo-text:503", "manual", "rejected", "httpServerError"),
    ],
)
def test_an_echoed_secret_is_scrubbed_from_the_outcome(
    ledger: LedgerServer, two_secrets: None, action: str, policy: str, settlement: str, error_code: str | None
) -> None:
    ledger.set_script("/echo", [action])
    outcome = perform(echo_request(ledger, "/echo"), policy)
    assert (outcome.settlement, outcome.error_code) == (settlement, error_code)
    assert ledger.requests[0]["headers"]["authorization"] == SECRET  # it was sent, and reflected
    assert SECRET not in repr(outcome) and "tok-9f8e7d" not in repr(outcome)
    if settlement == "applied":
        output = outcome.result["output"]
        assert output["headers"]["x-echo-authorization"] == MARK
        assert output["headers"]["x-echo-x-short"] == "[secret:SHORT]"
        assert output["headers"]["x-echo-x-plain"] == "visible"
        if action.startswith("echo:"):
            assert output["body"]["headers"]["authorization"] == MARK
            assert output["body"]["headers"]["x-short"] == "[secret:SHORT]"
        else:
            assert f"authorization: {MARK}\n" in output["body"] and "x-short: [secret:SHORT]\n" in output["body"]
    else:
        assert outcome.result is None
        assert MARK in outcome.error and "[secret:SHORT]" in outcome.error and "visible" in outcome.error


class _ReflectingHandler(BaseHTTPRequestHandler):
    """Reflects the Authorization header where a test needs it: ``/pad/STATUS/N`` answers STATUS with
    N "x" then the header value then more text; ``/reason`` answers 400 with it as the reason
    phrase; ``/garbage`` sends it in a status line that is not HTTP."""

    def do_GET(self) -> None:
        reflected = self.headers["Authorization"]
        kind, *numbers = self.path.strip("/").split("/")
        if kind == "garbage":
            self.wfile.write(f"NOT-HTTP {reflected}\r\n\r\n".encode())
            return
        body = b""
        if kind == "reason":
            self.send_response(400, reflected)
        else:
            status, count = map(int, numbers)
            body = ("x" * count + reflected + " and more text after it").encode()
            self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def reflecting_server() -> Iterator[str]:
    yield from _serving(_ReflectingHandler)


def reflect(url: str, policy: str = "idempotent") -> Outcome:
    return perform({"method": "GET", "url": url, "headers": {"Authorization": {"secret": "TOKEN"}}}, policy)


def test_a_secret_ending_at_the_read_limit_is_scrubbed_before_the_body_is_cut(
    reflecting_server: str, credentials: Path
) -> None:
    """The body is read up to one byte past 256 KiB; the secret's last byte is that one. Cut
    first, all of the secret but its last character would be stored."""
    before = MAX_BODY_BYTES + 1 - len(SECRET)
    output = reflect(f"{reflecting_server}/pad/200/{before}").result["output"]
    assert output["bodyTruncated"] is True
    assert output["body"] == "x" * before + MARK


def test_the_start_of_a_secret_cut_off_at_the_read_limit_is_dropped(reflecting_server: str, credentials: Path) -> None:
    output = reflect(f"{reflecting_server}/pad/200/{MAX_BODY_BYTES - 5}").result["output"]
    assert output["bodyTruncated"] is True
    assert output["body"] == "x" * (MAX_BODY_BYTES - 5)  # not "...xxBeare"


def test_a_secret_at_the_error_text_limit_is_scrubbed_before_the_text_is_cut(
    reflecting_server: str, credentials: Path
) -> None:
    outcome = reflect(f"{reflecting_server}/pad/404/1990")
    assert (outcome.settlement, outcome.error_code) == ("rejected", "httpClientError")
    assert outcome.error == "HTTP 404 Not Found: " + ("x" * 1990 + MARK)[:2000]  # not "...xxBearer tok"


def test_a_secret_in_the_reason_phrase_or_a_broken_status_line_is_scrubbed(
    reflecting_server: str, credentials: Path
) -> None:
    reason = reflect(f"{reflecting_server}/reason")
    assert (reason.settlement, reason.error) == ("rejected", f"HTTP 400 {MARK}")
    garbage = reflect(f"{reflecting_server}/garbage", "manual")
    assert (garbage.settlement, garbage.error_code) == ("ambiguous", "noAnswer")
    assert SECRET not in garbage.error and f"BadStatusLine: NOT-HTTP {MARK}" in garbage.error


@pytest.mark.parametrize("value", ["pässwörd", ""])
def test_a_secret_that_is_empty_or_not_ascii_is_never_sent(ledger: LedgerServer, credentials: Path, value: str) -> None:
    """Only a non-empty ASCII value can be found by a scrub: it has one byte form in any answer."""
    credentials.write_text(json.dumps({"secrets": {"TOKEN": value}}))
    assert_secret_unavailable(perform(auth_request(ledger)), ledger)

"""``http.request`` effects: one HTTP request, sent with the effect's idempotency key.

::

    resolve {"secret": NAME} headers (credentials file)   failure: rejected, nothing sent
    connect (TCP, TLS)                                     failure: nothing was sent
    send method url headers + Idempotency-Key body        failure from here on: maybe acted
    status line + headers, body up to 256 KiB             2xx applied, 4xx rejected, 5xx retry/rejected
    the Outcome, scrubbed: each secret value sent          -> "[secret:NAME]" (a remote may echo it)

Output: ``{status, headers, body}`` (lower-case header names; a JSON body
parsed, other bodies as text, none as null; ``bodyTruncated: true`` past
256 KiB). Failing to connect means nothing was sent: idempotent effects retry,
manual ones are rejected. A failure after sending started (no answer, a
timeout) may have acted: idempotent effects retry under the same key, manual
ones become ``ambiguous``. Secrets never enter the payload, and no error text
holds a header value or the request body. What the remote answered (headers,
body, reason, an error) is scrubbed of every secret value the request carried
before anything is cut and before the Outcome leaves the performer.
"""

from __future__ import annotations

import dataclasses
import http.client
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from piworkflows import canonical, faults
from piworkflows.credentials import (
    CredentialsError,
    drop_partial_secret,
    load_secret,
    scrub,
    valid_name,
    value_problem,
)
from piworkflows.performers import Outcome

PERFORMER = "http.request"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
MAX_BODY_BYTES = 256 * 1024  # the stored result must fit one blob frame
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SET_BY_PERFORMER = {"idempotency-key", "content-length", "transfer-encoding"}


def _check_headers(headers: Any) -> None:
    if not isinstance(headers, dict):
        raise ValueError('request headers must be an object of name -> string or {"secret": NAME}')
    seen: set[str] = set()
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise ValueError(f"invalid header name {name!r}")
        lower = name.lower()
        if lower in seen:
            raise ValueError(f"header {name!r} is given twice")
        seen.add(lower)
        if lower in _SET_BY_PERFORMER:
            raise ValueError(f"the {name} header is refused: the performer sets it")
        if isinstance(value, dict):
            if set(value) != {"secret"} or not valid_name(value["secret"]):
                raise ValueError(f'header {name!r}: a secret reference is {{"secret": NAME}} with a valid name')
        elif not isinstance(value, str):
            raise ValueError(f'header {name!r} must be a string or {{"secret": NAME}}')
        elif lower == "authorization":
            raise ValueError('a literal Authorization header is refused: name a secret instead, {"secret": "NAME"}')
        elif _BAD_VALUE.search(value):
            raise ValueError(f"header {name!r} holds a control character")


def _normalize(request: Any) -> dict[str, Any]:
    if not isinstance(request, dict):
        raise ValueError("request must return {method, url, headers?, body?}")
    unknown = set(request) - {"method", "url", "headers", "body"}
    if unknown:
        raise ValueError(f"request returned unknown fields: {sorted(unknown)}")
    method = request.get("method")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ValueError(f"request method must be one of {', '.join(METHODS)}")
    url = request.get("url")
    if not isinstance(url, str) or re.search(r"[\x00-\x20\x7f]", url):
        raise ValueError("request url must be a string without spaces or control characters")
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on an invalid port
    except ValueError:
        raise ValueError(f"request url has an invalid port: {url}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"request url must be http:// or https:// with a host: {url}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in the request url are refused: name a secret in a header instead")
    headers = request.get("headers", {})
    _check_headers(headers)
    headers = dict(headers)
    value: dict[str, Any] = {"performer": PERFORMER, "method": method.upper(), "url": url, "headers": headers}
    body = request.get("body")
    if body is not None:
        try:
            canonical.dumps_bytes(body)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"request body must be a JSON value: {exc}") from None
        if isinstance(body, str) and re.search("[\ud800-\udfff]", body):
            raise ValueError("request body text holds surrogate code points (not valid UTF-8)")
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "text/plain;charset=utf-8" if isinstance(body, str) else "application/json"
        value["body"] = body
    return value


def check_static_request(request: dict[str, Any]) -> None:
    """Refuse a request given as a dict at compile time (literal Authorization, Idempotency-Key, ...)."""
    _normalize(request)


def payload(request: Any, timeout_ms: int) -> dict[str, Any]:
    """The effect payload of a node's ``request(ctx)`` result; refuses what must not be sent."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
        raise ValueError("http timeoutMs must be a positive integer")
    return {**_normalize(request), "timeoutMs": timeout_ms}


def _failure(exc: BaseException) -> str:
    """Describe a transport error without quoting what was sent."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, (OSError, http.client.HTTPException)):
        return f"{type(exc).__name__}: {exc}"
    return type(exc).__name__


def _decode(data: bytes, content_type: str) -> Any:
    if not data:
        return None
    media = content_type.split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        try:
            return canonical.loads(data)
        except ValueError:
            pass
    return data.decode("utf-8", errors="replace")


def _body(data: bytes, content_type: str, truncated: bool, secrets: Mapping[str, str]) -> Any:
    """The answer's body, scrubbed before it is cut: a body cut short (``data`` may hold one byte
    past the limit) is text of at most MAX_BODY_BYTES, without the start of a secret at its end."""
    if not truncated:
        return scrub(_decode(data, content_type), secrets)
    text = scrub(data.decode("utf-8", errors="replace"), secrets)
    return drop_partial_secret(text.encode()[:MAX_BODY_BYTES].decode("utf-8", errors="replace"), secrets)


class HttpPerformer:
    def perform(self, payload: dict[str, Any], key: str, policy: str, spawned: Callable[[int], bool]) -> Outcome:
        headers: dict[str, str] = {}
        secrets: dict[str, str] = {}  # name -> value of each secret this request carries
        try:
            for name, value in payload["headers"].items():
                if not isinstance(value, dict):
                    headers[name] = value  # checked when the payload was made
                    continue
                headers[name] = secrets[value["secret"]] = load_secret(value["secret"])
                if value_problem(headers[name]) is not None:  # stored before the rule, or edited by hand
                    raise CredentialsError(f"the secret for header {name!r} is not a valid header value")
        except CredentialsError as exc:
            return Outcome("rejected", error=str(exc), error_code="secretUnavailable")
        headers["Idempotency-Key"] = key
        outcome = self._exchange(payload, headers, policy == "manual", secrets)
        return dataclasses.replace(
            outcome,
            result=scrub(outcome.result, secrets),
            error=scrub(outcome.error, secrets),
            external_ref=scrub(outcome.external_ref, secrets),
        )

    def _exchange(
        self, payload: dict[str, Any], headers: dict[str, str], manual: bool, secrets: Mapping[str, str]
    ) -> Outcome:
        """Send the request and settle on what came back (its body scrubbed before it is cut)."""
        body = payload.get("body")
        data = None if body is None else body.encode() if isinstance(body, str) else canonical.dumps_bytes(body)
        parts = urlsplit(payload["url"])
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname, parts.port, timeout=payload["timeoutMs"] / 1000)
        where = f"{payload['method']} {parts.scheme}://{parts.netloc}{parts.path}"
        try:
            try:
                conn.connect()
            except OSError as exc:  # nothing was sent: it did not act
                error = f"{where}: could not connect: {_failure(exc)}"
                return Outcome("rejected" if manual else "retry", error=error, error_code="connectionFailed")
            try:
                conn.request(payload["method"], target, body=data, headers=headers)
                faults.hit(faults.OUTBOX_AFTER_REQUEST_SENT)
                response = conn.getresponse()
            except Exception as exc:  # sending started: it may have acted
                error = f"{where}: no answer: {_failure(exc)}"
                return Outcome("ambiguous" if manual else "retry", error=error, error_code="noAnswer")
            received, truncated = bytearray(), False
            try:
                while len(received) <= MAX_BODY_BYTES and (chunk := response.read(MAX_BODY_BYTES + 1 - len(received))):
                    received += chunk
            except http.client.IncompleteRead as exc:
                received += exc.partial
                truncated = True
            except (OSError, http.client.HTTPException):  # the status is a definite answer; the body is cut short
                truncated = True
        finally:
            conn.close()
        truncated = truncated or len(received) > MAX_BODY_BYTES
        status = response.status
        answer: dict[str, str] = {}
        for name, value in response.headers.items():
            answer[name.lower()] = f"{answer[name.lower()]}, {value}" if name.lower() in answer else value
        if 200 <= status < 300:
            output = {
                "status": status,
                "headers": answer,
                "body": _body(bytes(received), answer.get("content-type", ""), truncated, secrets),
            }
            if truncated:
                output["bodyTruncated"] = True
            return Outcome("applied", result={"output": output, "nodeOutcome": "ok"})
        text = (_body(bytes(received), "text/plain", truncated, secrets) or "")[:2000]
        error = f"HTTP {status} {response.reason}" + (f": {text}" if text else "")
        if 400 <= status < 500:
            return Outcome("rejected", error=error, error_code="httpClientError")
        if 500 <= status < 600:
            return Outcome("rejected" if manual else "retry", error=error, error_code="httpServerError")
        if 300 <= status < 400:
            error = f"HTTP {status} {response.reason} (redirects are not followed)"
        return Outcome("rejected", error=error, error_code="httpUnexpectedStatus")

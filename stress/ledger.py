"""A local HTTP "ledger": records every request before answering it, answers as scripted.

::

    request ──> next scripted action for the path (the last one repeats; default "200")
            └─> record {method, path, idempotencyKey, headers, body, answer: the action}
                (list; JSON line + fsync) before answering
                  "200" / "500" / any 3-digit code: that status, {"ok", "key", "n"} as JSON
                  "echo:CODE": that status, {"ok", "key", "n", "headers": the request's} as
                      JSON, and each request header again as a response header X-Echo-NAME
                  "echo-text:CODE": the same, the body as text lines "name: value"
                  "delay:MS": wait MS milliseconds, then answer 200
                  "hang": no answer until stop() (or 30 s), then close
                  "close": close the connection without an answer

Used in tests (``with LedgerServer(script) as ledger: ... ledger.url``) and as a
process: ``python -m stress.ledger --ledger FILE [--port N] [--script JSON]``
prints ``ready <url>`` once listening and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

HANG_LIMIT_S = 30.0
_STATUS = re.compile(r"[1-5][0-9][0-9]\Z")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = HANG_LIMIT_S + 5  # an idle client never holds a thread forever

    def _handle(self) -> None:
        ledger = self.server.ledger
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            headers[name.lower()] = f"{headers[name.lower()]}, {value}" if name.lower() in headers else value
        record = {
            "method": self.command,
            "path": self.path,
            "idempotencyKey": headers.get("idempotency-key"),
            "headers": headers,
            "body": body.decode("utf-8", errors="replace"),
        }
        action, n = ledger._record(record, urlsplit(self.path).path)
        self.close_connection = True
        if action == "hang":
            ledger._stopping.wait(HANG_LIMIT_S)
            return
        if action.startswith("delay:"):
            ledger._stopping.wait(int(action.removeprefix("delay:")) / 1000)
            action = "200"
        echo, _, status = action.rpartition(":")  # a remote that reflects what it was sent
        if action == "close" or echo not in ("", "echo", "echo-text") or not _STATUS.match(status):
            return
        code = int(status)
        document: dict[str, Any] = {"ok": 200 <= code < 300, "key": record["idempotencyKey"], "n": n}
        media, answer = "application/json", json.dumps(document).encode()
        if echo == "echo":
            answer = json.dumps({**document, "headers": headers}).encode()
        elif echo == "echo-text":
            media, answer = "text/plain; charset=utf-8", "".join(f"{k}: {v}\n" for k, v in headers.items()).encode()
        self.send_response(code)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(answer)))
        for name, value in headers.items() if echo else ():
            self.send_header(f"X-Echo-{name}", value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() never waits for a handler (a hanging one wakes on its own)
    ledger: LedgerServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a sender killed mid-request is expected
            super().handle_error(request, client_address)


class LedgerServer:
    def __init__(
        self,
        script: dict[str, list[str]] | None = None,
        ledger_path: str | os.PathLike[str] | None = None,
        port: int = 0,
    ) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._script = {path: list(actions) for path, actions in (script or {}).items()}
        self._consumed: dict[str, int] = {}
        self._stopping = threading.Event()
        self._ledger_path = Path(ledger_path) if ledger_path is not None else None
        self._ledger: IO[str] | None = None
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> LedgerServer:
        if self._ledger_path is not None:
            self._ledger = open(self._ledger_path, "a", encoding="utf-8")
        self._httpd = _Server(("127.0.0.1", self._port), _Handler)
        self._httpd.ledger = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="ledger", daemon=True
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._httpd is not None, "the ledger is not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None

    def __enter__(self) -> LedgerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_script(self, path: str, actions: list[str]) -> None:
        """Answer ``path`` with ``actions`` from now on (from its first action)."""
        with self._lock:
            self._script[path] = list(actions)
            self._consumed[path] = 0

    def keys(self) -> list[str]:
        """The Idempotency-Keys received, in arrival order (requests without one are skipped)."""
        with self._lock:
            return [r["idempotencyKey"] for r in self.requests if r["idempotencyKey"] is not None]

    def count(self, key: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r["idempotencyKey"] == key)

    def _record(self, record: dict[str, Any], path: str) -> tuple[str, int]:
        """Pick the action, store ``record`` with it (durably with a ledger file): (action, n for its key)."""
        with self._lock:
            actions = self._script.get(path) or ["200"]
            index = self._consumed.get(path, 0)
            self._consumed[path] = index + 1
            record["answer"] = actions[min(index, len(actions) - 1)]
            self.requests.append(record)
            if self._ledger is not None:
                self._ledger.write(json.dumps(record, sort_keys=True) + "\n")
                self._ledger.flush()
                os.fsync(self._ledger.fileno())
            n = sum(1 for r in self.requests if r["idempotencyKey"] == record["idempotencyKey"])
            return record["answer"], n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stress.ledger")
    parser.add_argument("--ledger", required=True, help="append one JSON line per request to this file")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", default="{}", help='JSON: {"/path": ["500", "200"]}, or @FILE holding it')
    args = parser.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    script = Path(args.script[1:]).read_text(encoding="utf-8") if args.script.startswith("@") else args.script
    with LedgerServer(json.loads(script), args.ledger, args.port) as ledger:
        print(f"ready {ledger.url}", flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

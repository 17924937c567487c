"""A Telegram adapter child: one per profile, transport only (no decisions, no SQLite).

::

    manager ── configure {channel, base url, token, cursor} ──> adapter (first frame; the token
               only here)
    poll thread:  getUpdates {offset: cursor, timeout, allowed_updates}
                  ── updates {offset, next offset, items (normalised)} ──> manager
                  <── ack {cursor} (the batch committed): the next poll confirms it at Telegram
    main thread:  <── perform {effect, attempt, method, body} (its attempt recorded)
                  ── the Bot API call ── performed {outcome, result, retry after, not acted} ──>
    faults:       fault {unauthorized | pollConflict | floodWait | network} ──> manager

Only an ack moves the offset, so no update is confirmed at Telegram before what it caused
committed. A 429 closes the profile's gate for ``retry_after``: no request of this bot (poll or
call) goes out before it. A 401 (polling or a call) and a poll's 404 stop the adapter until a reload;
409 (another poller) waits 30 s; other errors back off 1-60 s. When the manager is gone (end of
file) the adapter exits at once.

A call's outcome: ``applied`` (ok, or "message is not modified"); ``rejected`` (another 4xx; 401
also stops the profile); ``failed`` with ``not_acted`` (429, or the connection never opened: the
request surely never reached Telegram); ``uncertain`` (5xx, a timeout, a connection dropped after
the request was written: it may have acted).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import queue
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from piworkflows import faults
from piworkflows.protocol import frames
from piworkflows.protocol.child_log import relay_logs
from piworkflows.protocol.internal.base import Frame
from piworkflows.protocol.internal.channels import (
    EXIT_UNAUTHORIZED,
    Ack,
    Configure,
    Fault,
    Perform,
    Performed,
    TelegramUpdate,
    Updates,
)

log = logging.getLogger("piworkflows.channels")

CONFLICT_WAIT_S = 30.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0


@dataclass(frozen=True)
class Answer:
    """One Bot API answer: HTTP status, the JSON document (None: unreadable)."""

    status: int
    document: dict[str, Any] | None


class NotSent(Exception):
    """The connection never opened: the request surely did not reach Telegram."""


class Uncertain(Exception):
    """The request was (maybe) written, and no answer came: it may have acted."""


class BotApi:
    """POST {base}/bot{token}/{method} with a JSON body; the token never leaves this object."""

    def __init__(self, base_url: str, token: str, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "", parts.port
        self.prefix = parts.path.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def call(
        self,
        method: str,
        body: dict[str, Any],
        timeout_s: float | None = None,
        after_sent: Callable[[], None] = lambda: None,
    ) -> Answer:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        connection: http.client.HTTPConnection
        if self.https:
            connection = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=ssl.create_default_context()
            )
        else:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            try:
                connection.connect()
            except OSError:
                raise NotSent from None
            data = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
            try:
                connection.request("POST", f"{self.prefix}/bot{self._token}/{method}", data, headers)
                after_sent()
                response = connection.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException):
                raise Uncertain from None
            try:
                document = json.loads(raw)
            except ValueError:
                document = None
            return Answer(response.status, document if isinstance(document, dict) else None)
        finally:
            connection.close()


def normalise(update: dict[str, Any]) -> TelegramUpdate | None:
    """A press or a text message as the writer takes it; anything else is None (still confirmed)."""
    update_id = update.get("update_id")
    if not isinstance(update_id, int):
        return None
    query = update.get("callback_query")
    if isinstance(query, dict):
        message = query.get("message") or {}
        chat = (message.get("chat") or {}).get("id")
        return _update(
            update_id=update_id,
            update_kind="callback",
            user_id=str((query.get("from") or {}).get("id")),
            chat_id=str(chat) if chat is not None else None,
            callback_query_id=str(query.get("id")),
            data=query.get("data") if isinstance(query.get("data"), str) else None,
        )
    message = update.get("message")
    if isinstance(message, dict) and isinstance(message.get("text"), str):
        replied = message.get("reply_to_message") or {}
        quoted = replied.get("text")
        return _update(
            update_id=update_id,
            update_kind="message",
            user_id=str((message.get("from") or {}).get("id")),
            chat_id=str((message.get("chat") or {}).get("id")),
            text=message["text"][:8192],
            reply_to_text=quoted[:8192] if isinstance(quoted, str) else None,
        )
    return None


def _update(**fields: Any) -> TelegramUpdate | None:
    try:
        return TelegramUpdate(**fields)
    except ValueError:  # ids that are not Telegram's (the model's patterns): not an update we take
        return None


class Adapter:
    def __init__(self, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self.stdout = stdout
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()  # perform frames
        self.acks: queue.Queue[int | None] = queue.Queue()
        self.send_lock = threading.Lock()
        self.gate = threading.Condition()
        self.gate_until = 0.0  # monotonic: no request before it (a 429's retry_after)
        self.ids = 0
        self.config: Configure | None = None
        threading.Thread(target=self._read, args=(stdin,), daemon=True).start()

    def _read(self, stdin: BinaryIO) -> None:
        decoder = frames.FrameDecoder()
        try:
            while data := stdin.read1(1 << 16):  # type: ignore[attr-defined]
                for frame in decoder.feed(data):
                    if frame["k"] == Ack.kind:
                        self.acks.put(Ack.model_validate(frame["b"]).cursor)
                    else:
                        self.inbox.put(frame)
        finally:  # the manager is gone: nothing acts without an owner
            os._exit(0)

    def send(self, frame: Frame) -> None:
        with self.send_lock:
            self.ids += 1
            self.stdout.write(frames.encode(frame.kind, self.ids, frame.model_dump()))
            self.stdout.flush()

    # --- the flood gate ---------------------------------------------------------------------

    def wait_gate(self) -> None:
        with self.gate:
            while (left := self.gate_until - time.monotonic()) > 0:
                self.gate.wait(left)

    def close_gate(self, seconds: float) -> None:
        with self.gate:
            self.gate_until = max(self.gate_until, time.monotonic() + seconds)

    # --- serving ---------------------------------------------------------------------------

    def serve(self) -> int:
        first = self.inbox.get()
        if first is None or first["k"] != Configure.kind:
            return 2
        self.config = config = Configure.model_validate(first["b"])
        api = BotApi(config.base_url, config.token, config.request_timeout_ms / 1000)
        threading.Thread(target=self.poll, args=(api,), daemon=True).start()
        while (frame := self.inbox.get()) is not None:
            if frame["k"] == Perform.kind:
                performed = self.perform(api, Perform.model_validate(frame["b"]))
                self.send(performed)
                if performed.error_code == "telegram401":  # the token was refused: stop until a reload
                    os._exit(EXIT_UNAUTHORIZED)
        return 0

    def poll(self, api: BotApi) -> None:
        assert self.config is not None
        cursor, backoff = self.config.cursor, BACKOFF_MIN_S
        timeout = self.config.poll_timeout_s
        while True:
            self.wait_gate()
            body = {"offset": cursor, "timeout": timeout, "allowed_updates": ["callback_query", "message"]}
            try:
                answer = api.call("getUpdates", body, timeout_s=timeout + api.timeout_s)
            except (NotSent, Uncertain):
                self.send(Fault(fault="network", detail="getUpdates got no answer"))
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            document = answer.document or {}
            if answer.status == 200 and document.get("ok") and isinstance(document.get("result"), list):
                backoff = BACKOFF_MIN_S
                batch = [u for u in document["result"] if isinstance(u, dict) and isinstance(u.get("update_id"), int)]
                if not batch:
                    continue
                faults.hit(faults.CHANNEL_AFTER_UPDATES_RECEIVED)
                for part in parts(cursor, batch):
                    self.send(part)
                    acked = self.acks.get()  # the manager answers once the part committed
                    if acked is None:
                        return
                    faults.hit(faults.CHANNEL_AFTER_UPDATES_COMMITTED)
                    cursor = acked
                continue
            if answer.status == 429:
                retry_after = _retry_after(document)
                self.close_gate(retry_after)
                self.send(Fault(fault="floodWait", retry_after_ms=int(retry_after * 1000)))
            elif answer.status in (401, 404):
                self.send(Fault(fault="unauthorized", detail=f"getUpdates answered {answer.status}"))
                os._exit(EXIT_UNAUTHORIZED)
            elif answer.status == 409:
                self.send(Fault(fault="pollConflict", detail="another getUpdates poller or a webhook"))
                time.sleep(CONFLICT_WAIT_S)
            else:
                self.send(Fault(fault="network", detail=f"getUpdates answered {answer.status}"))
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def perform(self, api: BotApi, task: Perform) -> Performed:
        """One Bot API call of a claimed effect (its attempt is recorded), and how it ended."""
        faults.hit(faults.CHANNEL_AFTER_ATTEMPT_RECORDED)
        self.wait_gate()
        done = {"effect_id": task.effect_id}
        try:
            answer = api.call(task.method, task.body, after_sent=lambda: faults.hit(faults.CHANNEL_AFTER_REQUEST_SENT))
        except NotSent:
            return Performed(**done, outcome="failed", error_code="notSent", not_acted=True)
        except Uncertain:
            return Performed(**done, outcome="uncertain", error_code="noAnswer", error="the Bot API did not answer")
        document = answer.document or {}
        description = str(document.get("description") or "")[:256]
        if answer.status == 200 and document.get("ok"):
            return Performed(**done, outcome="applied", result=_reference(document.get("result")))
        if answer.status == 400 and "not modified" in description:
            return Performed(**done, outcome="applied", result={"notModified": True})
        if answer.status == 429:
            retry_after = _retry_after(document)
            self.close_gate(retry_after)
            retry_ms = int(retry_after * 1000)
            return Performed(**done, outcome="failed", error_code="floodWait", retry_after_ms=retry_ms, not_acted=True)
        if answer.status == 401:
            self.send(Fault(fault="unauthorized", detail=f"{task.method} answered 401"))
        if 400 <= answer.status < 500:
            return Performed(**done, outcome="rejected", error_code=f"telegram{answer.status}", error=description)
        return Performed(**done, outcome="uncertain", error_code=f"telegram{answer.status}", error=description)


def parts(cursor: int, batch: list[dict[str, Any]]) -> list[Updates]:
    """A getUpdates batch as ``updates`` frames: one, or (too big for a frame: up to 100 long texts)
    one per update, each committed and acknowledged before the next."""
    ordered = sorted(batch, key=lambda update: int(update["update_id"]))
    items = [item for item in map(normalise, ordered) if item is not None]
    whole = Updates(offset=cursor, next_offset=ordered[-1]["update_id"] + 1, items=items)
    try:
        frames.encode(whole.kind, 0, whole.model_dump())
        return [whole]
    except frames.FrameError:
        pass
    split, offset = [], cursor
    for update in ordered:
        item = normalise(update)
        split.append(Updates(offset=offset, next_offset=update["update_id"] + 1, items=[item] if item else []))
        offset = update["update_id"] + 1
    return split


def _retry_after(document: dict[str, Any]) -> float:
    value = (document.get("parameters") or {}).get("retry_after")
    return float(value) if isinstance(value, int | float) and value >= 0 else 1.0


def _reference(result: Any) -> dict[str, Any]:
    """A sent or edited message's Telegram reference ({chatId, messageId}); else {ok: true}."""
    if isinstance(result, dict) and isinstance(result.get("message_id"), int):
        return {"chatId": str((result.get("chat") or {}).get("id")), "messageId": result["message_id"]}
    return {"ok": True}


def main() -> int:
    adapter = Adapter(sys.stdin.buffer, sys.stdout.buffer)
    relay_logs(sys.stdout.buffer)
    sys.stdout = sys.stderr  # nothing printed may corrupt the channel
    return adapter.serve()

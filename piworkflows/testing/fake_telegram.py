"""A fake Telegram Bot API on loopback, for the tests and the demo (never the network).

::

    FakeTelegram(token).start() -> base URL http://127.0.0.1:PORT (the profile's baseUrl)
    POST {base}/bot{token}/{method}, a JSON body, answered as the Bot API answers:
      getUpdates {offset, timeout, allowed_updates}   long poll; an offset confirms every update
                                                      below it (logged in ``confirmed``)
      sendMessage {chat_id, text, reply_markup?}       a new message of the chat
      editMessageText {chat_id, message_id, text, reply_markup?}
      editMessageReplyMarkup {chat_id, message_id, reply_markup?}
                                                      400 "message is not modified" when nothing changes
      answerCallbackQuery {callback_query_id, text?}   recorded in ``answered``
    the simulated chat users: press() a button, reply() with text (updates to poll)
    script(method, *faults): what the next calls of a method meet, in order:
      Delay(ms)          answered late
      TooMany(seconds)   429 with parameters.retry_after
      ServerError(code)  a 5xx answer, nothing done
      DropBefore()       the connection closed before the request was read: nothing done
      DropAfter()        done (a message really sent), then the connection closed with no answer

Every request is logged (``requests``: method and body, the token never). A wrong token is 401,
an unknown method 404, as the real API answers them.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_POLL_S = 5.0  # a getUpdates timeout is capped here (tests and the demo poll briefly)


@dataclass(frozen=True)
class Delay:
    ms: int


@dataclass(frozen=True)
class TooMany:
    retry_after: int


@dataclass(frozen=True)
class ServerError:
    status: int = 502


@dataclass(frozen=True)
class DropBefore:
    pass


@dataclass(frozen=True)
class DropAfter:
    pass


Fault = Delay | TooMany | ServerError | DropBefore | DropAfter


class BadRequest(Exception):
    def __init__(self, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.description, self.status = description, status


@dataclass
class Message:
    chat_id: int
    message_id: int
    text: str
    reply_markup: dict[str, Any] | None
    date: int
    edits: int = 0

    def wire(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "message_id": self.message_id,
            "chat": {"id": self.chat_id, "type": "private" if self.chat_id > 0 else "group"},
            "date": self.date,
            "text": self.text,
        }
        if self.reply_markup:
            shown["reply_markup"] = self.reply_markup
        return shown


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone before its answer (an adapter killed mid-request) is normal here; any
        other error still prints its traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class FakeTelegram:
    token: str
    bot_id: int = 424242
    messages: dict[tuple[int, int], Message] = field(default_factory=dict)  # (chat, message id)
    updates: list[dict[str, Any]] = field(default_factory=list)  # not yet confirmed
    confirmed: list[int] = field(default_factory=list)  # each offset a getUpdates confirmed with
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    answered: dict[str, str | None] = field(default_factory=dict)  # callback query id -> its text

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._faults: dict[str, deque[Fault]] = {}
        self._next_update = 1
        self._next_message: dict[int, int] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- the server ---------------------------------------------------------------------------

    def start(self) -> str:
        """Serve on a free loopback port; the base URL (a profile's ``baseUrl``)."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
                fake._serve(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        server = self._server
        self._thread = threading.Thread(target=lambda: server.serve_forever(0.05), name="fake-telegram", daemon=True)
        self._thread.start()
        return self.base_url

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        with self._lock:
            self._lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeTelegram:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scripting and the simulated users ----------------------------------------------------

    def script(self, method: str, *faults: Fault) -> None:
        """What the next calls of ``method`` meet, one fault per call, in order."""
        with self._lock:
            self._faults.setdefault(method, deque()).extend(faults)

    def press(self, chat_id: int, user_id: int, message_id: int, data: str) -> int:
        """A user presses a button of a message: a callback_query update; its update id."""
        with self._lock:
            message = self.messages[(chat_id, message_id)]
            query = {
                "id": f"cb{self._next_update}",
                "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"},
                "message": message.wire(),
                "chat_instance": str(chat_id),
                "data": data,
            }
            return self._add_update({"callback_query": query})

    def reply(self, chat_id: int, user_id: int, text: str, reply_to: int | None = None) -> int:
        """A user sends text (a reply to the bot's message ``reply_to``): a message update."""
        with self._lock:
            number = self._next_message.get(chat_id, 0) + 1
            self._next_message[chat_id] = number
            sent: dict[str, Any] = {
                "message_id": number,
                "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"},
                "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "group"},
                "date": int(time.time()),
                "text": text,
            }
            if reply_to is not None:
                sent["reply_to_message"] = self.messages[(chat_id, reply_to)].wire()
            return self._add_update({"message": sent})

    def chat(self, chat_id: int) -> list[Message]:
        """The bot's messages in a chat, oldest first."""
        with self._lock:
            return [m for (chat, _), m in sorted(self.messages.items()) if chat == chat_id]

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for name, body in self.requests if name == method]

    def _add_update(self, update: dict[str, Any]) -> int:
        update_id = self._next_update
        self._next_update += 1
        self.updates.append({"update_id": update_id, **update})
        self._lock.notify_all()
        return update_id

    # --- one request --------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        token, _, method = handler.path.removeprefix("/bot").partition("/")
        with self._lock:
            fault = self._faults.get(method, deque()).popleft() if self._faults.get(method) else None
        if isinstance(fault, DropBefore):
            _drop(handler)
            return
        length = int(handler.headers.get("Content-Length") or 0)
        try:
            body = json.loads(handler.rfile.read(length) or b"{}")
        except ValueError:
            _answer(handler, 400, {"ok": False, "error_code": 400, "description": "Bad Request: invalid JSON"})
            return
        if not isinstance(body, dict):
            body = {}
        with self._lock:
            self.requests.append((method, body))
        if token != self.token:
            _answer(handler, 401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
            return
        if isinstance(fault, Delay):
            time.sleep(fault.ms / 1000)
        elif isinstance(fault, TooMany):
            description = f"Too Many Requests: retry after {fault.retry_after}"
            wire = {"ok": False, "error_code": 429, "description": description}
            _answer(handler, 429, wire | {"parameters": {"retry_after": fault.retry_after}})
            return
        elif isinstance(fault, ServerError):
            _answer(handler, fault.status, {"ok": False, "error_code": fault.status, "description": "Bad Gateway"})
            return
        serve = _METHODS.get(method)
        if serve is None:
            _answer(handler, 404, {"ok": False, "error_code": 404, "description": "Not Found"})
            return
        try:
            result = serve(self, body)
        except BadRequest as exc:
            _answer(handler, exc.status, {"ok": False, "error_code": exc.status, "description": exc.description})
            return
        if isinstance(fault, DropAfter):
            _drop(handler)
            return
        _answer(handler, 200, {"ok": True, "result": result})

    def _get_updates(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        offset = int(body.get("offset") or 0)
        wait = min(float(body.get("timeout") or 0), MAX_POLL_S)
        deadline = time.monotonic() + wait
        with self._lock:
            if offset:
                self.updates = [u for u in self.updates if u["update_id"] >= offset]
                self.confirmed.append(offset)
            while not self.updates and time.monotonic() < deadline:
                self._lock.wait(deadline - time.monotonic())
            allowed = body.get("allowed_updates")
            return [u for u in self.updates if not allowed or any(kind in u for kind in allowed)]

    def _send_message(self, body: dict[str, Any]) -> dict[str, Any]:
        chat_id, text = _chat(body), _text(body)
        with self._lock:
            number = self._next_message.get(chat_id, 0) + 1
            self._next_message[chat_id] = number
            message = Message(chat_id, number, text, body.get("reply_markup"), int(time.time()))
            self.messages[(chat_id, number)] = message
            return message.wire()

    def _edit(self, body: dict[str, Any], text: bool) -> dict[str, Any]:
        chat_id = _chat(body)
        with self._lock:
            message = self.messages.get((chat_id, int(body.get("message_id") or 0)))
            if message is None:
                raise BadRequest("Bad Request: message to edit not found")
            new_text = _text(body) if text else message.text
            markup = body.get("reply_markup") or None
            if new_text == message.text and markup == (message.reply_markup or None):
                raise BadRequest("Bad Request: message is not modified")
            message.text, message.reply_markup = new_text, markup
            message.edits += 1
            return message.wire()

    def _answer_callback(self, body: dict[str, Any]) -> bool:
        query = body.get("callback_query_id")
        if not isinstance(query, str) or not query:
            raise BadRequest("Bad Request: query is too old and response timeout expired or query ID is invalid")
        with self._lock:
            self.answered[query] = body.get("text")
        return True


def _chat(body: dict[str, Any]) -> int:
    try:
        return int(body["chat_id"])
    except (KeyError, TypeError, ValueError):
        raise BadRequest("Bad Request: chat not found") from None


def _text(body: dict[str, Any]) -> str:
    text = body.get("text")
    if not isinstance(text, str) or not text:
        raise BadRequest("Bad Request: message text is empty")
    if len(text) > 4096:
        raise BadRequest("Bad Request: message is too long")
    return text


_METHODS: dict[str, Any] = {
    "getUpdates": FakeTelegram._get_updates,
    "sendMessage": FakeTelegram._send_message,
    "editMessageText": lambda fake, body: fake._edit(body, text=True),
    "editMessageReplyMarkup": lambda fake, body: fake._edit(body, text=False),
    "answerCallbackQuery": FakeTelegram._answer_callback,
}


def _answer(handler: BaseHTTPRequestHandler, status: int, wire: dict[str, Any]) -> None:
    data = json.dumps(wire).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _drop(handler: BaseHTTPRequestHandler) -> None:
    """End the connection with no answer, as a dropped network path looks to the client."""
    handler.close_connection = True
    try:
        handler.connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass

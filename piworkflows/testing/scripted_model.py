"""A scripted OpenAI-compatible model: chat completions answered from a script, for tests and the
demo (no network, no API key).

::

    client (Pi) ── POST /v1/chat/completions {model, messages, stream} ──> ScriptedModel
        the model id names a script; each request takes its next step, in order:
          {"text": "..."}                                   an assistant message
          {"tool_calls": [{"name": "...", "arguments": {...}}], "text"?: "..."}
          {"stall_ms": N, ...}                              wait N ms before answering
        ``${requestId}`` in a step's text or tool-call arguments becomes the request id that the
        latest user message names (a step contract's ``"requestId": "request-..."``)
        stream: server-sent chat.completion.chunk events, then ``data: [DONE]``
        otherwise one chat.completion object
    GET /v1/models    the scripted model ids
    GET /requests     every request received, in order (its model, path and JSON body)

``pi-workflows doctor``'s probe (agents/pi.py PROBE_PROMPT) is answered "OK" and takes no step.
A request for a model without a script, or past the end of its script, is answered 400 with an
OpenAI-shaped error naming the model, so a test sees why its agent stopped. With ``cycle=True``
a script starts again from its first step after its last (endless load: the crash harness).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from piworkflows.agents.pi import PROBE_PROMPT

PROVIDER = "scripted"  # the provider name the Pi configuration gives this server
CHUNK_CHARS = 16  # text and tool arguments are streamed in pieces of this size
REQUEST_ID = "${requestId}"
_CONTRACT_REQUEST_ID = re.compile(r'"requestId": "(request-[0-9a-f]+)"')

Step = Mapping[str, Any]


class ScriptedModel:
    """Serve ``scripts`` (model id -> steps) on 127.0.0.1 until :meth:`close`; a context manager."""

    def __init__(self, scripts: Mapping[str, Sequence[Step]], port: int = 0, cycle: bool = False) -> None:
        for model, steps in scripts.items():
            for index, step in enumerate(steps):
                _check_step(model, index, step)
        self._scripts = {model: list(steps) for model, steps in scripts.items()}
        self._next = {model: 0 for model in scripts}
        self._cycle = cycle
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self._server = _Server(("127.0.0.1", port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (``.../v1``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> ScriptedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> list[str]:
        return sorted(self._scripts)

    def write_pi_config(self, directory: Path) -> Path:
        """A Pi configuration directory (``PI_CODING_AGENT_DIR``) whose ``models.json`` names this
        server as provider ``scripted`` with every scripted model (``--model scripted/<id>``)."""
        directory.mkdir(parents=True, exist_ok=True)
        provider = {
            "baseUrl": self.url,
            "api": "openai-completions",
            "apiKey": "none",
            "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
            "models": [{"id": model, "name": f"scripted {model}"} for model in self.models()],
        }
        path = directory / "models.json"
        path.write_text(json.dumps({"providers": {PROVIDER: provider}}, indent=2))
        return directory

    def take(self, request: dict[str, Any]) -> Step | str:
        """Record the request and take its model's next step (or the reason there is none).
        ``pi-workflows doctor``'s probe is answered "OK" and takes no step."""
        model = request.get("model")
        with self._lock:
            self.requests.append(request)
            if _asks_the_probe(request):
                return {"text": "OK"}
            if not isinstance(model, str) or model not in self._scripts:
                return f"no script for model {model!r}"
            index = self._next[model]
            if self._cycle and self._scripts[model]:
                index %= len(self._scripts[model])
            if index >= len(self._scripts[model]):
                return f"the script of model {model!r} has no step {index + 1}"
            self._next[model] = index + 1
            return self._scripts[model][index]


def _asks_the_probe(request: Mapping[str, Any]) -> bool:
    messages = request.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, dict) else None
    text = content if isinstance(content, str) else json.dumps(content)
    return isinstance(last, dict) and last.get("role") == "user" and PROBE_PROMPT in text


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (an agent killed or aborted) is not an error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _check_step(model: str, index: int, step: Step) -> None:
    known = {"text", "tool_calls", "stall_ms"}
    if not isinstance(step, Mapping) or not step.keys() <= known or not step.keys() & {"text", "tool_calls"}:
        raise ValueError(f"model {model!r} step {index + 1}: a step has 'text' and/or 'tool_calls' (and 'stall_ms')")
    for call in step.get("tool_calls", ()):
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise ValueError(f"model {model!r} step {index + 1}: each tool call has a 'name' and 'arguments'")


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # tests read the recorded requests instead

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                data = [{"id": name, "object": "model", "owned_by": "scripted"} for name in model.models()]
                self._json(200, {"object": "list", "data": data})
            elif self.path == "/requests":
                with model._lock:
                    self._json(200, list(model.requests))
            else:
                self._json(404, _error(f"no such path {self.path}"))

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._json(404, _error(f"no such path {self.path}"))
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length))
                assert isinstance(request, dict)
            except (ValueError, AssertionError):
                self._json(400, _error("the body is not a JSON object"))
                return
            step = model.take(request)
            if isinstance(step, str):
                self._json(400, _error(step))
                return
            time.sleep(step.get("stall_ms", 0) / 1000)
            step = with_request_id(step, request)
            name = str(request["model"])
            if request.get("stream"):
                usage = bool((request.get("stream_options") or {}).get("include_usage"))
                self._stream(_chunks(name, step, usage))
            else:
                self._json(200, _completion(name, step))

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: Iterator[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def request_id_of(request: Mapping[str, Any]) -> str | None:
    """The request id the latest user message of a chat request names (its step contract's)."""
    for message in reversed(request.get("messages") or ()):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts: the text ones, in order
                content = "\n".join(
                    str(part.get("text", ""))
                    for part in content
                    if isinstance(part, Mapping) and part.get("type") == "text"
                )
            found = _CONTRACT_REQUEST_ID.findall(content) if isinstance(content, str) else []
            return found[-1] if found else None
    return None


def with_request_id(step: Step, request: Mapping[str, Any]) -> Step:
    """The step with every ``${requestId}`` in its text and tool-call arguments replaced by the
    request id of the latest user message (left as it is when that message names none)."""
    request_id = request_id_of(request)
    if request_id is None:
        return step

    def replace(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(REQUEST_ID, request_id)
        if isinstance(value, Mapping):
            return {key: replace(item) for key, item in value.items()}
        if isinstance(value, list):
            return [replace(item) for item in value]
        return value

    changed = dict(step)
    if "text" in step:
        changed["text"] = replace(step["text"])
    if "tool_calls" in step:
        changed["tool_calls"] = [
            {**call, "arguments": replace(call.get("arguments", {}))} for call in step["tool_calls"]
        ]
    return changed


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": "scripted_model"}}


def _calls(step: Step) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
        }
        for index, call in enumerate(step.get("tool_calls", ()))
    ]


def _usage(step: Step) -> dict[str, int]:
    completion = len(step.get("text", "")) // 4 + 1
    return {"prompt_tokens": 1, "completion_tokens": completion, "total_tokens": completion + 1}


def _completion(model: str, step: Step) -> dict[str, Any]:
    calls = _calls(step)
    message: dict[str, Any] = {"role": "assistant", "content": step.get("text")}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": _usage(step),
    }


def _chunks(model: str, step: Step, usage: bool) -> Iterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    text = step.get("text", "")
    for start in range(0, len(text), CHUNK_CHARS):
        yield chunk({"content": text[start : start + CHUNK_CHARS]})
    calls = _calls(step)
    for index, call in enumerate(calls):
        head = {"index": index, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
        head["function"]["arguments"] = ""
        yield chunk({"tool_calls": [head]})
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), CHUNK_CHARS):
            piece = {"index": index, "function": {"arguments": arguments[start : start + CHUNK_CHARS]}}
            yield chunk({"tool_calls": [piece]})
    yield chunk({}, "tool_calls" if calls else "stop")
    if usage:
        yield {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [],
            "usage": _usage(step),
        }

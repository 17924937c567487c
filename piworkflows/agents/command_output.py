"""What a command step's run gives (agents/command.py): its output, its captured entries, and the
server's verdict on it.

::

    Finished (status, stdout, last stderr line) ── output_of ──> Output: the JSON value (a schema),
        the text (a description), the reply (an assistant message), or why there is none
    the step message and stdout ── entry_of ──> SessionEntry lines shaped like Pi's message entries
    Output.value ── submit: client.v1 interaction.submit on the server's socket (hello, request,
        response; a lost connection or ``unavailable`` tried again under the same key)
        ── verdict_of ──> accepted (None) or (error_code, error)
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import IO, Any

from piworkflows.agents.capture import ENTRY_BYTES_PER_RECORD
from piworkflows.isotime import iso
from piworkflows.protocol import client_v1, domain
from piworkflows.protocol.internal.agents import ExpectedOutput, SessionEntry
from piworkflows.protocol.internal.base import MAX_INLINE_BLOB_BYTES, BlobValue
from piworkflows.states import SUBMISSION_REJECTIONS

log = logging.getLogger("piworkflows.agents")

MAX_OUTPUT_BYTES = 256 * 1024  # stdout kept as the output (the rest is read and dropped)
SUBMIT_RETRY_MIN_S = 0.1
SUBMIT_RETRY_MAX_S = 2.0

Failure = tuple[str, str]  # (error_code, error): why the run gave no accepted output


def entry_id(segment_id: str, role: str) -> str:
    """A captured entry of the segment's run: 8 hex digits, like Pi's entry ids."""
    return hashlib.sha256(f"{segment_id}\x00{role}".encode()).hexdigest()[:8]


def submission_key(segment_id: str) -> str:
    """The submission of the segment's run (a repeat after a lost connection adopts it)."""
    return f"command-{segment_id}"


@dataclass(frozen=True)
class Finished:
    """How a command ended: its status (negative: the signal that killed it), its stdout (at most
    MAX_OUTPUT_BYTES; ``overflowed`` when it printed more), its last stderr line."""

    returncode: int
    stdout: bytes
    overflowed: bool = False
    last_stderr: str = ""


@dataclass(frozen=True)
class Output:
    """What a finished command gives: the output to submit (``value``), an assistant-message
    reply (``reply``), or why it gives none (``problem``, a commandFailed error)."""

    value: Any = None
    reply: str | None = None
    problem: str | None = None


def exit_problem(returncode: int, last_stderr: str = "") -> str | None:
    """Why a command's exit fails the step (None: it exited 0), with its last stderr line."""
    if returncode == 0:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        what = f"the command was killed by {name}"
    else:
        what = f"the command exited with status {returncode}"
    return f"{what}: {last_stderr}" if last_stderr else what


def output_of(expected: ExpectedOutput, finished: Finished) -> Output:
    """The step's output from what the command printed: JSON when the output has a schema, else
    the text (without its trailing line breaks)."""
    problem = exit_problem(finished.returncode, finished.last_stderr)
    if problem is not None:
        return Output(problem=problem)
    if finished.overflowed:
        return Output(problem=f"the command printed more than {MAX_OUTPUT_BYTES // 1024} KiB on stdout")
    try:
        text = finished.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return Output(problem="the command's stdout is not UTF-8 text")
    if not text.strip():
        return Output(problem="the command printed nothing on stdout")
    if expected.kind == "assistant-message":
        return Output(reply=text.rstrip("\r\n"))
    if expected.kind != "schema":
        return Output(value=text.rstrip("\r\n"))
    try:
        return Output(value=domain.loads(finished.stdout))
    except domain.OutsideDomain as exc:
        return Output(problem=f"the command's stdout is not a JSON value a run can keep ({exc})")


def entry_of(pi_entry_id: str, parent_id: str | None, role: str, text: str, at_ms: int, **fields: Any) -> SessionEntry:
    """A captured entry shaped like a Pi message entry (``fields`` join its message); a text too
    large for one record is cut, and the entry says ``truncated``."""
    limit = min(MAX_INLINE_BLOB_BYTES, ENTRY_BYTES_PER_RECORD)
    stamp = iso(at_ms)
    truncated = False
    while True:
        message = {"role": role, "content": [{"type": "text", "text": text}], **fields, "timestamp": at_ms}
        entry: dict[str, Any] = {
            "type": "message",
            "id": pi_entry_id,
            "parentId": parent_id,
            "timestamp": stamp,
            "message": message,
        }
        if truncated:
            entry["truncated"] = True
        line = json.dumps(entry, ensure_ascii=False)
        if len(line.encode("utf-8")) <= limit:
            return SessionEntry(pi_entry_id=pi_entry_id, entry_role=role, content=BlobValue.of_text(line))
        text, truncated = text[: len(text) // 2], True


def verdict_of(response: client_v1.Response) -> Failure | None:
    """What the server answered a submission: None when the output (or an earlier one) was
    accepted, else why the run failed (a rejection keeps the validator's code and error)."""
    if response.outcome in ("accepted", "adopted"):
        return None
    code = response.receipt.get("code") if isinstance(response.receipt, dict) else None
    if code in SUBMISSION_REJECTIONS:
        return code, response.error or "the output was rejected"
    if code == "winnerDecided":
        return None
    return (
        "commandFailed",
        f"the server did not take the command's output ({code or response.outcome}: {response.error})",
    )


def submit(socket_path: str, request: client_v1.Request, stop: threading.Event) -> client_v1.Response | None:
    """client.v1 ``interaction.submit`` as the workflow tool sends it: a connection, the server's
    hello, the request, its response (held until the output is validated). A lost connection or
    ``unavailable`` is tried again (a new requestId, the same idempotency key) until ``stop`` is
    set (None then)."""
    delay = SUBMIT_RETRY_MIN_S
    while not stop.is_set():
        attempt = request.model_copy(update={"requestId": "command-" + uuid.uuid4().hex})
        try:
            response = _exchange(socket_path, attempt)
            if response.outcome != "unavailable":
                return response
            log.warning("agent host: the server cannot take the output now (%s); trying again", response.error)
        except (OSError, ValueError) as exc:
            log.warning("agent host: submitting the command's output failed (%s); trying again", exc)
        stop.wait(delay)
        delay = min(delay * 2, SUBMIT_RETRY_MAX_S)
    return None


def _exchange(socket_path: str, request: client_v1.Request) -> client_v1.Response:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(socket_path)
        with sock.makefile("rb") as lines:
            hello = _message(lines)
            if hello.get("type") != "hello":
                raise ConnectionError(f"the server refused the connection: {hello.get('error')}")
            sock.sendall(client_v1.encode(request))
            while True:
                message = _message(lines)
                if message.get("type") == "response" and message.get("requestId") == request.requestId:
                    return client_v1.Response.model_validate(message)


def _message(lines: IO[bytes]) -> dict[str, Any]:
    line = lines.readline(client_v1.MAX_MESSAGE_BYTES + 1)
    if not line.endswith(b"\n"):
        raise ConnectionError("the server closed the connection")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("the server sent a line that is not a JSON object")
    return message

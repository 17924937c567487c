"""The oracles of agent runs: the database against Pi's session files and the model's requests.

Pure functions, like ``oracles.py``. ``sessions`` maps a Pi session file's path to its entries
(JSON objects, in file order, the header left out; ``read_session``); ``asked`` is every request
the scripted model received. A step message is recognised by its last line,
``pi-workflows-message: <id>`` (read here on its own, not with the product's parser).

    lost        the workflow tool answered "Accepted" (its tool result is in a session file)
                but the request is not accepted
    duplicated  a request with more than one accepted submission (or an accepted request
                without exactly its one); a step message sent more than once; a marker twice
                among the user entries of a session's active branch, or of one model request
    violations  a sent step whose Pi entry is not that step's user entry in its run's session
                files; a host or Pi alive after its server stopped
    stuck       an agent run that did not end
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stress.crash.snapshot import State

Entry = Mapping[str, Any]
TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})
_MARKER = re.compile(r"pi-workflows-message: (\S+)\s*\Z")
ACCEPTED = "Accepted"  # the workflow tool's answer to an accepted submission (agents/pi/workflow.ts)


def read_session(path: Path) -> list[dict[str, Any]]:
    """The entries of a session file (a torn or unreadable line is skipped)."""
    entries = []
    for raw in path.read_bytes().split(b"\n"):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("type") != "session" and isinstance(entry.get("id"), str):
            entries.append(entry)
    return entries


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def marker_of(message: Any) -> str | None:
    """The step message id a user message carries on its last line."""
    if not isinstance(message, Mapping) or message.get("role") != "user":
        return None
    found = _MARKER.search(_text(message.get("content")).rstrip("\n").rsplit("\n", 1)[-1])
    return found.group(1) if found else None


def active_branch(entries: list[Entry]) -> list[Entry]:
    """The chain of parentId from the last entry back to the root."""
    by_id = {entry["id"]: entry for entry in entries}
    chain: list[Entry] = []
    seen: set[str] = set()
    current = entries[-1] if entries else None
    while current is not None and current["id"] not in seen:
        seen.add(current["id"])
        chain.append(current)
        parent = current.get("parentId")
        current = by_id.get(parent) if isinstance(parent, str) else None
    return chain[::-1]


def _markers(messages: Iterable[Any]) -> list[str]:
    return [marker for marker in map(marker_of, messages) if marker is not None]


def accepted_twice(state: State) -> list[str]:
    """One accepted submission per request, and it is the request's own (none for the others)."""
    accepted: dict[str, list[str]] = {}
    for submission in state.submissions:
        if submission["outcome"] == "accepted":
            accepted.setdefault(submission["requestId"], []).append(submission["submissionId"])
    found = []
    for request_id, request in sorted(state.requests.items()):
        ids = accepted.get(request_id, [])
        expected = [request["accepted"]] if request["status"] == "accepted" else []
        if ids != expected:
            found.append(f"request {request_id} is {request['status']} with accepted submissions {ids}")
    return found


def sent_twice(state: State) -> list[str]:
    return [
        f"step message {message_id} was sent {message['sentEvents']} times"
        for message_id, message in sorted(state.messages.items())
        if message["sentEvents"] > 1
    ]


def shown_twice(sessions: Mapping[str, list[Entry]], asked: list[dict[str, Any]]) -> list[str]:
    """No step message is twice among the user entries of a session's active branch, nor among the
    user messages of one request to the model (what the model was shown)."""
    found = []
    for path, entries in sorted(sessions.items()):
        counts = Counter(_markers(entry.get("message") for entry in active_branch(entries)))
        found += [f"{path}: step message {m} is {n} times on the branch" for m, n in sorted(counts.items()) if n > 1]
    for index, request in enumerate(asked):
        counts = Counter(_markers(request.get("messages") or []))
        found += [f"model request {index + 1}: step message {m} shown {n} times" for m, n in counts.items() if n > 1]
    return found


def accepted_but_lost(sessions: Mapping[str, list[Entry]], state: State) -> list[str]:
    """Every submission the workflow tool told the model was accepted is accepted in the database."""
    found = []
    for path, entries in sorted(sessions.items()):
        by_id = {entry["id"]: entry for entry in entries}
        for entry in entries:
            message = entry.get("message") or {}
            if message.get("role") != "toolResult" or message.get("toolName") != "workflow":
                continue
            if _text(message.get("content")) != ACCEPTED:
                continue
            request_id = _submitted_for(entry, message.get("toolCallId"), by_id)
            status = (state.requests.get(request_id) or {}).get("status") if request_id else None
            if status != "accepted":
                found.append(f"{path}: the tool answered Accepted for {request_id}, which is {status or 'missing'}")
    return found


def _submitted_for(result: Entry, call_id: Any, by_id: Mapping[str, Entry]) -> str | None:
    """The requestId of the tool call a tool result answers: in the assistant entry it follows
    (call ids repeat across turns)."""
    current = by_id.get(result.get("parentId"))  # type: ignore[arg-type]
    while current is not None and (current.get("message") or {}).get("role") == "toolResult":
        current = by_id.get(current.get("parentId"))  # type: ignore[arg-type]
    content = (current.get("message") or {}).get("content") if current is not None else None
    for part in content if isinstance(content, list) else []:
        if isinstance(part, Mapping) and part.get("type") == "toolCall" and part.get("id") == call_id:
            request_id = (part.get("arguments") or {}).get("requestId")
            return request_id if isinstance(request_id, str) else None
    return None


def sent_off_session(sessions: Mapping[str, list[Entry]], state: State) -> list[str]:
    """A step message recorded sent is its Pi entry: a user entry carrying its marker in a session
    file of its run."""
    entries = {path: {entry["id"]: entry for entry in found} for path, found in sessions.items()}
    found = []
    for message_id, message in sorted(state.messages.items()):
        if message["state"] != "sent":
            if message["sentEvents"]:
                found.append(f"step message {message_id} is {message['state']} after a sent event")
            continue
        files = state.session_files.get(message["runId"], set())
        shown = [entries.get(path, {}).get(message["entry"]) for path in files]
        if not any(entry is not None and marker_of(entry.get("message")) == message_id for entry in shown):
            found.append(f"step message {message_id} was sent as entry {message['entry']}, not in its session")
    return found


def agent_runs_unended(state: State, workflow: str) -> list[str]:
    """After the quiet period (paused and parked agent runs resumed) every agent run has ended."""
    return [
        f"agent run {run_id} is {run['status']} (paused {run['paused']}, park {run['parkReason']})"
        for run_id, run in sorted(state.runs.items())
        if run["workflow"] == workflow and run["status"] not in TERMINAL
    ]


def judge(evidence: Mapping[str, Any], state: State, workflow: str) -> dict[str, list[str]]:
    sessions, asked = evidence.get("sessions", {}), evidence.get("modelRequests", [])
    return {
        "lost": accepted_but_lost(sessions, state),
        "duplicated": accepted_twice(state) + sent_twice(state) + shown_twice(sessions, asked),
        "violations": sent_off_session(sessions, state)
        + [f"left behind: {proc}" for proc in evidence.get("leftovers", [])],
        "stuck": agent_runs_unended(state, workflow),
    }

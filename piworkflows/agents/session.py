"""Reading a Pi session file (docs/session-format.md of Pi): its entries, the active branch, the
step messages on it, a settled reply.

::

    <header {"type": "session", ...}>
    {"type": "message", "id": "a1b2c3d4", "parentId": null | "<id>", "message": {"role": ...}}
    ...                                  one JSON object per line, appended as Pi goes

The active branch is the chain of ``parentId`` from the last entry line back to the root (Pi
appends each entry as a child of its current leaf). A step message's user entry ends with the
line ``pi-workflows-message: <id>`` (protocol/step_contract.py ``message_of``). Lines end with
LF only; a JSON string may hold U+2028, so the file is never read with a generic line reader.
A last line without its LF is being written: it is read once it is complete.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from piworkflows.protocol.internal.agents import PI_ENTRY_ID
from piworkflows.protocol.step_contract import message_of

_ENTRY_ID = re.compile(PI_ENTRY_ID)

Entry = Mapping[str, Any]


@dataclass(frozen=True)
class Line:
    """An entry and its JSON line exactly as Pi wrote it (without the LF)."""

    entry: Entry
    text: str


@dataclass
class SessionFile:
    """A session file read incrementally: ``read()`` takes the complete lines appended since the
    last call. A file that shrank was rewritten (Pi migrates old files when it opens them): it
    is read again from the start."""

    path: str
    lines: list[Line] = field(default_factory=list)
    by_id: dict[str, Line] = field(default_factory=dict)
    offset: int = 0
    _partial: bytes = b""

    def read(self) -> list[Line]:
        """The entry lines appended since the last read (the header and unreadable lines left out)."""
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:  # rewritten
                    self.lines.clear()
                    self.by_id.clear()
                    self.offset, self._partial = 0, b""
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        added = []
        for raw in complete:
            line = parse_line(raw)
            if line is not None:
                self.lines.append(line)
                self.by_id[line.entry["id"]] = line
                added.append(line)
        return added

    def branch(self) -> list[Line]:
        """The active branch, root first."""
        return active_branch(self.lines, self.by_id)


def parse_line(raw: bytes) -> Line | None:
    """An entry line (an object with a string ``id``); None for the header, a blank or bad line."""
    text = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
    try:
        entry = json.loads(text)
    except ValueError:
        return None
    if not isinstance(entry, dict) or entry.get("type") == "session" or not isinstance(entry.get("id"), str):
        return None
    return Line(entry, text)


def read_lines(path: str) -> list[Line]:
    """Every complete entry line of a session file, in file order."""
    session = SessionFile(path)
    session.read()
    return session.lines


def active_branch(lines: list[Line], by_id: Mapping[str, Line] | None = None) -> list[Line]:
    """The chain of ``parentId`` from the last entry line to the root, root first (a cycle or a
    missing parent ends it)."""
    if not lines:
        return []
    index = by_id if by_id is not None else {line.entry["id"]: line for line in lines}
    chain: list[Line] = []
    seen: set[str] = set()
    current: Line | None = lines[-1]
    while current is not None and current.entry["id"] not in seen:
        seen.add(current.entry["id"])
        chain.append(current)
        parent = current.entry.get("parentId")
        current = index.get(parent) if isinstance(parent, str) else None
    chain.reverse()
    return chain


def role_of(entry: Entry) -> str:
    """A message entry's role (``user``, ``assistant``, ``toolResult`` ...), else the entry type."""
    message = entry.get("message")
    if entry.get("type") == "message" and isinstance(message, Mapping) and isinstance(message.get("role"), str):
        return str(message["role"])
    return str(entry.get("type") or "unknown")


def text_of(content: Any, separator: str) -> str:
    """The text of a message's content: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return separator.join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        )
    return ""


def step_of(entry: Entry) -> str | None:
    """The workflow message a user entry is (its last line's marker), if any."""
    if role_of(entry) != "user":
        return None
    return message_of(text_of(entry["message"].get("content"), "\n"))


def is_entry_id(value: object) -> bool:
    return isinstance(value, str) and _ENTRY_ID.fullmatch(value) is not None


def steps_on(branch: Iterable[Line], steps: Collection[str]) -> list[tuple[str, str]]:
    """(workflow message id, Pi entry id) of each of ``steps`` whose user entry is on the branch,
    in branch order (the first entry of a step that appears twice)."""
    found: dict[str, str] = {}
    for line in branch:
        message_id = step_of(line.entry)
        if message_id is not None and message_id in steps and message_id not in found and is_entry_id(line.entry["id"]):
            found[message_id] = line.entry["id"]
    return list(found.items())


def assistant_text(entry: Entry) -> str:
    return text_of(entry["message"].get("content"), "")


def stop_reason(entry: Entry) -> str | None:
    reason = entry["message"].get("stopReason")
    return reason if isinstance(reason, str) else None


def settled_reply(branch: list[Line], steps: Collection[str]) -> tuple[str, str, str] | None:
    """The final reply to the branch's latest step: (workflow message id, its assistant entry id,
    its text) when the branch ends with that step's turn finished by a non-empty ``stop`` reply."""
    latest: int | None = None
    for index, line in enumerate(branch):
        if step_of(line.entry) in steps:
            latest = index
    if latest is None:
        return None
    last = branch[-1].entry
    if len(branch) - 1 == latest or role_of(last) != "assistant" or stop_reason(last) != "stop":
        return None
    text = assistant_text(last)
    message_id = step_of(branch[latest].entry)
    if not text.strip() or message_id is None or not is_entry_id(last["id"]):
        return None
    return message_id, last["id"], text


def last_assistant(branch: Iterable[Line]) -> Entry | None:
    """The last assistant message entry on the branch."""
    found = None
    for line in branch:
        if role_of(line.entry) == "assistant":
            found = line.entry
    return found

"""What an agent host records of a Pi session: compact events, settled entries, the attempt's links.

::

    Pi RPC event ── compact() ──> SessionEvent {type, id, role, status, times}   (or dropped)
    session file entry line ── entry() ──> SessionEntry {id, role, the line as a text blob}
    Capture: what waits for the next agent.record (at most 64 events, 16 entries and a byte
    budget an agent.record frame holds), numbered from the segment's event count

Never text, deltas, thinking, tool arguments or results: ``message_update`` and
``tool_execution_update`` are dropped, the rest keep their type, ids, role, status and times.
Entries are Pi's own lines, captured once each as they settle in the session file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from piworkflows.agents.session import Line, is_entry_id, role_of
from piworkflows.protocol.internal.agents import (
    CHECKPOINT_EVERY,
    MAX_ENTRIES_PER_RECORD,
    MAX_EVENTS_PER_RECORD,
    ActiveSample,
    AgentRecordFrame,
    AttemptLinks,
    SessionEntry,
    SessionEvent,
)
from piworkflows.protocol.internal.base import MAX_FRAME_BYTES, MAX_INLINE_BLOB_BYTES, BlobValue

log = logging.getLogger("piworkflows.agents")

KEPT_PREFIXES = ("agent_", "turn_", "message_", "tool_", "auto_retry_", "compaction_")
DROPPED = frozenset({"message_update", "tool_execution_update"})
ENTRY_BYTES_PER_RECORD = MAX_FRAME_BYTES // 2  # entries' share of one agent.record frame
MAX_OPEN_TOOLS = 64  # a checkpoint names at most this many open tool calls
_FIELD_CHARS = 64


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _short(value: object, limit: int = _FIELD_CHARS) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _status(event: Mapping[str, Any]) -> str | None:
    kind = event.get("type")
    message = event.get("message")
    if kind == "message_end" and isinstance(message, Mapping):
        return _short(message.get("stopReason"))
    if kind == "tool_execution_end":
        return "error" if event.get("isError") else "ok"
    if kind == "auto_retry_end":
        return "succeeded" if event.get("success") else "failed"
    if kind == "compaction_end":
        return "aborted" if event.get("aborted") else ("failed" if event.get("errorMessage") else "ok")
    if kind == "compaction_start":
        return _short(event.get("reason"))
    return None


def compact(event: Mapping[str, Any], at_ms: int) -> SessionEvent | None:
    """The compact form of a Pi RPC event (None: not kept). ``at_ms``: when the host saw it."""
    kind = event.get("type")
    if not isinstance(kind, str) or kind in DROPPED or not kind.startswith(KEPT_PREFIXES):
        return None
    message = event.get("message")
    role = None
    if isinstance(message, Mapping):
        role = _short(message.get("role"))
    elif kind.startswith("tool_"):
        role = _short(event.get("toolName"))  # which tool ran (its name, never its arguments)
    started = ended = None
    if kind.endswith("_end"):
        ended = at_ms
    else:
        started = message.get("timestamp") if isinstance(message, Mapping) else None
        started = started if isinstance(started, int) else at_ms
    return SessionEvent(
        event_type=kind[:64],
        pi_event_id=_short(event.get("toolCallId"), 256),
        event_role=role,
        event_status=_status(event),
        started_at=started,
        ended_at=ended,
    )


def next_sample_ns(now_ns: int, started_ns: int, sample_ms: int, timeout_ms: int, spent_ms: int) -> int:
    """When an open turn's next sample is due: its next multiple of ``sample_ms``, or the moment
    the budget runs out when that comes first (``timeout_ms`` > 0; ``spent_ms`` spent before the
    turn). Monotonic nanoseconds."""
    period = sample_ms * 1_000_000
    due = started_ns + ((now_ns - started_ns) // period + 1) * period
    if timeout_ms > 0:
        budget_end = started_ns + max(0, timeout_ms - spent_ms) * 1_000_000
        if budget_end > now_ns:
            due = min(due, budget_end)
    return due


def prompt_event(workflow_message_id: str, at_ms: int) -> SessionEvent:
    """The host sent a step message to Pi (RPC ``prompt``)."""
    return SessionEvent(event_type="prompt", pi_event_id=workflow_message_id, event_role="user", started_at=at_ms)


def entry(line: Line) -> SessionEntry | None:
    """A settled entry as captured (None when its id is not Pi's or its line exceeds a blob)."""
    data = line.text.encode("utf-8")
    if not is_entry_id(line.entry["id"]):
        return None
    if len(data) > min(MAX_INLINE_BLOB_BYTES, ENTRY_BYTES_PER_RECORD):
        log.warning("session entry %s (%d bytes) is too large to capture inline; skipped", line.entry["id"], len(data))
        return None
    return SessionEntry(
        pi_entry_id=line.entry["id"], entry_role=role_of(line.entry)[:64], content=BlobValue.of_text(line.text)
    )


@dataclass
class Capture:
    """Captured events and entries waiting for the next agent.record, and the open state a
    checkpoint names."""

    event_count: int = 0  # events recorded in this segment so far (the next first_event_index)
    events: list[SessionEvent] = field(default_factory=list)
    entries: list[SessionEntry] = field(default_factory=list)
    links: AttemptLinks | None = None
    _linked: AttemptLinks = field(default_factory=AttemptLinks)
    open_tools: list[str] = field(default_factory=list)

    def add_event(self, event: Mapping[str, Any], at_ms: int) -> None:
        compacted = compact(event, at_ms)
        if compacted is None:
            return
        self.events.append(compacted)
        call = event.get("toolCallId")
        if event.get("type") == "tool_execution_start" and isinstance(call, str):
            self.open_tools.append(call)
        elif event.get("type") == "tool_execution_end" and call in self.open_tools:
            self.open_tools.remove(call)

    def add(self, compacted: SessionEvent) -> None:
        """An event the host itself makes (``prompt``)."""
        self.events.append(compacted)

    def add_entry(self, line: Line) -> None:
        captured = entry(line)
        if captured is not None:
            self.entries.append(captured)

    def link(self, prompt_entry_id: str | None = None, response_entry_id: str | None = None) -> None:
        """The attempt's prompt or response entry changed (sent with the next record)."""
        wanted = AttemptLinks(
            prompt_entry_id=prompt_entry_id or self._linked.prompt_entry_id,
            response_entry_id=response_entry_id or self._linked.response_entry_id,
        )
        if wanted != self._linked:
            self._linked = self.links = wanted

    @property
    def full(self) -> bool:
        return len(self.events) >= MAX_EVENTS_PER_RECORD or len(self.entries) >= MAX_ENTRIES_PER_RECORD

    @property
    def waiting(self) -> bool:
        return bool(self.events or self.entries or self.links)

    def take(self, sample: ActiveSample | None, open_turn: str | None, active_message: str | None) -> AgentRecordFrame:
        """The next agent.record: up to 64 events and the entries that fit its byte budget; the
        rest waits for the following one."""
        events, self.events = self.events[:MAX_EVENTS_PER_RECORD], self.events[MAX_EVENTS_PER_RECORD:]
        budget, count = ENTRY_BYTES_PER_RECORD, 0
        for captured in self.entries[:MAX_ENTRIES_PER_RECORD]:
            if len(captured.content.data) > budget:
                break
            budget -= len(captured.content.data)
            count += 1
        entries, self.entries = self.entries[:count], self.entries[count:]
        links = None
        if not self.entries:  # links name entries recorded by now
            links, self.links = self.links, None
        first = self.event_count
        self.event_count += len(events)
        checkpoint = None
        if _crosses_checkpoint(first, self.event_count):
            checkpoint = BlobValue.of_json(
                {
                    "openTurn": open_turn,
                    "activeMessage": active_message,
                    "openTools": self.open_tools[:MAX_OPEN_TOOLS],
                }
            )
        return AgentRecordFrame(
            first_event_index=first,
            events=events,
            entries=entries,
            sample=sample,
            links=links,
            checkpoint=checkpoint,
        )


def _crosses_checkpoint(first: int, end: int) -> bool:
    """Whether events ``first`` to ``end - 1`` hold a positive multiple of CHECKPOINT_EVERY."""
    boundary = -(-max(first, 1) // CHECKPOINT_EVERY) * CHECKPOINT_EVERY  # the first multiple >= first
    return boundary < end

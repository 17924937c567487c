"""The run's histories, as the run view's tail windows and as ``view.page``'s pages.

::

    kind             rows (in order)                          an item (writer/views/run_view.py)
    steps            run_steps + node_attempts, step_index    a step record, values bounded
    trace            events of the run, resource_revision     a trace event (total: the run revision)
    updates          workflow_updates, update_seq             {seq, type, nodeId, attemptId, at, data}
    session_entries  session_entries, run_seq                 {seq, at, entry}
    session_events   session_events, run_seq                  a compact session event
    settings         workflow_settings, scope_key             {scopeId, scopeKey, settings, updatedAt}
    follow_ups       workflow_follow_ups, source_order        {followUpId, sourceOrder, ..., status}

A window is the last WINDOW rows (read newest first by the row's own key, so its cost does not
grow with the history); a page is at most PAGE_ROWS rows from a position (``OFFSET`` on the
run's index). Values are bounded per field (REFERENCE_BYTES), so an item stays under 1 KiB.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from piworkflows.isotime import iso, iso_or_none
from piworkflows.states import PAGE_KINDS
from piworkflows.writer.views.content import REFERENCE_BYTES, RunValues

WINDOW = 64  # a snapshot's history windows: the last WINDOW rows of each
PAGE_ROWS = 256  # view.page: at most this many rows a page
PAGE_SCHEMA = "pi-workflows.run-page.v1"
_SCOPES = {"run": "run", "runner": "run", "server": "run", "node": "node", "checkpoint": "node", "agent": "agent"}
_SCOPES |= {"interaction": "agent", "effect": "action", "effects": "action", "decision": "node"}


@dataclass(frozen=True)
class History:
    count: str  # SQL: how many rows the run has (:run)
    select: str  # SQL: the rows' columns and tables, without WHERE
    where: str  # SQL: the run's rows (:run)
    key: str  # the column that orders them
    item: Callable[[tuple[Any, ...], RunValues], dict[str, Any]]

    def window(self, conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
        """The last WINDOW rows, oldest first, with where they start and how many there are."""
        total = self.total(conn, run_id)
        rows = self.newest(conn, run_id, WINDOW)
        return {"start": total - len(rows), "total": total, "items": [self.item(row, values) for row in rows]}

    def total(self, conn: sqlite3.Connection, run_id: str) -> int:
        (total,) = conn.execute(self.count, {"run": run_id}).fetchone()
        return int(total)

    def newest(self, conn: sqlite3.Connection, run_id: str, limit: int) -> list[tuple[Any, ...]]:
        """The last ``limit`` rows, oldest first."""
        rows = conn.execute(
            f"{self.select} WHERE {self.where} ORDER BY {self.key} DESC LIMIT :limit", {"run": run_id, "limit": limit}
        ).fetchall()
        rows.reverse()
        return rows

    def row(self, conn: sqlite3.Connection, run_id: str, key: Any) -> tuple[Any, ...] | None:
        """The row whose key is ``key``."""
        found: tuple[Any, ...] | None = conn.execute(
            f"{self.select} WHERE {self.where} AND {self.key} = :key", {"run": run_id, "key": key}
        ).fetchone()
        return found

    def later(self, conn: sqlite3.Connection, run_id: str, key: Any, limit: int) -> int:
        """How many rows come after the row whose key is ``key``, counted up to ``limit``."""
        (count,) = conn.execute(
            f"SELECT count(*) FROM ({self.select} WHERE {self.where} AND {self.key} > :key LIMIT :limit)",
            {"run": run_id, "key": key, "limit": limit},
        ).fetchone()
        return int(count)

    def page(self, conn: sqlite3.Connection, run_id: str, values: RunValues, start: int, limit: int) -> dict[str, Any]:
        """At most ``limit`` rows from position ``start`` (past the end: none)."""
        (total,) = conn.execute(self.count, {"run": run_id}).fetchone()
        rows = conn.execute(
            f"{self.select} WHERE {self.where} ORDER BY {self.key} LIMIT :limit OFFSET :start",
            {"run": run_id, "limit": limit, "start": start},
        ).fetchall()
        return {"start": start, "total": total, "items": [self.item(row, values) for row in rows]}


# A step row with its values' digests (its values are read through RunValues, bounded).
STEP_SELECT = """
    SELECT s.step_index, a.attempt_id, a.node_path, a.node_kind, a.visit_number, a.attempt_number,
           a.attempt_status, a.outcome, a.started_at, a.finished_at, a.error_code, a.output_digest, a.error_digest,
           a.receipt_digest
    FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
"""


def step(row: tuple[Any, ...], values: RunValues, limit: int = REFERENCE_BYTES) -> dict[str, Any]:
    """upstream's step record and ours (visit, attempt, status, durationMs, errorCode; a
    checkpoint's ``request``, the question it asks)."""
    _, attempt_id, node, kind, visit, attempt, status, outcome, started, finished, code, output, error, asked = row
    return {
        "attemptId": attempt_id,
        "nodeId": node,
        "nodeType": kind,
        "visit": visit,
        "attempt": attempt,
        "status": status,
        "outcome": outcome,
        "startedAt": iso(started),
        "finishedAt": iso_or_none(finished),
        "durationMs": finished - started if finished is not None else None,
        "errorCode": code,
        "prompt": None,
        "output": values.value(output, limit),
        **({"error": values.value(error, limit)} if error is not None else {}),
        **({"request": values.value(asked, limit)} if kind == "checkpoint" else {}),
    }


def _trace_event(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    seq, event, actor, payload, at, run_id, node, attempt = row
    about = {"nodeId": node, "attemptId": attempt} if attempt is not None else {}
    return {
        "seq": seq,
        "at": iso(at),
        "scope": _SCOPES.get(event.partition(".")[0], "run"),
        "type": event,
        "runId": run_id,
        **about,
        "payload": values.value(payload, REFERENCE_BYTES) if payload is not None else {},
        "piworkflows": {"actor": actor},
    }


def _update(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    seq, kind, node, attempt, body, at = row
    return {
        "seq": seq,
        "type": kind,
        "nodeId": node,
        "attemptId": attempt,
        "at": iso(at),
        "data": values.value(body, REFERENCE_BYTES),
    }


def _entry(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    seq, at, digest = row
    return {"seq": seq, "at": iso(at), "entry": values.value(digest, REFERENCE_BYTES)}


def _session_event(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    """A compact session event: what happened and when, never text, deltas or tool data."""
    seq, recorded, node, attempt, kind, pi_id, role, status, started, ended = row
    return {
        "seq": seq,
        "at": iso(recorded),
        "nodeId": node,
        "attemptId": attempt,
        "type": kind,
        "payload": {
            "id": pi_id,
            "role": role,
            "status": status,
            "startedAt": iso_or_none(started),
            "endedAt": iso_or_none(ended),
        },
    }


def _setting(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    scope, key, digest, at = row
    return {"scopeId": scope, "scopeKey": key, "settings": values.value(digest, REFERENCE_BYTES), "updatedAt": iso(at)}


def _follow_up(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    follow_up, order, session, digest, status, at = row
    return {
        "followUpId": follow_up,
        "sourceOrder": order,
        "sourceSessionId": session,
        "prompt": values.value(digest, REFERENCE_BYTES),
        "status": status,
        "createdAt": iso(at),
    }


def _workflow_message(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    """What the run added to a Pi session (workflow_messages): its kind, source, delivery state and
    the Pi entry that confirmed it."""
    _, message, kind, source_kind, source, session, order, state, entry, stop, digest, created, updated = row
    return {
        "workflowMessageId": message,
        "kind": kind,
        "sourceKind": source_kind,
        "sourceId": source,
        "targetSessionId": session,
        "sessionOrder": order,
        "state": state,
        "piEntryId": entry,
        "recoveryStop": stop,
        "content": values.value(digest, REFERENCE_BYTES),
        "createdAt": iso(created),
        "updatedAt": iso(updated),
    }


HISTORIES: dict[str, History] = {  # one per states.PAGE_KINDS
    "steps": History(
        "SELECT count(*) FROM run_steps WHERE run_id = :run", STEP_SELECT, "s.run_id = :run", "s.step_index", step
    ),
    "trace": History(  # one event per run revision: the count is the revision
        "SELECT revision FROM resources WHERE resource_id = :run",
        "SELECT e.resource_revision, e.event_type, e.actor_class, e.payload_digest, e.committed_at, e.resource_id, "
        "a.node_path, e.attempt_id FROM events e LEFT JOIN node_attempts a ON a.attempt_id = e.attempt_id",
        "e.resource_id = :run",
        "e.resource_revision",
        _trace_event,
    ),
    "updates": History(
        "SELECT count(*) FROM workflow_updates WHERE run_id = :run",
        "SELECT u.update_seq, u.update_kind, a.node_path, u.attempt_id, u.body_digest, u.created_at "
        "FROM workflow_updates u LEFT JOIN node_attempts a ON a.attempt_id = u.attempt_id",
        "u.run_id = :run",
        "u.update_seq",
        _update,
    ),
    "session_entries": History(
        "SELECT count(*) FROM session_entries WHERE run_id = :run",
        "SELECT run_seq, settled_at, content_digest FROM session_entries",
        "run_id = :run",
        "run_seq",
        _entry,
    ),
    "session_events": History(
        "SELECT count(*) FROM session_events WHERE run_id = :run",
        "SELECT e.run_seq, e.recorded_at, a.node_path, g.attempt_id, e.event_type, e.pi_event_id, e.event_role, "
        "e.event_status, e.started_at, e.ended_at FROM session_events e "
        "JOIN session_segments g ON g.segment_id = e.segment_id "
        "LEFT JOIN node_attempts a ON a.attempt_id = g.attempt_id",
        "e.run_id = :run",
        "e.run_seq",
        _session_event,
    ),
    "settings": History(
        "SELECT count(*) FROM workflow_settings WHERE run_id = :run",
        "SELECT scope_id, scope_key, value_digest, updated_at FROM workflow_settings",
        "run_id = :run",
        "scope_key",
        _setting,
    ),
    "follow_ups": History(
        "SELECT count(*) FROM workflow_follow_ups WHERE run_id = :run",
        "SELECT follow_up_id, source_order, source_session_id, prompt_digest, follow_up_status, created_at "
        "FROM workflow_follow_ups",
        "run_id = :run",
        "source_order",
        _follow_up,
    ),
    "workflow_messages": History(  # in the order added (a vacuum renumbers rowids, in the same order)
        "SELECT count(*) FROM workflow_messages WHERE run_id = :run",
        "SELECT m.rowid, m.workflow_message_id, m.message_kind, m.source_kind, m.source_id, m.target_session_id, "
        "m.session_order, m.message_state, m.pi_entry_id, m.recovery_stop, m.content_digest, m.created_at, "
        "m.updated_at FROM workflow_messages m",
        "m.run_id = :run",
        "m.rowid",
        _workflow_message,
    ),
}
assert tuple(HISTORIES) == PAGE_KINDS

"""Run lists and run views: bounded reads derived from rows, never repaired.

A run-list page (``pi-workflows.run-list-page.v1``) reads metadata, status,
lease facts and presentation revisions, never an input, output or step value
(its display reads bounded prefixes of small blobs: an agent request's
contract kind, a park cause, a terminal error). A run view (``pi-workflows.run-view.v1``)
adds the graph, the input (JSON reader, bounded), steps and compact trace
events (at most 256 rows each, with a cursor), and the display object.
Each step carries its own values (output, error text, a checkpoint's
request): each at most ``INLINE_VALUE_BYTES`` and all of one view together
at most ``STEP_VALUES_BYTES``, newest step first; the rest only by size and
digest, so one view fits one reply frame. What upstream's view does not have
stays under ``piworkflows`` (the active step, the run's ambiguous effects, a park detail, the
pending agent step: writer/views/pending.py).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from piworkflows.isotime import iso, iso_or_none
from piworkflows.protocol.internal.base import MAX_FRAME_BYTES
from piworkflows.protocol.internal.runners import MAX_PARK_DETAIL_BYTES
from piworkflows.writer import records
from piworkflows.writer.views.display import REASON_BYTES, RunFacts, display
from piworkflows.writer.views.pending import pending_view
from piworkflows.writer.views.values import INLINE_VALUE_BYTES
from piworkflows.writer.views.values import omitted as _omitted
from piworkflows.writer.views.values import read_json as _read_json
from piworkflows.writer.views.values import read_text as _read_text

PAGE_ROWS = 256
# The step values of one view together: with the input, output, error and 256 step and trace rows
# beside them the view stays within one reply frame.
STEP_VALUES_BYTES = MAX_FRAME_BYTES * 3 // 8
RUN_VIEW_SCHEMA = "pi-workflows.run-view.v1"
RUN_LIST_SCHEMA = "pi-workflows.run-list-page.v1"
MANIFEST_SCHEMA = "pi-workflows.run-manifest.v1"
TRACE_SCHEMA = "pi-workflows.trace-event.v1"
PAGE_BYTES = 256 * 1024  # a run-list page's items as compact JSON, at most (and 256 items)

# The facts behind the display status, as correlated subqueries on indexed columns.
_FACTS = """
    r.status, r.paused, r.park_reason,
    (SELECT count(*) FROM effects e WHERE e.run_id = r.run_id AND e.effect_status = 'ambiguous'),
    (SELECT a.node_kind FROM node_attempts a WHERE a.run_id = r.run_id AND a.attempt_status = 'waiting'),
    EXISTS (SELECT 1 FROM run_workers w JOIN leases l ON l.resource_id = w.run_id
            WHERE w.run_id = r.run_id AND w.ended_at IS NULL AND l.owner_id IS NOT NULL AND l.expires_at > :now),
    EXISTS (SELECT 1 FROM workflow_turns t WHERE t.run_id = r.run_id AND t.turn_state = 'open'),
    (SELECT json_extract(CAST(b.bytes AS TEXT), '$.expected_output.kind') FROM interactive_requests i
     JOIN blobs b ON b.digest = i.contract_digest
     WHERE i.run_id = r.run_id AND i.request_status IN ('pending', 'validating')),
    EXISTS (SELECT 1 FROM workflow_messages m WHERE m.run_id = r.run_id AND m.message_kind = 'step'
            AND m.message_state = 'pending' AND NOT EXISTS (
                -- a step its own open turn works on was sent (its entry is not on file yet)
                SELECT 1 FROM workflow_turns t WHERE t.workflow_message_id = m.workflow_message_id
                AND t.turn_state = 'open')),
    CASE WHEN r.park_reason = 'agentNoProgress' THEN
        (SELECT substr(b.bytes, 1, :cause_bytes) FROM workflow_updates u JOIN blobs b ON b.digest = u.body_digest
         WHERE u.run_id = r.run_id AND u.update_kind = 'notification' ORDER BY u.update_seq DESC LIMIT 1) END,
    CASE WHEN r.error_digest IS NOT NULL THEN
        (SELECT substr(b.bytes, 1, :reason_bytes + 1) FROM blobs b WHERE b.digest = r.error_digest) END
"""
# The cause of an agentNoProgress park as a display reason shows at most this much of its notification.
PARK_CAUSE_BYTES = 4096


def _facts(row: tuple[Any, ...]) -> RunFacts:
    status, paused, park_reason, ambiguous, waiting_for, live_runner, open_turn, expected, pending, cause, error = row
    return RunFacts(
        status,
        bool(paused),
        park_reason,
        ambiguous,
        waiting_for,
        bool(live_runner),
        bool(open_turn),
        expected_output=expected,
        pending_step=bool(pending),
        park_cause=bytes(cause).decode("utf-8", "replace") if cause is not None else None,
        error=bytes(error) if error is not None else None,
    )


def list_runs(
    conn: sqlite3.Connection,
    now: int,
    limit: int,
    before: tuple[int, str] | None = None,
    project_path: str | None = None,
    statuses: list[str] | None = None,
    workflow_name: str | None = None,
    since: int | None = None,
    offset: int | None = None,
) -> dict[str, Any]:
    """One ``pi-workflows.run-list-page.v1`` page, newest first, of the runs every given filter
    admits (a run's durable status, its workflow name, created at or after ``since``, its
    project), after the keyset cursor ``before`` or ``offset`` runs into the list.

    The items walk each filter's own index in (created_at, run_id) order (schema.sql
    ``runs_by_*``), several statuses one index range each, merged: at most ``offset + limit + 1``
    keys per range. ``total``, ``start`` and ``revision`` count the filtered runs (their
    ``viewer_runs`` rows, no payload): ``revision`` is ``count:sum of presentation revisions:latest
    viewer_runs.updated_at``, so any visible change of a listed run, a new run or a deleted one
    changes it.
    """
    where = ["1"]
    params: dict[str, Any] = {
        "now": now,
        "cause_bytes": PARK_CAUSE_BYTES,
        "reason_bytes": REASON_BYTES,
        "project": project_path,
        "workflow": workflow_name,
        "since": since,
        "before_at": before[0] if before else None,
        "before_id": before[1] if before else None,
        "skip": offset or 0,
        "take": limit + 1,
        "rows": (offset or 0) + limit + 1,
    }
    if project_path is not None:
        where.append("r.project_id = (SELECT project_id FROM projects WHERE canonical_path = :project)")
    if workflow_name is not None:
        where.append("r.workflow_name = :workflow")
    if since is not None:
        where.append("r.created_at >= :since")
    if statuses:
        params.update({f"status{n}": status for n, status in enumerate(statuses)})
        where.append(f"r.status IN ({', '.join(f':status{n}' for n in range(len(statuses)))})")
    # Unfiltered: viewer_runs alone (a row per run, written with it), a quarter of the join's cost.
    admitted = "viewer_runs v" if where == ["1"] else "runs r JOIN viewer_runs v ON v.run_id = r.run_id"
    count, revisions, updated = conn.execute(
        "SELECT count(*), coalesce(sum(v.presentation_revision), 0), coalesce(max(v.updated_at), 0) "
        f"FROM {admitted} WHERE {' AND '.join(where)}",
        params,
    ).fetchone()
    if before is not None:
        (start,) = conn.execute(
            f"SELECT count(*) FROM runs r WHERE {' AND '.join(where)} "
            "AND (r.created_at, r.run_id) >= (:before_at, :before_id)",  # the cursor is the last run shown
            params,
        ).fetchone()
        where.append("(r.created_at, r.run_id) < (:before_at, :before_id)")
    else:
        start = offset or 0
    ranges = []
    for n in range(len(statuses)) if statuses else [None]:
        condition = [c for c in where if not c.startswith("r.status IN")]
        if n is not None:
            condition.append(f"r.status = :status{n}")
        ranges.append(
            f"SELECT * FROM (SELECT r.created_at, r.run_id FROM runs r WHERE {' AND '.join(condition)} "
            "ORDER BY r.created_at DESC, r.run_id DESC LIMIT :rows)"
        )
    rows = conn.execute(
        f"""WITH page (created_at, run_id) AS (
                SELECT created_at, run_id FROM ({" UNION ALL ".join(ranges)})
                ORDER BY created_at DESC, run_id DESC LIMIT :take OFFSET :skip)
            SELECT r.run_id, r.workflow_name, r.title, r.execution_mode, r.origin_session_id, r.created_at,
                   r.updated_at, r.started_at, r.finished_at, v.presentation_revision, res.revision,
                   l.owner_id IS NOT NULL, l.expires_at, p.canonical_path, q.queue_status,
                   s.source_kind, s.source_path, s.source_sha256, s.builtin_id, s.builtin_revision, {_FACTS}
            FROM page JOIN runs r ON r.run_id = page.run_id JOIN viewer_runs v ON v.run_id = r.run_id
            JOIN resources res ON res.resource_id = r.run_id LEFT JOIN leases l ON l.resource_id = r.run_id
            JOIN projects p ON p.project_id = r.project_id JOIN run_sources s ON s.run_id = r.run_id
            LEFT JOIN run_queue q ON q.run_id = r.run_id
            ORDER BY page.created_at DESC, page.run_id DESC""",
        params,
    ).fetchall()
    items: list[dict[str, Any]] = []
    size = 0
    for row in rows[:limit]:
        item = _list_item(row, now)
        size += len(json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode()) + 1  # its wire size
        if items and size > PAGE_BYTES:
            break
        items.append(item)
    more = len(items) < len(rows)
    last = rows[len(items) - 1] if items else None
    return {
        "schema": RUN_LIST_SCHEMA,
        "revision": f"{count}:{revisions}:{updated}",
        "start": start,
        "total": count,
        "items": items,
        "cursor": {"createdAt": last[5], "runId": last[0]} if more and last is not None else None,
    }


def _list_item(row: tuple[Any, ...], now: int) -> dict[str, Any]:
    """A run-list item: upstream's summary fields, ours under ``piworkflows``."""
    (run_id, name, title, mode, session, created, updated, started, finished, revision, run_revision) = row[:11]
    claimed, expires, project, queue_status = row[11:15]
    source = source_view(*row[15:20])
    facts = _facts(row[20:])
    shown = display(facts)
    return {
        "runId": run_id,
        "workflowName": name,
        "originSessionId": session,
        "createdAt": iso(created),
        "updatedAt": iso(updated),
        "display": shown,
        "manifest": manifest(run_id, name, source, created, started, finished, shown["status"]),
        "live": shown["status"] in ("running", "waiting"),
        "possiblyInterrupted": queue_status == "parked" and shown["status"] != "paused",
        "piworkflows": {
            "title": title,
            "projectPath": project,
            "revision": revision,
            "runRevision": run_revision,
            "executionMode": mode,
            "parkReason": facts.park_reason,
            "startedAt": iso_or_none(started),
            "claim": {"held": bool(claimed), "expired": bool(claimed) and expires <= now},
        },
    }


def manifest(
    run_id: str,
    name: str,
    source: dict[str, Any],
    created: int,
    started: int | None,
    finished: int | None,
    status: str,
) -> dict[str, Any]:
    """upstream's ``pi-workflows.run-manifest.v1``: started at its creation until it starts, no
    ``finishedAt`` until it ends, its display status; every path is the server's ("host")."""
    found: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "runId": run_id,
        "workflowName": name,
        "workflowSource": source,
        "startedAt": iso(started if started is not None else created),
        "status": status,
        "traceSchema": TRACE_SCHEMA,
        "paths": {"workflow": "host", "state": "host", "trace": "host"},
    }
    if finished is not None:
        found["finishedAt"] = iso(finished)
    return found


def source_view(
    kind: str, path: str | None, sha256: bytes | None, builtin_id: str | None, builtin_revision: str | None
) -> dict[str, Any]:
    """A run's source identity as views show it (no source text)."""
    if kind == "file":
        assert sha256 is not None
        return {"kind": "file", "path": path, "sha256": sha256.hex()}
    return {"kind": "builtin", "id": builtin_id, "revision": builtin_revision}


def run_view(conn: sqlite3.Connection, now: int, run_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        f"""SELECT r.workflow_name, r.title, p.canonical_path, r.execution_mode, r.origin_session_id, r.max_steps,
                   r.lineage, r.parent_run_id, r.restart_number, r.created_at, r.started_at, r.finished_at,
                   r.error_code, r.definition_digest, r.input_digest, r.output_digest, r.error_digest,
                   v.presentation_revision, res.revision,
                   s.source_kind, s.source_path, s.source_sha256, s.builtin_id, s.builtin_revision, {_FACTS}
            FROM runs r JOIN viewer_runs v ON v.run_id = r.run_id JOIN resources res ON res.resource_id = r.run_id
            JOIN projects p ON p.project_id = r.project_id JOIN run_sources s ON s.run_id = r.run_id
            WHERE r.run_id = :run_id""",
        {"run_id": run_id, "now": now, "cause_bytes": PARK_CAUSE_BYTES, "reason_bytes": REASON_BYTES},
    ).fetchone()
    if row is None:
        return None
    (
        name,
        title,
        project,
        mode,
        session,
        max_steps,
        lineage,
        parent,
        restart_number,
        created,
        started,
        finished,
        error_code,
        definition_digest,
        input_digest,
        output_digest,
        error_digest,
        revision,
        run_revision,
        kind,
        path,
        sha256,
        builtin_id,
        builtin_revision,
    ) = row[:24]
    facts = _facts(row[24:])
    snapshot = _read_json(conn, definition_digest, limit=None)
    source = source_view(kind, path, sha256, builtin_id, builtin_revision)
    return {
        "schema": RUN_VIEW_SCHEMA,
        "runId": run_id,
        "revision": revision,
        "runRevision": run_revision,
        "run": {
            "workflowName": name,
            "title": title,
            "projectPath": project,
            "status": facts.status,
            "paused": facts.paused,
            "parkReason": facts.park_reason,
            "executionMode": mode,
            "originSessionId": session,
            "maxSteps": max_steps,
            "lineage": lineage,
            "parentRunId": parent,
            "restartNumber": restart_number,
            "createdAt": created,
            "startedAt": started,
            "finishedAt": finished,
            "durationMs": _duration(started, finished),
            "errorCode": error_code,
        },
        "source": source,
        "definitionDigest": "sha256:" + definition_digest.hex(),
        "graph": {"startAt": snapshot["startAt"], "nodes": snapshot["nodes"], "edges": snapshot["edges"]},
        "input": _read_json(conn, input_digest, limit=INLINE_VALUE_BYTES),
        "output": _read_json(conn, output_digest, limit=INLINE_VALUE_BYTES) if output_digest else None,
        "error": _read_text(conn, error_digest, limit=INLINE_VALUE_BYTES) if error_digest else None,
        "steps": _steps(conn, run_id),
        "trace": _trace(conn, run_id),
        "display": display(facts),
        "piworkflows": {
            "currentStep": _current_step(conn, run_id),
            "ambiguousEffects": _ambiguous_effects(conn, run_id),
            "parkDetail": _park_detail(conn, run_id) if facts.park_reason == "runnerNoProgress" else None,
            "pending": pending_view(conn, run_id),
        },
    }


def _park_detail(conn: sqlite3.Connection, run_id: str) -> str | None:
    """What the runner that parked the run left (its last stderr line), from the latest runner exit."""
    row = conn.execute(
        "SELECT payload_digest FROM events WHERE resource_id = ? AND event_type = 'runner.exited' "
        "ORDER BY resource_revision DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    return _read_text(conn, row[0], limit=MAX_PARK_DETAIL_BYTES) if row and row[0] else None


def _duration(started: int | None, finished: int | None) -> int | None:
    return finished - started if started is not None and finished is not None else None


class _StepValues:
    """Reads step values while the view's budget lasts; a value it cannot afford is only its size and digest.

    Sizes come from the blobs rows (``byte_length``), so nothing beyond the budget is read.
    """

    def __init__(self, conn: sqlite3.Connection, budget: int) -> None:
        self.conn, self.left = conn, budget

    def _afford(self, cost: int) -> bool:
        if cost > self.left:
            return False
        self.left -= cost
        return True

    def json(self, digest: bytes | None, length: int | None) -> Any:
        if digest is None or length is None:
            return None
        if length > INLINE_VALUE_BYTES or not self._afford(length):
            return _omitted(length, digest)
        return _read_json(self.conn, digest, limit=None)

    def text(self, digest: bytes | None, length: int | None) -> Any:
        """Error text, cut at INLINE_VALUE_BYTES."""
        if digest is None or length is None:
            return None
        if not self._afford(min(length, INLINE_VALUE_BYTES)):
            return _omitted(length, digest)
        return _read_text(self.conn, digest, INLINE_VALUE_BYTES)


# A step row with its values' digests and stored sizes (a LEFT JOIN to blobs each: no bytes read).
_STEP_SELECT = """
    SELECT s.step_index, a.attempt_id, a.node_path, a.node_kind, a.visit_number, a.attempt_number,
           a.attempt_status, a.outcome, a.started_at, a.finished_at, a.error_code,
           a.output_digest, o.byte_length, a.error_digest, e.byte_length, a.receipt_digest, q.byte_length
    FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
    LEFT JOIN blobs o ON o.digest = a.output_digest LEFT JOIN blobs e ON e.digest = a.error_digest
    LEFT JOIN blobs q ON q.digest = a.receipt_digest
"""
_STEP_KEYS = (
    "stepIndex",
    "attemptId",
    "nodePath",
    "nodeKind",
    "visit",
    "attempt",
    "status",
    "outcome",
    "startedAt",
    "finishedAt",
    "errorCode",
)


def _step(row: tuple[Any, ...], values: _StepValues) -> dict[str, Any]:
    """One step item: its row's facts, its duration once finished, and its values (the request of a
    checkpoint first: it is what a waiting run needs answered)."""
    item = dict(zip(_STEP_KEYS, row[:11], strict=True))
    output, output_length, error, error_length, request, request_length = row[11:]
    item["durationMs"] = _duration(item["startedAt"], item["finishedAt"])
    item["request"] = values.json(request, request_length) if item["nodeKind"] == "checkpoint" else None
    item["error"] = values.text(error, error_length)
    item["output"] = values.json(output, output_length)
    return item


def _steps(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    rows = conn.execute(
        f"{_STEP_SELECT} WHERE s.run_id = ? ORDER BY s.step_index LIMIT ?", (run_id, PAGE_ROWS + 1)
    ).fetchall()
    values = _StepValues(conn, STEP_VALUES_BYTES)
    items = [_step(row, values) for row in reversed(rows[:PAGE_ROWS])][::-1]  # the newest step's values first
    return {"items": items, "cursor": items[-1]["stepIndex"] if len(rows) > PAGE_ROWS else None}


def _current_step(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The run's active step (running, or a checkpoint waiting with its request), also past the steps' page."""
    row = conn.execute(
        f"{_STEP_SELECT} WHERE a.run_id = ? AND a.attempt_status IN ('running', 'waiting')", (run_id,)
    ).fetchone()
    return None if row is None else _step(row, _StepValues(conn, INLINE_VALUE_BYTES))


def _ambiguous_effects(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's effects waiting for an operator's review, each with the node visit it was reserved for."""
    rows = conn.execute(
        "SELECT effect_id, effect_type, owner_scope, idempotency_key FROM effects "
        "WHERE run_id = ? AND effect_status = 'ambiguous' ORDER BY created_at, effect_id LIMIT ?",
        (run_id, PAGE_ROWS),
    ).fetchall()
    items = []
    for effect_id, effect_type, scope, key in rows:
        node_path, visit = records.effect_node(scope, key)
        items.append({"effectId": effect_id, "effectType": effect_type, "nodePath": node_path, "visit": visit})
    return items


def _trace(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    """Compact events: type, revision, actor class and time; never payloads."""
    rows = conn.execute(
        "SELECT resource_revision, event_type, actor_class, committed_at FROM events WHERE resource_id = ? "
        "ORDER BY resource_revision LIMIT ?",
        (run_id, PAGE_ROWS + 1),
    ).fetchall()
    items = [{"revision": r, "event": t, "actor": a, "at": at} for r, t, a, at in rows[:PAGE_ROWS]]
    return {"items": items, "cursor": items[-1]["revision"] if len(rows) > PAGE_ROWS else None}

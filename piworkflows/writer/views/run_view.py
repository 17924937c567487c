"""The run view, ``pi-workflows.run-view.v1``: one bounded snapshot of a run in upstream's
top-level fields and meanings (VIEWS.md §4), what upstream's view does not have under ``piworkflows``.

::

    schema, runId, revision (viewer_runs), runRevision (resources)    never substituted
    display                 writer/views/display.py, the one reducer
    manifest                run-manifest.v1 (runs, run_sources), status = display status
    state                   run-state.v1: traceSeq, times, status (upstream's durable vocabulary:
                            a queued run is running), input, outputs and results (the latest
                            finished attempt of each node), steps (the window), updates,
                            current node, paused, waitingOn, finalOutput, error
    workflow                the definition snapshot; above WORKFLOW_BYTES its summary and content
    queue                   upstream's WorkflowRunQueueView (run_queue, runs)
    graphSteps, takenTransitions, graphCursor   compact steps and "from->to" transitions taken
    windows                 steps (stepStart/stepTotal), updates, tracePage, session entryPage and
                            eventPage, settingsScopes, followUpQueue.items: each the tail of its
                            history, at most WINDOW rows from max(0, total - WINDOW)
    live, possiblyInterrupted
    piworkflows             title, projectPath, executionMode, maxSteps, lineage, restartNumber,
                            status (ours: queued too), parkReason, parkDetail, errorCode, durationMs,
                            currentStep, effects (the ambiguous ones), pending (its open request)

Times are ISO-8601 UTC with milliseconds; durations integer milliseconds. A history item's field
over REFERENCE_BYTES, and a state value over STATE_VALUE_BYTES, is a content reference
(writer/views/content.py): no blob beyond those bounds is read, so a snapshot stays bounded
whatever the run produced.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from piworkflows.isotime import iso, iso_or_none
from piworkflows.protocol.internal.runners import MAX_PARK_DETAIL_BYTES
from piworkflows.states import MEDIA_JSON
from piworkflows.writer import records
from piworkflows.writer.views.content import REFERENCE_BYTES, STATE_VALUE_BYTES, RunValues, reference
from piworkflows.writer.views.display import REASON_BYTES, display
from piworkflows.writer.views.pending import pending_view
from piworkflows.writer.views.runs import (
    FACTS,
    PARK_CAUSE_BYTES,
    RUN_VIEW_SCHEMA,
    liveness,
    manifest,
    run_facts,
    workflow_source,
)
from piworkflows.writer.views.values import read_text

WINDOW = 64  # a snapshot's history windows: the last WINDOW rows of each
WORKFLOW_BYTES = 128 * 1024  # a definition snapshot above this is shown as its summary and content
STATE_SCHEMA = "pi-workflows.run-state.v1"
DEFINITION_SCHEMA = "pi-workflows.definition-snapshot.v1"
SESSION_BINDING_SCHEMA = "pi-workflows.session-binding.v1"
SESSION_CAPTURE_SCHEMA = "pi-workflows.session-capture.v1"
SESSION_EVENT_SCHEMA = "pi-workflows.session-event.v1"
# upstream's durable run status: a run not yet started is running (its queue says queued)
_STATE_STATUS = {"queued": "running"}
# the queue status of a run whose queue row is gone (it finished)
_DONE_QUEUE = {"completed": "done", "failed": "failed", "timed_out": "failed", "cancelled": "cancelled"}
_SCOPES = {"run": "run", "runner": "run", "server": "run", "node": "node", "checkpoint": "node", "agent": "agent"}
_SCOPES |= {"interaction": "agent", "effect": "action", "effects": "action"}


def run_view(conn: sqlite3.Connection, now: int, run_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        f"""SELECT r.workflow_name, r.title, p.canonical_path, r.execution_mode, r.origin_session_id, r.max_steps,
                   r.lineage, r.root_run_id, r.parent_run_id, r.restart_number, r.created_at, r.started_at,
                   r.finished_at, r.updated_at, r.error_code, r.definition_digest, r.input_digest, r.output_digest,
                   r.error_digest, v.presentation_revision, res.revision, q.queue_status, q.updated_at,
                   s.source_kind, s.source_path, s.source_sha256, s.builtin_id, s.builtin_revision, {FACTS}
            FROM runs r JOIN viewer_runs v ON v.run_id = r.run_id JOIN resources res ON res.resource_id = r.run_id
            JOIN projects p ON p.project_id = r.project_id JOIN run_sources s ON s.run_id = r.run_id
            LEFT JOIN run_queue q ON q.run_id = r.run_id
            WHERE r.run_id = :run_id""",
        {"run_id": run_id, "now": now, "cause_bytes": PARK_CAUSE_BYTES, "reason_bytes": REASON_BYTES},
    ).fetchone()
    if row is None:
        return None
    (name, title, project, mode, session, max_steps, lineage, root, parent, restart_number) = row[:10]
    (created, started, finished, updated, error_code, definition, input_digest, output_digest, error_digest) = row[
        10:19
    ]
    revision, run_revision, queue_status, queue_updated = row[19:23]
    source = workflow_source(*row[23:28])
    facts = run_facts(row[28:])
    values = RunValues(conn, run_id)
    shown = display(facts)
    steps = _steps(conn, run_id, values)
    current = _current_step(conn, run_id, values)
    updates = _updates(conn, run_id, values)
    graph_steps, transitions = _graph(conn, run_id)
    state: dict[str, Any] = {
        "schema": STATE_SCHEMA,
        "traceSeq": run_revision,
        "runId": run_id,
        "workflowName": name,
        **({"runTitle": title} if title is not None else {}),
        **({"parentRunId": parent} if parent is not None else {}),
        "workflowSource": source,
        "definitionDigest": "sha256:" + definition.hex(),
        "startedAt": iso(started if started is not None else created),
        **({"finishedAt": iso(finished)} if finished is not None else {}),
        "updatedAt": iso(updated),
        "status": _STATE_STATUS.get(facts.status, facts.status),
        "input": values.value(input_digest, STATE_VALUE_BYTES),
        **_node_results(conn, run_id, values),
        "steps": steps["items"],
        "updates": updates["items"],
        "paused": facts.paused,
    }
    if current is not None:
        state |= {
            "currentNode": current["nodeId"],
            "currentAttemptId": current["attemptId"],
            "currentNodeStartedAt": current["startedAt"],
        }
        if current["status"] == "waiting":
            state["waitingOn"] = current["nodeId"]
    if facts.status == "completed":
        state["finalOutput"] = values.value(output_digest, STATE_VALUE_BYTES)
    if error_digest is not None:
        state["error"] = values.value(error_digest, STATE_VALUE_BYTES)
    followups = _follow_ups(conn, run_id, values)
    settings = _settings(conn, run_id, values)
    return {
        "schema": RUN_VIEW_SCHEMA,
        "runId": run_id,
        "revision": revision,
        "runRevision": run_revision,
        "display": shown,
        "manifest": manifest(run_id, name, source, created, started, finished, shown["status"]),
        "state": state,
        "workflow": _workflow(conn, run_id, definition),
        "queue": {
            "runId": run_id,
            "workflowName": name,
            "workflowSourceRef": source["path"] if source["kind"] == "file" else "builtin:" + source["id"],
            "initialized": started is not None,
            "definitionDigest": state["definitionDigest"],
            "status": queue_status or _DONE_QUEUE.get(facts.status, "done"),
            "originSessionId": session,
            "executionMode": mode,
            "parentRunId": parent,
            "rootRunId": root,
            "lineageKind": {"root": None, "restart": "restart"}.get(lineage, "continuation"),
            "restartNumber": restart_number,
            "parentTerminalFingerprint": None,
            "errorCode": error_code,
            "createdAt": iso(created),
            "updatedAt": iso(max(updated, queue_updated or 0)),
            "startedAt": iso_or_none(started),
            "finishedAt": iso_or_none(finished),
        },
        "updates": updates["items"],
        "updateStart": updates["start"],
        "updateTotal": updates["total"],
        "graphSteps": graph_steps["items"],
        "graphStepStart": graph_steps["start"],
        "graphStepTotal": graph_steps["total"],
        "takenTransitions": transitions["items"],
        "graphHistory": None,
        "takenTransitionStart": transitions["start"],
        "takenTransitionTotal": transitions["total"],
        "graphCursor": max(0, steps["total"] - 1),
        "stepStart": steps["start"],
        "stepTotal": steps["total"],
        "tracePage": _trace(conn, run_id, run_revision, values),
        "session": _session(conn, run_id, values),
        "settingsScopes": settings["items"],
        "settingsStart": settings["start"],
        "settingsTotal": settings["total"],
        "followUpQueue": None if followups["total"] == 0 else {"items": followups["items"]},
        "followUpStart": followups["start"],
        "followUpTotal": followups["total"],
        **liveness(shown, queue_status),
        "piworkflows": {
            "title": title,
            "projectPath": project,
            "executionMode": mode,
            "maxSteps": max_steps,
            "lineage": lineage,
            "restartNumber": restart_number,
            "status": facts.status,
            "parkReason": facts.park_reason,
            "parkDetail": _park_detail(conn, run_id) if facts.park_reason == "runnerNoProgress" else None,
            "errorCode": error_code,
            "durationMs": finished - started if started is not None and finished is not None else None,
            "currentStep": current,
            "effects": _ambiguous_effects(conn, run_id),
            "pending": pending_view(conn, run_id) or _checkpoint(conn, run_id, values),
        },
    }


def _window(total: int) -> int:
    """The first position of a history's tail window."""
    return max(0, total - WINDOW)


# A step row with its values' digests (its values are read through RunValues, bounded).
_STEP_SELECT = """
    SELECT s.step_index, a.attempt_id, a.node_path, a.node_kind, a.visit_number, a.attempt_number,
           a.attempt_status, a.outcome, a.started_at, a.finished_at, a.error_code, a.output_digest, a.error_digest,
           a.receipt_digest
    FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
"""


def _step(row: tuple[Any, ...], values: RunValues, limit: int = REFERENCE_BYTES) -> dict[str, Any]:
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


def _steps(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    (total,) = conn.execute("SELECT count(*) FROM run_steps WHERE run_id = ?", (run_id,)).fetchone()
    start = _window(total)
    rows = conn.execute(
        f"{_STEP_SELECT} WHERE s.run_id = ? AND s.step_index >= ? ORDER BY s.step_index", (run_id, start)
    ).fetchall()
    return {"items": [_step(row, values) for row in rows], "start": start, "total": total}


def _current_step(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any] | None:
    """The run's active step (running, or waiting), also when it is outside the steps' window."""
    row = conn.execute(
        f"{_STEP_SELECT} WHERE a.run_id = ? AND a.attempt_status IN ('running', 'waiting')", (run_id,)
    ).fetchone()
    return None if row is None else _step(row, values)


def _node_results(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    """``outputs`` (each node's latest accepted output) and ``results`` (its latest finished
    attempt), one row per node of the graph."""
    rows = conn.execute(
        """SELECT attempt_id, node_path, node_kind, outcome, started_at, finished_at, output_digest, error_digest,
                  (SELECT b.output_digest FROM node_attempts b WHERE b.run_id = :run AND b.node_path = n.node_path
                   AND b.outcome = 'ok' ORDER BY b.finished_at DESC, b.visit_number DESC LIMIT 1)
           FROM (SELECT a.*, row_number() OVER (PARTITION BY a.node_path ORDER BY s.step_index DESC) AS newest
                 FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
                 WHERE s.run_id = :run AND a.finished_at IS NOT NULL) n
           WHERE newest = 1 ORDER BY node_path""",
        {"run": run_id},
    ).fetchall()
    outputs: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for attempt_id, node, kind, outcome, started, finished, output, error, ok_output in rows:
        if ok_output is not None:
            outputs[node] = values.value(ok_output, REFERENCE_BYTES)
        results[node] = {
            "attemptId": attempt_id,
            "nodeId": node,
            "nodeType": kind,
            "outcome": outcome,
            "startedAt": iso(started),
            "finishedAt": iso(finished),
            "durationMs": finished - started,
            **({"output": values.value(output, REFERENCE_BYTES)} if output is not None else {}),
            **({"error": values.value(error, REFERENCE_BYTES)} if error is not None else {}),
        }
    return {"outputs": outputs, "results": results}


def _graph(conn: sqlite3.Connection, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The compact steps (no values) and the distinct transitions taken, in the order first taken."""
    rows = conn.execute(
        "SELECT a.attempt_id, a.node_path, a.node_kind, a.outcome, a.started_at, a.finished_at "
        "FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id WHERE s.run_id = ? ORDER BY s.step_index",
        (run_id,),
    ).fetchall()
    transitions: dict[str, None] = {}
    for before, after in zip(rows, rows[1:], strict=False):
        transitions.setdefault(f"{before[1]}->{after[1]}")
    start = _window(len(rows))
    compact = [
        {
            "attemptId": attempt_id,
            "nodeId": node,
            "nodeType": kind,
            "outcome": outcome,
            "startedAt": iso(started),
            "finishedAt": iso_or_none(finished),
            "prompt": None,
            "output": None,
        }
        for attempt_id, node, kind, outcome, started, finished in rows[start:]
    ]
    taken = list(transitions)
    first = _window(len(taken))
    return (
        {"items": compact, "start": start, "total": len(rows)},
        {"items": taken[first:], "start": first, "total": len(taken)},
    )


def _trace(conn: sqlite3.Connection, run_id: str, run_revision: int, values: RunValues) -> dict[str, Any]:
    """upstream's trace events from the run's events (one per run revision), payloads bounded."""
    start = _window(run_revision)
    rows = conn.execute(
        "SELECT resource_revision, event_type, actor_class, payload_digest, committed_at FROM events "
        "WHERE resource_id = ? AND resource_revision > ? ORDER BY resource_revision",
        (run_id, start),
    ).fetchall()
    items = [
        {
            "seq": seq,
            "at": iso(at),
            "scope": _SCOPES.get(event.partition(".")[0], "run"),
            "type": event,
            "runId": run_id,
            "payload": values.value(payload, REFERENCE_BYTES) if payload is not None else {},
            "piworkflows": {"actor": actor},
        }
        for seq, event, actor, payload, at in rows
    ]
    return {"start": start, "total": run_revision, "items": items}


def _updates(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    (total,) = conn.execute("SELECT count(*) FROM workflow_updates WHERE run_id = ?", (run_id,)).fetchone()
    rows = conn.execute(
        "SELECT u.update_seq, u.update_kind, a.node_path, u.attempt_id, u.body_digest, u.created_at "
        "FROM workflow_updates u LEFT JOIN node_attempts a ON a.attempt_id = u.attempt_id "
        "WHERE u.run_id = ? ORDER BY u.update_seq DESC LIMIT ?",
        (run_id, WINDOW),
    ).fetchall()
    items = [
        {
            "seq": seq,
            "type": kind,
            "nodeId": node,
            "attemptId": attempt,
            "at": iso(at),
            "data": values.value(body, REFERENCE_BYTES),
        }
        for seq, kind, node, attempt, body, at in reversed(rows)
    ]
    return {"items": items, "start": total - len(items), "total": total}


def _session(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    """The run's Pi session: its binding (the first segment that knew the session file), the tail of
    its settled entries and of its compact events, capture state and the replay checkpoint."""
    segment = conn.execute(
        "SELECT g.pi_session_id, g.pi_session_file, g.started_at, p.canonical_path FROM session_segments g "
        "JOIN runs r ON r.run_id = g.run_id JOIN projects p ON p.project_id = r.project_id "
        "WHERE g.run_id = ? AND g.pi_session_id IS NOT NULL ORDER BY g.started_at LIMIT 1",
        (run_id,),
    ).fetchone()
    (entry_total, last_entry) = conn.execute(
        "SELECT count(*), coalesce(max(run_seq), 0) FROM session_entries WHERE run_id = ?", (run_id,)
    ).fetchone()
    (event_total, last_event, recording) = conn.execute(
        "SELECT count(*), coalesce(max(run_seq), 0), "
        "EXISTS (SELECT 1 FROM session_segments WHERE run_id = :run AND segment_status = 'recording') "
        "FROM session_events WHERE run_id = :run",
        {"run": run_id},
    ).fetchone()
    entries = conn.execute(
        "SELECT run_seq, settled_at, content_digest FROM session_entries WHERE run_id = ? "
        "ORDER BY run_seq DESC LIMIT ?",
        (run_id, WINDOW),
    ).fetchall()
    events = conn.execute(
        "SELECT e.run_seq, e.recorded_at, a.node_path, g.attempt_id, e.event_type, e.pi_event_id, e.event_role, "
        "e.event_status, e.started_at, e.ended_at FROM session_events e "
        "JOIN session_segments g ON g.segment_id = e.segment_id "
        "LEFT JOIN node_attempts a ON a.attempt_id = g.attempt_id "
        "WHERE e.run_id = ? ORDER BY e.run_seq DESC LIMIT ?",
        (run_id, WINDOW),
    ).fetchall()
    event_start = event_total - len(events)
    checkpoint = conn.execute(
        "SELECT state_digest FROM viewer_session_checkpoints WHERE run_id = ? AND run_seq <= ? "
        "ORDER BY run_seq DESC LIMIT 1",
        (run_id, events[-1][0] if events else 0),
    ).fetchone()
    binding = None
    if segment is not None:
        session_id, session_file, bound, cwd = segment
        binding = {
            "schema": SESSION_BINDING_SCHEMA,
            "runId": run_id,
            "piSessionId": session_id,
            "piSessionFile": session_file,
            "cwd": cwd,
            "boundAt": iso(bound),
        }
    return {
        "binding": binding,
        "entryPage": {
            "start": entry_total - len(entries),
            "total": entry_total,
            "items": [
                {"seq": seq, "at": iso(at), "entry": values.value(digest, REFERENCE_BYTES)}
                for seq, at, digest in reversed(entries)
            ],
        },
        "eventPage": {
            "start": event_start,
            "total": event_total,
            "items": [_session_event(row) for row in reversed(events)],
        },
        "capture": None
        if event_total == 0 and entry_total == 0
        else {
            "schema": SESSION_CAPTURE_SCHEMA,
            "eventSchema": SESSION_EVENT_SCHEMA,
            "status": "recording" if recording else "complete",
            "eventCount": event_total,
            "entryCount": entry_total,
            "lastEventSeq": max(last_event, last_entry),
        },
        "integrity": {"status": "complete" if binding is not None else "unavailable", "diagnostics": []},
        "replayCheckpoint": values.value(checkpoint[0], 0) if checkpoint is not None else None,
    }


def _session_event(row: tuple[Any, ...]) -> dict[str, Any]:
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


def _settings(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    (total,) = conn.execute("SELECT count(*) FROM workflow_settings WHERE run_id = ?", (run_id,)).fetchone()
    rows = conn.execute(
        "SELECT scope_id, scope_key, value_digest, updated_at FROM workflow_settings WHERE run_id = ? "
        "ORDER BY scope_key DESC LIMIT ?",
        (run_id, WINDOW),
    ).fetchall()
    items = [
        {"scopeId": scope, "scopeKey": key, "settings": values.value(digest, REFERENCE_BYTES), "updatedAt": iso(at)}
        for scope, key, digest, at in reversed(rows)
    ]
    return {"items": items, "start": total - len(items), "total": total}


def _follow_ups(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    (total,) = conn.execute("SELECT count(*) FROM workflow_follow_ups WHERE run_id = ?", (run_id,)).fetchone()
    rows = conn.execute(
        "SELECT follow_up_id, source_order, source_session_id, prompt_digest, follow_up_status, created_at "
        "FROM workflow_follow_ups WHERE run_id = ? ORDER BY source_order DESC LIMIT ?",
        (run_id, WINDOW),
    ).fetchall()
    items = [
        {
            "followUpId": follow_up,
            "sourceOrder": order,
            "sourceSessionId": session,
            "prompt": values.value(digest, REFERENCE_BYTES),
            "status": status,
            "createdAt": iso(at),
        }
        for follow_up, order, session, digest, status, at in reversed(rows)
    ]
    return {"items": items, "start": total - len(items), "total": total}


def _workflow(conn: sqlite3.Connection, run_id: str, definition: bytes) -> dict[str, Any]:
    """The definition snapshot; above WORKFLOW_BYTES its name, start and counts with the whole
    snapshot as ``content`` (the run's definition: readable through view.content)."""
    (length,) = conn.execute("SELECT byte_length FROM blobs WHERE digest = ?", (definition,)).fetchone()
    if length > WORKFLOW_BYTES:
        summary = conn.execute(
            "SELECT json_extract(CAST(bytes AS TEXT), '$.name'), json_extract(CAST(bytes AS TEXT), '$.startAt'), "
            "(SELECT count(*) FROM json_each(CAST(bytes AS TEXT), '$.nodes')), "
            "json_array_length(CAST(bytes AS TEXT), '$.edges') FROM blobs WHERE digest = ?",
            (definition,),
        ).fetchone()
        return {
            "schema": DEFINITION_SCHEMA,
            "name": summary[0],
            "startAt": summary[1],
            "nodes": {},
            "nodeStart": 0,
            "nodeTotal": summary[2],
            "edges": [],
            "edgeStart": 0,
            "edgeTotal": summary[3],
            "content": reference(run_id, definition, MEDIA_JSON, length),
        }
    snapshot = records.read_json(conn, definition)
    return {
        "schema": DEFINITION_SCHEMA,
        "name": snapshot.get("name"),
        "startAt": snapshot["startAt"],
        "nodes": snapshot["nodes"],
        "edges": snapshot["edges"],
    }


def _checkpoint(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any] | None:
    """A checkpoint the run waits on: its node and the question it asks."""
    row = conn.execute(
        "SELECT node_path, node_kind, attempt_id, receipt_digest FROM node_attempts "
        "WHERE run_id = ? AND attempt_status = 'waiting' AND node_kind = 'checkpoint'",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    node, kind, attempt_id, request = row
    question = values.value(request, STATE_VALUE_BYTES)
    return {"kind": kind, "nodePath": node, "attemptId": attempt_id, "request": question}


def _park_detail(conn: sqlite3.Connection, run_id: str) -> str | None:
    """What the runner that parked the run left (its last stderr line), from the latest runner exit."""
    row = conn.execute(
        "SELECT payload_digest FROM events WHERE resource_id = ? AND event_type = 'runner.exited' "
        "ORDER BY resource_revision DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    return read_text(conn, row[0], limit=MAX_PARK_DETAIL_BYTES) if row and row[0] else None


def _ambiguous_effects(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's effects waiting for an operator's review, each with the node visit it was reserved for."""
    rows = conn.execute(
        "SELECT effect_id, effect_type, owner_scope, idempotency_key FROM effects "
        "WHERE run_id = ? AND effect_status = 'ambiguous' ORDER BY created_at, effect_id LIMIT ?",
        (run_id, WINDOW),
    ).fetchall()
    items = []
    for effect_id, effect_type, scope, key in rows:
        node_path, visit = records.effect_node(scope, key)
        items.append({"effectId": effect_id, "effectType": effect_type, "nodePath": node_path, "visit": visit})
    return items

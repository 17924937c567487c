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
from piworkflows.writer.views.pages import HISTORIES, PAGE_SCHEMA, STEP_SELECT, WINDOW, step
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
    steps = HISTORIES["steps"].window(conn, run_id, values)
    current = _current_step(conn, run_id, values)
    updates = HISTORIES["updates"].window(conn, run_id, values)
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
    followups = HISTORIES["follow_ups"].window(conn, run_id, values)
    settings = HISTORIES["settings"].window(conn, run_id, values)
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
        "tracePage": HISTORIES["trace"].window(conn, run_id, values),
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


def _current_step(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any] | None:
    """The run's active step (running, or waiting), also when it is outside the steps' window."""
    row = conn.execute(
        f"{STEP_SELECT} WHERE a.run_id = ? AND a.attempt_status IN ('running', 'waiting')", (run_id,)
    ).fetchone()
    return None if row is None else step(row, values)


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
    start = max(0, len(rows) - WINDOW)
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
    first = max(0, len(taken) - WINDOW)
    return (
        {"items": compact, "start": start, "total": len(rows)},
        {"items": taken[first:], "start": first, "total": len(taken)},
    )


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
    entries = HISTORIES["session_entries"].window(conn, run_id, values)
    events = HISTORIES["session_events"].window(conn, run_id, values)
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
        "entryPage": entries,
        "eventPage": events,
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
        "replayCheckpoint": replay_checkpoint(conn, run_id, events, values),
    }


def replay_checkpoint(
    conn: sqlite3.Connection, run_id: str, events: dict[str, Any], values: RunValues
) -> dict[str, Any] | None:
    """The replay checkpoint at or before the first session event of ``events`` (a window or page):
    a reader rebuilds the session's state from it and the events that follow."""
    first = events["items"][0]["seq"] if events["items"] else 0
    row = conn.execute(
        "SELECT state_digest FROM viewer_session_checkpoints WHERE run_id = ? AND run_seq <= ? "
        "ORDER BY run_seq DESC LIMIT 1",
        (run_id, first),
    ).fetchone()
    return values.value(row[0], 0) if row is not None else None


def page(conn: sqlite3.Connection, run_id: str, kind: str, start: int, limit: int) -> dict[str, Any] | None:
    """``view.page``: ``run-page.v1``, at most ``limit`` rows of one history from ``start``, at the
    run's current presentation revision; None for an unknown run."""
    found = conn.execute("SELECT presentation_revision FROM viewer_runs WHERE run_id = ?", (run_id,)).fetchone()
    if found is None:
        return None
    values = RunValues(conn, run_id)
    rows = HISTORIES[kind].page(conn, run_id, values, start, limit)
    return {
        "schema": PAGE_SCHEMA,
        "runId": run_id,
        "revision": found[0],
        "kind": kind,
        "cursor": start + len(rows["items"]) if start + len(rows["items"]) < rows["total"] else None,
        **rows,
        "replayCheckpoint": replay_checkpoint(conn, run_id, rows, values) if kind == "session_events" else None,
    }


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

"""The run view, ``pi-workflows.run-view.v1``: one bounded snapshot of a run in upstream's
top-level fields and meanings (docs/protocol.md, Run views), what upstream's view does not have under ``piworkflows``.

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
                            effects (the ambiguous ones), pending (its open request)

Times are ISO-8601 UTC with milliseconds; durations integer milliseconds. A history item's field
over REFERENCE_BYTES, and a state value over STATE_VALUE_BYTES, is a content reference
(writer/views/content.py): no blob beyond those bounds is read, so a snapshot stays bounded
whatever the run produced.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from piworkflows.isotime import iso, iso_or_none
from piworkflows.protocol.internal.runners import MAX_PARK_DETAIL_BYTES
from piworkflows.states import DETAILED_PARKS, MEDIA_JSON
from piworkflows.writer import records
from piworkflows.writer.views.content import REFERENCE_BYTES, STATE_VALUE_BYTES, RunValues, reference
from piworkflows.writer.views.display import REASON_BYTES, display
from piworkflows.writer.views.pages import HISTORIES, PAGE_SCHEMA, STEP_SELECT, WINDOW, History, step
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


def run_view(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The snapshot at the run's current presentation revision: its fixed parts, its head, its
    windows, transitions and node results, each read by the function its patches use too."""
    values = RunValues(conn, run_id)
    parts = head(conn, run_id, values)
    if parts is None:
        return None
    view: dict[str, Any] = {"schema": RUN_VIEW_SCHEMA, "runId": run_id}
    for pointer, value in (fixed(conn, run_id, values) | parts | transitions(conn, run_id)).items():
        put(view, pointer, value)
    for window in WINDOWS:
        for pointer, value in window.snapshot(conn, run_id, values).items():
            put(view, pointer, value)
    view["state"] |= node_results(conn, run_id, values)
    (view["revision"],) = conn.execute(
        "SELECT presentation_revision FROM viewer_runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    return view


def put(document: dict[str, Any], pointer: str, value: Any) -> None:
    """Set the member a JSON Pointer of (escaped) object keys names, making its parents."""
    *parents, last = [unescape(token) for token in pointer.split("/")[1:]]
    for token in parents:
        document = document.setdefault(token, {})
    document[last] = value


def escape(key: str) -> str:
    """A key as a JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def fixed(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    """What a run view shows that never changes after the run was created."""
    row = conn.execute(
        "SELECT r.workflow_name, r.parent_run_id, r.definition_digest, r.input_digest, s.source_kind, "
        "s.source_path, s.source_sha256, s.builtin_id, s.builtin_revision "
        "FROM runs r JOIN run_sources s ON s.run_id = r.run_id WHERE r.run_id = ?",
        (run_id,),
    ).fetchone()
    name, parent, definition, input_digest = row[:4]
    return {
        "/state/schema": STATE_SCHEMA,
        "/state/runId": run_id,
        "/state/workflowName": name,
        **({"/state/parentRunId": parent} if parent is not None else {}),
        "/state/workflowSource": workflow_source(*row[4:9]),
        "/state/definitionDigest": "sha256:" + definition.hex(),
        "/state/input": values.value(input_digest, STATE_VALUE_BYTES),
        "/workflow": _workflow(conn, run_id, definition),
        "/graphHistory": None,
    }


def head(conn: sqlite3.Connection, run_id: str, values: RunValues, session: bool = True) -> dict[str, Any] | None:
    """What a run view shows that may change with any transaction, as JSON Pointers and their values
    (a key a run view does not have now is absent): read from indexed rows, bounded, no history.
    ``session=False``: without its /session members (the projection keeps them when no session row
    changed)."""
    row = conn.execute(
        f"""SELECT r.workflow_name, r.title, p.canonical_path, r.execution_mode, r.origin_session_id, r.max_steps,
                   r.lineage, r.root_run_id, r.parent_run_id, r.restart_number, r.created_at, r.started_at,
                   r.finished_at, r.updated_at, r.error_code, r.definition_digest, r.output_digest,
                   r.error_digest, res.revision, q.queue_status, q.updated_at,
                   s.source_kind, s.source_path, s.source_sha256, s.builtin_id, s.builtin_revision,
                   (SELECT count(*) FROM run_steps c WHERE c.run_id = r.run_id), {FACTS}
            FROM runs r JOIN resources res ON res.resource_id = r.run_id
            JOIN projects p ON p.project_id = r.project_id JOIN run_sources s ON s.run_id = r.run_id
            LEFT JOIN run_queue q ON q.run_id = r.run_id
            WHERE r.run_id = :run_id""",
        {"run_id": run_id, "cause_bytes": PARK_CAUSE_BYTES, "reason_bytes": REASON_BYTES},
    ).fetchone()
    if row is None:
        return None
    (name, title, project, mode, session, max_steps, lineage, root, parent, restart_number) = row[:10]
    (created, started, finished, updated, error_code, definition, output_digest, error_digest) = row[10:18]
    run_revision, queue_status, queue_updated = row[18:21]
    source = workflow_source(*row[21:26])
    step_total = row[26]
    facts = run_facts(row[27:])
    shown = display(facts)
    current = _current_step(conn, run_id, values)
    parts: dict[str, Any] = {
        "/runRevision": run_revision,
        "/display": shown,
        "/manifest": manifest(run_id, name, source, created, started, finished, shown["status"]),
        "/state/traceSeq": run_revision,
        **({"/state/runTitle": title} if title is not None else {}),
        "/state/startedAt": iso(started if started is not None else created),
        "/state/finishedAt": iso_or_none(finished),
        "/state/updatedAt": iso(updated),
        "/state/status": _STATE_STATUS.get(facts.status, facts.status),
        "/state/paused": facts.paused,
    }
    if current is not None:
        parts |= {
            "/state/currentNode": current["nodeId"],
            "/state/currentAttemptId": current["attemptId"],
            "/state/currentNodeStartedAt": current["startedAt"],
        }
        if current["status"] == "waiting":
            parts["/state/waitingOn"] = current["nodeId"]
    if facts.status == "completed":
        parts["/state/finalOutput"] = values.value(output_digest, STATE_VALUE_BYTES)
    if error_digest is not None:
        parts["/state/error"] = values.value(error_digest, STATE_VALUE_BYTES)
    parts["/queue"] = {
        "runId": run_id,
        "workflowName": name,
        "workflowSourceRef": source["path"] if source["kind"] == "file" else "builtin:" + source["id"],
        "initialized": started is not None,
        "definitionDigest": "sha256:" + definition.hex(),
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
    }
    parts["/graphCursor"] = max(0, step_total - 1)
    parts |= {"/" + key: value for key, value in liveness(shown, queue_status).items()}
    if session:
        parts |= _session(conn, run_id, values)
    parts["/piworkflows"] = {
        "title": title,
        "projectPath": project,
        "executionMode": mode,
        "maxSteps": max_steps,
        "lineage": lineage,
        "restartNumber": restart_number,
        "status": facts.status,
        "parkReason": facts.park_reason,
        "parkDetail": _park_detail(conn, run_id) if facts.park_reason in DETAILED_PARKS else None,
        "errorCode": error_code,
        "durationMs": finished - started if started is not None and finished is not None else None,
        "effects": _ambiguous_effects(conn, run_id) if facts.ambiguous_effects else [],
        "pending": pending_view(conn, run_id)
        or (_checkpoint(conn, run_id, values) if facts.waiting_for == "checkpoint" else None),
    }
    return parts


@dataclass(frozen=True)
class Window:
    """A history as a run view's tail window: the arrays it fills (each with its item), and where
    its start and total are shown."""

    kind: str  # the history (pages.HISTORIES)
    arrays: tuple[tuple[str, Callable[[tuple[Any, ...], RunValues], dict[str, Any]]], ...]
    starts: tuple[str, ...]
    totals: tuple[str, ...]
    holder: str | None = None  # an object holding the only array, null while the history is empty

    @property
    def history(self) -> History:
        return HISTORIES[self.kind]

    def snapshot(self, conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
        total = self.history.total(conn, run_id)
        return self.shown(self.history.newest(conn, run_id, WINDOW), total, values)

    def shown(self, rows: list[tuple[Any, ...]], total: int, values: RunValues) -> dict[str, Any]:
        """The window's members as JSON Pointers: its last rows, start and total."""
        start = total - len(rows)
        parts: dict[str, Any] = {pointer: start for pointer in self.starts} | {
            pointer: total for pointer in self.totals
        }
        for pointer, item in self.arrays:
            items = [item(row, values) for row in rows]
            if self.holder is None:
                parts[pointer] = items
            else:
                parts[self.holder] = {"items": items} if total else None
        return parts


def _graph_step(row: tuple[Any, ...], values: RunValues) -> dict[str, Any]:
    """A compact step of ``graphSteps``: no values."""
    _, attempt_id, node, kind, _, _, _, outcome, started, finished = row[:10]
    return {
        "attemptId": attempt_id,
        "nodeId": node,
        "nodeType": kind,
        "outcome": outcome,
        "startedAt": iso(started),
        "finishedAt": iso_or_none(finished),
        "prompt": None,
        "output": None,
    }


WINDOWS = (
    Window(
        "steps",
        (("/state/steps", step), ("/graphSteps", _graph_step)),
        ("/stepStart",),  # /graphSteps is the same window: upstream's view has no start or total of its own
        ("/stepTotal",),
    ),
    Window(
        "updates",
        (("/updates", HISTORIES["updates"].item), ("/state/updates", HISTORIES["updates"].item)),
        ("/updateStart",),
        ("/updateTotal",),
    ),
    Window(
        "trace",
        (("/tracePage/items", HISTORIES["trace"].item),),
        ("/tracePage/start",),
        ("/tracePage/total",),
    ),
    Window(
        "session_entries",
        (("/session/entryPage/items", HISTORIES["session_entries"].item),),
        ("/session/entryPage/start",),
        ("/session/entryPage/total",),
    ),
    Window(
        "session_events",
        (("/session/eventPage/items", HISTORIES["session_events"].item),),
        ("/session/eventPage/start",),
        ("/session/eventPage/total",),
    ),
    Window(
        "settings",
        (("/settingsScopes", HISTORIES["settings"].item),),
        ("/settingsStart",),
        ("/settingsTotal",),
    ),
    Window(
        "follow_ups",
        (("/followUpQueue/items", HISTORIES["follow_ups"].item),),
        ("/followUpStart",),
        ("/followUpTotal",),
        holder="/followUpQueue",
    ),
    Window(
        "workflow_messages",
        (("/workflowMessages", HISTORIES["workflow_messages"].item),),
        ("/workflowMessageStart",),
        ("/workflowMessageTotal",),
    ),
)


def transitions(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    """The distinct transitions the run took, as a tail window (the snapshot's)."""
    return transitions_window(taken_transitions(conn, run_id))


def taken_transitions(conn: sqlite3.Connection, run_id: str) -> list[str]:
    """Every distinct transition the run took ("from->to"), in the order first taken (reads every
    step: the projection extends the list it knows from the new steps alone)."""
    rows = conn.execute(
        "SELECT a.node_path FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id "
        "WHERE s.run_id = ? ORDER BY s.step_index",
        (run_id,),
    ).fetchall()
    return extend_transitions([], [row[0] for row in rows])


def extend_transitions(taken: list[str], nodes: list[str]) -> list[str]:
    """``taken`` with the transitions between consecutive ``nodes`` it does not have yet, in order."""
    seen = set(taken)
    for before, after in zip(nodes, nodes[1:], strict=False):
        name = f"{before}->{after}"
        if name not in seen:
            seen.add(name)
            taken = [*taken, name]
    return taken


def transitions_window(names: list[str]) -> dict[str, Any]:
    first = max(0, len(names) - WINDOW)
    return {"/takenTransitions": names[first:], "/takenTransitionStart": first, "/takenTransitionTotal": len(names)}


def _current_step(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any] | None:
    """The run's active step (running, or waiting), also when it is outside the steps' window."""
    row = conn.execute(
        f"{STEP_SELECT} WHERE a.run_id = ? AND a.attempt_status IN ('running', 'waiting')", (run_id,)
    ).fetchone()
    return None if row is None else step(row, values)


def node_results(conn: sqlite3.Connection, run_id: str, values: RunValues, node: str | None = None) -> dict[str, Any]:
    """``outputs`` (each node's latest accepted output) and ``results`` (its latest finished
    attempt: the highest visit and attempt, the node's own index walked backwards), one row per
    node of the graph (or of ``node`` only)."""
    accepted = """(SELECT b.output_digest FROM node_attempts b WHERE b.run_id = :run AND b.node_path = n.node_path
                   AND b.outcome = 'ok' ORDER BY b.visit_number DESC, b.attempt_number DESC LIMIT 1)"""
    columns = (
        f"attempt_id, node_path, node_kind, outcome, started_at, finished_at, output_digest, error_digest, {accepted}"
    )
    if node is None:
        rows = conn.execute(
            f"""SELECT {columns}
                FROM (SELECT a.*, row_number() OVER (
                          PARTITION BY a.node_path ORDER BY a.visit_number DESC, a.attempt_number DESC) AS newest
                      FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
                      WHERE s.run_id = :run AND a.finished_at IS NOT NULL) n
                WHERE newest = 1 ORDER BY node_path""",
            {"run": run_id},
        ).fetchall()
    else:  # the node's own attempts (the (run, node, visit, attempt) index), not the run's
        rows = conn.execute(
            f"""SELECT {columns}
                FROM (SELECT a.* FROM node_attempts a
                      WHERE a.run_id = :run AND a.node_path = :node AND a.finished_at IS NOT NULL
                      ORDER BY a.visit_number DESC, a.attempt_number DESC LIMIT 1) n""",
            {"run": run_id, "node": node},
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


def _session(conn: sqlite3.Connection, run_id: str, values: RunValues) -> dict[str, Any]:
    """The run's Pi session: its binding (the first segment that knew the session file), capture
    state and the replay checkpoint of its event window (the windows are WINDOWS')."""
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
    first = conn.execute(  # the first event of the window
        "SELECT run_seq FROM session_events WHERE run_id = ? ORDER BY run_seq DESC LIMIT 1 OFFSET ?",
        (run_id, min(event_total, WINDOW) - 1),
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
        "/session/binding": binding,
        "/session/capture": None
        if event_total == 0 and entry_total == 0
        else {
            "schema": SESSION_CAPTURE_SCHEMA,
            "eventSchema": SESSION_EVENT_SCHEMA,
            "status": "recording" if recording else "complete",
            "eventCount": event_total,
            "entryCount": entry_total,
            "lastEventSeq": max(last_event, last_entry),
        },
        "/session/integrity": {"status": "complete" if binding is not None else "unavailable", "diagnostics": []},
        "/session/replayCheckpoint": _checkpoint_at(conn, run_id, first[0] if first else 0, values),
    }


def replay_checkpoint(
    conn: sqlite3.Connection, run_id: str, events: dict[str, Any], values: RunValues
) -> dict[str, Any] | None:
    """The replay checkpoint at or before the first session event of ``events`` (a page): a reader
    rebuilds the session's state from it and the events that follow."""
    return _checkpoint_at(conn, run_id, events["items"][0]["seq"] if events["items"] else 0, values)


def _checkpoint_at(conn: sqlite3.Connection, run_id: str, first: int, values: RunValues) -> dict[str, Any] | None:
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
    """What the runner that parked the run left (its last stderr line, or what changed in the
    run's source), from the latest runner exit."""
    row = conn.execute(
        "SELECT payload_digest FROM events WHERE resource_id = ? AND event_type = 'runner.exited' "
        "ORDER BY resource_revision DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    return read_text(conn, row[0], limit=MAX_PARK_DETAIL_BYTES) if row and row[0] else None


def _ambiguous_effects(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's effects waiting for an operator's review, each with the node visit it was reserved for."""
    rows = conn.execute(
        "SELECT effect_id, effect_type, owner_scope, idempotency_key FROM effects WHERE run_id = ? "
        "AND channel_id IS NULL AND effect_status = 'ambiguous' ORDER BY created_at, effect_id LIMIT ?",
        (run_id, WINDOW),
    ).fetchall()
    (status,) = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone() or (None,)
    items = []
    for effect_id, effect_type, scope, key in rows:
        node_path, visit = records.effect_node(scope, key)
        controls = records.review_controls(scope, status)
        items.append(
            {
                "effectId": effect_id,
                "effectType": effect_type,
                "nodePath": node_path,
                "visit": visit,
                "controls": controls,
            }
        )
    return items

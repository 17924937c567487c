"""Run lists and run views: bounded reads derived from rows, never repaired.

A run list reads metadata, status, lease facts and the presentation
revision, never payload bodies. A run view (``pi-workflows.run-view.v1``)
adds the graph, the input (JSON reader, bounded), steps and compact trace
events (at most 256 rows each, with a cursor), and the display object.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.writer import records
from piworkflows.writer.views.display import RunFacts, display

PAGE_ROWS = 256
INLINE_VALUE_BYTES = 64 * 1024
RUN_VIEW_SCHEMA = "pi-workflows.run-view.v1"
RUN_LIST_SCHEMA = "pi-workflows.run-list-page.v1"

# The facts behind the display status, as correlated subqueries on indexed columns.
_FACTS = """
    r.status, r.paused, r.park_reason,
    (SELECT count(*) FROM effects e WHERE e.run_id = r.run_id AND e.effect_status = 'ambiguous'),
    (SELECT a.node_kind FROM node_attempts a WHERE a.run_id = r.run_id AND a.attempt_status = 'waiting'),
    EXISTS (SELECT 1 FROM run_workers w JOIN leases l ON l.resource_id = w.run_id
            WHERE w.run_id = r.run_id AND w.ended_at IS NULL AND l.owner_id IS NOT NULL AND l.expires_at > :now),
    EXISTS (SELECT 1 FROM workflow_turns t WHERE t.run_id = r.run_id AND t.turn_state = 'open')
"""


def _facts(row: tuple[Any, ...]) -> RunFacts:
    status, paused, park_reason, ambiguous, waiting_for, live_runner, open_turn = row
    return RunFacts(status, bool(paused), park_reason, ambiguous, waiting_for, bool(live_runner), bool(open_turn))


def list_runs(
    conn: sqlite3.Connection,
    now: int,
    limit: int,
    before: tuple[int, str] | None,
    project_path: str | None = None,
    statuses: list[str] | None = None,
    workflow_name: str | None = None,
    since: int | None = None,
) -> dict[str, Any]:
    """One page, newest first, of the runs every given filter admits (a run's durable status,
    its workflow name, created at or after ``since``, its project), after the keyset cursor.

    Each filter walks its own index in (created_at, run_id) order (schema.sql ``runs_by_*``),
    several statuses one index range each, merged: a page reads at most ``limit + 1`` keys per
    range, however many runs the table holds.
    """
    where = ["1"]
    params: dict[str, Any] = {"now": now, "rows": limit + 1, "project": project_path, "workflow": workflow_name,
                              "since": since, "before_at": before[0] if before else None,
                              "before_id": before[1] if before else None}  # fmt: skip
    if project_path is not None:
        where.append("r.project_id = (SELECT project_id FROM projects WHERE canonical_path = :project)")
    if workflow_name is not None:
        where.append("r.workflow_name = :workflow")
    if since is not None:
        where.append("r.created_at >= :since")
    if before is not None:
        where.append("(r.created_at, r.run_id) < (:before_at, :before_id)")
    ranges = []
    for n, status in enumerate(statuses or [None]):
        condition = where if status is None else [*where, f"r.status = :status{n}"]
        params[f"status{n}"] = status
        ranges.append(f"SELECT * FROM (SELECT r.created_at, r.run_id FROM runs r WHERE {' AND '.join(condition)} "
                      "ORDER BY r.created_at DESC, r.run_id DESC LIMIT :rows)")  # fmt: skip
    rows = conn.execute(
        f"""WITH page (created_at, run_id) AS (
                SELECT created_at, run_id FROM ({" UNION ALL ".join(ranges)})
                ORDER BY created_at DESC, run_id DESC LIMIT :rows)
            SELECT r.run_id, r.workflow_name, r.title, r.execution_mode, r.created_at, r.updated_at, r.started_at,
                   r.finished_at, v.presentation_revision, res.revision, l.owner_id IS NOT NULL, l.expires_at, {_FACTS}
            FROM page JOIN runs r ON r.run_id = page.run_id JOIN viewer_runs v ON v.run_id = r.run_id
            JOIN resources res ON res.resource_id = r.run_id LEFT JOIN leases l ON l.resource_id = r.run_id
            ORDER BY page.created_at DESC, page.run_id DESC""",
        params,
    ).fetchall()
    items = []
    for row in rows[:limit]:
        (run_id, name, title, mode, created, updated, started, finished, revision, run_revision, claimed,
         expires) = row[:12]  # fmt: skip
        items.append(
            {
                "runId": run_id,
                "workflowName": name,
                "title": title,
                "executionMode": mode,
                "createdAt": created,
                "updatedAt": updated,
                "startedAt": started,
                "finishedAt": finished,
                "revision": revision,
                "runRevision": run_revision,
                "claim": {"held": bool(claimed), "expired": bool(claimed) and expires <= now},
                "display": display(_facts(row[12:])),
            }
        )
    cursor = {"createdAt": items[-1]["createdAt"], "runId": items[-1]["runId"]} if len(rows) > limit else None
    return {"schema": RUN_LIST_SCHEMA, "items": items, "cursor": cursor}


def source_view(kind: str, path: str | None, sha256: bytes | None, builtin_id: str | None,
                builtin_revision: str | None) -> dict[str, Any]:  # fmt: skip
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
        {"run_id": run_id, "now": now},
    ).fetchone()
    if row is None:
        return None
    (name, title, project, mode, session, max_steps, lineage, parent, restart_number, created, started, finished,
     error_code, definition_digest, input_digest, output_digest, error_digest, revision, run_revision, kind, path,
     sha256, builtin_id, builtin_revision) = row[:24]  # fmt: skip
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
    }


def _read_json(conn: sqlite3.Connection, digest: bytes, limit: int | None) -> Any:
    """A JSON value through its declared media type; above ``limit`` only its size."""
    row = conn.execute("SELECT media_type, byte_length FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None or row[0] != "application/json":
        raise CommandError("presentationFailed", "a stored JSON value is missing or has another media type")
    length = row[1]
    if limit is not None and length > limit:
        return {"omitted": {"byteLength": length, "digest": "sha256:" + digest.hex()}}
    return records.read_json(conn, digest)


def _read_text(conn: sqlite3.Connection, digest: bytes, limit: int) -> str:
    """A stored text value through its declared media type, cut at ``limit`` bytes."""
    row = conn.execute("SELECT media_type, substr(bytes, 1, ?) FROM blobs WHERE digest = ?", (limit, digest)).fetchone()
    if row is None or row[0] != "text/plain;charset=utf-8":
        raise CommandError("presentationFailed", "a stored text value is missing or has another media type")
    return bytes(row[1]).decode("utf-8", "replace")


def _steps(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    rows = conn.execute(
        """SELECT s.step_index, a.attempt_id, a.node_path, a.node_kind, a.visit_number, a.attempt_number,
                  a.attempt_status, a.outcome, a.started_at, a.finished_at, a.error_code
           FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
           WHERE s.run_id = ? ORDER BY s.step_index LIMIT ?""",
        (run_id, PAGE_ROWS + 1),
    ).fetchall()
    keys = ("stepIndex", "attemptId", "nodePath", "nodeKind", "visit", "attempt", "status", "outcome", "startedAt",
            "finishedAt", "errorCode")  # fmt: skip
    items = [dict(zip(keys, row, strict=True)) for row in rows[:PAGE_ROWS]]
    return {"items": items, "cursor": items[-1]["stepIndex"] if len(rows) > PAGE_ROWS else None}


def _trace(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    """Compact events: type, revision, actor class and time; never payloads."""
    rows = conn.execute(
        "SELECT resource_revision, event_type, actor_class, committed_at FROM events WHERE resource_id = ? "
        "ORDER BY resource_revision LIMIT ?",
        (run_id, PAGE_ROWS + 1),
    ).fetchall()
    items = [{"revision": r, "event": t, "actor": a, "at": at} for r, t, a, at in rows[:PAGE_ROWS]]
    return {"items": items, "cursor": items[-1]["revision"] if len(rows) > PAGE_ROWS else None}

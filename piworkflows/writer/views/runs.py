"""Run lists: ``pi-workflows.run-list-page.v1`` pages, bounded reads derived from rows, never repaired.

A page reads metadata, status, lease facts and presentation revisions, never an input, output or
step value (its display reads bounded prefixes of small blobs: an agent request's contract kind, a
park cause, a terminal error). The facts behind a display (``FACTS``, ``run_facts``), the manifest
and the source object are shared with the run view (writer/views/run_view.py).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from piworkflows.isotime import iso, iso_or_none
from piworkflows.writer.views.display import REASON_BYTES, RunFacts, display

BUILTIN_PREFIX = "builtin:"  # a workflow filter for the built-in of that name only
RUN_VIEW_SCHEMA = "pi-workflows.run-view.v1"
RUN_LIST_SCHEMA = "pi-workflows.run-list-page.v1"
MANIFEST_SCHEMA = "pi-workflows.run-manifest.v1"
TRACE_SCHEMA = "pi-workflows.trace-event.v1"
PAGE_BYTES = 256 * 1024  # a run-list page's items as compact JSON, at most (and 256 items)

# The facts behind the display status, as correlated subqueries on indexed columns. No clock: a
# runner is live while its run_workers row is open (startup recovery ends an older server's rows).
FACTS = """
    r.status, r.paused, r.park_reason,
    (SELECT count(*) FROM effects e WHERE e.run_id = r.run_id AND e.channel_id IS NULL
        AND e.effect_status = 'ambiguous'),
    (SELECT a.node_kind FROM node_attempts a WHERE a.run_id = r.run_id AND a.attempt_status = 'waiting'),
    EXISTS (SELECT 1 FROM run_workers w WHERE w.run_id = r.run_id AND w.ended_at IS NULL),
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


def run_facts(row: tuple[Any, ...]) -> RunFacts:
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
    if workflow_name is not None and workflow_name.startswith(BUILTIN_PREFIX):  # builtin:NAME, as run start takes it
        params["workflow"] = workflow_name.removeprefix(BUILTIN_PREFIX)
        where.append("r.workflow_name = :workflow")
        where.append("(SELECT s.source_kind FROM run_sources s WHERE s.run_id = r.run_id) = 'builtin'")
    elif workflow_name is not None:
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
                   s.source_kind, s.source_path, s.source_sha256, s.builtin_id, s.builtin_revision, {FACTS}
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
    source = workflow_source(*row[15:20])
    facts = run_facts(row[20:])
    shown = display(facts)
    return {
        "runId": run_id,
        "workflowName": name,
        "originSessionId": session,
        "createdAt": iso(created),
        "updatedAt": iso(updated),
        "display": shown,
        "manifest": manifest(run_id, name, source, created, started, finished, shown["status"]),
        **liveness(shown, queue_status),
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


def liveness(shown: dict[str, Any], queue_status: str | None) -> dict[str, bool]:
    """upstream's ``live`` (the display says the run moves: running or waiting) and
    ``possiblyInterrupted`` (parked, and not because it is paused), of run views and list items."""
    return {
        "live": shown["status"] in ("running", "waiting"),
        "possiblyInterrupted": queue_status == "parked" and shown["status"] != "paused",
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
    """upstream's ``pi-workflows.run-manifest.v1``: started at its creation until it starts,
    ``finishedAt`` null until it ends, its display status; every path is the server's ("host")."""
    return {
        "schema": MANIFEST_SCHEMA,
        "runId": run_id,
        "workflowName": name,
        "workflowSource": source,
        "startedAt": iso(started if started is not None else created),
        "finishedAt": iso_or_none(finished),
        "status": status,
        "traceSchema": TRACE_SCHEMA,
        "paths": {"workflow": "host", "state": "host", "trace": "host"},
    }


def source_view(
    kind: str, path: str | None, sha256: bytes | None, builtin_id: str | None, builtin_revision: str | None
) -> dict[str, Any]:
    """A run's source identity as the runner protocol carries it (no source text)."""
    if kind == "file":
        assert sha256 is not None
        return {"kind": "file", "path": path, "sha256": sha256.hex()}
    return {"kind": "builtin", "id": builtin_id, "revision": builtin_revision}


def workflow_source(
    kind: str, path: str | None, sha256: bytes | None, builtin_id: str | None, builtin_revision: str | None
) -> dict[str, Any]:
    """A run's source as upstream's views name it (``WorkflowSource``): a file by path and hash, or a
    built-in by id and revision."""
    if kind == "file":
        assert sha256 is not None
        return {"kind": "file", "path": path, "hash": "sha256:" + sha256.hex()}
    return {"kind": "builtin", "id": builtin_id, "revision": builtin_revision}

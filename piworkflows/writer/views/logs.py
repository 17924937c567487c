"""Run logs: a run's steps with what each produced, and bounded reads of the values linked to the run.

::

    run.logs {run, node?, after?, limit}
      run_steps + node_attempts in step order; per step: node, kind, visit, attempt, status,
      outcome, times, error code, output (JSON, inline up to 64 KiB), error (text, up to 64 KiB),
      and for a shell step the streams its effect's result names (digest, byteLength,
      keptBytes, seenBytes), on the latest attempt of the node visit (the one that adopted it)
      a page: at most ``limit`` steps and about PAGE_BYTES; ``cursor`` is the next ``after``
    run.content {run, digest, media type, offset, limit}
      a value the run owns with exactly this digest and media type (writer/views/content.py's
      rule, view.content's too), else contentNotFound; at most 256 KiB, read through SQLite's
      incremental blob I/O (a part never loads the whole value)
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from piworkflows import canonical
from piworkflows.errors import CommandError
from piworkflows.writer import records
from piworkflows.writer.views import content

# The views' readers and bound: one form of an inline (or omitted) value in every view.
from piworkflows.writer.views.values import INLINE_VALUE_BYTES
from piworkflows.writer.views.values import read_json as _read_json
from piworkflows.writer.views.values import read_text as _read_text

# A page of steps stays well inside one message: steps are added while the page is smaller than
# this (the first always; one step is at most its two inline values, escaped).
PAGE_BYTES = 512 * 1024

_STEPS = """
    SELECT s.step_index, a.attempt_id, a.node_path, a.node_kind, a.visit_number, a.attempt_number,
           a.attempt_status, a.outcome, a.started_at, a.finished_at, a.error_code, a.output_digest, a.error_digest,
           NOT EXISTS (SELECT 1 FROM node_attempts b WHERE b.run_id = a.run_id AND b.node_path = a.node_path
                       AND b.visit_number = a.visit_number AND b.attempt_number > a.attempt_number)
    FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
    WHERE s.run_id = :run AND s.step_index > :after AND (:node IS NULL OR a.node_path = :node)
    ORDER BY s.step_index LIMIT :limit"""


def run_logs(
    conn: sqlite3.Connection, run_id: str, node_path: str | None, after: int | None, limit: int
) -> dict[str, Any] | None:
    """One page of the run's steps, or None when there is no such run."""
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        return None
    rows = conn.execute(
        _STEPS, {"run": run_id, "after": -1 if after is None else after, "node": node_path, "limit": limit + 1}
    ).fetchall()
    effects = _shell_effects(conn, run_id) if any(row[3] == "shell" for row in rows) else {}
    steps: list[dict[str, Any]] = []
    size = 0
    for row in rows[:limit]:
        (
            index,
            attempt_id,
            path,
            kind,
            visit,
            attempt,
            status,
            outcome,
            started,
            finished,
            error_code,
            output_digest,
            error_digest,
            latest,
        ) = row
        step = {
            "stepIndex": index,
            "attemptId": attempt_id,
            "nodePath": path,
            "nodeKind": kind,
            "visit": visit,
            "attempt": attempt,
            "status": status,
            "outcome": outcome,
            "startedAt": started,
            "finishedAt": finished,
            "errorCode": error_code,
            "output": _read_json(conn, output_digest, INLINE_VALUE_BYTES) if output_digest is not None else None,
            "error": _read_text(conn, error_digest, INLINE_VALUE_BYTES) if error_digest is not None else None,
            "streams": _streams(conn, effects.get((path, visit))) if kind == "shell" and latest else None,
        }
        step_bytes = len(canonical.dumps_bytes(step))
        if steps and size + step_bytes > PAGE_BYTES:
            break
        steps.append(step)
        size += step_bytes
    more = len(steps) < len(rows)
    return {"runId": run_id, "steps": steps, "cursor": steps[-1]["stepIndex"] if more else None}


def _shell_effects(conn: sqlite3.Connection, run_id: str) -> dict[tuple[str, int], str]:
    """The run's shell effects by node visit (a node's key is [runId, effect type, full path, visit])."""
    found = {}
    for effect_id, key in conn.execute(
        "SELECT effect_id, idempotency_key FROM effects WHERE run_id = ? AND performer = 'shell.exec'", (run_id,)
    ):
        path, visit = json.loads(key)[2:4]
        found[(path, visit)] = effect_id
    return found


def _streams(conn: sqlite3.Connection, effect_id: str | None) -> dict[str, Any] | None:
    """The streams the effect's latest attempt with a result names (none before it settled)."""
    if effect_id is None:
        return None
    row = conn.execute(
        "SELECT result_digest FROM effect_attempts WHERE effect_id = ? AND result_digest IS NOT NULL "
        "ORDER BY attempt_number DESC LIMIT 1",
        (effect_id,),
    ).fetchone()
    if row is None:
        return None
    result = records.read_json(conn, row[0])
    streams = result.get("streams") if isinstance(result, dict) else None
    return streams if isinstance(streams, dict) else None


def read_content(
    conn: sqlite3.Connection, run_id: str, digest: bytes, media_type: str, offset: int, limit: int
) -> dict[str, Any]:
    """At most ``limit`` bytes from ``offset`` of a value the run owns with this media type
    (writer/views/content.py, the ownership rule ``view.content`` follows too)."""
    found = content.owned_blob(conn, run_id, digest, media_type)
    if found is None:
        raise CommandError(
            "contentNotFound",
            "the run has no content with this digest and media type",
            runId=run_id,
            digest="sha256:" + digest.hex(),
        )
    rowid, byte_length = found
    data = content.read(conn, rowid, offset, min(limit, byte_length - offset))
    return {
        "digest": "sha256:" + digest.hex(),
        "mediaType": media_type,
        "byteLength": byte_length,
        "offset": offset,
        "data": data,
    }

"""Old terminal root-run trees planted into a state dir, for retention's benchmark and tests.

Each tree is one root run written by the writer's own ``run.create`` (its resource,
creation event, run row, queue row, viewer row and its own input blob; the demo's
definition blob is shared), then made terminal the way the engine leaves a run:
``completed`` with a settled queue. Trees finish one millisecond apart, oldest first,
long before any retention cutoff. No server may be running on the state dir.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from piworkflows.clock import FakeClock
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.settings import Settings
from piworkflows.workflows import discovery
from piworkflows.writer.db import GroupExecutor, Submitted, open_database

PLANTED_AT_MS = 1_700_000_000_000  # 2023-11-14: older than any retention age
_GROUP = 200
CLIENT = {"actor_class": "client", "actor_id": "planter"}


def plant(paths: StatePaths, count: int, prefix: str = "old") -> list[str]:
    """Plant ``count`` trees; returns their root run ids, oldest first."""
    clock = FakeClock(PLANTED_AT_MS)
    conn = open_database(paths, Settings(), clock)
    executor = GroupExecutor(conn, Settings(), clock)
    definition = BlobValue.of_json(discovery.load(discovery.resolve("builtin:demo", Path("/"))).compile().snapshot)
    ids = itertools.count(1)
    run_ids = [f"{prefix}-{n:06d}" for n in range(count)]
    try:
        for start in range(0, count, _GROUP):
            chunk = run_ids[start : start + _GROUP]
            batch = [Submitted(next(ids), "run.create", _create(run_id, definition)) for run_id in chunk]
            replies, leftover = executor.run(batch)
            refused = [reply for _, reply in replies if reply.outcome != "accepted"]
            if leftover or refused:
                raise RuntimeError(f"planting failed: {refused[:1] or 'a group did not fit'}")
        with conn:
            conn.executemany(
                "UPDATE runs SET status = 'completed', finished_at = ? WHERE run_id = ?",
                [(PLANTED_AT_MS + n, run_id) for n, run_id in enumerate(run_ids)],
            )
            conn.executemany("UPDATE run_queue SET queue_status = 'done' WHERE run_id = ?", [(r,) for r in run_ids])
    finally:
        conn.close()
    return run_ids


def _create(run_id: str, definition: BlobValue) -> dict:
    return {
        "actor": CLIENT,
        "run_id": run_id,
        "project_path": "/projects/planted",
        "workflow_name": "demo",
        "definition": definition.model_dump(),
        "source": {"source_kind": "builtin", "builtin_id": "builtin:demo", "builtin_revision": "4"},
        "input": BlobValue.of_json({"tree": run_id}).model_dump(),
        "title": "a planted old run",
        "max_steps": 20,
        "execution_mode": "headless",
        "origin_session_id": None,
    }

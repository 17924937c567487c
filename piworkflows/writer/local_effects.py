"""Local effects: follow-up work the writer applies itself (never an outbox round trip).

::

    group commit (e.g. node.finish ends the run; run.cancel) ── inserts a pending
        local effect "run.settle_queue" {"queueStatus": ...}
    replies sent ── apply_pending(): one more transaction right away: claim
        (new lease generation, attempt 1 recorded), settle the queue row,
        effect applied, lease released, effect revision + event, the
        run view's ops (its queue status)

Between the two commits the spec's window holds: a terminal run whose queue
settlement effect is still pending is no contradiction. A crash in between
leaves the effect pending; the writer applies it when it opens the database
again. Only runs that have a ``run_queue`` row get one.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from piworkflows.protocol.internal.base import Actor, BlobValue
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.writer import records

if TYPE_CHECKING:
    from piworkflows.writer.views.projection import Projection

log = logging.getLogger("piworkflows.writer")

SETTLE_QUEUE = "run.settle_queue"
WRITER = Actor(actor_class="server", actor_id="writer")
# Local effects are the writer's to perform: the effects_due index finds them.
_PENDING = (
    f"SELECT 1 FROM effects WHERE performer = 'writer' AND {records.UNSETTLED_WORK} AND effect_status = 'pending' "
    "LIMIT 1"
)


def settle_queue(run_id: str, queue_status: str) -> EffectRequest:
    """The request a terminal transition records for its run's queue row."""
    return EffectRequest(
        effect_type=SETTLE_QUEUE,
        idempotency_key=run_id,
        payload=BlobValue.of_json({"queueStatus": queue_status}),
        effect_class="local",
        performer="writer",
        recovery_policy="idempotent",
        owner_scope="server",
        run_id=run_id,
        max_attempts=1,
    )


def _apply_settle_queue(conn: sqlite3.Connection, run_id: str, payload: dict[str, Any], now: int) -> None:
    conn.execute(
        "UPDATE run_queue SET queue_status = ?, updated_at = ? WHERE run_id = ?", (payload["queueStatus"], now, run_id)
    )


APPLIERS: dict[str, Callable[[sqlite3.Connection, str, dict[str, Any], int], None]] = {
    SETTLE_QUEUE: _apply_settle_queue
}


def apply_pending(conn: sqlite3.Connection, now: int, projection: Projection) -> int:
    """Apply every pending local effect in one transaction, with the view ops it causes (a settled
    queue shows in the run view). Returns how many."""
    if conn.execute(_PENDING).fetchone() is None:
        return 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        rows = conn.execute(
            "SELECT e.effect_id, e.effect_type, e.run_id, e.payload_digest, r.revision FROM effects e "
            "JOIN resources r ON r.resource_id = e.effect_id "
            f"WHERE e.performer = 'writer' AND e.{records.UNSETTLED_WORK} AND e.effect_status = 'pending' "
            "ORDER BY e.created_at, e.effect_id"
        ).fetchall()
        for effect_id, effect_type, run_id, payload_digest, revision in rows:
            token_hash = os.urandom(32)  # the writer's own claim, released in this transaction
            generation = records.acquire_lease(conn, effect_id, WRITER.actor_id or "writer", token_hash, 60_000, now)
            records.begin_effect_attempt(conn, effect_id, generation, "writer", now)
            APPLIERS[effect_type](conn, run_id, records.read_json(conn, payload_digest), now)
            conn.execute(
                "UPDATE effects SET effect_status = 'applied', settled_at = ?, updated_at = ? WHERE effect_id = ?",
                (now, now, effect_id),
            )
            conn.execute(
                "UPDATE effect_attempts SET attempt_status = 'applied', ended_at = ? "
                "WHERE effect_id = ? AND attempt_status = 'applying'",
                (now, effect_id),
            )
            records.release_lease(conn, effect_id, generation)
            new_revision = records.increment_revision(conn, effect_id, revision, now)
            records.write_event(conn, effect_id, new_revision, "effect.applied", WRITER, now, generation)
        projection.project(conn, now)
        projection.settle(kept=True)
        conn.execute("COMMIT")
        projection.end(committed=True)
    except Exception:
        projection.end(committed=False)
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    log.debug("applied %d local effects", len(rows))
    return len(rows)


__all__ = ["SETTLE_QUEUE", "apply_pending", "settle_queue"]

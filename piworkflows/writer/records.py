"""The spec's shared records: resources, leases, events, blobs, effects, receipts.

Every domain command builds on these functions; none reimplements them. Each
is one short SQL operation on the writer's connection inside the command's
savepoint, and raises ``CommandError`` when the contract refuses.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from typing import Any

from piworkflows import canonical
from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import (
    Actor,
    BlobValue,
    Claim,
    ClientReceiptKey,
    WorkerMessageKey,
    server_owner_id,
)
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.states import CHANNEL_PERFORMER, MEDIA_TEXT, POOL_PERFORMERS, TERMINAL_RUN_STATUSES

# --- projects -----------------------------------------------------------------


def ensure_project(conn: sqlite3.Connection, canonical_path: str, now: int) -> tuple[str, bool]:
    """The stable id of a project path, created on first use. Returns (project_id, created)."""
    row = conn.execute("SELECT project_id FROM projects WHERE canonical_path = ?", (canonical_path,)).fetchone()
    if row is not None:
        return row[0], False
    project_id = "project-" + hashlib.sha256(canonical_path.encode("utf-8")).hexdigest()[:32]
    conn.execute(
        "INSERT INTO projects (project_id, canonical_path, created_at) VALUES (?, ?, ?)",
        (project_id, canonical_path, now),
    )
    return project_id, True


# --- resources ----------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    resource_id: str
    resource_kind: str
    revision: int


def get_resource(conn: sqlite3.Connection, resource_id: str) -> Resource | None:
    row = conn.execute(
        "SELECT resource_id, resource_kind, revision FROM resources WHERE resource_id = ?", (resource_id,)
    ).fetchone()
    return Resource(*row) if row else None


def create_resource(
    conn: sqlite3.Connection, resource_id: str, kind: str, now: int, project_id: str | None = None
) -> int:
    """Callers check that the id is new (the primary key refuses a duplicate in any case)."""
    conn.execute(
        "INSERT INTO resources (resource_id, resource_kind, revision, project_id, created_at, updated_at) "
        "VALUES (?, ?, 1, ?, ?, ?)",
        (resource_id, kind, project_id, now, now),
    )
    return 1


def increment_revision(conn: sqlite3.Connection, resource_id: str, expected: int, now: int) -> int:
    """Compare-and-increment: exactly once per accepted command."""
    cur = conn.execute(
        "UPDATE resources SET revision = revision + 1, updated_at = ? WHERE resource_id = ? AND revision = ?",
        (now, resource_id, expected),
    )
    if cur.rowcount != 1:
        raise CommandError("staleRevision", "the resource changed since the expected revision", resourceId=resource_id)
    return expected + 1


def end_live_runner(conn: sqlite3.Connection, run_id: str, now: int) -> None:
    """The runner's work ended with this transaction (the run finished or waits); it exits next."""
    conn.execute(
        "UPDATE run_workers SET outcome = 'exited', ended_at = ? WHERE run_id = ? AND ended_at IS NULL", (now, run_id)
    )


# --- leases -------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    resource_id: str
    lease_generation: int
    owner_id: str | None
    claim_token_hash: bytes | None
    expires_at: int | None

    def live(self, now: int) -> bool:
        return self.owner_id is not None and self.expires_at is not None and self.expires_at > now


def get_lease(conn: sqlite3.Connection, resource_id: str) -> Lease | None:
    row = conn.execute(
        "SELECT resource_id, lease_generation, owner_id, claim_token_hash, expires_at "
        "FROM leases WHERE resource_id = ?",
        (resource_id,),
    ).fetchone()
    return Lease(*row) if row else None


def acquire_lease(
    conn: sqlite3.Connection,
    resource_id: str,
    owner_id: str,
    token_hash: bytes,
    ttl_ms: int,
    now: int,
    after: int = 0,
) -> int:
    """Give a new owner a new generation. A live owner keeps its lease. ``after``: a generation the
    new one must exceed (a run's successive segments are new resources, yet their generations
    keep rising, so a stale segment's epoch never matches a newer one)."""
    lease = get_lease(conn, resource_id)
    if lease is not None and lease.live(now):
        raise CommandError("leaseHeld", "another owner holds a live claim on the resource", resourceId=resource_id)
    generation = 1 if lease is None else lease.lease_generation + 1
    generation = max(generation, after + 1)
    conn.execute(
        "INSERT INTO leases (resource_id, lease_generation, owner_id, claim_token_hash, acquired_at, renewed_at, "
        "expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (resource_id) DO UPDATE SET "
        "lease_generation = excluded.lease_generation, owner_id = excluded.owner_id, "
        "claim_token_hash = excluded.claim_token_hash, acquired_at = excluded.acquired_at, "
        "renewed_at = excluded.renewed_at, expires_at = excluded.expires_at",
        (resource_id, generation, owner_id, token_hash, now, now, now + ttl_ms),
    )
    return generation


def verify_server_epoch(conn: sqlite3.Connection, server_epoch: int) -> None:
    row = conn.execute("SELECT server_epoch FROM workflow_host_state").fetchone()
    if row is None or row[0] != server_epoch:
        raise CommandError("staleServerEpoch", "this belongs to an older server epoch")


def verify_and_renew_claim(conn: sqlite3.Connection, resource_id: str, claim: Claim, now: int) -> Lease:
    """Verify the epoch, the exact still-live token and generation, then renew it."""
    verify_server_epoch(conn, claim.server_epoch)
    lease = get_lease(conn, resource_id)
    if lease is None or lease.owner_id is None:
        raise CommandError("notClaimed", "the resource has no live claim", resourceId=resource_id)
    if lease.lease_generation != claim.lease_generation:
        raise CommandError("staleGeneration", "the claim generation is no longer current", resourceId=resource_id)
    if lease.claim_token_hash != claim.claim_token_hash or lease.owner_id != claim.owner_id:
        raise CommandError("claimTokenMismatch", "the claim token does not match", resourceId=resource_id)
    if not lease.live(now):
        raise CommandError("claimExpired", "the claim expired", resourceId=resource_id)
    conn.execute(
        "UPDATE leases SET renewed_at = ?, expires_at = ? WHERE resource_id = ? AND lease_generation = ?",
        (now, now + claim.ttl_ms, resource_id, claim.lease_generation),
    )
    return lease


def release_lease(conn: sqlite3.Connection, resource_id: str, generation: int) -> None:
    """Clear the owner; the generation stays, so it is never reused."""
    conn.execute(
        "UPDATE leases SET owner_id = NULL, claim_token_hash = NULL, acquired_at = NULL, renewed_at = NULL, "
        "expires_at = NULL WHERE resource_id = ? AND lease_generation = ?",
        (resource_id, generation),
    )


# --- events -------------------------------------------------------------------


def write_event(
    conn: sqlite3.Connection,
    resource_id: str,
    revision: int,
    event_type: str,
    actor: Actor,
    now: int,
    lease_generation: int | None = None,
    payload_digest: bytes | None = None,
    attempt_id: str | None = None,
) -> None:
    """``attempt_id``: the node attempt a run's event is about, if any."""
    conn.execute(
        "INSERT INTO events (resource_id, resource_revision, event_type, actor_class, actor_id, lease_generation, "
        "payload_digest, attempt_id, committed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            resource_id,
            revision,
            event_type,
            actor.actor_class,
            actor.actor_id,
            lease_generation,
            payload_digest,
            attempt_id,
            now,
        ),
    )


# --- blobs --------------------------------------------------------------------


def put_blob(conn: sqlite3.Connection, blob: BlobValue, now: int) -> bool:
    """Insert verified content; repeated content adopts the row. True if created."""
    row = conn.execute("SELECT media_type, byte_length, bytes FROM blobs WHERE digest = ?", (blob.digest,)).fetchone()
    if row is not None:
        if row != (blob.media_type, len(blob.data), blob.data):
            raise CommandError("blobMismatch", "stored content under this digest differs", digest=blob.digest.hex())
        return False
    conn.execute(
        "INSERT INTO blobs (digest, media_type, byte_length, bytes, created_at) VALUES (?, ?, ?, ?, ?)",
        (blob.digest, blob.media_type, len(blob.data), blob.data, now),
    )
    return True


def put_own_blobs(conn: sqlite3.Connection, blobs: dict[bytes, bytes], media_type: str, now: int) -> None:
    """Insert values the writer encoded itself (each digest computed here from its bytes), in one
    statement; a digest stored already is adopted without reading it back."""
    conn.executemany(
        "INSERT INTO blobs (digest, media_type, byte_length, bytes, created_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (digest) DO NOTHING",
        [(digest, media_type, len(data), data, now) for digest, data in blobs.items()],
    )


def read_text(conn: sqlite3.Connection, digest: bytes) -> str:
    """A stored text value, read through its declared media type."""
    row = conn.execute("SELECT media_type, bytes FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None or row[0] != MEDIA_TEXT:
        raise CommandError("presentationFailed", "a stored text value is missing or has another media type")
    return bytes(row[1]).decode("utf-8")


def read_json(conn: sqlite3.Connection, digest: bytes) -> Any:
    """A stored JSON value, read through its declared media type."""
    row = conn.execute("SELECT media_type, bytes FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None or row[0] != "application/json":
        raise CommandError("presentationFailed", "a stored JSON value is missing or has another media type")
    return canonical.loads(row[1])


# --- effects ------------------------------------------------------------------


def node_effect_key(run_id: str, effect_type: str, node_path: str, visit: int) -> str:
    """The idempotency key of a node's effect: one effect per node visit."""
    return canonical.dumps([run_id, effect_type, node_path, visit])


def effect_node(owner_scope: str, idempotency_key: str) -> tuple[str | None, int | None]:
    """The node path and visit a run-scoped effect was reserved for (``node_effect_key``), else (None, None)."""
    if owner_scope == "run" and idempotency_key.startswith("["):
        node_path, visit = canonical.loads(idempotency_key)[2:4]
        return node_path, visit
    return None, None


def review_controls(owner_scope: str, run_status: str | None) -> list[str]:
    """What an operator can do with an ambiguous effect now: a run-scoped effect of an ended run is
    never attempted again, so only its confirmation is left (``effect.retry`` answers runFinished)."""
    if owner_scope == "run" and run_status in TERMINAL_RUN_STATUSES:
        return ["confirm"]
    return ["confirm", "retry"]


# The ambiguous effects of runs that ended: shown apart, since nothing will ever attempt them again.
AMBIGUOUS_OF_ENDED_RUNS = (
    "SELECT count(*) FROM effects e JOIN runs r ON r.run_id = e.run_id WHERE e.effect_status = 'ambiguous' "
    f"AND e.owner_scope = 'run' AND r.status IN ({', '.join(repr(s) for s in sorted(TERMINAL_RUN_STATUSES))})"
)


def insert_effect(
    conn: sqlite3.Connection,
    request: EffectRequest,
    source_resource_id: str,
    source_revision: int,
    actor: Actor,
    now: int,
) -> tuple[str, bool]:
    """Record one deterministic effect. Returns (effect_id, adopted).

    A matching repeated request adopts the existing effect; a different
    request under the same key is a conflict.
    """
    fingerprint = request.fingerprint(source_resource_id)
    row = conn.execute(
        "SELECT effect_id, request_fingerprint FROM effects WHERE effect_type = ? AND idempotency_key = ?",
        (request.effect_type, request.idempotency_key),
    ).fetchone()
    if row is not None:
        if row[1] != fingerprint:
            raise CommandError("effectKeyConflict", "another effect request already holds this key", effectId=row[0])
        return row[0], True
    effect_id = request.effect_id(source_resource_id)
    put_blob(conn, request.payload, now)
    create_resource(conn, effect_id, "effect", now)
    write_event(conn, effect_id, 1, "effect.reserved", actor, now, payload_digest=request.payload.digest)
    conn.execute(
        "INSERT INTO effects (effect_id, source_resource_id, source_revision, effect_type, idempotency_key, "
        "request_fingerprint, payload_digest, effect_class, performer, recovery_policy, owner_scope, run_id, "
        "channel_id, effect_status, available_at, attempt_count, max_attempts, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, 0, ?, ?, ?)",
        (
            effect_id,
            source_resource_id,
            source_revision,
            request.effect_type,
            request.idempotency_key,
            fingerprint,
            request.payload.digest,
            request.effect_class,
            request.performer,
            request.recovery_policy,
            request.owner_scope,
            request.run_id,
            request.channel_id,
            now,
            request.max_attempts,
            now,
            now,
        ),
    )
    return effect_id, False


def begin_effect_attempt(
    conn: sqlite3.Connection, effect_id: str, lease_generation: int, owner_id: str, now: int
) -> int:
    """Record the next numbered attempt, before anything acts. Returns its number."""
    number: int = conn.execute(
        "SELECT coalesce(max(attempt_number), 0) + 1 FROM effect_attempts WHERE effect_id = ?", (effect_id,)
    ).fetchone()[0]
    conn.execute(
        "INSERT INTO effect_attempts (effect_id, attempt_number, lease_generation, owner_id, attempt_status, "
        "started_at) "
        "VALUES (?, ?, ?, ?, 'applying', ?)",
        (effect_id, number, lease_generation, owner_id, now),
    )
    conn.execute(
        "UPDATE effects SET effect_status = 'applying', attempt_count = attempt_count + 1, updated_at = ? "
        "WHERE effect_id = ? AND effect_status = 'pending'",
        (now, effect_id),
    )
    return number


def uncertain_effect_status(conn: sqlite3.Connection, effect_id: str, cancelled: bool) -> tuple[str, str | None]:
    """Where an applying effect goes when its attempt may or may not have acted.

    Idempotent: a new attempt under the same key (``pending``), or ``rejected``
    with ``retriesExhausted`` after ``max_attempts``. Manual, or its run was
    cancelled: ``ambiguous`` (only an operator decides). Returns (status, error code).
    """
    policy, attempts, max_attempts = conn.execute(
        "SELECT recovery_policy, attempt_count, max_attempts FROM effects WHERE effect_id = ?", (effect_id,)
    ).fetchone()
    if cancelled or policy == "manual":
        return "ambiguous", None
    if attempts >= max_attempts:
        return "rejected", "retriesExhausted"
    return "pending", None


UNCERTAIN = "uncertainAttempt"  # the error code of an attempt whose claimant was gone before it reported


def end_uncertain_attempt(
    conn: sqlite3.Connection, effect_id: str, status: str, error_code: str | None, now: int, retry_at: int | None = None
) -> None:
    """Domain rows only: the applying attempt ends ``ambiguous``; the effect takes ``status``
    (``pending``: the next attempt is due at ``retry_at``, default now; recorded on the attempt)."""
    retry_at = (now if retry_at is None else retry_at) if status == "pending" else None
    conn.execute(
        "UPDATE effect_attempts SET attempt_status = 'ambiguous', error_code = ?, retry_at = ?, ended_at = ? "
        "WHERE effect_id = ? AND attempt_status = 'applying'",
        (UNCERTAIN, retry_at, now, effect_id),
    )
    conn.execute(
        "UPDATE effects SET effect_status = ?, error_code = coalesce(?, ?), available_at = coalesce(?, available_at), "
        "settled_at = ?, updated_at = ? WHERE effect_id = ? AND effect_status = 'applying'",
        (status, error_code, UNCERTAIN, retry_at, now if status == "rejected" else None, now, effect_id),
    )


def abandon_effect(
    conn: sqlite3.Connection,
    effect_id: str,
    actor: Actor,
    now: int,
    cancelled: bool = False,
    retry_at: int | None = None,
) -> str:
    """From another resource's transaction (a cancel, a runner's exit, a recovery): end an
    applying effect's uncertain attempt, release its claim, and advance its own revision
    and event. Returns the new status."""
    status, error_code = uncertain_effect_status(conn, effect_id, cancelled)
    end_uncertain_attempt(conn, effect_id, status, error_code, now, retry_at)
    lease = get_lease(conn, effect_id)
    if lease is not None and lease.owner_id is not None:
        release_lease(conn, effect_id, lease.lease_generation)
    resource = get_resource(conn, effect_id)
    assert resource is not None
    revision = increment_revision(conn, effect_id, resource.revision, now)
    write_event(conn, effect_id, revision, f"effect.{status}", actor, now)
    return status


def retry_effect(conn: sqlite3.Connection, effect_id: str, now: int) -> None:
    """An operator's retry of an ambiguous effect: pending and due now, with room for one more
    numbered attempt (its claim records it)."""
    conn.execute(
        "UPDATE effects SET effect_status = 'pending', available_at = ?, error_code = NULL, "
        "max_attempts = max(max_attempts, attempt_count + 1), updated_at = ? WHERE effect_id = ?",
        (now, now, effect_id),
    )


def cancel_pending_effects(conn: sqlite3.Connection, run_id: str, actor: Actor, now: int) -> None:
    """A run ended: its external effects that never started never will (each effect's revision advances)."""
    rows = conn.execute(
        "SELECT e.effect_id, r.revision FROM effects e JOIN resources r ON r.resource_id = e.effect_id "
        "WHERE e.run_id = ? AND e.effect_class = 'external' AND e.channel_id IS NULL AND e.effect_status = 'pending'",
        (run_id,),
    ).fetchall()
    for effect_id, revision in rows:
        conn.execute(
            "UPDATE effects SET effect_status = 'cancelled', settled_at = ?, updated_at = ? WHERE effect_id = ?",
            (now, now, effect_id),
        )
        write_event(conn, effect_id, increment_revision(conn, effect_id, revision, now), "effect.cancelled", actor, now)


# The condition of the partial index effects_due (performer, effect_status, available_at): SQLite
# uses a partial index only for a query that repeats its WHERE term, so every due query does.
UNSETTLED_WORK = "effect_status IN ('pending', 'applying')"
_DEAD_CLAIM = "(l.owner_id IS NULL OR l.expires_at <= ? OR l.owner_id != ?)"


def _owner_now(conn: sqlite3.Connection) -> str:
    (epoch,) = conn.execute("SELECT server_epoch FROM workflow_host_state").fetchone() or (0,)
    return server_owner_id(epoch)


def stale_applying_effects(conn: sqlite3.Connection, run_id: str, now: int) -> list[str]:
    """Applying effects of a run whose claim is dead: expired, released, or of an older server epoch."""
    rows = conn.execute(
        "SELECT e.effect_id FROM effects e LEFT JOIN leases l ON l.resource_id = e.effect_id "
        f"WHERE e.run_id = ? AND e.channel_id IS NULL AND e.effect_status = 'applying' AND {_DEAD_CLAIM} "
        "ORDER BY e.effect_id",
        (run_id, now, _owner_now(conn)),
    ).fetchall()
    return [row[0] for row in rows]


def stale_pool_effects(conn: sqlite3.Connection, now: int) -> list[str]:
    """Applying effects of the outbox pool or of a channel's adapter whose claim is dead (their
    worker or adapter is gone)."""
    performers = ", ".join(f"'{p}'" for p in sorted(POOL_PERFORMERS | {CHANNEL_PERFORMER}))
    rows = conn.execute(
        "SELECT e.effect_id FROM effects e LEFT JOIN leases l ON l.resource_id = e.effect_id "
        f"WHERE e.performer IN ({performers}) AND e.{UNSETTLED_WORK} AND e.effect_status = 'applying' "
        f"AND {_DEAD_CLAIM} "
        "ORDER BY e.effect_id",
        (now, _owner_now(conn)),
    ).fetchall()
    return [row[0] for row in rows]


# --- receipts: host_commands and worker_messages --------------------------------


@dataclass(frozen=True)
class StoredAnswer:
    outcome: str
    revision: int | None
    receipt: dict[str, Any] | None
    error: str | None


ReceiptKey = ClientReceiptKey | WorkerMessageKey


def _receipt_table(key: ReceiptKey) -> tuple[str, str, str, tuple[str, str]]:
    if isinstance(key, ClientReceiptKey):
        return "host_commands", "client_id", "idempotency_key", (key.client_id, key.idempotency_key)
    return "worker_messages", "sender_scope", "message_id", (key.sender_scope, key.message_id)


def find_answer(conn: sqlite3.Connection, key: ReceiptKey) -> StoredAnswer | None:
    """The stored answer for this exact request, None if new; conflict if the key was reused."""
    table, scope_col, key_col, ident = _receipt_table(key)
    row = conn.execute(
        f"SELECT fingerprint, outcome, revision, receipt, error FROM {table} WHERE {scope_col} = ? AND {key_col} = ?",
        ident,
    ).fetchone()
    if row is None:
        return None
    if row[0] != key.fingerprint:
        raise CommandError("idempotencyKeyReused", "this idempotency key was used for another request")
    return StoredAnswer(row[1], row[2], canonical.loads(row[3]) if row[3] is not None else None, row[4])


def store_answer(conn: sqlite3.Connection, key: ReceiptKey, answer: StoredAnswer, now: int) -> None:
    table, scope_col, key_col, ident = _receipt_table(key)
    operation_col, operation = (
        ("operation", key.operation) if isinstance(key, ClientReceiptKey) else ("message_kind", key.message_kind)
    )
    conn.execute(
        f"INSERT INTO {table} ({scope_col}, {key_col}, fingerprint, {operation_col}, outcome, revision, receipt, "
        "error, run_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            *ident,
            key.fingerprint,
            operation,
            answer.outcome,
            answer.revision,
            canonical.dumps(answer.receipt) if answer.receipt is not None else None,
            answer.error,
            key.run_id,
            now,
        ),
    )

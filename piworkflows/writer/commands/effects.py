"""The transactional outbox: reserve, claim (numbered attempt), settle, and operator recovery.

Statuses and allowed transitions are ``states.EFFECT_TRANSITIONS`` (the table
of docs/workflows.md, Effects). A claim records the next numbered attempt in the
same transaction, before the claimant acts; a settlement is fenced by that
claim's token, generation and expiry. An operator settles an ambiguous
effect (``effect.confirm`` -> applied, ``effect.retry`` -> pending: the next
claim records a new numbered attempt); the run parked for it continues in
the same transaction.
"""

from __future__ import annotations

import json
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.effects import (
    EffectAbandon,
    EffectClaim,
    EffectConfirm,
    EffectDue,
    EffectList,
    EffectRecover,
    EffectReserve,
    EffectRetry,
    EffectSettle,
)
from piworkflows.states import (
    ATTEMPT_END_FOR_EFFECT_STATUS,
    EFFECT_TRANSITIONS,
    TERMINAL_EFFECT_STATUSES,
    TERMINAL_RUN_STATUSES,
)
from piworkflows.writer import channel_effects, records
from piworkflows.writer.contract import Change, Handler, NewClaim, ResourceHandler, Result, Stamp, Target, Tx
from piworkflows.writer.views import touched

OPERATORS = frozenset({"client", "operator"})


def effect_target(tx: Tx, effect_id: str, claim: Any = None) -> Target:
    resource = records.get_resource(tx.conn, effect_id)
    if resource is None or resource.resource_kind != "effect":
        raise CommandError("effectNotFound", "no such effect", effectId=effect_id)
    return Target(effect_id, resource.revision, claim=claim)


class ReserveEffects(ResourceHandler[EffectReserve]):
    """A source resource records follow-up effects at its exact revision."""

    model = EffectReserve
    actors = frozenset({"server", "runner", "channel", "operator"})

    def target(self, tx: Tx, cmd: EffectReserve) -> Target:
        return Target(cmd.source_resource_id, cmd.expected_revision, claim=cmd.claim)

    def transition(self, tx: Tx, cmd: EffectReserve, resource: records.Resource | None) -> Change:
        return Change(event_type="effects.reserved", effects=list(cmd.effects))


def _pool_due(tx: Tx, performers: list[str]) -> tuple[str, int] | None:
    """The pool effect of these performers that is due first (its id and revision), unclaimed."""
    chosen = sorted(set(performers))
    marks = ", ".join("?" for _ in chosen)
    row: tuple[str, int] | None = tx.conn.execute(
        "SELECT e.effect_id, r.revision FROM effects e JOIN resources r ON r.resource_id = e.effect_id "
        "LEFT JOIN leases l ON l.resource_id = e.effect_id "
        f"WHERE e.performer IN ({marks}) AND e.{records.UNSETTLED_WORK} AND e.effect_status = 'pending' "
        "AND e.available_at <= ? "
        "AND (l.owner_id IS NULL OR l.expires_at <= ?) ORDER BY e.available_at, e.effect_id LIMIT 1",
        (*chosen, tx.now, tx.now),
    ).fetchone()
    return row


def _pool_next_due(tx: Tx, performers: list[str]) -> int | None:
    """When the earliest pending pool effect of these performers is due (None: none is pending)."""
    chosen = sorted(set(performers))
    marks = ", ".join("?" for _ in chosen)
    next_due: int | None = tx.conn.execute(
        f"SELECT min(available_at) FROM effects WHERE performer IN ({marks}) AND {records.UNSETTLED_WORK} "
        "AND effect_status = 'pending'",
        chosen,
    ).fetchone()[0]
    return next_due


class DueEffects(Handler[EffectDue]):
    """Whether a pool effect is due now and when the next one is (nothing claimed, nothing written)."""

    model = EffectDue
    actors = frozenset({"server", "outbox"})
    read_only = True

    def execute(self, tx: Tx, cmd: EffectDue) -> Result:
        due = _pool_due(tx, cmd.performers) is not None
        return Result(receipt={"due": due, "nextDueAt": None if due else _pool_next_due(tx, cmd.performers)})


class ClaimEffect(ResourceHandler[EffectClaim]):
    """Take a new claim generation on a due pending effect and record its attempt."""

    model = EffectClaim
    actors = frozenset({"server", "outbox", "channel"})

    def target(self, tx: Tx, cmd: EffectClaim) -> Target:
        if cmd.effect_id is not None:
            row = tx.conn.execute(
                "SELECT e.effect_id, r.revision FROM effects e JOIN resources r ON r.resource_id = e.effect_id "
                "WHERE e.effect_id = ?",
                (cmd.effect_id,),
            ).fetchone()
            if row is None:
                raise CommandError("effectNotFound", "no such effect", effectId=cmd.effect_id)
        elif cmd.channel_id is not None:  # its channel manager: the channel's next due effect
            row = tx.conn.execute(
                "SELECT e.effect_id, r.revision FROM effects e JOIN resources r ON r.resource_id = e.effect_id "
                "LEFT JOIN leases l ON l.resource_id = e.effect_id "
                "WHERE e.channel_id = ? AND e.effect_status = 'pending' AND e.available_at <= ? "
                "AND (l.owner_id IS NULL OR l.expires_at <= ?) ORDER BY e.available_at, e.effect_id LIMIT 1",
                (cmd.channel_id, tx.now, tx.now),
            ).fetchone()
            if row is None:
                (next_due,) = tx.conn.execute(
                    "SELECT min(available_at) FROM effects WHERE channel_id = ? AND effect_status = 'pending'",
                    (cmd.channel_id,),
                ).fetchone()
                raise CommandError("nothingDue", "no effect of the channel is due", nextDueAt=next_due)
        else:
            row = _pool_due(tx, cmd.performers)
            if row is None:
                raise CommandError("nothingDue", "no effect is due", nextDueAt=_pool_next_due(tx, cmd.performers))
        return Target(row[0], row[1])

    def transition(self, tx: Tx, cmd: EffectClaim, resource: records.Resource | None) -> Change:
        assert resource is not None
        status, available_at, effect_type, key, payload_digest, policy, performer, run_id = tx.conn.execute(
            "SELECT effect_status, available_at, effect_type, idempotency_key, payload_digest, recovery_policy, "
            "performer, run_id FROM effects WHERE effect_id = ?",
            (resource.resource_id,),
        ).fetchone()
        if status != "pending":
            raise CommandError(
                "invalidTransition", f"a {status} effect cannot be claimed", effectId=resource.resource_id
            )
        if available_at > tx.now:
            raise CommandError("invalidTransition", "the effect is not due yet", effectId=resource.resource_id)
        change = Change(
            event_type="effect.applying",
            acquire_claim=NewClaim(cmd.owner_id, cmd.claim_token_hash, cmd.ttl_ms),
            receipt={
                "effectId": resource.resource_id,
                "effectType": effect_type,
                "idempotencyKey": key,
                "payloadDigest": payload_digest.hex(),
                "recoveryPolicy": policy,
                "performer": performer,
                "runId": run_id,
            },
        )
        if cmd.effect_id is None or cmd.channel_id is not None:  # performed from the payload alone
            change.receipt["payload"] = records.read_json(tx.conn, payload_digest)

        def apply(stamp: Stamp) -> None:
            assert stamp.lease_generation is not None
            number = records.begin_effect_attempt(
                tx.conn, resource.resource_id, stamp.lease_generation, cmd.owner_id, tx.now
            )
            change.receipt.update(attemptNumber=number, leaseGeneration=stamp.lease_generation)

        change.apply = apply
        return change


class SettleEffect(ResourceHandler[EffectSettle]):
    """End the applying attempt: applied, rejected, retry later, or ambiguous. The stored values its
    result names (``view_content``: a shell command's streams) are linked to the run in the same
    transaction (``run_view_content``), so they live as long as the run and go with it."""

    model = EffectSettle
    actors = frozenset({"server", "outbox", "channel"})
    claim_required = True

    def target(self, tx: Tx, cmd: EffectSettle) -> Target:
        return Target(cmd.effect_id, cmd.expected_revision, claim=cmd.claim)

    def transition(self, tx: Tx, cmd: EffectSettle, resource: records.Resource | None) -> Change:
        effect_id = cmd.effect_id
        status, policy, attempts, max_attempts, run_id, channel_id = tx.conn.execute(
            "SELECT effect_status, recovery_policy, attempt_count, max_attempts, run_id, channel_id FROM effects "
            "WHERE effect_id = ?",
            (effect_id,),
        ).fetchone()
        error_code = cmd.error_code
        if cmd.settlement == "retry":
            if policy == "manual" and not cmd.not_acted:
                raise CommandError(
                    "invalidTransition", "a manual effect is never repeated without an operator", effectId=effect_id
                )
            new_status = "pending" if attempts < max_attempts else "rejected"
            if new_status == "rejected":
                error_code = "retriesExhausted"
        else:
            new_status = cmd.settlement
        if new_status not in EFFECT_TRANSITIONS[status]:
            raise CommandError("invalidTransition", f"a {status} effect cannot become {new_status}", effectId=effect_id)
        blobs = [b for b in (cmd.result, cmd.error) if b is not None]
        result_digest = cmd.result.digest if cmd.result else None
        error_digest = cmd.error.digest if cmd.error else None
        settled_at = tx.now if new_status in TERMINAL_EFFECT_STATUSES else None
        available_at = cmd.retry_at if new_status == "pending" else None
        links = _view_content(tx, run_id, cmd.view_content)

        def apply(stamp: Stamp) -> None:
            tx.conn.executemany(
                "INSERT INTO run_view_content (run_id, digest, media_type, byte_length, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(run_id, digest, media_type, length, tx.now) for digest, media_type, length in links],
            )
            tx.conn.execute(
                "UPDATE effects SET effect_status = ?, available_at = coalesce(?, available_at), result_digest = ?, "
                "error_digest = ?, error_code = ?, external_ref = coalesce(?, external_ref), settled_at = ?, "
                "updated_at = ? WHERE effect_id = ? AND effect_status = 'applying'",
                (
                    new_status,
                    available_at,
                    result_digest,
                    error_digest,
                    error_code,
                    cmd.external_ref,
                    settled_at,
                    tx.now,
                    effect_id,
                ),
            )
            tx.conn.execute(
                "UPDATE effect_attempts SET attempt_status = ?, result_digest = ?, error_digest = ?, error_code = ?, "
                "external_ref = ?, retry_at = ?, ended_at = ? "
                "WHERE effect_id = ? AND attempt_status = 'applying' AND lease_generation = ?",
                (
                    ATTEMPT_END_FOR_EFFECT_STATUS[new_status],
                    result_digest,
                    error_digest,
                    cmd.error_code,
                    cmd.external_ref,
                    available_at,
                    tx.now,
                    effect_id,
                    stamp.lease_generation,
                ),
            )
            if channel_id is not None:  # a decision's message: its receipts, and its edit once resolved
                channel_effects.settled(tx.conn, effect_id, new_status, tx.actor, tx.now)

        return Change(
            event_type=f"effect.{new_status}",
            apply=apply,
            blobs=blobs,
            event_payload=result_digest or error_digest,
            release_claim=True,
            receipt={
                "effectId": effect_id,
                "effectStatus": new_status,
                **({"errorCode": error_code} if error_code else {}),
            },
        )


def _view_content(tx: Tx, run_id: str | None, digests: list[bytes]) -> list[tuple[bytes, str, int]]:
    """The stored values a settlement's result names (a shell command's streams), to link to the
    effect's run: (digest, media type, byte length) of each."""
    if digests and run_id is None:
        raise CommandError("validationFailed", "only a run's effect links content to its run")
    links = []
    for digest in digests:
        row = tx.conn.execute("SELECT media_type, byte_length FROM blobs WHERE digest = ?", (digest,)).fetchone()
        if row is None:
            raise CommandError("blobNotFound", "a value the result names is not stored", digest=digest.hex())
        links.append((digest, row[0], row[1]))
    return links


class AbandonEffect(ResourceHandler[EffectAbandon]):
    """Its claimant died while applying: a new attempt later (idempotent) or an operator (manual)."""

    model = EffectAbandon
    actors = frozenset({"server", "channel"})
    claim_required = True

    def target(self, tx: Tx, cmd: EffectAbandon) -> Target:
        return effect_target(tx, cmd.effect_id, cmd.claim)

    def transition(self, tx: Tx, cmd: EffectAbandon, resource: records.Resource | None) -> Change:
        (status,) = tx.conn.execute(
            "SELECT effect_status FROM effects WHERE effect_id = ?", (cmd.effect_id,)
        ).fetchone()
        if status != "applying":
            raise CommandError("invalidTransition", f"a {status} effect has no attempt to abandon")
        new_status, error_code = records.uncertain_effect_status(tx.conn, cmd.effect_id, cancelled=False)

        def apply(stamp: Stamp) -> None:
            records.end_uncertain_attempt(tx.conn, cmd.effect_id, new_status, error_code, tx.now, cmd.retry_at)
            channel_effects.settled(tx.conn, cmd.effect_id, new_status, tx.actor, tx.now)

        return Change(
            event_type=f"effect.{new_status}",
            apply=apply,
            release_claim=True,
            receipt={"effectId": cmd.effect_id, "effectStatus": new_status},
        )


class RecoverEffects(Handler[EffectRecover]):
    """Pool effects left applying under a dead claim (their server epoch crashed, or the claim
    expired): each attempt ends uncertain, as if its worker's death had been seen."""

    model = EffectRecover
    actors = frozenset({"server"})

    def execute(self, tx: Tx, cmd: EffectRecover) -> Result:
        recovered = {}
        for effect_id in records.stale_pool_effects(tx.conn, tx.now):
            recovered[effect_id] = records.abandon_effect(tx.conn, effect_id, tx.actor, tx.now)
            channel_effects.settled(tx.conn, effect_id, recovered[effect_id], tx.actor, tx.now)
        return Result(receipt={"effects": recovered})


def _continue_parked_run(tx: Tx, effect_id: str) -> None:
    """After an effect left ``ambiguous`` (or never became it): its run, parked ``effectAmbiguous``
    with no other ambiguous effect, is queued again (a paused one stays parked, now for the pause).
    The run's revision and presentation advance with its event."""
    conn, now = tx.conn, tx.now
    row = conn.execute(
        "SELECT r.run_id, r.paused, res.revision FROM effects e JOIN runs r ON r.run_id = e.run_id "
        "JOIN run_queue q ON q.run_id = r.run_id JOIN resources res ON res.resource_id = r.run_id "
        "WHERE e.effect_id = ? AND r.status = 'running' AND q.queue_status = 'parked' "
        "AND r.park_reason = 'effectAmbiguous'",
        (effect_id,),
    ).fetchone()
    if row is None:
        return
    run_id, paused, revision = row
    if conn.execute("SELECT 1 FROM effects WHERE run_id = ? AND effect_status = 'ambiguous'", (run_id,)).fetchone():
        return
    if paused:
        conn.execute("UPDATE runs SET park_reason = 'paused', updated_at = ? WHERE run_id = ?", (now, run_id))
    else:
        conn.execute(
            "UPDATE runs SET status = 'queued', park_reason = NULL, updated_at = ? WHERE run_id = ?", (now, run_id)
        )
        conn.execute("UPDATE run_queue SET queue_status = 'queued', updated_at = ? WHERE run_id = ?", (now, run_id))
    new_revision = records.increment_revision(conn, run_id, revision, now)
    records.write_event(conn, run_id, new_revision, "run.effectReviewed", tx.actor, now)
    touched.touch(conn, run_id)


def _ambiguous(tx: Tx, effect_id: str) -> None:
    status, channel_id = tx.conn.execute(
        "SELECT effect_status, channel_id FROM effects WHERE effect_id = ?", (effect_id,)
    ).fetchone()
    if channel_id is not None:
        raise CommandError(
            "useChannelRecover",
            "a channel's message is recovered with channel.recover (pi-workflows channels recover)",
            effectId=effect_id,
        )
    if status != "ambiguous":
        code = "winnerDecided" if status in TERMINAL_EFFECT_STATUSES else "invalidTransition"
        raise CommandError(code, f"the effect is {status}, not ambiguous", effectId=effect_id, status=status)


def _run_unfinished(tx: Tx, effect_id: str) -> None:
    """A run-scoped effect acts for its run only: once the run ended, nothing attempts it again."""
    row = tx.conn.execute(
        "SELECT r.run_id, r.status FROM effects e JOIN runs r ON r.run_id = e.run_id "
        "WHERE e.effect_id = ? AND e.owner_scope = 'run'",
        (effect_id,),
    ).fetchone()
    if row is not None and row[1] in TERMINAL_RUN_STATUSES:
        run_id, status = row
        raise CommandError(
            "runFinished",
            f"run {run_id} already ended {status}: its effect is not attempted again",
            effectId=effect_id,
            runId=run_id,
            runStatus=status,
        )


class ConfirmEffect(ResourceHandler[EffectConfirm]):
    """An operator's evidence that the ambiguous attempt acted: ``applied``, with the note."""

    model = EffectConfirm
    actors = OPERATORS
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: EffectConfirm) -> Target:
        return effect_target(tx, cmd.effect_id)

    def transition(self, tx: Tx, cmd: EffectConfirm, resource: records.Resource | None) -> Change:
        _ambiguous(tx, cmd.effect_id)
        output = json.loads(cmd.output.data) if cmd.output is not None else None
        result = BlobValue.of_json(
            {"output": output, "nodeOutcome": "ok", "confirmedBy": tx.actor.actor_class, "note": cmd.note}
        )

        def apply(stamp: Stamp) -> None:
            tx.conn.execute(
                "UPDATE effects SET effect_status = 'applied', result_digest = ?, settled_at = ?, updated_at = ? "
                "WHERE effect_id = ?",
                (result.digest, tx.now, tx.now, cmd.effect_id),
            )
            _continue_parked_run(tx, cmd.effect_id)

        return Change(
            event_type="effect.confirmed",
            apply=apply,
            blobs=[result],
            event_payload=result.digest,
            receipt={"effectId": cmd.effect_id, "effectStatus": "applied"},
        )


class RetryEffect(ResourceHandler[EffectRetry]):
    """An operator asks for a new attempt: ``pending`` and due now; its claim records the attempt."""

    model = EffectRetry
    actors = OPERATORS
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: EffectRetry) -> Target:
        return effect_target(tx, cmd.effect_id)

    def transition(self, tx: Tx, cmd: EffectRetry, resource: records.Resource | None) -> Change:
        _ambiguous(tx, cmd.effect_id)
        _run_unfinished(tx, cmd.effect_id)

        def apply(stamp: Stamp) -> None:
            records.retry_effect(tx.conn, cmd.effect_id, tx.now)
            _continue_parked_run(tx, cmd.effect_id)

        return Change(
            event_type="effect.retried", apply=apply, receipt={"effectId": cmd.effect_id, "effectStatus": "pending"}
        )


class ListEffects(Handler[EffectList]):
    """What an operator reviews: no payloads, results, error texts or secrets."""

    model = EffectList
    actors = frozenset({"server", "client", "operator"})
    read_only = True

    def execute(self, tx: Tx, cmd: EffectList) -> Result:
        where, params = [f"effect_status IN ({', '.join('?' for _ in cmd.statuses)})"], list(cmd.statuses)
        for column, value in (("effect_id", cmd.effect_id), ("run_id", cmd.run_id)):
            if value is not None:  # only the filters given, so SQLite can use their indexes
                where.append(f"{column} = ?")
                params.append(value)
        rows = tx.conn.execute(
            "SELECT effect_id, effect_type, effect_status, recovery_policy, performer, run_id, idempotency_key, "
            "owner_scope, attempt_count, max_attempts, available_at, error_code, created_at, updated_at, settled_at, "
            "(SELECT status FROM runs WHERE runs.run_id = effects.run_id) "
            f"FROM effects WHERE {' AND '.join(where)} ORDER BY created_at DESC, effect_id DESC LIMIT ?",
            (*params, cmd.limit),
        ).fetchall()
        items = []
        for (
            effect_id,
            effect_type,
            status,
            policy,
            performer,
            run_id,
            key,
            scope,
            attempts,
            max_attempts,
            available_at,
            error_code,
            created_at,
            updated_at,
            settled_at,
            run_status,
        ) in rows:
            node_path, visit = records.effect_node(scope, key)
            item: dict[str, Any] = {
                "effectId": effect_id,
                "effectType": effect_type,
                "status": status,
                "recoveryPolicy": policy,
                "performer": performer,
                "runId": run_id,
                "nodePath": node_path,
                "visit": visit,
                "attempts": attempts,
                "maxAttempts": max_attempts,
                "nextAttemptAt": available_at if status == "pending" else None,
                "errorCode": error_code,
                "createdAt": created_at,
                "updatedAt": updated_at,
                "settledAt": settled_at,
                "controls": records.review_controls(scope, run_status) if status == "ambiguous" else [],
            }
            items.append(item)
        return Result(receipt={"items": items, "now": tx.now})


HANDLERS = (
    ReserveEffects(),
    ClaimEffect(),
    SettleEffect(),
    AbandonEffect(),
    RecoverEffects(),
    ConfirmEffect(),
    RetryEffect(),
    ListEffects(),
    DueEffects(),
)

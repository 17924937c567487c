"""The transactional outbox: reserve, claim (numbered attempt), settle.

Statuses and allowed transitions are ``states.EFFECT_TRANSITIONS`` (the table
of WORKFLOWS.md, Effects). A claim records the next numbered attempt in the
same transaction, before the claimant acts; a settlement is fenced by that
claim's token, generation and expiry.
"""

from __future__ import annotations

from piworkflows.errors import CommandError
from piworkflows.protocol.internal import EffectAbandon, EffectClaim, EffectReserve, EffectSettle
from piworkflows.states import ATTEMPT_END_FOR_EFFECT_STATUS, EFFECT_TRANSITIONS, TERMINAL_EFFECT_STATUSES
from piworkflows.writer import records
from piworkflows.writer.contract import Change, NewClaim, ResourceHandler, Stamp, Target, Tx


class ReserveEffects(ResourceHandler[EffectReserve]):
    """A source resource records follow-up effects at its exact revision."""

    kind = EffectReserve.kind
    model = EffectReserve
    actors = frozenset({"server", "runner", "channel", "operator"})

    def target(self, tx: Tx, cmd: EffectReserve) -> Target:
        return Target(cmd.source_resource_id, cmd.expected_revision, claim=cmd.claim)

    def transition(self, tx: Tx, cmd: EffectReserve, resource: records.Resource | None) -> Change:
        return Change(event_type="effects.reserved", effects=list(cmd.effects))


class ClaimEffect(ResourceHandler[EffectClaim]):
    """Take a new claim generation on a due pending effect and record its attempt."""

    kind = EffectClaim.kind
    model = EffectClaim
    actors = frozenset({"server", "outbox"})

    def target(self, tx: Tx, cmd: EffectClaim) -> Target:
        if cmd.effect_id is not None:
            row = tx.conn.execute(
                "SELECT e.effect_id, r.revision FROM effects e JOIN resources r ON r.resource_id = e.effect_id "
                "WHERE e.effect_id = ?",
                (cmd.effect_id,),
            ).fetchone()
            if row is None:
                raise CommandError("effectNotFound", "no such effect", effectId=cmd.effect_id)
        else:
            row = tx.conn.execute(
                "SELECT e.effect_id, r.revision FROM effects e JOIN resources r ON r.resource_id = e.effect_id "
                "LEFT JOIN leases l ON l.resource_id = e.effect_id "
                "WHERE e.effect_class = ? AND e.effect_status = 'pending' AND e.available_at <= ? "
                "AND (l.owner_id IS NULL OR l.expires_at <= ?) ORDER BY e.available_at, e.effect_id LIMIT 1",
                (cmd.effect_class, tx.now, tx.now),
            ).fetchone()
            if row is None:
                raise CommandError("nothingDue", "no effect is due")
        return Target(row[0], row[1])

    def transition(self, tx: Tx, cmd: EffectClaim, resource: records.Resource | None) -> Change:
        assert resource is not None
        status, available_at, effect_type, key, payload_digest, policy = tx.conn.execute(
            "SELECT effect_status, available_at, effect_type, idempotency_key, payload_digest, recovery_policy "
            "FROM effects WHERE effect_id = ?",
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
            },
        )

        def apply(stamp: Stamp) -> None:
            assert stamp.lease_generation is not None
            number = records.begin_effect_attempt(
                tx.conn, resource.resource_id, stamp.lease_generation, cmd.owner_id, tx.now
            )
            change.receipt.update(attemptNumber=number, leaseGeneration=stamp.lease_generation)

        change.apply = apply
        return change


class SettleEffect(ResourceHandler[EffectSettle]):
    """End the applying attempt: applied, rejected, retry later, or ambiguous."""

    kind = EffectSettle.kind
    model = EffectSettle
    actors = frozenset({"server", "outbox"})
    claim_required = True

    def target(self, tx: Tx, cmd: EffectSettle) -> Target:
        return Target(cmd.effect_id, cmd.expected_revision, claim=cmd.claim)

    def transition(self, tx: Tx, cmd: EffectSettle, resource: records.Resource | None) -> Change:
        effect_id = cmd.effect_id
        status, policy, attempts, max_attempts = tx.conn.execute(
            "SELECT effect_status, recovery_policy, attempt_count, max_attempts FROM effects WHERE effect_id = ?",
            (effect_id,),
        ).fetchone()
        error_code = cmd.error_code
        if cmd.settlement == "retry":
            if policy == "manual":
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

        def apply(stamp: Stamp) -> None:
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
                "UPDATE effect_attempts SET attempt_status = ?, result_digest = ?, error_digest = ?, external_ref = ?, "
                "ended_at = ? WHERE effect_id = ? AND attempt_status = 'applying' AND lease_generation = ?",
                (
                    ATTEMPT_END_FOR_EFFECT_STATUS[new_status],
                    result_digest,
                    error_digest,
                    cmd.external_ref,
                    tx.now,
                    effect_id,
                    stamp.lease_generation,
                ),
            )

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


class AbandonEffect(ResourceHandler[EffectAbandon]):
    """Its claimant died while applying: a new attempt later (idempotent) or an operator (manual)."""

    kind = EffectAbandon.kind
    model = EffectAbandon
    actors = frozenset({"server"})
    claim_required = True

    def target(self, tx: Tx, cmd: EffectAbandon) -> Target:
        resource = records.get_resource(tx.conn, cmd.effect_id)
        if resource is None or resource.resource_kind != "effect":
            raise CommandError("effectNotFound", "no such effect", effectId=cmd.effect_id)
        return Target(cmd.effect_id, resource.revision, claim=cmd.claim)

    def transition(self, tx: Tx, cmd: EffectAbandon, resource: records.Resource | None) -> Change:
        (status,) = tx.conn.execute(
            "SELECT effect_status FROM effects WHERE effect_id = ?", (cmd.effect_id,)
        ).fetchone()
        if status != "applying":
            raise CommandError("invalidTransition", f"a {status} effect has no attempt to abandon")
        new_status, error_code = records.uncertain_effect_status(tx.conn, cmd.effect_id, cancelled=False)

        def apply(stamp: Stamp) -> None:
            records.end_uncertain_attempt(tx.conn, cmd.effect_id, new_status, error_code, tx.now)

        return Change(event_type=f"effect.{new_status}", apply=apply, release_claim=True,
                      receipt={"effectId": cmd.effect_id, "effectStatus": new_status})  # fmt: skip


HANDLERS = (ReserveEffects(), ClaimEffect(), SettleEffect(), AbandonEffect())

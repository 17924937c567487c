"""Effects: reserve, claim, settle, abandon, recover; an operator's confirm and retry (writer/commands/effects.py)."""

from __future__ import annotations

import hashlib
from typing import ClassVar

from pydantic import Field, model_validator

from piworkflows import canonical
from piworkflows.protocol.internal.base import BlobValue, Claim, Command, Digest, Frame, Id, Model, ReadCommand
from piworkflows.protocol.internal.values import (
    EffectClass,
    EffectOwnerScope,
    EffectStatus,
    Performer,
    PoolPerformer,
    RecoveryPolicy,
    Settlement,
)
from piworkflows.states import CHANNEL_PERFORMER, MEDIA_JSON, MEDIA_TEXT, POOL_PERFORMERS, UNSETTLED_EFFECT_STATUSES


class EffectRequest(Model):
    """One deterministic effect a transaction records before it commits."""

    effect_type: str = Field(min_length=1, max_length=128)
    idempotency_key: str = Field(min_length=1, max_length=1024)
    payload: BlobValue
    effect_class: EffectClass
    performer: Performer
    recovery_policy: RecoveryPolicy
    owner_scope: EffectOwnerScope
    run_id: Id | None = None
    channel_id: Id | None = None  # the channel whose adapter performs it (scope channel, only)
    max_attempts: int = Field(default=5, ge=1, le=1000)

    @model_validator(mode="after")
    def _json_payload(self) -> EffectRequest:
        if self.payload.media_type != MEDIA_JSON:
            raise ValueError("an effect payload is canonical JSON")
        if (self.effect_class == "local") != (self.performer == "writer"):
            raise ValueError("the writer performs exactly the local effects")
        if (self.owner_scope == "channel") != (self.channel_id is not None):
            raise ValueError("a channel effect names its channel, and only it")
        if (self.performer == CHANNEL_PERFORMER) != (self.owner_scope == "channel"):
            raise ValueError("a channel's adapter performs exactly the channel effects")
        return self

    def effect_id(self, source_resource_id: str) -> str:
        """Deterministic: derived from source resource, effect type and key."""
        ident = canonical.dumps_bytes([source_resource_id, self.effect_type, self.idempotency_key])
        return "effect-" + hashlib.sha256(ident).hexdigest()[:32]

    def fingerprint(self, source_resource_id: str) -> bytes:
        """What makes a repeated request 'the same' (the source revision is not part of it)."""
        fields = self.model_dump(exclude={"payload"})
        fields["payload"] = self.payload.digest.hex()
        fields["source"] = source_resource_id
        return hashlib.sha256(canonical.dumps_bytes(fields)).digest()


class EffectReserve(Command):
    """Record effects for a source resource at its exact expected revision."""

    kind: ClassVar[str] = "effect.reserve"
    source_resource_id: Id
    expected_revision: int = Field(ge=1)
    claim: Claim | None = None
    effects: list[EffectRequest] = Field(min_length=1, max_length=64)


class EffectClaim(Command):
    """Claim one due pending effect: a named one, or the next due one of these performers."""

    kind: ClassVar[str] = "effect.claim"
    effect_id: Id | None = None
    performers: list[PoolPerformer] = Field(default_factory=lambda: sorted(POOL_PERFORMERS), min_length=1)
    channel_id: Id | None = None  # the next due effect of this channel instead (its manager claims)
    owner_id: Id
    claim_token_hash: Digest
    ttl_ms: int = Field(ge=1)


class EffectDue(ReadCommand):
    """Whether an effect of these performers is due now, and when the next pending one is: what
    the outbox pool asks before it starts a worker to claim one."""

    kind: ClassVar[str] = "effect.due"
    performers: list[PoolPerformer] = Field(default_factory=lambda: sorted(POOL_PERFORMERS), min_length=1)


class EffectSettleFrame(Frame):
    """How an applying attempt ended, as its performer reports it: a runner (an action body) or
    an outbox worker. The supervisor adds the effect's claim, its expected revision and, for a
    retry, when the next attempt is due (``EffectSettle``)."""

    kind: ClassVar[str] = "effect.settle"
    effect_id: Id
    settlement: Settlement
    result: BlobValue | None = None
    error: BlobValue | None = None
    error_code: str | None = Field(default=None, max_length=64)
    external_ref: str | None = Field(default=None, max_length=1024)
    # Stored values the result names (a shell command's streams): linked to the effect's run
    # (run_view_content) in the same transaction, so they live as long as the run.
    view_content: list[Digest] = Field(default_factory=list, max_length=16)
    # The request surely never reached its receiver (a channel's 429, a connection never opened):
    # a manual effect may then be retried (settlement retry) without an operator.
    not_acted: bool = False

    @model_validator(mode="after")
    def _report_shape(self) -> EffectSettleFrame:
        if self.settlement == "applied" and self.error is not None:
            raise ValueError("an applied settlement carries no error")
        if self.error is not None and self.error.media_type != MEDIA_TEXT:
            raise ValueError("an effect error is text")
        return self

    def fingerprint(self) -> bytes:
        """What makes a repeated report the same (worker_messages): its fields, values by digest."""
        fields = self.model_dump(exclude={"result", "error", "view_content"})
        fields["result"] = self.result.digest.hex() if self.result is not None else None
        fields["error"] = self.error.digest.hex() if self.error is not None else None
        fields["view_content"] = [digest.hex() for digest in self.view_content]
        return hashlib.sha256(canonical.dumps_bytes(fields)).digest()


class EffectSettle(Command, EffectSettleFrame):
    """effect.settle as the writer gets it: the performer's report, fenced by the effect's claim."""

    expected_revision: int = Field(ge=1)
    claim: Claim
    retry_at: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _retry_at_given(self) -> EffectSettle:
        if (self.settlement == "retry") != (self.retry_at is not None):
            raise ValueError("retry_at is given exactly when the settlement is retry")
        return self


class EffectAbandon(Command):
    """The claimant of an applying effect is gone (its runner or worker died): the attempt is
    uncertain. An idempotent effect's next attempt is due at ``retry_at`` (default: now)."""

    kind: ClassVar[str] = "effect.abandon"
    effect_id: Id
    claim: Claim
    retry_at: int | None = Field(default=None, ge=0)


class EffectRecover(Command):
    """At pool start: end the applying attempts of pool effects whose claims are dead (an
    older server epoch, or expired), as an abandon would."""

    kind: ClassVar[str] = "effect.recover"


class EffectConfirm(Command):
    """An operator confirms an ambiguous effect acted: it becomes ``applied`` with the note
    (and the node output, if given); the run parked for it continues."""

    kind: ClassVar[str] = "effect.confirm"
    effect_id: Id
    note: str = Field(default="", max_length=2000)
    output: BlobValue | None = None


class EffectRetry(Command):
    """An operator asks for a new numbered attempt of an ambiguous effect (it becomes
    ``pending``; the claim records the attempt); the run parked for it continues."""

    kind: ClassVar[str] = "effect.retry"
    effect_id: Id


class EffectList(ReadCommand):
    """Effects for operators, newest first: unsettled and ambiguous by default. No payloads."""

    kind: ClassVar[str] = "effect.list"
    effect_id: Id | None = None
    run_id: Id | None = None
    statuses: list[EffectStatus] = Field(default_factory=lambda: sorted(UNSETTLED_EFFECT_STATUSES), min_length=1)
    limit: int = Field(default=256, ge=1, le=256)

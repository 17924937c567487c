"""The write contract: the one helper every resource command runs through.

The spec's order, which no handler can change or skip::

    BEGIN IMMEDIATE                      (the group, writer/db.py)
    verify the exact schema              (per group, writer/db.py)
    verify the actor and operation       -> Handler.actors
    verify the expected resource revision-> Handler.target()
    verify claim token/generation/expiry -> records.verify_and_renew_claim
    renew that exact still-live claim
    verify the domain transition         -> Handler.transition() returns a Change
                                            (or an adoption: a matching repeat, nothing written)
    write content-addressed values       -> Change.blobs
    increment the resource revision      (exactly once)
    write the immutable event            -> Change.event_type
    update the domain row                -> Change.apply(revision)
    insert deterministic follow-up effects -> Change.effects
    COMMIT                               (the group, writer/db.py)

A handler only reads in ``target``/``transition`` and only writes domain rows
in ``Change.apply``; everything shared is written here. A failed check raises
``CommandError`` and the savepoint around the command rolls all of it back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import Actor, BlobValue, Claim, Command, ReadCommand
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.writer import records

C = TypeVar("C", bound="Command | ReadCommand")


@dataclass
class Tx:
    """What a command sees: the connection inside its savepoint, the time, the actor."""

    conn: sqlite3.Connection
    now: int
    actor: Actor


@dataclass
class Result:
    revision: int | None = None
    receipt: dict[str, Any] | None = None
    damage: str | None = None  # a read found the file damaged: the writer refuses every write from now on


class Handler(Generic[C]):
    """One command kind. Subclasses set ``model`` and ``actors``; ``kind`` is the model's.

    ``stores_refusals``: a refusal is stored under the command's key like an
    acceptance, so a repeat answers it again. A handler whose refusals depend on
    something outside the database (the filesystem at that moment) sets it
    False: its refusal is answered but not stored, and a repeat is checked again.
    """

    kind: ClassVar[str]  # the model's kind (set when a subclass names its model)
    model: ClassVar[type[Command] | type[ReadCommand]]
    actors: ClassVar[frozenset[str]]
    read_only: ClassVar[bool] = False
    stores_refusals: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "model" in vars(cls):
            cls.kind = cls.model.kind

    def run(self, tx: Tx, cmd: C) -> Result:
        if tx.actor.actor_class not in self.actors:
            raise CommandError("actorNotAllowed", f"{tx.actor.actor_class} may not send {self.kind}")
        return self.execute(tx, cmd)

    def execute(self, tx: Tx, cmd: C) -> Result:
        raise NotImplementedError


@dataclass
class Target:
    resource_id: str
    expected_revision: int | None  # None: the command creates the resource
    claim: Claim | None = None
    create_kind: str | None = None
    project_path: str | None = None  # a created resource's project (ensured with it)


@dataclass(frozen=True)
class Stamp:
    """What the contract wrote for this command: the new revision, the claim's
    generation, and a created resource's project."""

    revision: int
    lease_generation: int | None
    project_id: str | None = None


@dataclass(frozen=True)
class NewClaim:
    """A claim the command takes: a new owner always gets a new generation."""

    owner_id: str
    claim_token_hash: bytes
    ttl_ms: int


@dataclass
class Change:
    """What a verified transition writes. ``apply`` updates domain rows only and
    may add to ``receipt``."""

    event_type: str
    apply: Callable[[Stamp], None] = lambda stamp: None
    blobs: list[BlobValue] = field(default_factory=list)
    event_payload: bytes | None = None
    attempt_id: str | None = None  # the node attempt the event is about (a run's events)
    effects: list[EffectRequest] = field(default_factory=list)
    acquire_claim: NewClaim | None = None
    release_claim: bool = False
    release_generation: int | None = None  # release the lease if it is still at this generation
    receipt: dict[str, Any] = field(default_factory=dict)
    adopted: bool = False  # see adoption()


def adoption(receipt: dict[str, Any]) -> Change:
    """A repeat that matches the saved result (the same segment opened, the same turn reported):
    it is answered with ``receipt`` and writes nothing (no revision, no event); its claim was
    still verified and renewed."""
    return Change(event_type="adopted", adopted=True, receipt=receipt)


class ResourceHandler(Handler[C]):
    """A command on one resource; ``execute`` is the contract and is final.

    ``claim_required``: the command must carry the live claim. Otherwise a
    resource with a live claim still only accepts that claim's owner, unless
    ``fenced_by_transition``: a control command (a runner's exit record,
    later pause and cancel) that fences itself in ``transition`` by an exact
    record (runner epoch, generation) instead of the claim token.
    """

    claim_required: ClassVar[bool] = False
    fenced_by_transition: ClassVar[bool] = False

    def target(self, tx: Tx, cmd: C) -> Target:
        raise NotImplementedError

    def transition(self, tx: Tx, cmd: C, resource: records.Resource | None) -> Change:
        raise NotImplementedError

    def execute(self, tx: Tx, cmd: C) -> Result:
        conn, now = tx.conn, tx.now
        target = self.target(tx, cmd)
        resource = records.get_resource(conn, target.resource_id)
        if target.create_kind is not None:
            if resource is not None:
                raise CommandError("resourceExists", "the resource already exists", resourceId=target.resource_id)
        elif resource is None:
            raise CommandError("resourceNotFound", "no such resource", resourceId=target.resource_id)
        elif target.expected_revision != resource.revision:
            raise CommandError(
                "staleRevision",
                "the resource changed since the expected revision",
                resourceId=target.resource_id,
                revision=resource.revision,
            )
        generation = project_id = None
        if target.claim is not None:
            generation = records.verify_and_renew_claim(conn, target.resource_id, target.claim, now).lease_generation
        elif self.claim_required:
            raise CommandError("validationFailed", f"{self.kind} requires a claim")
        elif not self.fenced_by_transition and target.create_kind is None:  # a new resource has no lease
            lease = records.get_lease(conn, target.resource_id)
            if lease is not None and lease.live(now):
                raise CommandError(
                    "leaseHeld", "another owner holds a live claim on the resource", resourceId=target.resource_id
                )

        change = self.transition(tx, cmd, resource)
        if change.adopted:
            assert resource is not None  # a created resource has nothing to adopt
            return Result(revision=resource.revision, receipt=dict(change.receipt))

        for blob in change.blobs:
            records.put_blob(conn, blob, now)
        if target.create_kind is not None:
            project_id = records.ensure_project(conn, target.project_path, now)[0] if target.project_path else None
            revision = records.create_resource(conn, target.resource_id, target.create_kind, now, project_id)
        else:
            assert resource is not None
            revision = records.increment_revision(conn, target.resource_id, resource.revision, now)
        if change.acquire_claim is not None:
            new = change.acquire_claim
            generation = records.acquire_lease(
                conn, target.resource_id, new.owner_id, new.claim_token_hash, new.ttl_ms, now
            )
        records.write_event(
            conn,
            target.resource_id,
            revision,
            change.event_type,
            tx.actor,
            now,
            generation,
            change.event_payload,
            change.attempt_id,
        )
        change.apply(Stamp(revision, generation, project_id))
        effect_ids = []  # reported: external effects (local ones are the writer's own follow-up)
        for request in change.effects:
            effect_id = records.insert_effect(conn, request, target.resource_id, revision, tx.actor, now)[0]
            if request.effect_class == "external":
                effect_ids.append(effect_id)
        if change.release_claim and generation is not None:
            records.release_lease(conn, target.resource_id, generation)
        if change.release_generation is not None:
            records.release_lease(conn, target.resource_id, change.release_generation)
        receipt = dict(change.receipt)
        if effect_ids:
            receipt["effectIds"] = effect_ids
        return Result(revision=revision, receipt=receipt)

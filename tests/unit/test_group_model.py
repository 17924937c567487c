"""Random groups of writer commands against a simple in-memory model.

Every example builds a fresh state database, takes the server epoch, then runs
random groups of ``effect.reserve`` / ``effect.claim`` / ``effect.settle`` /
``blob.put`` commands (valid and invalid mixed, some carrying client receipts)
through a real ``GroupExecutor``, with clock advances between groups so leases
expire. The model predicts every reply; after every group the database must
equal the model exactly and the shared-record invariants must hold.

The model is the oracle: each operation first checks everything (raising
``Refused``) and only then mutates, so a refused command leaves it untouched,
which is exactly what a rolled-back savepoint must do.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piworkflows import canonical
from piworkflows.clock import FakeClock
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.writer.db import GroupExecutor, Submitted, open_database
from tests.support import (
    SERVER,
    claim_effect,
    client_receipt,
    effect_request,
    reserve,
    run_group,
    settle,
    take_epoch,
    token_hash,
)

pytestmark = pytest.mark.timeout(120)

# --- the oracle's own tables (from WORKFLOWS.md, Effects; not imported from the code) ---

NEXT_STATUS = {
    "pending": {"applying", "cancelled"},
    "applying": {"applied", "rejected", "pending", "ambiguous"},
    "ambiguous": {"applied", "applying"},
    "applied": set(),
    "rejected": set(),
    "cancelled": set(),
}
ATTEMPT_END = {"applied": "applied", "rejected": "rejected", "pending": "failed", "ambiguous": "ambiguous"}
OUTCOME_OF = {
    "staleRevision": "conflict",
    "idempotencyKeyReused": "conflict",
    "leaseHeld": "conflict",
    "effectKeyConflict": "conflict",
    "resourceNotFound": "notFound",
    "effectNotFound": "notFound",
    "nothingDue": "notFound",
    "claimExpired": "claimLost",
    "claimTokenMismatch": "claimLost",
    "staleGeneration": "claimLost",
    "notClaimed": "claimLost",
    "invalidTransition": "rejected",
    "blobMismatch": "rejected",
}

EFFECT_TYPE = "test.effect"
# key -> (recovery policy, max attempts): manual, exhausted-after-one, and room to retry.
EFFECT_KEYS = {"k0": ("manual", 2), "k1": ("idempotent", 1), "k2": ("idempotent", 2), "k3": ("idempotent", 5)}
RECEIPT_KEYS = ("r0", "r1", "r2", "r3", "r4", "r5")
OWNERS = ("worker-1", "worker-2")
# JSON values and texts; the text '{"ok":true}' has the same bytes (so digest) as the
# JSON {"ok": true} that an applied settlement stores: whichever comes second is blobMismatch.
BLOB_POOL = (
    BlobValue.of_json({"key": "k0", "v": 0}),
    BlobValue.of_json({"ok": True}),
    BlobValue.of_json({"n": 1}),
    BlobValue.of_text("boom"),
    BlobValue.of_text('{"ok":true}'),
)
ERROR_TEXTS = (None, BlobValue.of_text("boom"), BlobValue.of_text('{"ok":true}'), BlobValue.of_text("timeout"))
APPLIED_RESULT = BlobValue.of_json({"ok": True})  # what tests.support.settle attaches to "applied"
SERVER_ID = "server"


def request_of(key: str, variant: int) -> dict[str, Any]:
    policy, max_attempts = EFFECT_KEYS[key]
    return effect_request(key, payload={"key": key, "v": variant}, policy=policy, max_attempts=max_attempts)


def effect_id_of(key: str) -> str:
    return EffectRequest.model_validate(request_of(key, 0)).effect_id(SERVER_ID)


# --- the model -------------------------------------------------------------------


class Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class Expect:
    outcome: str
    revision: int | None
    receipt: dict[str, Any]  # accepted: a subset of the receipt; refused: {"code": ...}

    @property
    def code(self) -> str | None:
        return self.receipt.get("code")


@dataclass
class EffectModel:
    key: str
    variant: int
    effect_id: str
    policy: str
    max_attempts: int
    payload_digest: bytes
    source_revision: int
    available_at: int
    revision: int = 1
    status: str = "pending"
    attempt_count: int = 0
    error_code: str | None = None
    generation: int = 0  # 0: no lease row yet
    owner: str | None = None
    token: str | None = None
    expires_at: int | None = None
    last_claim: tuple[str, str, int] | None = None  # (owner, token, generation), kept after release
    attempts: list[list[Any]] = field(default_factory=list)  # [number, generation, owner, status]
    events: list[tuple[int, str, int | None, bytes | None]] = field(default_factory=list)

    def live(self, now: int) -> bool:
        return self.owner is not None and self.expires_at is not None and self.expires_at > now


@dataclass
class StoredModel:
    fingerprint: bytes
    operation: str
    expect: Expect


@dataclass
class Model:
    now: int = 0
    server_revision: int = 0
    server_events: list[tuple[int, str, int | None, bytes | None]] = field(default_factory=list)
    effects: dict[str, EffectModel] = field(default_factory=dict)  # by idempotency key
    blobs: dict[bytes, str] = field(default_factory=dict)  # digest -> media type
    answers: dict[str, StoredModel] = field(default_factory=dict)  # receipt key -> stored answer

    def _check_blobs(self, blobs: list[BlobValue]) -> None:
        for blob in blobs:
            if self.blobs.get(blob.digest, blob.media_type) != blob.media_type:
                raise Refused("blobMismatch")

    def take_epoch(self) -> Expect:
        assert self.server_revision == 0
        self.server_revision = 1
        self.server_events.append((1, "server.epoch_taken", None, None))
        return Expect("accepted", 1, {"serverEpoch": 1})

    def blob_put(self, blob: BlobValue) -> Expect:
        self._check_blobs([blob])
        created = blob.digest not in self.blobs
        self.blobs[blob.digest] = blob.media_type
        return Expect("accepted", None, {"digest": blob.digest.hex(), "byteLength": len(blob.data), "created": created})

    def reserve(self, expected: int, wanted: list[tuple[str, int]]) -> Expect:
        if expected != self.server_revision:
            raise Refused("staleRevision")
        new: dict[str, int] = {}  # effects this command inserts, in order
        for key, variant in wanted:
            existing = self.effects[key].variant if key in self.effects else new.get(key)
            if existing is None:
                payload = BlobValue.of_json({"key": key, "v": variant})
                self._check_blobs([payload])
                new[key] = variant
            elif existing != variant:
                raise Refused("effectKeyConflict")
        self.server_revision += 1
        self.server_events.append((self.server_revision, "effects.reserved", None, None))
        for key, variant in new.items():
            payload = BlobValue.of_json({"key": key, "v": variant})
            self.blobs[payload.digest] = payload.media_type
            policy, max_attempts = EFFECT_KEYS[key]
            effect = EffectModel(
                key, variant, effect_id_of(key), policy, max_attempts, payload.digest, self.server_revision, self.now
            )
            effect.events.append((1, "effect.reserved", None, payload.digest))
            self.effects[key] = effect
        return Expect("accepted", self.server_revision, {"effectIds": [effect_id_of(k) for k, _ in wanted]})

    def claim(self, key: str | None, owner: str, token: str, ttl: int) -> Expect:
        now = self.now
        if key is not None:
            if key not in self.effects:
                raise Refused("effectNotFound")
            effect = self.effects[key]
        else:
            due = [
                e for e in self.effects.values() if e.status == "pending" and e.available_at <= now and not e.live(now)
            ]
            if not due:
                raise Refused("nothingDue")
            effect = min(due, key=lambda e: (e.available_at, e.effect_id))
        if effect.live(now):
            raise Refused("leaseHeld")
        if effect.status != "pending" or effect.available_at > now:
            raise Refused("invalidTransition")
        effect.revision += 1
        effect.generation += 1
        effect.owner, effect.token, effect.expires_at = owner, token, now + ttl
        effect.last_claim = (owner, token, effect.generation)
        effect.attempt_count += 1
        effect.attempts.append([len(effect.attempts) + 1, effect.generation, owner, "applying"])
        effect.status = "applying"
        effect.events.append((effect.revision, "effect.applying", effect.generation, None))
        return Expect(
            "accepted",
            effect.revision,
            {
                "effectId": effect.effect_id,
                "effectType": EFFECT_TYPE,
                "idempotencyKey": effect.key,
                "recoveryPolicy": effect.policy,
                "attemptNumber": len(effect.attempts),
                "leaseGeneration": effect.generation,
            },
        )

    def settle(
        self,
        key: str,
        expected: int,
        owner: str,
        token: str,
        generation: int,
        settlement: str,
        result: BlobValue | None,
        error: BlobValue | None,
        error_code: str | None,
        retry_at: int | None,
    ) -> Expect:
        if key not in self.effects:
            raise Refused("resourceNotFound")
        effect = self.effects[key]
        if expected != effect.revision:
            raise Refused("staleRevision")
        if effect.owner is None:
            raise Refused("notClaimed")
        if generation != effect.generation:
            raise Refused("staleGeneration")
        if (owner, token) != (effect.owner, effect.token):
            raise Refused("claimTokenMismatch")
        if not effect.live(self.now):
            raise Refused("claimExpired")
        if settlement == "retry":
            if effect.policy == "manual":
                raise Refused("invalidTransition")
            new_status = "pending" if effect.attempt_count < effect.max_attempts else "rejected"
            if new_status == "rejected":
                error_code = "retriesExhausted"
        else:
            new_status = settlement
        if new_status not in NEXT_STATUS[effect.status]:
            raise Refused("invalidTransition")
        blobs = [b for b in (result, error) if b is not None]
        self._check_blobs(blobs)
        for blob in blobs:
            self.blobs[blob.digest] = blob.media_type
        effect.revision += 1
        effect.events.append((effect.revision, f"effect.{new_status}", generation, blobs[0].digest if blobs else None))
        effect.status = new_status
        if new_status == "pending":
            assert retry_at is not None
            effect.available_at = retry_at
        effect.error_code = error_code
        applying = [a for a in effect.attempts if a[3] == "applying" and a[1] == generation]
        assert len(applying) == 1
        applying[0][3] = ATTEMPT_END[new_status]
        effect.owner = effect.token = effect.expires_at = None  # released; the generation stays
        receipt: dict[str, Any] = {"effectId": effect.effect_id, "effectStatus": new_status}
        if error_code:
            receipt["errorCode"] = error_code
        return Expect("accepted", effect.revision, receipt)

    # -- one command, with or without a client receipt --

    def run(
        self, op: Callable[[Model], Expect] | None, receipt_key: str | None, fingerprint: bytes | None, operation: str
    ) -> tuple[Expect, bool]:
        """Predict one command; returns (expectation, whether it replays a stored answer)."""
        if receipt_key is not None:
            stored = self.answers.get(receipt_key)
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    return Expect("conflict", None, {"code": "idempotencyKeyReused"}), False
                first = stored.expect
                outcome = "adopted" if first.outcome == "accepted" else first.outcome
                return Expect(outcome, first.revision, first.receipt), True
        assert op is not None, "a replayed request always finds its stored answer"
        try:
            expect = op(self)
        except Refused as refusal:
            expect = Expect(OUTCOME_OF[refusal.code], None, {"code": refusal.code})
        if receipt_key is not None:
            assert fingerprint is not None
            self.answers[receipt_key] = StoredModel(fingerprint, operation, expect)
        return expect, False

    # -- what the database must hold --

    def snapshot(self) -> dict[str, Any]:
        effects = list(self.effects.values())
        return {
            "resources": {
                SERVER_ID: ("server", self.server_revision),
                **{e.effect_id: ("effect", e.revision) for e in effects},
            },
            "events": {SERVER_ID: self.server_events, **{e.effect_id: e.events for e in effects}},
            "leases": {
                e.effect_id: (e.generation, e.owner, token_hash(e.token) if e.token else None, e.expires_at)
                for e in effects
                if e.generation
            },
            "effects": {
                e.effect_id: (
                    e.key,
                    e.status,
                    e.attempt_count,
                    e.max_attempts,
                    e.available_at,
                    e.error_code,
                    e.source_revision,
                    e.payload_digest,
                    e.policy,
                    e.status in ("applied", "rejected", "cancelled"),
                )
                for e in effects
            },
            "attempts": {e.effect_id: [tuple(a) for a in e.attempts] for e in effects},
            "blobs": dict(self.blobs),
            "host_commands": {
                k: (s.fingerprint, s.operation, s.expect.outcome, s.expect.revision, s.expect.code)
                for k, s in self.answers.items()
            },
        }


def db_snapshot(conn) -> dict[str, Any]:
    q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
    events: dict[str, list] = {}
    for rid, rev, etype, gen, digest in q(
        "SELECT resource_id, resource_revision, event_type, lease_generation, "
        "payload_digest FROM events ORDER BY resource_id, resource_revision"
    ):
        events.setdefault(rid, []).append((rev, etype, gen, digest))
    attempts: dict[str, list] = {eid: [] for (eid,) in q("SELECT effect_id FROM effects")}
    for eid, number, gen, owner, status in q(
        "SELECT effect_id, attempt_number, lease_generation, owner_id, "
        "attempt_status FROM effect_attempts ORDER BY effect_id, attempt_number"
    ):
        attempts[eid].append((number, gen, owner, status))
    host_commands = {}
    for key, fp, op, outcome, rev, receipt in q(
        "SELECT idempotency_key, fingerprint, operation, outcome, revision, receipt FROM host_commands"
    ):
        code = None if receipt is None else canonical.loads(receipt).get("code")
        host_commands[key] = (fp, op, outcome, rev, code)
    return {
        "resources": {
            rid: (kind, rev) for rid, kind, rev in q("SELECT resource_id, resource_kind, revision FROM resources")
        },
        "events": events,
        "leases": {
            rid: (gen, owner, token, expires)
            for rid, gen, owner, token, expires in q(
                "SELECT resource_id, lease_generation, owner_id, claim_token_hash, expires_at FROM leases"
            )
        },
        "effects": {
            row[0]: (*row[1:10], row[10] is not None)
            for row in q(
                "SELECT effect_id, idempotency_key, effect_status, attempt_count, max_attempts, available_at, "
                "error_code, source_revision, payload_digest, recovery_policy, settled_at FROM effects"
            )
        },
        "attempts": attempts,
        "blobs": {digest: media for digest, media in q("SELECT digest, media_type FROM blobs")},
        "host_commands": host_commands,
    }


def check_invariants(conn) -> None:
    q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
    assert q("PRAGMA foreign_key_check") == []
    # at most one applying attempt per effect
    assert (
        q(
            "SELECT effect_id FROM effect_attempts WHERE attempt_status = 'applying' "
            "GROUP BY effect_id HAVING count(*) > 1"
        )
        == []
    )
    # an applying effect has a lease with an owner (live or expired) ...
    assert (
        q(
            "SELECT e.effect_id FROM effects e LEFT JOIN leases l ON l.resource_id = e.effect_id "
            "WHERE e.effect_status = 'applying' AND (l.owner_id IS NULL OR l.expires_at IS NULL)"
        )
        == []
    )
    # ... and an applying attempt of that lease's generation; no other effect has one
    assert (
        q(
            "SELECT e.effect_id FROM effects e LEFT JOIN leases l ON l.resource_id = e.effect_id "
            "WHERE e.effect_status = 'applying' AND NOT EXISTS (SELECT 1 FROM effect_attempts a "
            "WHERE a.effect_id = e.effect_id AND a.attempt_status = 'applying' "
            "AND a.lease_generation = l.lease_generation)"
        )
        == []
    )
    assert (
        q(
            "SELECT a.effect_id FROM effect_attempts a JOIN effects e USING (effect_id) "
            "WHERE a.attempt_status = 'applying' AND e.effect_status != 'applying'"
        )
        == []
    )
    # events of each resource are exactly revisions 1..revision
    for rid, revision in q("SELECT resource_id, revision FROM resources"):
        revs = [
            r
            for (r,) in conn.execute(
                "SELECT resource_revision FROM events WHERE resource_id = ? ORDER BY resource_revision", (rid,)
            )
        ]
        assert revs == list(range(1, revision + 1)), rid


# --- generating commands -----------------------------------------------------------


@dataclass
class Sent:
    """A command that carried a client receipt, kept so it can be sent again verbatim."""

    kind: str
    body: dict[str, Any]
    receipt: dict[str, Any]


class Run:
    """One example: a fresh database, its executor, the model and the replies seen."""

    def __init__(self, state_dir: str) -> None:
        self.clock = FakeClock()
        self.settings = Settings()
        self.conn = open_database(StatePaths.resolve(state_dir), self.settings, self.clock)
        self.executor = GroupExecutor(self.conn, self.settings, self.clock)
        self.model = Model(now=self.clock.now_ms())
        self.sent: list[Sent] = []
        self.first_replies: dict[str, Reply] = {}
        self.tokens = itertools.count(1)
        self.ids = itertools.count(1)

    def close(self) -> None:
        self.conn.close()

    def submitted(self, kind: str, body: dict[str, Any]) -> Submitted:
        return Submitted(next(self.ids), kind, body)

    def pick_key(self, data: st.DataObject, preferred: list[str]) -> str:
        """Mostly one of ``preferred`` (when there is one), sometimes any key of the pool."""
        if preferred and data.draw(st.sampled_from([True, True, True, False])):
            return data.draw(st.sampled_from(sorted(preferred)))
        return data.draw(st.sampled_from(sorted(EFFECT_KEYS)))

    def plan(self, data: st.DataObject) -> tuple[str, dict[str, Any], Callable[[Model], Expect]]:
        """Draw one command against the model as it stands (earlier commands of the group included)."""
        m = self.model
        if not m.effects:
            kinds = ["reserve", "reserve", "reserve", "claim", "settle", "blob"]
        elif any(e.status == "applying" for e in m.effects.values()):
            kinds = ["settle", "settle", "claim", "reserve", "settle", "claim", "blob"]
        else:
            kinds = ["claim", "settle", "reserve", "claim", "blob"]
        kind = data.draw(st.sampled_from(kinds))
        if kind == "reserve":
            stale = data.draw(st.sampled_from([False, False, True]))
            expected = m.server_revision if not stale else (m.server_revision - 1 or m.server_revision + 1)
            wanted = data.draw(
                st.lists(st.tuples(st.sampled_from(sorted(EFFECT_KEYS)), st.integers(0, 1)), min_size=1, max_size=3)
            )
            body = reserve(expected, *(request_of(k, v) for k, v in wanted)).body
            return "effect.reserve", body, lambda model: model.reserve(expected, wanted)
        if kind == "claim":
            pending = [k for k, e in m.effects.items() if e.status == "pending"]
            key = None if data.draw(st.booleans()) else self.pick_key(data, pending or list(m.effects))
            owner = data.draw(st.sampled_from(OWNERS))
            ttl = data.draw(st.sampled_from([10_000, 1_000]))
            token = f"token-{next(self.tokens)}"
            body = claim_effect(token, None if key is None else effect_id_of(key), ttl_ms=ttl, owner=owner).body
            return "effect.claim", body, lambda model: model.claim(key, owner, token, ttl)
        if kind == "settle":
            key = self.pick_key(data, [k for k, e in m.effects.items() if e.status == "applying"] or list(m.effects))
            effect = m.effects.get(key)
            revision = effect.revision if effect else 1
            stale = data.draw(st.sampled_from([False, False, False, True]))
            expected = revision if not stale else (revision - 1 or revision + 1)
            owner, token, generation = (
                effect.last_claim if effect and effect.last_claim else ("worker-1", "never-claimed", 1)
            )
            how = data.draw(
                st.sampled_from(["right", "right", "right", "wrong_token", "wrong_owner", "other_generation"])
            )
            if how == "wrong_token":
                token = "wrong-token"
            elif how == "wrong_owner":
                owner = OWNERS[1] if owner == OWNERS[0] else OWNERS[0]
            elif how == "other_generation":
                generation = generation - 1 or generation + 1
            settlement = data.draw(st.sampled_from(["retry", "retry", "applied", "rejected", "ambiguous"]))
            extra: dict[str, Any] = {}
            result = error = None
            error_code = retry_at = None
            if settlement == "applied":
                result = APPLIED_RESULT
            else:
                error = data.draw(st.sampled_from(ERROR_TEXTS))
                if error is not None:
                    extra["error"] = error.model_dump()
            if settlement == "rejected" and data.draw(st.booleans()):
                error_code = extra["error_code"] = "http4xx"
            if settlement == "retry":
                retry_at = extra["retry_at"] = m.now + data.draw(st.sampled_from([0, 0, 1_000, 20_000]))
            body = settle(effect_id_of(key), expected, token, generation, settlement, owner=owner, **extra).body
            return (
                "effect.settle",
                body,
                lambda model: model.settle(
                    key, expected, owner, token, generation, settlement, result, error, error_code, retry_at
                ),
            )
        blob = data.draw(st.sampled_from(BLOB_POOL))
        body = {"actor": SERVER, "blob": blob.model_dump()}
        return "blob.put", body, lambda model: model.blob_put(blob)

    def group(self, data: st.DataObject) -> None:
        items: list[Submitted] = []
        expects: list[tuple[Expect, str | None, bool]] = []
        for _ in range(data.draw(st.integers(1, 5), label="group size")):
            how = data.draw(
                st.sampled_from(["plain", "plain", "plain", "receipt", "replay"])
                if self.sent
                else st.sampled_from(["plain", "plain", "plain", "receipt"])
            )
            if how == "replay":
                sent = data.draw(st.sampled_from(self.sent))
                kind, body, op, receipt = sent.kind, sent.body, None, sent.receipt
            else:
                kind, body, op = self.plan(data)
                receipt = None
                if how == "receipt":
                    key = data.draw(st.sampled_from(RECEIPT_KEYS))
                    receipt = client_receipt(key, (kind, body), operation=kind)
                    self.sent.append(Sent(kind, body, receipt))
            key = receipt["idempotency_key"] if receipt else None
            expect, replayed = self.model.run(op, key, receipt["fingerprint"] if receipt else None, kind)
            items.append(self.submitted(kind, body if receipt is None else {**body, "client_receipt": receipt}))
            expects.append((expect, key, replayed))
        replies = run_group(self.executor, *items)
        for item, reply, (expect, key, replayed) in zip(items, replies, expects, strict=True):
            context = f"{item.kind} {item.body} -> {reply}"
            assert reply.outcome == expect.outcome, context
            assert reply.revision == expect.revision, context
            receipt = reply.receipt or {}
            assert {k: receipt.get(k) for k in expect.receipt} == expect.receipt, context
            if expect.outcome != "accepted" and expect.outcome != "adopted":
                assert receipt.get("code") == expect.code and reply.error, context
            if key is not None and expect.code != "idempotencyKeyReused":
                if replayed:  # the stored answer again, word for word
                    first = self.first_replies[key]
                    assert (reply.revision, reply.receipt, reply.error) == (
                        first.revision,
                        first.receipt,
                        first.error,
                    ), context
                else:
                    self.first_replies[key] = reply
        self.check()

    def check(self) -> None:
        assert db_snapshot(self.conn) == self.model.snapshot()
        check_invariants(self.conn)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_groups_match_the_model(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        run = Run(state_dir)
        try:
            [reply] = run_group(run.executor, take_epoch())
            assert reply.outcome == "accepted"
            run.model.take_epoch()
            run.check()
            for _ in range(data.draw(st.integers(1, 15), label="groups")):
                advances = st.sampled_from([0, 0, 200, 1_000, 1_500, 6_000, 10_000, 12_000])
                advance = data.draw(advances, label="advance ms")
                run.clock.advance(advance)
                run.model.now = run.clock.now_ms()
                run.group(data)
        finally:
            run.close()


# --- one deterministic case ----------------------------------------------------------


def test_conflicting_effect_key_rolls_back_only_the_middle_command() -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        clock = FakeClock()
        conn = open_database(StatePaths.resolve(state_dir), Settings(), clock)
        executor = GroupExecutor(conn, Settings(), clock)
        try:
            assert [r.outcome for r in run_group(executor, take_epoch(), reserve(1, effect_request("a")))] == [
                "accepted",
                "accepted",
            ]
            before_blobs = {d for (d,) in conn.execute("SELECT digest FROM blobs")}

            new_in_middle = effect_request("c", payload={"only": "middle"})
            conflicting = effect_request("a", payload={"different": True})
            receipt = client_receipt("middle", ("reserve", 3, "c", "a-different"))
            middle = reserve(3, new_in_middle, conflicting, receipt=receipt)
            first, second, third = run_group(
                executor,
                reserve(2, effect_request("b")),
                middle,
                reserve(3, effect_request("d")),
            )
            assert (first.outcome, first.revision) == ("accepted", 3)
            assert second.outcome == "conflict" and second.revision is None
            assert second.receipt["code"] == "effectKeyConflict"
            assert second.receipt["effectId"] == EffectRequest.model_validate(conflicting).effect_id(SERVER_ID)
            assert (third.outcome, third.revision) == ("accepted", 4)  # the middle did not increment

            ids = {k: EffectRequest.model_validate(effect_request(k)).effect_id(SERVER_ID) for k in "abcd"}
            assert conn.execute("SELECT revision FROM resources WHERE resource_id = 'server'").fetchone() == (4,)
            assert [
                r
                for (r,) in conn.execute(
                    "SELECT resource_revision FROM events WHERE resource_id = 'server' ORDER BY resource_revision"
                )
            ] == [1, 2, 3, 4]
            assert {e for (e,) in conn.execute("SELECT effect_id FROM effects")} == {ids["a"], ids["b"], ids["d"]}
            assert conn.execute("SELECT count(*) FROM resources WHERE resource_id = ?", (ids["c"],)).fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM events WHERE resource_id = ?", (ids["c"],)).fetchone() == (0,)
            # source_revision of the third command's effect is the revision it committed at
            assert conn.execute("SELECT source_revision FROM effects WHERE effect_id = ?", (ids["d"],)).fetchone() == (
                4,
            )
            blobs = {d for (d,) in conn.execute("SELECT digest FROM blobs")}
            payload = lambda req: BlobValue.model_validate(req["payload"]).digest  # noqa: E731
            assert blobs == before_blobs | {payload(effect_request("b")), payload(effect_request("d"))}
            assert payload(new_in_middle) not in blobs and payload(conflicting) not in blobs
            # the refusal is stored under the receipt ...
            stored = conn.execute(
                "SELECT outcome, revision, receipt FROM host_commands WHERE idempotency_key = 'middle'"
            ).fetchone()
            assert stored[0] == "conflict" and stored[1] is None and '"effectKeyConflict"' in stored[2]

            # ... and answered again, word for word, although the revision has moved on since
            clock.advance(1_000)
            [again] = run_group(executor, reserve(3, new_in_middle, conflicting, receipt=receipt))
            assert again == second
            # the same key for another request is refused and stores nothing
            other = client_receipt("middle", ("something else",))
            [reused] = run_group(executor, reserve(4, effect_request("e"), receipt=other))
            assert reused.outcome == "conflict" and reused.receipt == {"code": "idempotencyKeyReused"}
            assert conn.execute("SELECT count(*) FROM host_commands").fetchone() == (1,)
            assert conn.execute("SELECT revision FROM resources WHERE resource_id = 'server'").fetchone() == (4,)
            check_invariants(conn)
        finally:
            conn.close()

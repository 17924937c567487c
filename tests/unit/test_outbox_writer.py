"""The outbox at the writer: next-due claims, retry and abandon schedules, recovery of dead claims,
operator review (confirm / retry) with the parked run continuing, the operator list, and a
property test of two claimants competing for the next due effect.

Everything runs through a real ``GroupExecutor`` on a FakeClock against a real SQLite file.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from piworkflows import canonical
from piworkflows.clock import FakeClock
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.settings import Settings
from piworkflows.writer import records
from piworkflows.writer.db import GroupExecutor, Submitted, open_database
from piworkflows.writer.invariants import violations
from tests.support import (
    claim_run,
    client_receipt,
    effect_request,
    effect_row,
    reserve,
    run_create,
    run_group,
    run_state,
    runner_exited,
    settle,
    submitted,
    take_epoch,
    token_hash,
)

pytestmark = pytest.mark.timeout(60)

SERVER = {"actor_class": "server"}
OPERATOR = {"actor_class": "operator", "actor_id": "op-1"}
CLIENT = {"actor_class": "client", "actor_id": "client-1"}
RUNNER = {"actor_class": "runner"}
POOL_OWNER = "server-1"  # what server_owner_id(1) names: every claim the first epoch's pool takes


# --- command builders ------------------------------------------------------------------


def pool_claim(
    token: str,
    effect_id: str | None = None,
    performers: list[str] | None = None,
    ttl_ms: int = 10_000,
    owner: str = POOL_OWNER,
) -> Submitted:
    body: dict[str, Any] = {"actor": SERVER, "owner_id": owner, "claim_token_hash": token_hash(token), "ttl_ms": ttl_ms}
    if effect_id is not None:
        body["effect_id"] = effect_id
    if performers is not None:
        body["performers"] = performers
    return submitted("effect.claim", body)


def claim_body(token: str, generation: int, owner: str = POOL_OWNER, epoch: int = 1, ttl_ms: int = 10_000):
    return {
        "server_epoch": epoch,
        "owner_id": owner,
        "claim_token_hash": token_hash(token),
        "lease_generation": generation,
        "ttl_ms": ttl_ms,
    }


def pool_settle(effect_id: str, revision: int, token: str, generation: int, settlement: str = "applied", **extra):
    return settle(effect_id, revision, token, generation, settlement, owner=POOL_OWNER, **extra)


def abandon(effect_id: str, token: str, generation: int, retry_at: int | None = None, owner: str = POOL_OWNER):
    body: dict[str, Any] = {"actor": SERVER, "effect_id": effect_id, "claim": claim_body(token, generation, owner)}
    if retry_at is not None:
        body["retry_at"] = retry_at
    return submitted("effect.abandon", body)


def renew(effect_id: str, token: str, generation: int, ttl_ms: int = 10_000) -> Submitted:
    return submitted(
        "claim.renew",
        {"actor": SERVER, "resource_id": effect_id, "claim": claim_body(token, generation, ttl_ms=ttl_ms)},
    )


def recover() -> Submitted:
    return submitted("effect.recover", {"actor": SERVER})


def confirm(effect_id: str, note: str = "", output: Any = None, actor=OPERATOR, receipt=None) -> Submitted:
    body: dict[str, Any] = {"actor": actor, "effect_id": effect_id, "note": note}
    if output is not None:
        body["output"] = BlobValue.of_json(output).model_dump()
    if receipt is not None:
        body["client_receipt"] = receipt
    return submitted("effect.confirm", body)


def retry(effect_id: str, actor=OPERATOR, receipt=None) -> Submitted:
    body: dict[str, Any] = {"actor": actor, "effect_id": effect_id}
    if receipt is not None:
        body["client_receipt"] = receipt
    return submitted("effect.retry", body)


def list_effects(actor=OPERATOR, **filters) -> Submitted:
    return submitted("effect.list", {"actor": actor, **filters})


# --- row readers -----------------------------------------------------------------------


def attempts(conn, effect_id: str) -> list[tuple]:
    return conn.execute(
        "SELECT attempt_number, lease_generation, owner_id, attempt_status, error_code, retry_at, ended_at "
        "FROM effect_attempts WHERE effect_id = ? ORDER BY attempt_number",
        (effect_id,),
    ).fetchall()


def lease(conn, resource_id: str) -> tuple | None:
    return conn.execute(
        "SELECT lease_generation, owner_id, expires_at FROM leases WHERE resource_id = ?", (resource_id,)
    ).fetchone()


def revision(conn, resource_id: str) -> int:
    return conn.execute("SELECT revision FROM resources WHERE resource_id = ?", (resource_id,)).fetchone()[0]


def events(conn, resource_id: str) -> list[tuple]:
    return conn.execute(
        "SELECT resource_revision, event_type, actor_class FROM events WHERE resource_id = ? ORDER BY 1",
        (resource_id,),
    ).fetchall()


def reserved(executor, *requests: dict[str, Any]) -> list[str]:
    """Reserve effects on the server resource (at its current revision); their ids, in order."""
    (reply,) = run_group(executor, reserve(revision(executor.conn, "server"), *requests))
    assert reply.outcome == "accepted", reply
    return reply.receipt["effectIds"]


def claimed_ok(executor, token: str, effect_id: str | None = None, **kw) -> dict[str, Any]:
    (reply,) = run_group(executor, pool_claim(token, effect_id, **kw))
    assert reply.outcome == "accepted", reply
    return reply.receipt


@pytest.fixture
def epoch(executor):
    (take,) = run_group(executor, take_epoch())
    assert take.outcome == "accepted" and take.receipt == {"serverEpoch": 1}
    return executor


# --- 1. the next due claim -------------------------------------------------------------------


def test_next_due_claim_hands_out_only_the_asked_pool_performers(epoch):
    conn = epoch.conn
    runner_req = effect_request("act", performer="runner")
    http_req = effect_request("h", payload={"url": "https://example.invalid", "n": 1})
    shell_req = effect_request(
        "s", payload={"argv": ["true"]}, policy="manual", effect_type="shell.run", performer="shell.exec"
    )
    runner_id, http_id, shell_id = reserved(epoch, runner_req, http_req, shell_req)

    shell = claimed_ok(epoch, "t1", performers=["shell.exec"])
    assert shell == {
        "effectId": shell_id,
        "effectType": "shell.run",
        "idempotencyKey": "s",
        "payloadDigest": BlobValue.of_json({"argv": ["true"]}).digest.hex(),
        "recoveryPolicy": "manual",
        "performer": "shell.exec",
        "runId": None,
        "payload": {"argv": ["true"]},
        "attemptNumber": 1,
        "leaseGeneration": 1,
    }
    (none_of_shell,) = run_group(epoch, pool_claim("t2", performers=["shell.exec"]))
    assert none_of_shell.outcome == "notFound"
    assert none_of_shell.receipt == {"code": "nothingDue", "nextDueAt": None}

    http = claimed_ok(epoch, "t3")  # the default performers: both pool performers
    assert (http["effectId"], http["performer"], http["payload"]) == (
        http_id,
        "http.request",
        {"url": "https://example.invalid", "n": 1},
    )
    assert (http["recoveryPolicy"], http["idempotencyKey"], http["attemptNumber"]) == ("idempotent", "h", 1)

    # The runner's effect is pending and due, yet never handed to the pool, and it does not
    # count for nextDueAt either.
    (nothing,) = run_group(epoch, pool_claim("t4"))
    assert nothing.outcome == "notFound" and nothing.receipt == {"code": "nothingDue", "nextDueAt": None}
    assert nothing.error
    assert effect_row(conn, runner_id)["effect_status"] == "pending"
    assert attempts(conn, runner_id) == [] and lease(conn, runner_id) is None


def test_the_writer_performs_exactly_the_local_effects():
    with pytest.raises(ValueError, match="the writer performs exactly the local effects"):
        effect_request("local", performer="writer")  # external, yet the writer's
    with pytest.raises(ValueError, match="the writer performs exactly the local effects"):
        EffectRequest(
            effect_type="t",
            idempotency_key="k",
            payload=BlobValue.of_json({}),
            effect_class="local",
            performer="http.request",
            recovery_policy="idempotent",
            owner_scope="server",
        )


def test_a_named_claim_takes_a_runner_effect_without_its_payload(epoch):
    (runner_id,) = reserved(epoch, effect_request("act", performer="runner"))
    receipt = claimed_ok(epoch, "t1", runner_id)
    assert receipt["effectId"] == runner_id and receipt["performer"] == "runner"
    assert "payload" not in receipt  # only the pool performs from the payload alone
    (unknown,) = run_group(epoch, pool_claim("t2", "effect-nope"))
    assert unknown.outcome == "notFound" and unknown.receipt == {"code": "effectNotFound", "effectId": "effect-nope"}


def test_future_effects_are_not_due_and_next_due_at_names_the_earliest_of_those_performers(epoch, clock):
    conn = epoch.conn
    now = clock.now_ms()
    late_id, soon_id = reserved(epoch, effect_request("late"), effect_request("soon"))
    shell_id = reserved(epoch, effect_request("sh", performer="shell.exec"))[0]
    # Each is claimed and settled for a retry at its own time.
    for effect_id, delay in ((late_id, 5_000), (soon_id, 2_000), (shell_id, 1_000)):
        got = claimed_ok(epoch, f"tok-{effect_id}", effect_id)
        (reply,) = run_group(
            epoch, pool_settle(effect_id, 2, f"tok-{effect_id}", got["leaseGeneration"], "retry", retry_at=now + delay)
        )
        assert reply.outcome == "accepted" and reply.receipt["effectStatus"] == "pending"
    (http_none,) = run_group(epoch, pool_claim("x", performers=["http.request"]))
    assert http_none.receipt == {"code": "nothingDue", "nextDueAt": now + 2_000}
    (any_none,) = run_group(epoch, pool_claim("x"))
    assert any_none.receipt == {"code": "nothingDue", "nextDueAt": now + 1_000}
    (shell_none,) = run_group(epoch, pool_claim("x", performers=["shell.exec"]))
    assert shell_none.receipt == {"code": "nothingDue", "nextDueAt": now + 1_000}

    clock.advance(1_999)  # the shell effect is due, the http ones are not
    (http_early,) = run_group(epoch, pool_claim("x", performers=["http.request"]))
    assert http_early.receipt == {"code": "nothingDue", "nextDueAt": now + 2_000}
    clock.advance(1)
    assert claimed_ok(epoch, "a", performers=["http.request"])["effectId"] == soon_id
    clock.advance(3_000)  # all due: the earliest available first
    first = claimed_ok(epoch, "b")
    second = claimed_ok(epoch, "c")
    assert (first["effectId"], second["effectId"]) == (shell_id, late_id)
    assert (first["attemptNumber"], first["leaseGeneration"]) == (2, 2)
    assert effect_row(conn, soon_id)["effect_status"] == "applying"


# --- 2. settle retry -------------------------------------------------------------------------------


def test_settle_retry_reschedules_then_exhausts(epoch, clock):
    conn = epoch.conn
    (effect_id,) = reserved(epoch, effect_request("k", max_attempts=2))
    t0 = clock.now_ms()
    claimed_ok(epoch, "t1")
    error = BlobValue.of_text("503 from upstream")
    (first,) = run_group(
        epoch,
        pool_settle(effect_id, 2, "t1", 1, "retry", retry_at=t0 + 700, error_code="http503", error=error.model_dump()),
    )
    assert first.outcome == "accepted" and first.revision == 3
    assert first.receipt == {"effectId": effect_id, "effectStatus": "pending", "errorCode": "http503"}
    row = effect_row(conn, effect_id)
    assert (row["effect_status"], row["available_at"], row["attempt_count"], row["error_code"], row["settled_at"]) == (
        "pending",
        t0 + 700,
        1,
        "http503",
        None,
    )
    assert attempts(conn, effect_id) == [(1, 1, POOL_OWNER, "failed", "http503", t0 + 700, t0)]
    assert conn.execute("SELECT error_digest FROM effect_attempts WHERE effect_id = ?", (effect_id,)).fetchone() == (
        error.digest,
    )
    assert lease(conn, effect_id)[:2] == (1, None)  # released, generation kept

    (early,) = run_group(epoch, pool_claim("t2"))
    assert early.receipt == {"code": "nothingDue", "nextDueAt": t0 + 700}
    clock.advance(700)
    second = claimed_ok(epoch, "t2")
    assert (second["effectId"], second["attemptNumber"], second["leaseGeneration"]) == (effect_id, 2, 2)
    (last,) = run_group(
        epoch, pool_settle(effect_id, 4, "t2", 2, "retry", retry_at=clock.now_ms() + 700, error_code="http503")
    )
    assert last.outcome == "accepted"
    assert last.receipt == {"effectId": effect_id, "effectStatus": "rejected", "errorCode": "retriesExhausted"}
    row = effect_row(conn, effect_id)
    assert (row["effect_status"], row["error_code"], row["settled_at"], row["attempt_count"]) == (
        "rejected",
        "retriesExhausted",
        clock.now_ms(),
        2,
    )
    # the ended attempt keeps the performer's own code; no next attempt is scheduled
    assert attempts(conn, effect_id)[1] == (2, 2, POOL_OWNER, "rejected", "http503", None, clock.now_ms())
    assert [e[1] for e in events(conn, effect_id)] == [
        "effect.reserved",
        "effect.applying",
        "effect.pending",
        "effect.applying",
        "effect.rejected",
    ]
    (nothing,) = run_group(epoch, pool_claim("t3"))
    assert nothing.receipt == {"code": "nothingDue", "nextDueAt": None}


# --- 3. abandon ------------------------------------------------------------------------------------


def test_abandon_of_an_idempotent_effect_schedules_the_next_attempt_at_retry_at(epoch, clock):
    conn = epoch.conn
    (effect_id,) = reserved(epoch, effect_request("k"))
    claimed_ok(epoch, "t1")
    now = clock.now_ms()
    (reply,) = run_group(epoch, abandon(effect_id, "t1", 1, retry_at=now + 900))
    assert reply.outcome == "accepted" and reply.revision == 3
    assert reply.receipt == {"effectId": effect_id, "effectStatus": "pending"}
    assert attempts(conn, effect_id) == [(1, 1, POOL_OWNER, "ambiguous", "uncertainAttempt", now + 900, now)]
    row = effect_row(conn, effect_id)
    assert (row["effect_status"], row["available_at"], row["error_code"], row["settled_at"]) == (
        "pending",
        now + 900,
        "uncertainAttempt",
        None,
    )
    assert lease(conn, effect_id)[:2] == (1, None)
    assert events(conn, effect_id)[-1] == (3, "effect.pending", "server")
    (early,) = run_group(epoch, pool_claim("t2"))
    assert early.receipt == {"code": "nothingDue", "nextDueAt": now + 900}
    clock.advance(900)
    assert claimed_ok(epoch, "t2")["attemptNumber"] == 2


def test_abandon_without_retry_at_is_due_now(epoch, clock):
    (effect_id,) = reserved(epoch, effect_request("k"))
    claimed_ok(epoch, "t1")
    clock.advance(50)
    (reply,) = run_group(epoch, abandon(effect_id, "t1", 1))
    assert reply.receipt["effectStatus"] == "pending"
    assert effect_row(epoch.conn, effect_id)["available_at"] == clock.now_ms()
    assert claimed_ok(epoch, "t2")["attemptNumber"] == 2


def test_abandon_of_a_manual_effect_leaves_it_ambiguous(epoch, clock):
    conn = epoch.conn
    (effect_id,) = reserved(epoch, effect_request("m", policy="manual"))
    created = effect_row(conn, effect_id)["available_at"]
    claimed_ok(epoch, "t1")
    now = clock.now_ms()
    (reply,) = run_group(epoch, abandon(effect_id, "t1", 1, retry_at=now + 900))
    assert reply.receipt == {"effectId": effect_id, "effectStatus": "ambiguous"}
    assert attempts(conn, effect_id) == [(1, 1, POOL_OWNER, "ambiguous", "uncertainAttempt", None, now)]
    row = effect_row(conn, effect_id)
    assert (row["effect_status"], row["available_at"], row["settled_at"]) == ("ambiguous", created, None)
    (nothing,) = run_group(epoch, pool_claim("t2"))
    assert nothing.receipt == {"code": "nothingDue", "nextDueAt": None}


def test_abandon_after_the_last_attempt_rejects_and_needs_the_live_claim(epoch, clock):
    conn = epoch.conn
    (effect_id,) = reserved(epoch, effect_request("k", max_attempts=1))
    claimed_ok(epoch, "t1")
    (wrong,) = run_group(epoch, abandon(effect_id, "other", 1))
    assert wrong.outcome == "claimLost" and wrong.receipt["code"] == "claimTokenMismatch"
    (not_server,) = run_group(
        epoch, submitted("effect.abandon", {**abandon(effect_id, "t1", 1).body, "actor": {"actor_class": "outbox"}})
    )
    assert not_server.outcome == "rejected" and not_server.receipt["code"] == "actorNotAllowed"
    assert effect_row(conn, effect_id)["effect_status"] == "applying"
    (reply,) = run_group(epoch, abandon(effect_id, "t1", 1))
    assert reply.receipt == {"effectId": effect_id, "effectStatus": "rejected"}
    row = effect_row(conn, effect_id)
    assert (row["effect_status"], row["error_code"], row["settled_at"]) == (
        "rejected",
        "retriesExhausted",
        clock.now_ms(),
    )
    assert attempts(conn, effect_id)[0][3:6] == ("ambiguous", "uncertainAttempt", None)


# --- 4. recover ------------------------------------------------------------------------------------


def test_recover_ends_dead_pool_claims_and_leaves_live_ones(epoch, clock):
    conn = epoch.conn
    expiring, live, manual, exhausted, runner = reserved(
        epoch,
        effect_request("expiring"),
        effect_request("live"),
        effect_request("manual", policy="manual"),
        effect_request("exhausted", max_attempts=1),
        effect_request("runner", performer="runner"),
    )
    claimed_ok(epoch, "a", expiring, ttl_ms=1_000)
    claimed_ok(epoch, "b", live, ttl_ms=60_000)
    claimed_ok(epoch, "c", manual, ttl_ms=1_000)
    claimed_ok(epoch, "d", exhausted, ttl_ms=1_000)
    claimed_ok(epoch, "e", runner, ttl_ms=1_000)  # not the pool's: a runner's exit recovers it
    clock.advance(999)
    (none_yet,) = run_group(epoch, recover())
    assert none_yet.outcome == "accepted" and none_yet.receipt == {"effects": {}} and none_yet.revision is None
    clock.advance(1)  # expires_at <= now: dead
    now = clock.now_ms()
    (reply,) = run_group(epoch, recover())
    assert reply.outcome == "accepted"
    assert reply.receipt == {"effects": {expiring: "pending", manual: "ambiguous", exhausted: "rejected"}}
    assert attempts(conn, expiring) == [(1, 1, POOL_OWNER, "ambiguous", "uncertainAttempt", now, now)]
    row = effect_row(conn, expiring)
    assert (row["effect_status"], row["available_at"], row["error_code"]) == ("pending", now, "uncertainAttempt")
    assert effect_row(conn, manual)["effect_status"] == "ambiguous"
    assert (effect_row(conn, exhausted)["effect_status"], effect_row(conn, exhausted)["error_code"]) == (
        "rejected",
        "retriesExhausted",
    )
    for effect_id, status in ((expiring, "pending"), (manual, "ambiguous"), (exhausted, "rejected")):
        assert lease(conn, effect_id)[:2] == (1, None)
        assert revision(conn, effect_id) == 3
        assert events(conn, effect_id)[-1] == (3, f"effect.{status}", "server")
    # untouched: the live claim of this epoch, and the runner's effect
    for effect_id in (live, runner):
        assert effect_row(conn, effect_id)["effect_status"] == "applying"
        assert attempts(conn, effect_id)[0][3] == "applying"
        assert revision(conn, effect_id) == 2
    assert lease(conn, live)[1] == POOL_OWNER
    (again,) = run_group(epoch, recover())
    assert again.receipt == {"effects": {}}
    # the old claimant of a recovered effect has lost it
    (late,) = run_group(epoch, pool_settle(expiring, 3, "a", 1))
    assert late.outcome == "claimLost" and late.receipt["code"] == "notClaimed"
    assert violations(conn, clock.now_ms()) == {}


def test_recover_after_a_new_server_epoch_ends_live_claims_of_the_old_one(epoch, clock):
    conn = epoch.conn
    old, runner = reserved(epoch, effect_request("old"), effect_request("runner", performer="runner"))
    claimed_ok(epoch, "a", old, ttl_ms=60_000)
    claimed_ok(epoch, "r", runner, ttl_ms=60_000)
    (take2,) = run_group(epoch, take_epoch("second-server"))
    assert take2.receipt == {"serverEpoch": 2}
    (new_id,) = reserved(epoch, effect_request("new"))
    claimed_ok(epoch, "n", new_id, ttl_ms=60_000, owner="server-2")
    (reply,) = run_group(epoch, recover())
    assert reply.receipt == {"effects": {old: "pending"}}  # its claim is live, but of the older epoch
    assert effect_row(conn, new_id)["effect_status"] == "applying"
    assert effect_row(conn, runner)["effect_status"] == "applying"
    assert attempts(conn, old)[0][3:5] == ("ambiguous", "uncertainAttempt")
    assert claimed_ok(epoch, "n2", owner="server-2")["effectId"] == old  # due again, for the new epoch


# --- 5. operator review --------------------------------------------------------------------------


def ambiguous_effect(executor, key: str = "m", max_attempts: int = 5, performer: str = "http.request") -> str:
    """A server-scoped manual effect whose only attempt ended ambiguous (effect revision 3)."""
    (effect_id,) = reserved(
        executor, effect_request(key, policy="manual", max_attempts=max_attempts, performer=performer)
    )
    claimed_ok(executor, f"tok-{key}", effect_id)
    (reply,) = run_group(executor, pool_settle(effect_id, 2, f"tok-{key}", 1, "ambiguous"))
    assert reply.receipt["effectStatus"] == "ambiguous"
    return effect_id


def test_confirm_turns_ambiguous_into_applied_and_a_repeat_is_adopted(epoch, clock):
    conn = epoch.conn
    effect_id = ambiguous_effect(epoch)
    clock.advance(10)
    receipt = client_receipt("confirm-1", ("confirm", effect_id), operation="effect.confirm")
    request = confirm(effect_id, note="seen in the remote log", output={"status": 201}, receipt=receipt)
    (reply,) = run_group(epoch, request)
    assert reply.outcome == "accepted" and reply.revision == 4
    assert reply.receipt == {"effectId": effect_id, "effectStatus": "applied"}
    row = effect_row(conn, effect_id)
    assert (row["effect_status"], row["settled_at"]) == ("applied", clock.now_ms())
    expected = {
        "output": {"status": 201},
        "nodeOutcome": "ok",
        "confirmedBy": "operator",
        "note": "seen in the remote log",
    }
    assert records.read_json(conn, row["result_digest"]) == expected
    assert row["result_digest"] == BlobValue.of_json(expected).digest
    assert events(conn, effect_id)[-1] == (4, "effect.confirmed", "operator")
    assert conn.execute(
        "SELECT payload_digest FROM events WHERE resource_id = ? AND resource_revision = 4", (effect_id,)
    ).fetchone() == (row["result_digest"],)
    assert attempts(conn, effect_id)[0][3] == "ambiguous"  # the attempt's history is not rewritten

    (again,) = run_group(
        epoch, confirm(effect_id, note="seen in the remote log", output={"status": 201}, receipt=receipt)
    )
    assert again.outcome == "adopted" and (again.revision, again.receipt) == (reply.revision, reply.receipt)
    assert revision(conn, effect_id) == 4
    (decided,) = run_group(epoch, confirm(effect_id, note="twice"))
    assert decided.outcome == "conflict"
    assert decided.receipt == {"code": "winnerDecided", "effectId": effect_id, "status": "applied"}
    (no_retry,) = run_group(epoch, retry(effect_id))
    assert no_retry.outcome == "conflict" and no_retry.receipt["code"] == "winnerDecided"
    assert revision(conn, effect_id) == 4


def test_confirm_by_a_client_without_output_records_null(epoch):
    effect_id = ambiguous_effect(epoch)
    (reply,) = run_group(epoch, confirm(effect_id, actor=CLIENT))
    assert reply.outcome == "accepted"
    result = records.read_json(epoch.conn, effect_row(epoch.conn, effect_id)["result_digest"])
    assert result == {"output": None, "nodeOutcome": "ok", "confirmedBy": "client", "note": ""}


def test_retry_makes_ambiguous_pending_and_due_now_and_the_next_claim_is_attempt_two(epoch, clock):
    conn = epoch.conn
    effect_id = ambiguous_effect(epoch, max_attempts=1)  # the operator's retry goes beyond max_attempts
    clock.advance(5_000)
    receipt = client_receipt("retry-1", ("retry", effect_id), operation="effect.retry")
    (reply,) = run_group(epoch, retry(effect_id, actor=CLIENT, receipt=receipt))
    assert reply.outcome == "accepted" and reply.revision == 4
    assert reply.receipt == {"effectId": effect_id, "effectStatus": "pending"}
    row = effect_row(conn, effect_id)
    assert (row["effect_status"], row["available_at"], row["error_code"], row["settled_at"]) == (
        "pending",
        clock.now_ms(),
        None,
        None,
    )
    assert (row["attempt_count"], row["max_attempts"]) == (1, 2)
    assert events(conn, effect_id)[-1] == (4, "effect.retried", "client")
    (again,) = run_group(epoch, retry(effect_id, actor=CLIENT, receipt=receipt))
    assert again.outcome == "adopted" and (again.revision, again.receipt) == (4, reply.receipt)

    (pending_retry,) = run_group(epoch, retry(effect_id))
    assert pending_retry.outcome == "rejected"
    assert pending_retry.receipt == {"code": "invalidTransition", "effectId": effect_id, "status": "pending"}
    (pending_confirm,) = run_group(epoch, confirm(effect_id))
    assert pending_confirm.outcome == "rejected" and pending_confirm.receipt["code"] == "invalidTransition"

    got = claimed_ok(epoch, "next")
    assert (got["effectId"], got["attemptNumber"], got["leaseGeneration"]) == (effect_id, 2, 2)
    assert [a[:4] for a in attempts(conn, effect_id)] == [
        (1, 1, POOL_OWNER, "ambiguous"),
        (2, 2, POOL_OWNER, "applying"),
    ]
    (applying,) = run_group(epoch, confirm(effect_id))
    assert applying.outcome == "rejected" and applying.receipt["status"] == "applying"


@pytest.mark.parametrize("make", [confirm, retry])
def test_review_of_an_unknown_effect_or_by_another_actor_is_refused(epoch, make):
    (unknown,) = run_group(epoch, make("effect-missing"))
    assert unknown.outcome == "notFound" and unknown.receipt == {"code": "effectNotFound", "effectId": "effect-missing"}
    effect_id = ambiguous_effect(epoch)
    for actor in (SERVER, {"actor_class": "outbox"}, RUNNER):
        (refused,) = run_group(epoch, make(effect_id, actor=actor))
        assert refused.outcome == "rejected" and refused.receipt["code"] == "actorNotAllowed"
    assert effect_row(epoch.conn, effect_id)["effect_status"] == "ambiguous"


# --- 6. the parked run continues --------------------------------------------------------------------


def run_claim(generation: int = 1, token: str = "tok") -> dict[str, Any]:
    return claim_body(token, generation)


class RunBuilder:
    """run-1 driven by real runner messages: action nodes whose manual effects end ambiguous."""

    def __init__(self, executor) -> None:
        self.executor = executor
        run_group(executor, take_epoch(), run_create("run-1"), claim_run())
        self.attempt_id: str | None = None

    @property
    def rev(self) -> int:
        return revision(self.executor.conn, "run-1")

    def start_action(self, node: str) -> None:
        body = {
            "actor": RUNNER,
            "run_id": "run-1",
            "claim": run_claim(),
            "expected_revision": self.rev,
            "node_path": node,
            "node_kind": "action",
            "visit_number": 1,
        }
        if self.attempt_id is None:
            (reply,) = run_group(self.executor, submitted("node.start", body))
            assert reply.outcome == "accepted", reply
            self.attempt_id = reply.receipt["attemptId"]
        else:  # finish the previous node and start this one in one commit
            finish = {
                "actor": RUNNER,
                "run_id": "run-1",
                "claim": run_claim(),
                "expected_revision": self.rev,
                "attempt_id": self.attempt_id,
                "outcome": "ok",
                "output": BlobValue.of_json({"done": True}).model_dump(),
                "next_node": node,
                "start_next": {"node_kind": "action", "visit_number": 1},
            }
            (reply,) = run_group(self.executor, submitted("node.finish", finish))
            assert reply.outcome == "accepted", reply
            self.attempt_id = reply.receipt["nextAttemptId"]

    def reserve_effect(self, policy: str = "manual", performer: str = "shell.exec") -> str:
        body = {
            "actor": RUNNER,
            "run_id": "run-1",
            "claim": run_claim(),
            "expected_revision": self.rev,
            "attempt_id": self.attempt_id,
            "effect_type": "shell.run",
            "recovery_policy": policy,
            "performer": performer,
            "payload": BlobValue.of_json({"argv": ["deploy"]}).model_dump(),
        }
        (reply,) = run_group(self.executor, submitted("node.reserve_effect", body))
        assert reply.outcome == "accepted" and reply.receipt["effectStatus"] == "pending", reply
        return reply.receipt["effectId"]

    def ambiguous(self, node: str) -> str:
        self.start_action(node)
        effect_id = self.reserve_effect()
        got = claimed_ok(self.executor, f"tok-{node}", effect_id)
        (reply,) = run_group(
            self.executor, pool_settle(effect_id, 2, f"tok-{node}", got["leaseGeneration"], "ambiguous")
        )
        assert reply.receipt["effectStatus"] == "ambiguous", reply
        return effect_id

    def runner_exits(self) -> None:
        (reply,) = run_group(self.executor, runner_exited(1))
        assert reply.receipt == {"runId": "run-1", "placement": "parked", "parkReason": "effectAmbiguous"}, reply


def run_facts(conn) -> tuple:
    return conn.execute(
        "SELECT r.status, r.park_reason, r.paused, q.queue_status, res.revision, v.presentation_revision "
        "FROM runs r JOIN run_queue q USING (run_id) JOIN resources res ON res.resource_id = r.run_id "
        "JOIN viewer_runs v ON v.run_id = r.run_id WHERE r.run_id = 'run-1'"
    ).fetchone()


@pytest.mark.parametrize("review", ["confirm", "retry"])
def test_review_of_the_only_ambiguous_effect_queues_the_parked_run(executor, clock, review):
    run = RunBuilder(executor)
    effect_id = run.ambiguous("greet")
    run.runner_exits()
    conn = executor.conn
    status, park, paused, queue, rev, presentation = run_facts(conn)
    assert (status, park, paused, queue) == ("running", "effectAmbiguous", 0, "parked")
    clock.advance(10)
    (reply,) = run_group(executor, confirm(effect_id, note="ok") if review == "confirm" else retry(effect_id))
    assert reply.outcome == "accepted"
    assert run_facts(conn) == ("queued", None, 0, "queued", rev + 1, presentation + 1)
    assert run_state(executor) == (("queued", "queued", False, False), None)
    assert conn.execute(
        "SELECT event_type, actor_class, committed_at FROM events WHERE resource_id = 'run-1' "
        "AND resource_revision = ?",
        (rev + 1,),
    ).fetchone() == ("run.effectReviewed", "operator", clock.now_ms())
    assert violations(conn, clock.now_ms()) == {}
    (claimable,) = run_group(executor, submitted("run.claimable", {"actor": SERVER}))
    assert claimable.receipt["runIds"] == ["run-1"]
    if review == "retry":  # the effect is due for its performer: attempt 2
        got = claimed_ok(executor, "again", performers=["shell.exec"])
        assert (got["effectId"], got["attemptNumber"], got["runId"]) == (effect_id, 2, "run-1")


def test_a_run_with_two_ambiguous_effects_stays_parked_until_both_are_reviewed(executor, clock):
    run = RunBuilder(executor)
    first = run.ambiguous("greet")
    second = run.ambiguous("progress")
    run.runner_exits()
    conn = executor.conn
    before = run_facts(conn)
    assert before[:4] == ("running", "effectAmbiguous", 0, "parked")
    (one,) = run_group(executor, confirm(first))
    assert one.outcome == "accepted"
    # still parked (the other is still ambiguous); the view lists one ambiguous effect fewer
    assert run_facts(conn) == (*before[:5], before[5] + 1)
    (two,) = run_group(executor, retry(second))
    assert two.outcome == "accepted"
    assert run_facts(conn) == ("queued", None, 0, "queued", before[4] + 1, before[5] + 2)
    assert violations(conn, clock.now_ms()) == {}


def test_a_paused_parked_run_stays_parked_for_the_pause(executor, clock):
    run = RunBuilder(executor)
    effect_id = run.ambiguous("greet")
    run.runner_exits()
    (paused,) = run_group(executor, submitted("run.pause", {"actor": CLIENT, "run_id": "run-1"}))
    assert paused.outcome == "accepted"
    conn = executor.conn
    before = run_facts(conn)
    assert before[:4] == ("running", "effectAmbiguous", 1, "parked")
    (reply,) = run_group(executor, retry(effect_id))
    assert reply.outcome == "accepted"
    assert run_facts(conn) == ("running", "paused", 1, "parked", before[4] + 1, before[5] + 1)
    assert events(conn, "run-1")[-1][1] == "run.effectReviewed"
    (claimable,) = run_group(executor, submitted("run.claimable", {"actor": SERVER}))
    assert claimable.receipt["runIds"] == []
    (resumed,) = run_group(executor, submitted("run.resume", {"actor": CLIENT, "run_id": "run-1"}))
    assert resumed.outcome == "accepted" and resumed.receipt["status"] == "queued"
    assert violations(conn, clock.now_ms()) == {}


def test_review_while_the_runner_still_runs_leaves_the_run_alone(executor):
    run = RunBuilder(executor)
    effect_id = run.ambiguous("greet")
    conn = executor.conn
    before = run_facts(conn)
    (reply,) = run_group(executor, confirm(effect_id))
    assert reply.outcome == "accepted"
    # not parked: nothing to continue (the runner learns the result itself); the view shows it reviewed
    assert run_facts(conn) == (*before[:5], before[5] + 1)


def test_a_runner_asking_to_park_for_an_ambiguity_already_reviewed_queues_the_run(executor, clock):
    """The race a CI run found: the runner saw the effect ambiguous and exits asking to park the
    run for it, but an operator confirmed the effect in between. Parked for it, nothing would ever
    continue the run; it is queued instead (the next runner adopts the applied result). (A pause
    in between cannot meet this exit: it ends the runner record itself.)"""
    run = RunBuilder(executor)
    effect_id = run.ambiguous("greet")
    (reply,) = run_group(executor, confirm(effect_id))
    assert reply.outcome == "accepted"
    body = {
        "actor": SERVER,
        "run_id": "run-1",
        "runner_epoch": 1,
        "outcome": "exited",
        "stopped_by_server": False,
        "park_reason": "effectAmbiguous",
    }
    (exited_reply,) = run_group(executor, submitted("runner.exited", body))
    assert exited_reply.receipt == {"runId": "run-1", "placement": "requeued"}, exited_reply
    assert run_facts(executor.conn)[:4] == ("queued", None, 0, "queued")
    (claimable,) = run_group(executor, submitted("run.claimable", {"actor": SERVER}))
    assert claimable.receipt["runIds"] == ["run-1"]
    assert violations(executor.conn, clock.now_ms()) == {}


def test_retry_of_an_effect_of_a_finished_run_is_refused_and_confirm_still_records_it(executor, clock):
    """The issue's scenario at the writer: the run is cancelled while its manual command applies; the
    effect is ambiguous, but the run is over: a retry would act again for nobody (runFinished)."""
    run = RunBuilder(executor)
    run.start_action("deploy")
    effect_id = run.reserve_effect()
    claimed_ok(executor, "tok-deploy", effect_id)
    (cancelled,) = run_group(executor, submitted("run.cancel", {"actor": CLIENT, "run_id": "run-1"}))
    assert cancelled.outcome == "accepted", cancelled
    conn = executor.conn
    assert effect_row(conn, effect_id)["effect_status"] == "ambiguous"
    before = revision(conn, effect_id)

    receipt = client_receipt("retry-late", ("retry", effect_id), operation="effect.retry")
    (refused,) = run_group(executor, retry(effect_id, actor=CLIENT, receipt=receipt))
    assert refused.outcome == "conflict", refused
    assert refused.receipt == {"code": "runFinished", "effectId": effect_id, "runId": "run-1", "runStatus": "cancelled"}
    assert "run-1" in refused.error and "cancelled" in refused.error
    assert effect_row(conn, effect_id)["effect_status"] == "ambiguous" and revision(conn, effect_id) == before
    (again,) = run_group(executor, retry(effect_id, actor=CLIENT, receipt=receipt))
    assert again.outcome == "conflict" and again.receipt == refused.receipt  # the stored refusal
    (nothing,) = run_group(executor, pool_claim("next", performers=["shell.exec"]))
    assert nothing.receipt["code"] == "nothingDue"  # no attempt 2

    (confirmed,) = run_group(executor, confirm(effect_id, note="the deploy log shows it ran"))
    assert confirmed.outcome == "accepted" and confirmed.receipt["effectStatus"] == "applied"
    assert run_facts(conn)[0] == "cancelled"  # the run keeps its outcome
    assert violations(conn, clock.now_ms()) == {}


def test_retry_of_an_effect_of_a_running_run_or_one_not_run_scoped_is_accepted(executor, clock):
    run = RunBuilder(executor)
    effect_id = run.ambiguous("greet")
    (reply,) = run_group(executor, retry(effect_id))
    assert reply.outcome == "accepted" and reply.receipt == {"effectId": effect_id, "effectStatus": "pending"}
    # An effect that outlives its run by design (not run-scoped) is retried after the run ended.
    outliving = EffectRequest(
        effect_type="channel.edit",
        idempotency_key="settle-edit",
        payload=BlobValue.of_json({"edit": 1}),
        effect_class="external",
        performer="http.request",
        recovery_policy="manual",
        owner_scope="server",
        run_id="run-1",
    ).model_dump()
    (channel_effect,) = reserved(executor, outliving)
    claimed_ok(executor, "tok-edit", channel_effect)
    (ambiguous,) = run_group(executor, pool_settle(channel_effect, 2, "tok-edit", 1, "ambiguous"))
    assert ambiguous.receipt["effectStatus"] == "ambiguous"
    (cancelled,) = run_group(executor, submitted("run.cancel", {"actor": CLIENT, "run_id": "run-1"}))
    assert cancelled.outcome == "accepted", cancelled
    (later,) = run_group(executor, retry(channel_effect))
    assert later.outcome == "accepted" and later.receipt["effectStatus"] == "pending"
    assert violations(executor.conn, clock.now_ms()) == {}


# --- 7. effect.list ----------------------------------------------------------------------------------


LIST_KEYS = set(
    "effectId effectType status recoveryPolicy performer runId nodePath visit attempts maxAttempts nextAttemptAt "
    "errorCode createdAt updatedAt settledAt controls".split()
)


def test_list_shows_unsettled_effects_newest_first_without_payloads(executor, clock):
    run = RunBuilder(executor)
    t_pending = clock.now_ms()
    (pending,) = reserved(executor, effect_request("pending", payload={"secret": "s3cret-payload"}))
    clock.advance(10)
    (applying,) = reserved(executor, effect_request("applying"))
    claimed_ok(executor, "a", applying)
    clock.advance(10)
    (applied,) = reserved(executor, effect_request("applied"))
    claimed_ok(executor, "b", applied)
    run_group(executor, pool_settle(applied, 2, "b", 1, result=BlobValue.of_json({"r": "s3cret-result"}).model_dump()))
    clock.advance(10)
    failed = reserved(executor, effect_request("failed", max_attempts=3))[0]
    claimed_ok(executor, "c", failed)
    error = BlobValue.of_text("s3cret-error").model_dump()
    run_group(
        executor,
        pool_settle(failed, 2, "c", 1, "retry", retry_at=clock.now_ms() + 1_000, error_code="http500", error=error),
    )
    clock.advance(10)
    ambiguous = ambiguous_effect(executor)
    clock.advance(10)
    run.start_action("greet")
    node_effect = run.reserve_effect()

    (listed,) = run_group(executor, list_effects())
    assert listed.outcome == "accepted" and listed.receipt["now"] == clock.now_ms()
    items = listed.receipt["items"]
    assert [i["effectId"] for i in items] == [node_effect, ambiguous, failed, applying, pending]
    assert all(set(i) == LIST_KEYS for i in items)
    text = json.dumps(listed.receipt)
    for secret in ("s3cret-payload", "s3cret-result", "s3cret-error", "deploy"):
        assert secret not in text
    by_id = {i["effectId"]: i for i in items}
    assert by_id[pending] == {
        "effectId": pending,
        "effectType": "test.effect",
        "status": "pending",
        "recoveryPolicy": "idempotent",
        "performer": "http.request",
        "runId": None,
        "nodePath": None,
        "visit": None,
        "attempts": 0,
        "maxAttempts": 5,
        "nextAttemptAt": t_pending,
        "errorCode": None,
        "createdAt": t_pending,
        "updatedAt": t_pending,
        "settledAt": None,
        "controls": [],  # only an ambiguous effect is reviewed
    }
    assert (by_id[failed]["status"], by_id[failed]["nextAttemptAt"], by_id[failed]["errorCode"]) == (
        "pending",
        clock.now_ms() - 20 + 1_000,
        "http500",
    )
    assert (by_id[applying]["status"], by_id[applying]["attempts"], by_id[applying]["nextAttemptAt"]) == (
        "applying",
        1,
        None,
    )
    assert (by_id[ambiguous]["status"], by_id[ambiguous]["nextAttemptAt"]) == ("ambiguous", None)
    assert by_id[ambiguous]["controls"] == ["confirm", "retry"]  # not a run's: retry stays offered
    node = by_id[node_effect]
    assert (node["runId"], node["nodePath"], node["visit"], node["effectType"], node["performer"]) == (
        "run-1",
        "greet",
        1,
        "shell.run",
        "shell.exec",
    )
    key = executor.conn.execute("SELECT idempotency_key FROM effects WHERE effect_id = ?", (node_effect,)).fetchone()
    assert key == (canonical.dumps(["run-1", "shell.run", "greet", 1]),)

    (only_applied,) = run_group(executor, list_effects(statuses=["applied"]))
    [item] = only_applied.receipt["items"]
    assert (item["effectId"], item["status"], item["settledAt"]) == (applied, "applied", t_pending + 20)
    (of_run,) = run_group(executor, list_effects(run_id="run-1"))
    assert [i["effectId"] for i in of_run.receipt["items"]] == [node_effect]
    (one,) = run_group(executor, list_effects(effect_id=failed))
    assert [i["effectId"] for i in one.receipt["items"]] == [failed]
    (filtered_out,) = run_group(executor, list_effects(effect_id=applied))  # applied is not a default status
    assert filtered_out.receipt["items"] == []
    (limited,) = run_group(executor, list_effects(limit=2, actor=SERVER))
    assert [i["effectId"] for i in limited.receipt["items"]] == [node_effect, ambiguous]
    (by_client,) = run_group(executor, list_effects(actor=CLIENT))
    assert by_client.outcome == "accepted"
    (by_runner,) = run_group(executor, list_effects(actor=RUNNER))
    assert by_runner.outcome == "rejected" and by_runner.receipt["code"] == "actorNotAllowed"


# --- 8. two claimants competing for the next due effect (hypothesis) -----------------------------------

TTL = 1_000
CLAIMANTS = ("A", "B")
# key -> (policy, max_attempts)
ARENA_EFFECTS = {"e0": ("idempotent", 50), "e1": ("idempotent", 3), "e2": ("manual", 50)}

CLAIM = st.tuples(st.just("claim"), st.sampled_from(CLAIMANTS))
# who's applying claim lapses, recovery ends it, the other claims until it wins that effect, then who settles
STEAL = st.tuples(
    st.just("steal"),
    st.sampled_from(CLAIMANTS),
    st.integers(0, 3),
    st.sampled_from(["retry", "applied", "ambiguous", "rejected"]),
)
step_strategy = st.one_of(
    CLAIM,
    CLAIM,
    CLAIM,
    st.tuples(
        st.just("settle"),
        st.sampled_from(CLAIMANTS),
        st.integers(0, 3),
        st.sampled_from(["retry", "retry", "retry", "applied", "ambiguous", "rejected"]),
    ),
    st.tuples(st.just("settle"), st.sampled_from(CLAIMANTS), st.integers(0, 3), st.just("retry")),
    st.tuples(st.just("renew"), st.sampled_from(CLAIMANTS), st.integers(0, 3)),
    st.tuples(st.just("abandon"), st.sampled_from(CLAIMANTS), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.sampled_from([0, 300, 999, 1_000, 1_001, 1_500])),
    st.tuples(st.just("lapse")),  # past the TTL, then the pool's recovery
    st.tuples(st.just("recover")),
    st.tuples(st.just("review")),
    STEAL,
    STEAL,
)


class Arena:
    """One example: a fresh database with three due effects and two claimants of the same epoch."""

    def __init__(self, state_dir: str) -> None:
        self.clock = FakeClock()
        self.conn = open_database(StatePaths.resolve(state_dir), Settings(), self.clock)
        self.executor = GroupExecutor(self.conn, Settings(), self.clock)
        self.ids = itertools.count(1)
        assert self.run(take_epoch()).outcome == "accepted"
        requests = [effect_request(k, policy=p, max_attempts=m) for k, (p, m) in ARENA_EFFECTS.items()]
        self.effects = self.run(reserve(1, *requests)).receipt["effectIds"]
        self.held: dict[str, dict[str, int]] = {c: {} for c in CLAIMANTS}  # claimant -> effect -> generation
        self.superseded_settles = 0

    def close(self) -> None:
        self.conn.close()

    def run(self, item: Submitted):
        (reply,) = run_group(self.executor, item)
        return reply

    def now(self) -> int:
        return self.clock.now_ms()

    def rows(self) -> dict[str, list[tuple]]:
        q = self.conn.execute
        return {
            "effects": q("SELECT * FROM effects ORDER BY effect_id").fetchall(),
            "attempts": q("SELECT * FROM effect_attempts ORDER BY effect_id, attempt_number").fetchall(),
            "leases": q("SELECT * FROM leases ORDER BY resource_id").fetchall(),
            "events": q("SELECT * FROM events ORDER BY event_id").fetchall(),
            "resources": q("SELECT resource_id, revision FROM resources ORDER BY 1").fetchall(),
        }

    def status(self, effect_id: str) -> tuple[str, int, int, str]:
        return self.conn.execute(
            "SELECT effect_status, attempt_count, max_attempts, recovery_policy FROM effects WHERE effect_id = ?",
            (effect_id,),
        ).fetchone()

    def fence(self, effect_id: str, who: str, generation: int) -> str | None:
        """The refusal code the claim fence must give, or None if the claim is the live current one."""
        current = records.get_lease(self.conn, effect_id)
        if current is None or current.owner_id is None:
            return "notClaimed"
        if current.lease_generation != generation:
            return "staleGeneration"
        if current.claim_token_hash != token_hash(f"claimant-{who}"):
            return "claimTokenMismatch"
        if not current.live(self.now()):
            return "claimExpired"
        return None

    def pick(self, who: str, index: int) -> tuple[str, int]:
        held = sorted(self.held[who].items())
        return held[index % len(held)] if held else (self.effects[index % len(self.effects)], 1)

    # -- steps --

    def claim(self, who: str) -> None:
        now = self.now()
        rows = self.conn.execute(
            "SELECT e.effect_id, e.available_at, l.lease_generation, l.owner_id, l.expires_at, "
            "(SELECT count(*) FROM effect_attempts a WHERE a.effect_id = e.effect_id) "
            "FROM effects e LEFT JOIN leases l ON l.resource_id = e.effect_id WHERE e.effect_status = 'pending'"
        ).fetchall()
        due = sorted(
            (at, eid, gen or 0, n)
            for eid, at, gen, owner, exp, n in rows
            if at <= now and (owner is None or exp <= now)
        )
        reply = self.run(pool_claim(f"claimant-{who}", ttl_ms=TTL))
        if not due:
            assert reply.outcome == "notFound", reply
            assert reply.receipt == {"code": "nothingDue", "nextDueAt": min((r[1] for r in rows), default=None)}
            return
        _, effect_id, generation, n = due[0]
        assert reply.outcome == "accepted", reply
        assert (reply.receipt["effectId"], reply.receipt["leaseGeneration"], reply.receipt["attemptNumber"]) == (
            effect_id,
            generation + 1,
            n + 1,
        )
        self.held[who][effect_id] = generation + 1

    def fenced(self, who: str, index: int, kind: str, settlement: str = "retry", chosen=None) -> None:
        effect_id, generation = chosen or self.pick(who, index)
        token = f"claimant-{who}"
        code = self.fence(effect_id, who, generation)
        current = records.get_lease(self.conn, effect_id)
        superseded = (
            current is not None
            and current.owner_id is not None
            and current.lease_generation > generation
            and current.claim_token_hash != token_hash(f"claimant-{who}")
        )
        status, count, max_attempts, policy = self.status(effect_id)
        before = self.rows()
        rev = revision(self.conn, effect_id)
        if kind == "settle":
            extra = {"retry_at": self.now() + 500} if settlement == "retry" else {}
            reply = self.run(pool_settle(effect_id, rev, token, generation, settlement, **extra))
        elif kind == "renew":
            reply = self.run(renew(effect_id, token, generation, ttl_ms=TTL))
        else:
            reply = self.run(abandon(effect_id, token, generation))
        context = (kind, who, effect_id, generation, settlement, reply)
        if code is not None:
            assert reply.outcome == "claimLost" and reply.receipt["code"] == code, context
            if superseded:
                assert code == "staleGeneration", context
                if currently_in_test_context():  # --hypothesis-show-statistics shows how often this is met
                    event(f"a superseded claimant's {kind} refused")
                self.superseded_settles += kind == "settle"
            assert self.rows() == before, context  # a refused claimant changed nothing
            return
        assert status == "applying", context  # the live claim is on an applying effect
        if kind == "renew":
            assert reply.outcome == "accepted" and reply.receipt == {"expiresAt": self.now() + TTL}, context
            return
        if kind == "settle" and settlement == "retry" and policy == "manual":
            assert reply.outcome == "rejected" and reply.receipt["code"] == "invalidTransition", context
            assert self.rows() == before, context
            return
        assert reply.outcome == "accepted", context
        if kind == "settle":
            expected = settlement if settlement != "retry" else ("pending" if count < max_attempts else "rejected")
        else:
            expected = "ambiguous" if policy == "manual" else ("pending" if count < max_attempts else "rejected")
        assert reply.receipt["effectStatus"] == expected, context
        assert self.status(effect_id)[0] == expected
        ended = self.conn.execute(
            "SELECT attempt_status FROM effect_attempts WHERE effect_id = ? AND lease_generation = ?",
            (effect_id, generation),
        ).fetchone()
        assert ended != ("applying",), context

    def recover(self) -> None:
        now = self.now()
        dead = self.conn.execute(
            "SELECT e.effect_id, e.recovery_policy, e.attempt_count, e.max_attempts FROM effects e "
            "JOIN leases l ON l.resource_id = e.effect_id WHERE e.effect_status = 'applying' AND l.expires_at <= ?",
            (now,),
        ).fetchall()
        expected = {
            eid: ("ambiguous" if policy == "manual" else "pending" if n < m else "rejected")
            for eid, policy, n, m in dead
        }
        reply = self.run(recover())
        assert reply.outcome == "accepted" and reply.receipt == {"effects": expected}, reply

    def applying_claims(self, who: str) -> list[tuple[str, int]]:
        """The claims of who that are the current ones of applying effects (live or expired)."""
        return sorted(
            (eid, gen)
            for eid, gen in self.held[who].items()
            if self.status(eid)[0] == "applying" and self.fence(eid, who, gen) in (None, "claimExpired")
        )

    def steal(self, who: str, index: int, settlement: str) -> None:
        mine = self.applying_claims(who)
        if not mine:  # who takes the next due effect first
            self.claim(who)
            self.check()
            mine = self.applying_claims(who)
            if not mine:
                return
        effect_id, generation = mine[index % len(mine)]
        other = CLAIMANTS[1 - CLAIMANTS.index(who)]
        self.clock.advance(TTL)
        self.check()
        self.recover()
        self.check()
        if self.status(effect_id)[0] == "ambiguous":  # a manual effect: an operator asks for a new attempt
            self.review(effect_id)
            self.check()
        for _ in self.effects:
            if self.held[other].get(effect_id, 0) > generation:
                break
            self.claim(other)
            self.check()
        self.fenced(who, 0, "settle", settlement, chosen=(effect_id, generation))

    def review(self, effect_id: str | None = None) -> None:
        row = self.conn.execute(
            "SELECT effect_id FROM effects WHERE effect_status = 'ambiguous' AND (? IS NULL OR effect_id = ?) "
            "ORDER BY effect_id",
            (effect_id, effect_id),
        ).fetchone()
        if row is None:
            return
        reply = self.run(retry(row[0]))
        assert reply.outcome == "accepted" and reply.receipt["effectStatus"] == "pending", reply

    def step(self, step: tuple) -> None:
        kind = step[0]
        if kind == "claim":
            self.claim(step[1])
        elif kind == "settle":
            self.fenced(step[1], step[2], "settle", step[3])
        elif kind in ("renew", "abandon"):
            self.fenced(step[1], step[2], kind)
        elif kind == "advance":
            self.clock.advance(step[1])
        elif kind == "recover":
            self.recover()
        elif kind == "lapse":
            self.clock.advance(TTL)
            self.check()
            self.recover()
        elif kind == "steal":
            self.steal(step[1], step[2], step[3])
        else:
            self.review()
        self.check()

    def check(self) -> None:
        conn, now = self.conn, self.now()
        assert (
            conn.execute(
                "SELECT effect_id FROM effect_attempts WHERE attempt_status = 'applying' "
                "GROUP BY effect_id HAVING count(*) > 1"
            ).fetchall()
            == []
        )
        for effect_id in self.effects:
            status, count, _, _ = self.status(effect_id)
            current = records.get_lease(conn, effect_id)
            rows = conn.execute(
                "SELECT attempt_number, lease_generation, owner_id, attempt_status FROM effect_attempts "
                "WHERE effect_id = ? ORDER BY attempt_number",
                (effect_id,),
            ).fetchall()
            assert [r[0] for r in rows] == list(range(1, count + 1)), rows
            generations = [r[1] for r in rows]
            assert generations == sorted(set(generations)), rows  # each attempt its own claim generation
            applying = [r for r in rows if r[3] == "applying"]
            held = current is not None and current.owner_id is not None
            # A claim is held exactly while the effect is applying under it (it may have expired) ...
            assert held == (status == "applying"), (effect_id, status, current)
            if status == "applying":
                assert len(applying) == 1 and applying[0][1] == current.lease_generation, (rows, current)
                assert applying[0][2] == current.owner_id
            else:
                assert applying == [], rows
            # ... and a live lease exists only on an applying effect, under its applying attempt.
            if current is not None and current.live(now):
                assert status == "applying" and applying[0][1] == current.lease_generation


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps=st.lists(step_strategy, min_size=1, max_size=30))
def test_two_claimants_competing_for_the_next_due_effect(steps: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        arena = Arena(state_dir)
        try:
            arena.check()
            for step in steps:
                arena.step(step)
        finally:
            arena.close()


def test_a_superseded_claimant_cannot_settle_renew_or_abandon(tmp_path) -> None:
    """The deterministic core of the property: A's claim expires, recovery ends it, B claims next."""
    arena = Arena(str(tmp_path / "state"))
    try:
        effect_id = arena.effects[0]  # idempotent; the other two are planted far in the future
        arena.conn.execute(
            "UPDATE effects SET available_at = available_at + 1000000000 WHERE effect_id != ?", (effect_id,)
        )
        arena.step(("claim", "A"))
        assert arena.held["A"] == {effect_id: 1}
        arena.step(("advance", TTL))
        arena.step(("claim", "B"))  # A's effect is still applying (expired): nothing is due
        assert arena.held["B"] == {}
        arena.step(("recover",))
        arena.step(("claim", "B"))
        assert arena.held["B"] == {effect_id: 2}
        for kind in ("settle", "renew", "abandon"):
            arena.fenced("A", 0, kind, "applied")
        assert arena.superseded_settles == 1
        assert [a[:4] for a in attempts(arena.conn, effect_id)] == [
            (1, 1, POOL_OWNER, "ambiguous"),
            (2, 2, POOL_OWNER, "applying"),
        ]
        arena.fenced("B", 0, "settle", "applied")
        assert arena.status(effect_id)[0] == "applied"
        arena.check()
    finally:
        arena.close()


@pytest.mark.parametrize(
    "policy, effect_status, park_reason",
    [("manual", "ambiguous", "effectAmbiguous"), ("idempotent", "pending", "shutdown")],
)
def test_an_effect_left_applying_by_a_runner_of_a_crashed_server(executor, policy, effect_status, park_reason):
    """Startup recovery records the old epoch's runner as orphaned: the attempt it left applying may
    or may not have acted. A manual effect is never applied again without an operator."""
    run = RunBuilder(executor)
    run.start_action("greet")
    effect_id = run.reserve_effect(policy=policy, performer="runner")
    claimed_ok(executor, "tok-effect", effect_id, ttl_ms=60_000)
    run_group(executor, take_epoch("second-server"))  # the old epoch's claims are dead, though unexpired
    (reply,) = run_group(executor, runner_exited(1, outcome="orphaned", by_server=True))
    assert reply.receipt == {"runId": "run-1", "placement": "parked", "parkReason": park_reason}
    conn = executor.conn
    assert effect_row(conn, effect_id)["effect_status"] == effect_status
    assert [(row[0], row[3], row[4]) for row in attempts(conn, effect_id)] == [(1, "ambiguous", "uncertainAttempt")]

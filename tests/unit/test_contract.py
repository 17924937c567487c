"""The write contract through the group executor (in-process, real SQLite file)."""

from __future__ import annotations

import sqlite3

import pytest

from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer.commands import REGISTRY
from piworkflows.writer.db import GroupFailed
from tests.support import (
    claim_effect,
    client_receipt,
    effect_request,
    reserve,
    run_group,
    settle,
    submitted,
    take_epoch,
)

pytestmark = pytest.mark.timeout(60)


def snapshot(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    """Every row of every table the commands here touch."""
    tables = [
        "resources",
        "leases",
        "events",
        "blobs",
        "effects",
        "effect_attempts",
        "host_commands",
        "workflow_host_state",
        "projects",
    ]
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables}


@pytest.fixture
def claimed(executor):
    """The server resource at revision 2 with one effect claimed by token 'tok' (generation 1)."""
    take, res = run_group(executor, take_epoch(), reserve(1, effect_request("k1")))
    assert take.outcome == res.outcome == "accepted"
    effect_id = res.receipt["effectIds"][0]
    (claim,) = run_group(executor, claim_effect("tok", effect_id))
    assert claim.outcome == "accepted" and claim.receipt["leaseGeneration"] == 1
    return effect_id


def test_accepted_command_writes_revision_event_and_effect(executor):
    take, res = run_group(executor, take_epoch(), reserve(1, effect_request("k1")))
    assert (take.revision, res.revision) == (1, 2)
    conn = executor.conn
    assert conn.execute("SELECT revision FROM resources WHERE resource_id = 'server'").fetchone() == (2,)
    events = conn.execute("SELECT resource_revision, event_type FROM events WHERE resource_id = 'server'").fetchall()
    assert events == [(1, "server.epoch_taken"), (2, "effects.reserved")]
    effect_id = res.receipt["effectIds"][0]
    assert conn.execute(
        "SELECT source_resource_id, source_revision, effect_status FROM effects WHERE effect_id = ?", (effect_id,)
    ).fetchone() == ("server", 2, "pending")


@pytest.mark.parametrize(
    "case, expected_outcome, expected_code",
    [
        ("stale revision", "conflict", "staleRevision"),
        ("wrong token", "claimLost", "claimTokenMismatch"),
        ("old generation", "claimLost", "staleGeneration"),
        ("expired lease", "claimLost", "claimExpired"),
        ("bad transition", "rejected", "invalidTransition"),
        ("actor not allowed", "rejected", "actorNotAllowed"),
    ],
)
def test_each_check_rolls_back_the_middle_command_only(executor, clock, claimed, case, expected_outcome, expected_code):
    effect_id = claimed
    conn = executor.conn
    if case == "stale revision":
        bad = settle(effect_id, 1, "tok", 1)
    elif case == "wrong token":
        bad = settle(effect_id, 2, "other", 1)
    elif case == "old generation":
        bad = settle(effect_id, 2, "tok", 7)
    elif case == "expired lease":
        clock.advance(10_001)
        bad = settle(effect_id, 2, "tok", 1)
    elif case == "bad transition":
        bad = settle(effect_id, 2, "tok", 1, settlement="retry", retry_at=0)
        conn.execute("UPDATE effects SET recovery_policy = 'manual' WHERE effect_id = ?", (effect_id,))
    else:
        bad = settle(effect_id, 2, "tok", 1)
        bad.body["actor"] = {"actor_class": "client"}
    before = snapshot(conn)
    first = submitted("blob.put", {"actor": {"actor_class": "server"}, "blob": BlobValue.of_json("first").model_dump()})
    third = reserve(2, effect_request("k3"))
    r1, r2, r3 = run_group(executor, first, bad, third)
    assert (r1.outcome, r3.outcome) == ("accepted", "accepted")
    assert r2.outcome == expected_outcome and r2.receipt["code"] == expected_code and r2.error
    after = snapshot(conn)
    # The effect, its lease and its attempt are exactly as before: no renewal, no settlement.
    for table in ("leases", "effect_attempts"):
        assert after[table] == before[table]
    assert [row for row in after["effects"] if row[0] == effect_id] == [
        row for row in before["effects"] if row[0] == effect_id
    ]
    assert conn.execute("SELECT revision FROM resources WHERE resource_id = ?", (effect_id,)).fetchone() == (2,)
    # The neighbours committed.
    assert conn.execute("SELECT revision FROM resources WHERE resource_id = 'server'").fetchone() == (3,)
    assert len(after["blobs"]) == len(before["blobs"]) + 2  # 'first' and the k3 payload


def test_failure_after_writes_rolls_back_everything_the_command_wrote(executor):
    """The second effect of one reserve conflicts after the first was written."""
    run_group(executor, take_epoch(), reserve(1, effect_request("k1", {"v": 1})))
    before = snapshot(executor.conn)
    (reply,) = run_group(executor, reserve(2, effect_request("k2", {"v": 2}), effect_request("k1", {"v": "other"})))
    assert reply.outcome == "conflict" and reply.receipt["code"] == "effectKeyConflict"
    assert snapshot(executor.conn) == before


def test_settle_applied_releases_the_claim_but_keeps_the_generation(executor, claimed):
    (reply,) = run_group(executor, settle(claimed, 2, "tok", 1))
    assert reply.outcome == "accepted" and reply.receipt["effectStatus"] == "applied"
    lease = executor.conn.execute(
        "SELECT lease_generation, owner_id, claim_token_hash FROM leases WHERE resource_id = ?", (claimed,)
    ).fetchone()
    assert lease == (1, None, None)
    attempt = executor.conn.execute(
        "SELECT attempt_number, attempt_status, lease_generation FROM effect_attempts WHERE effect_id = ?", (claimed,)
    ).fetchall()
    assert attempt == [(1, "applied", 1)]


def test_retry_gets_new_generation_and_attempt_number(executor, clock, claimed):
    (retry,) = run_group(executor, settle(claimed, 2, "tok", 1, settlement="retry", retry_at=clock.now_ms() + 500))
    assert retry.receipt["effectStatus"] == "pending"
    (early,) = run_group(executor, claim_effect("tok2", claimed))
    assert early.outcome == "rejected" and early.receipt["code"] == "invalidTransition"
    clock.advance(500)
    (again,) = run_group(executor, claim_effect("tok2"))
    assert again.receipt["effectId"] == claimed
    assert (again.receipt["attemptNumber"], again.receipt["leaseGeneration"]) == (2, 2)
    (stale,) = run_group(executor, settle(claimed, 4, "tok", 1))
    assert stale.outcome == "claimLost" and stale.receipt["code"] == "staleGeneration"


def test_retries_exhausted_end_rejected(executor, clock):
    run_group(executor, take_epoch(), reserve(1, effect_request("k1", max_attempts=1)))
    (claim,) = run_group(executor, claim_effect("tok"))
    (reply,) = run_group(executor, settle(claim.receipt["effectId"], 2, "tok", 1, settlement="retry", retry_at=0))
    assert reply.outcome == "accepted"
    assert reply.receipt == {
        "effectId": claim.receipt["effectId"],
        "effectStatus": "rejected",
        "errorCode": "retriesExhausted",
    }


def test_live_claim_cannot_be_taken_twice_but_expired_one_can(executor, clock, claimed):
    # Planted: the effect is pending again while its old claim still lives.
    executor.conn.execute("UPDATE effects SET effect_status = 'pending' WHERE effect_id = ?", (claimed,))
    executor.conn.execute("UPDATE effect_attempts SET attempt_status = 'failed', ended_at = 0")
    (second,) = run_group(executor, claim_effect("tok2", claimed))
    assert second.outcome == "conflict" and second.receipt["code"] == "leaseHeld"
    (none_due,) = run_group(executor, claim_effect("tok2"))
    assert none_due.outcome == "notFound" and none_due.receipt["code"] == "nothingDue"
    clock.advance(10_001)
    (third,) = run_group(executor, claim_effect("tok3", claimed))
    assert third.outcome == "accepted" and third.receipt["leaseGeneration"] == 2


def test_receipts_adopt_same_request_and_conflict_on_other(executor):
    run_group(executor, take_epoch())
    request = reserve(1, effect_request("k1"), receipt=client_receipt("key-1", "request A"))
    (first,) = run_group(executor, request)
    repeat = reserve(1, effect_request("k1"), receipt=client_receipt("key-1", "request A"))
    (adopted,) = run_group(executor, repeat)
    assert first.outcome == "accepted" and adopted.outcome == "adopted"
    assert (adopted.revision, adopted.receipt) == (first.revision, first.receipt)
    other = reserve(2, effect_request("k2"), receipt=client_receipt("key-1", "request B"))
    (conflict,) = run_group(executor, other)
    assert conflict.outcome == "conflict" and conflict.receipt["code"] == "idempotencyKeyReused"
    assert executor.conn.execute("SELECT count(*) FROM host_commands").fetchone() == (1,)
    assert executor.conn.execute("SELECT revision FROM resources WHERE resource_id = 'server'").fetchone() == (2,)


def test_stored_rejection_is_answered_again(executor):
    run_group(executor, take_epoch())
    stale = reserve(5, effect_request("k1"), receipt=client_receipt("key-2", "stale"))
    (first,) = run_group(executor, stale)
    (again,) = run_group(executor, reserve(5, effect_request("k1"), receipt=client_receipt("key-2", "stale")))
    assert first.outcome == again.outcome == "conflict"
    assert first.receipt == again.receipt == {"code": "staleRevision", "resourceId": "server", "revision": 1}
    assert executor.conn.execute("SELECT outcome FROM host_commands").fetchall() == [("conflict",)]


def test_invalid_body_is_rejected_without_touching_the_database(executor):
    before = snapshot(executor.conn)
    bad_digest = BlobValue.of_json({"a": 1}).model_dump()
    bad_digest["data"] = b'{"a":2}'
    replies = run_group(
        executor,
        submitted("blob.put", {"actor": {"actor_class": "server"}, "blob": bad_digest}),
        submitted("blob.put", {"actor": {"actor_class": "server"}, "blob": {**bad_digest, "data": b'{"a": 1}'}}),
        submitted("no.such.command", {}),
        submitted("effect.reserve", {"actor": {"actor_class": "server"}, "token": "s3cret-value"}),
    )
    assert [r.outcome for r in replies] == ["rejected"] * 4
    assert [r.receipt["code"] for r in replies] == [
        "validationFailed",
        "validationFailed",
        "unknownCommand",
        "validationFailed",
    ]
    assert "s3cret-value" not in replies[3].error  # field names only, never values
    assert snapshot(executor.conn) == before


def test_blobs_adopt_identical_content_and_refuse_mismatch(executor):
    value = BlobValue.of_json({"a": 1})
    put = {"actor": {"actor_class": "server"}, "blob": value.model_dump()}
    r1, r2 = run_group(executor, submitted("blob.put", put), submitted("blob.put", put))
    assert (r1.receipt["created"], r2.receipt["created"]) == (True, False)
    # Same digest stored under another media type: the stored row wins, the insert is refused.
    executor.conn.execute("UPDATE blobs SET media_type = 'text/plain;charset=utf-8'")
    (r3,) = run_group(executor, submitted("blob.put", put))
    assert r3.outcome == "rejected" and r3.receipt["code"] == "blobMismatch"
    (part,) = run_group(
        executor,
        submitted("blob.read", {"actor": {"actor_class": "server"}, "digest": value.digest, "offset": 2, "limit": 3}),
    )
    assert part.receipt["data"] == value.data[2:5] and part.receipt["byteLength"] == len(value.data)


def test_error_that_ends_the_transaction_acknowledges_nothing(executor):
    """A full disk (max_page_count) fails the whole group: no reply, nothing kept."""
    run_group(executor, take_epoch())
    before = snapshot(executor.conn)
    pages = executor.conn.execute("PRAGMA page_count").fetchone()[0]
    executor.conn.execute(f"PRAGMA max_page_count = {pages + 1}")
    big = BlobValue.of_text("x" * 200_000).model_dump()
    with pytest.raises(GroupFailed):
        executor.run(
            [
                reserve(1, effect_request("k1")),
                submitted("blob.put", {"actor": {"actor_class": "server"}, "blob": big}),
                reserve(2, effect_request("k2")),
            ]
        )
    assert not executor.conn.in_transaction
    executor.conn.execute("PRAGMA max_page_count = 1073741823")
    assert snapshot(executor.conn) == before


def test_group_stops_at_its_time_bound_and_leaves_the_rest(paths, clock):
    from piworkflows.settings import Settings
    from piworkflows.writer.db import GroupExecutor, open_database

    class TickingClock(type(clock)):
        def monotonic_ms(self) -> int:  # every reading is 10 ms later
            self.advance(10)
            return super().monotonic_ms()

    ticking = TickingClock()
    settings = Settings(group_max_ms=25, group_max_commands=100)
    executor = GroupExecutor(open_database(paths, settings, ticking), settings, ticking)
    items = [
        submitted("blob.put", {"actor": {"actor_class": "server"}, "blob": BlobValue.of_json(i).model_dump()})
        for i in range(6)
    ]
    replies, leftover = executor.run(items)
    assert 1 <= len(replies) < 6 and len(replies) + len(leftover) == 6
    assert [r[0] for r in replies] + [i.corr_id for i in leftover] == [i.corr_id for i in items]
    assert executor.groups_committed == 1


def test_epoch_claim_is_fenced(executor, clock):
    (take,) = run_group(executor, take_epoch("t1", ttl_ms=1000))
    assert take.receipt == {"serverEpoch": 1}
    renew = submitted(
        "server.renew_epoch",
        {
            "actor": {"actor_class": "server"},
            "server_epoch": 1,
            "claim_token_hash": __import__("tests.support").support.token_hash("t1"),
            "ttl_ms": 1000,
        },
    )
    (ok,) = run_group(executor, renew)
    assert ok.outcome == "accepted"
    (take2,) = run_group(executor, take_epoch("t2"))
    assert take2.receipt == {"serverEpoch": 2}
    stale = submitted("server.renew_epoch", {**renew.body})
    (lost,) = run_group(executor, stale)
    assert lost.outcome == "claimLost" and lost.receipt["code"] == "staleServerEpoch"


def test_claims_of_an_older_server_epoch_are_dead(executor, claimed):
    """A newer epoch fences every claim taken before it, even a live one with the right token."""
    (take2,) = run_group(executor, take_epoch("second-server"))
    assert take2.receipt == {"serverEpoch": 2}
    (old,) = run_group(executor, settle(claimed, 2, "tok", 1, server_epoch=1))
    assert old.outcome == "claimLost" and old.receipt["code"] == "staleServerEpoch"
    (current,) = run_group(executor, settle(claimed, 2, "tok", 1, server_epoch=2))
    assert current.outcome == "accepted"


def test_a_handler_bug_answers_only_its_own_command(executor, monkeypatch):
    """An unexpected exception in one handler leaves no trace and the group commits the rest."""

    def broken(tx, cmd):
        tx.conn.execute("INSERT INTO projects VALUES ('p-broken', '/broken', 0)")
        raise KeyError("bug")

    monkeypatch.setattr(REGISTRY["project.ensure"], "execute", broken)
    good = submitted("blob.put", {"actor": {"actor_class": "server"}, "blob": BlobValue.of_json("ok").model_dump()})
    bad = submitted("project.ensure", {"actor": {"actor_class": "server"}, "canonical_path": "/broken"})
    r1, r2 = run_group(executor, bad, good)
    assert r1.outcome == "rejected" and r1.receipt == {"code": "internalError"}
    assert r2.outcome == "accepted"
    assert executor.conn.execute("SELECT count(*) FROM projects").fetchone() == (0,)

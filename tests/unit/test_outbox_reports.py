"""A worker's report is deduplicated through worker_messages: a repeat is harmless."""

from __future__ import annotations

import hashlib

import pytest

from piworkflows.protocol.internal.base import BlobValue
from tests.support import claim_effect, effect_request, reserve, run_group, settle, take_epoch

pytestmark = pytest.mark.timeout(30)


def report_key(effect_id: str, generation: int, report: bytes) -> dict:
    """What the pool attaches to effect.settle (supervisor/outbox.py)."""
    return {
        "sender_scope": effect_id,
        "message_kind": "effect.settle",
        "message_id": f"{generation}:settle",
        "fingerprint": hashlib.sha256(report).digest(),
        "run_id": None,
    }


def test_a_repeated_worker_report_is_adopted_and_changes_nothing(executor):
    _, reserved = run_group(executor, take_epoch(), reserve(1, effect_request("k1")))
    effect_id = reserved.receipt["effectIds"][0]
    (claimed,) = run_group(executor, claim_effect("tok"))
    assert claimed.outcome == "accepted" and claimed.receipt["effectId"] == effect_id
    generation = claimed.receipt["leaseGeneration"]
    result = BlobValue.of_json({"output": {"status": 200}, "nodeOutcome": "ok"}).model_dump()
    key = report_key(effect_id, generation, b"report-1")
    (first,) = run_group(
        executor, settle(effect_id, claimed.revision, "tok", generation, result=result, worker_message=key)
    )
    assert first.outcome == "accepted" and first.receipt["effectStatus"] == "applied"
    conn = executor.conn
    before = conn.execute("SELECT * FROM effects").fetchall(), conn.execute("SELECT * FROM effect_attempts").fetchall()
    events = conn.execute("SELECT count(*) FROM events").fetchone()[0]

    (again,) = run_group(
        executor, settle(effect_id, claimed.revision, "tok", generation, result=result, worker_message=key)
    )
    assert again.outcome == "adopted" and again.receipt == first.receipt and again.revision == first.revision
    after = conn.execute("SELECT * FROM effects").fetchall(), conn.execute("SELECT * FROM effect_attempts").fetchall()
    assert after == before and conn.execute("SELECT count(*) FROM events").fetchone()[0] == events

    other = report_key(effect_id, generation, b"another report")  # the same message id, other content
    (conflict,) = run_group(
        executor, settle(effect_id, claimed.revision, "tok", generation, settlement="rejected", worker_message=other)
    )
    assert conflict.outcome == "conflict" and conflict.receipt["code"] == "idempotencyKeyReused"
    assert (
        conn.execute("SELECT * FROM effects").fetchall(),
        conn.execute("SELECT * FROM effect_attempts").fetchall(),
    ) == before

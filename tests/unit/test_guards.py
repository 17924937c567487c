"""Critical checks of the write path that no other fast test pins down on its own (each is named
by a planted bug in stress/planted/mutants.py; docs/TESTING.md, "What the fast tests guard").

Everything runs through a real ``GroupExecutor`` on a FakeClock against a real SQLite file."""

from __future__ import annotations

import sqlite3
import sys

import pytest

from piworkflows.errors import CommandError
from piworkflows.performers import shell
from piworkflows.protocol.internal.nodes import attempt_id_of
from piworkflows.writer import records
from tests.support import (
    claim_effect,
    claim_run,
    effect_request,
    effect_row,
    node_start,
    reserve,
    run_create,
    run_group,
    runner_exited,
    settle,
    submitted,
    take_epoch,
)

pytestmark = pytest.mark.timeout(30)

CLIENT = {"actor_class": "client", "actor_id": "client-1"}
RUNNER = {"actor_class": "runner"}


def revision(conn: sqlite3.Connection, resource_id: str) -> int:
    return conn.execute("SELECT revision FROM resources WHERE resource_id = ?", (resource_id,)).fetchone()[0]


# --- revision compare ---------------------------------------------------------------------------


def test_increment_revision_compares_before_it_increments(executor, clock):
    run_group(executor, take_epoch())
    conn = executor.conn
    with pytest.raises(CommandError) as refused:
        records.increment_revision(conn, "server", 7, clock.now_ms())
    assert refused.value.code == "staleRevision"
    assert revision(conn, "server") == 1
    assert records.increment_revision(conn, "server", 1, clock.now_ms()) == 2


def test_a_client_control_command_at_an_older_run_revision_is_a_conflict(executor):
    run_group(executor, take_epoch(), run_create("run-1"), claim_run())
    conn = executor.conn
    assert revision(conn, "run-1") == 2  # created, then claimed
    (stale,) = run_group(
        executor, submitted("run.cancel", {"actor": CLIENT, "run_id": "run-1", "expected_revision": 1})
    )
    assert stale.outcome == "conflict" and stale.receipt["code"] == "staleRevision"
    assert conn.execute("SELECT status FROM runs WHERE run_id = 'run-1'").fetchone() == ("running",)
    (current,) = run_group(
        executor, submitted("run.cancel", {"actor": CLIENT, "run_id": "run-1", "expected_revision": 2})
    )
    assert current.outcome == "accepted" and current.revision == 3


# --- idempotency fingerprint -------------------------------------------------------------------------


def test_a_repeated_effect_request_adopts_its_effect(executor):
    (_, first) = run_group(executor, take_epoch(), reserve(1, effect_request("k1", {"v": 1})))
    (again,) = run_group(executor, reserve(2, effect_request("k1", {"v": 1})))
    assert again.outcome == "accepted" and again.receipt["effectIds"] == first.receipt["effectIds"]
    assert executor.conn.execute("SELECT count(*) FROM effects").fetchone() == (1,)


# --- lease expiry -----------------------------------------------------------------------------


def test_a_claim_is_dead_at_its_expiry_instant(executor, clock):
    (_, reserved) = run_group(executor, take_epoch(), reserve(1, effect_request("k1")))
    (effect_id,) = reserved.receipt["effectIds"]
    (claimed,) = run_group(executor, claim_effect("tok", effect_id, ttl_ms=10_000))
    assert claimed.outcome == "accepted"
    clock.advance(10_000)  # now == expires_at
    (late,) = run_group(executor, settle(effect_id, 2, "tok", 1))
    assert late.outcome == "claimLost" and late.receipt["code"] == "claimExpired"
    assert effect_row(executor.conn, effect_id)["effect_status"] == "applying"


# --- node attempt numbering ---------------------------------------------------------------------


def test_an_interrupted_visit_takes_a_new_attempt_number_and_id(executor):
    conn = executor.conn
    run_group(executor, take_epoch(), run_create("run-1"), claim_run())
    (first,) = run_group(executor, node_start(conn, 1, generation=1))
    assert first.outcome == "accepted" and first.receipt["attemptId"] == attempt_id_of("run-1", "greet", 1, 1)
    run_group(executor, runner_exited(1, outcome="crashed"))  # the attempt is interrupted, the run requeued
    (again,) = run_group(executor, claim_run())
    assert again.receipt["leaseGeneration"] == 2
    (reused,) = run_group(executor, node_start(conn, 1, generation=2))
    assert reused.outcome == "rejected" and reused.receipt["code"] == "invalidTransition"
    (second,) = run_group(executor, node_start(conn, 2, generation=2))
    assert second.outcome == "accepted"
    assert second.receipt["attemptId"] == attempt_id_of("run-1", "greet", 1, 2) != first.receipt["attemptId"]
    rows = conn.execute(
        "SELECT attempt_number, attempt_status FROM node_attempts WHERE run_id = 'run-1' ORDER BY attempt_number"
    ).fetchall()
    assert rows == [(1, "interrupted"), (2, "running")]


# --- ambiguous on crash (also test_outbox_writer.py: an effect a crashed server's runner left applying)


@pytest.mark.parametrize("policy, settlement", [("manual", "ambiguous"), ("idempotent", "applied")])
def test_a_shell_command_that_timed_out_may_have_acted(policy, settlement):
    """Killed at its timeout, a command may have done its work: a manual effect becomes ambiguous
    (never repeated on its own); an idempotent one records the node's timed_out outcome."""
    sleeper = {"command": sys.executable, "args": ["-c", "import time; time.sleep(30)"], "timeoutMs": 100}
    payload = shell.payload(sleeper, max_output_chars=100, allow_non_zero_exit=False)
    outcome = shell.ShellPerformer(stream_max_bytes=1 << 20).perform(payload, "key-1", policy, lambda pid: True)
    assert outcome.settlement == settlement
    if policy == "manual":
        assert outcome.error_code == "timedOut"
    else:
        assert outcome.result["nodeOutcome"] == "timed_out"


# --- reply after commit ------------------------------------------------------------------------------


def test_a_group_is_committed_when_its_replies_are_returned(executor, paths):
    take, created = run_group(executor, take_epoch(), run_create("run-1"))
    assert take.outcome == created.outcome == "accepted"
    assert not executor.conn.in_transaction
    other = sqlite3.connect(f"{paths.database.absolute().as_uri()}?mode=ro", uri=True)
    try:
        assert other.execute("SELECT run_id, status FROM runs").fetchall() == [("run-1", "queued")]
    finally:
        other.close()

"""Runner lifecycle at the writer: admission, runner identity, exits and the respawn rules."""

from __future__ import annotations

import pytest

from tests.support import (
    SERVER,
    claim_run,
    node_start,
    run_create,
    run_group,
    run_state,
    runner_exited,
    submitted,
    take_epoch,
    token_hash,
)

pytestmark = pytest.mark.timeout(60)


def claimable(executor):
    (reply,) = run_group(executor, submitted("run.claimable", {"actor": SERVER}))
    return reply.receipt["runIds"]


@pytest.fixture
def queued(executor):
    run_group(executor, take_epoch(), run_create("run-1"))
    return executor


def test_claim_takes_a_new_generation_and_records_the_runner_before_spawn(queued):
    assert claimable(queued) == ["run-1"]
    (reply,) = run_group(queued, claim_run())
    assert reply.outcome == "accepted" and reply.revision == 2
    assert reply.receipt == {"runId": "run-1", "runnerEpoch": 1, "leaseGeneration": 1}
    assert run_state(queued) == (("running", "starting", True, True), None)
    conn = queued.conn
    assert conn.execute("SELECT start_revision, pid, launch_command FROM run_workers").fetchall() == [
        (2, None, "start")
    ]
    assert conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone() == (2,)
    assert conn.execute("SELECT started_at IS NOT NULL FROM runs").fetchone() == (1,)
    events = conn.execute(
        "SELECT event_type, lease_generation FROM events WHERE resource_id = 'run-1' ORDER BY resource_revision"
    ).fetchall()
    assert events == [("run.queued", None), ("run.claimed", 1)]
    assert claimable(queued) == []
    (twice,) = run_group(queued, claim_run("other"))
    assert twice.outcome == "conflict" and twice.receipt["code"] == "leaseHeld"


def test_a_claim_names_the_current_epoch(queued):
    (stale,) = run_group(queued, claim_run(epoch=7))
    assert stale.outcome == "claimLost" and stale.receipt["code"] == "staleServerEpoch"
    assert run_state(queued)[0] == ("queued", "queued", False, False)


def test_runner_identity_is_recorded_under_the_live_claim(queued):
    run_group(queued, claim_run())
    body = {
        "actor": SERVER,
        "run_id": "run-1",
        "runner_epoch": 1,
        "pid": 4242,
        "process_started_at": 5,
        "claim": {
            "server_epoch": 1,
            "owner_id": "server-1",
            "claim_token_hash": token_hash("tok"),
            "lease_generation": 1,
            "ttl_ms": 10_000,
        },
    }
    wrong = {**body, "claim": {**body["claim"], "claim_token_hash": token_hash("nope")}}
    (refused,) = run_group(queued, submitted("runner.spawned", wrong))
    assert refused.outcome == "claimLost" and refused.receipt["code"] == "claimTokenMismatch"
    (ok,) = run_group(queued, submitted("runner.spawned", body))
    assert ok.outcome == "accepted"
    (again,) = run_group(queued, submitted("runner.spawned", body))
    assert again.outcome == "rejected" and again.receipt["code"] == "invalidTransition"
    assert queued.conn.execute("SELECT pid, process_started_at FROM run_workers").fetchall() == [(4242, 5)]


def test_a_runner_that_exits_before_progress_parks_the_run(queued):
    run_group(queued, claim_run())
    (reply,) = run_group(queued, runner_exited(1))
    assert reply.receipt == {"runId": "run-1", "placement": "parked", "parkReason": "runnerNoProgress"}
    assert run_state(queued) == (("running", "parked", False, False), "runnerNoProgress")
    assert queued.conn.execute("SELECT lease_generation, owner_id FROM leases").fetchall() == [(1, None)]
    assert queued.conn.execute("SELECT outcome FROM run_workers").fetchall() == [("exited",)]
    assert claimable(queued) == []  # not restarted automatically
    (refused,) = run_group(queued, claim_run("tok2"))
    assert refused.outcome == "rejected" and refused.receipt["code"] == "invalidTransition"


def test_a_runner_that_dies_after_progress_requeues_with_a_new_generation(queued):
    run_group(queued, claim_run())
    queued.conn.execute("UPDATE resources SET revision = revision + 1 WHERE resource_id = 'run-1'")  # planted progress
    (reply,) = run_group(queued, runner_exited(1, outcome="crashed"))
    assert reply.receipt["placement"] == "requeued"
    assert run_state(queued) == (("queued", "queued", False, False), None)
    (again,) = run_group(queued, claim_run("tok2", command="resume"))
    assert again.receipt["leaseGeneration"] == 2 and again.receipt["runnerEpoch"] == 2


@pytest.mark.parametrize("outcome", ["cancelled", "orphaned"])
def test_a_runner_stopped_by_the_server_never_counts_as_no_progress(queued, outcome):
    run_group(queued, claim_run())
    (reply,) = run_group(queued, runner_exited(1, outcome=outcome, by_server=True))
    assert reply.receipt["parkReason"] == "shutdown"
    assert run_state(queued) == (("running", "parked", False, False), "shutdown")
    assert claimable(queued) == ["run-1"]  # resumed by the next start
    (resumed,) = run_group(queued, claim_run("tok2", command="start"))
    assert resumed.outcome == "accepted" and run_state(queued)[1] is None
    launches = queued.conn.execute("SELECT launch_command FROM run_workers ORDER BY runner_epoch").fetchall()
    assert launches == [("start",), ("resume",)]  # a run that ran before resumes


def test_a_paused_run_parks_paused_and_is_not_claimed(queued):
    run_group(queued, claim_run())
    queued.conn.execute("UPDATE runs SET paused = 1")
    (reply,) = run_group(queued, runner_exited(1, by_server=True))
    assert reply.receipt["parkReason"] == "paused"
    assert claimable(queued) == []


def test_an_exit_record_needs_the_exact_live_runner(queued):
    run_group(queued, claim_run())
    (wrong,) = run_group(queued, runner_exited(99))
    assert wrong.outcome == "rejected" and wrong.receipt["code"] == "invalidTransition"
    run_group(queued, runner_exited(1))
    (twice,) = run_group(queued, runner_exited(1))
    assert twice.outcome == "rejected"


def test_a_terminal_run_keeps_its_state_when_its_runner_exits(queued):
    run_group(queued, claim_run())
    queued.conn.execute("UPDATE runs SET status = 'completed', finished_at = 1")
    queued.conn.execute("UPDATE run_queue SET queue_status = 'done'")
    (reply,) = run_group(queued, runner_exited(1))
    assert reply.receipt == {"runId": "run-1", "placement": "finished"}
    assert run_state(queued) == (("completed", "done", False, False), None)


def test_startup_recovery_finds_runners_of_older_epochs(queued):
    run_group(queued, claim_run())
    run_group(queued, take_epoch("second"))
    (orphans,) = run_group(queued, submitted("runner.orphans", {"actor": SERVER, "server_epoch": 2}))
    assert orphans.receipt == {"runners": [{"runId": "run-1", "runnerEpoch": 1}]}
    # The old claim is still unexpired, but a new epoch fences it; the exit record frees the run.
    (reply,) = run_group(queued, runner_exited(1, outcome="orphaned", by_server=True))
    assert reply.receipt["parkReason"] == "shutdown"
    (claimed,) = run_group(queued, claim_run("tok2", epoch=2, command="resume"))
    assert claimed.outcome == "accepted" and claimed.receipt["leaseGeneration"] == 2


def test_a_dead_runner_park_detail_is_kept_with_a_no_progress_park_and_shown_in_the_view(queued):
    from piworkflows.protocol.internal.base import BlobValue

    run_group(queued, claim_run())
    died = runner_exited(1, outcome="crashed")
    died.body["park_detail"] = BlobValue.of_text("ValueError: x").model_dump()
    (reply,) = run_group(queued, died)
    assert reply.receipt["parkReason"] == "runnerNoProgress"
    (payload,) = queued.conn.execute(
        "SELECT b.bytes FROM events e JOIN blobs b ON b.digest = e.payload_digest WHERE e.event_type = 'runner.exited'"
    ).fetchone()
    assert payload == b"ValueError: x"
    (view,) = run_group(queued, submitted("run.get", {"actor": SERVER, "run_id": "run-1"}))
    assert view.receipt["piworkflows"]["parkDetail"] == "ValueError: x"
    assert queued.conn.execute("SELECT park_reason FROM runs").fetchone() == ("runnerNoProgress",)  # the closed set
    (resumed,) = run_group(queued, submitted("run.resume", {"actor": {"actor_class": "client"}, "run_id": "run-1"}))
    assert resumed.outcome == "accepted"
    (view,) = run_group(queued, submitted("run.get", {"actor": SERVER, "run_id": "run-1"}))
    assert view.receipt["piworkflows"]["parkDetail"] is None  # queued again: no park to explain


def test_a_park_detail_is_short_text_and_only_kept_with_a_no_progress_park(queued):
    from piworkflows.protocol.internal.base import BlobValue

    run_group(queued, claim_run())
    long = runner_exited(1, outcome="crashed")
    long.body["park_detail"] = BlobValue.of_text("x" * 1025).model_dump()
    (refused,) = run_group(queued, long)
    assert refused.outcome == "rejected" and refused.receipt["code"] == "validationFailed"
    queued.conn.execute("UPDATE resources SET revision = revision + 1 WHERE resource_id = 'run-1'")  # planted progress
    died = runner_exited(1, outcome="crashed")
    died.body["park_detail"] = BlobValue.of_text("ValueError: x").model_dump()
    (requeued,) = run_group(queued, died)
    assert requeued.receipt["placement"] == "requeued"
    assert queued.conn.execute("SELECT count(*) FROM events WHERE payload_digest IS NOT NULL").fetchone() == (0,)


# --- a runner that keeps dying at one node (a node that ends its own process) -------------------


def _die_at_greet(executor, clock, attempt: int, **exit_args):
    """One launch that starts greet's next attempt and dies there; the reply to its exit."""
    (claimed,) = run_group(executor, claim_run())
    assert claimed.outcome == "accepted", claimed
    generation, epoch = claimed.receipt["leaseGeneration"], claimed.receipt["runnerEpoch"]
    (started,) = run_group(executor, node_start(executor.conn, attempt, generation))
    assert started.outcome == "accepted", started
    (exited,) = run_group(executor, runner_exited(epoch, outcome="crashed", **exit_args))
    return exited


def test_a_death_at_a_node_requeues_after_a_doubling_backoff_then_parks_with_the_count(queued, clock):
    exits = dict(crash_backoff_ms=1000, crash_limit=3, park_detail="the runner exited with code 3")
    first = _die_at_greet(queued, clock, 1, **exits)
    assert first.receipt["placement"] == "requeued" and first.receipt["deaths"] == 1
    assert first.receipt["availableAt"] == clock.now_ms() + 1000
    assert claimable(queued) == []  # it waits out the backoff
    clock.advance(999)
    assert claimable(queued) == []
    clock.advance(1)
    assert claimable(queued) == ["run-1"]
    second = _die_at_greet(queued, clock, 2, **exits)
    assert second.receipt["deaths"] == 2 and second.receipt["availableAt"] == clock.now_ms() + 2000
    clock.advance(2000)
    third = _die_at_greet(queued, clock, 3, **exits)
    assert third.receipt == {"runId": "run-1", "placement": "parked", "parkReason": "runnerNoProgress"}
    assert run_state(queued)[1] == "runnerNoProgress"
    (digest,) = queued.conn.execute(
        "SELECT payload_digest FROM events WHERE event_type = 'runner.exited' ORDER BY resource_revision DESC LIMIT 1"
    ).fetchone()
    (detail,) = queued.conn.execute("SELECT bytes FROM blobs WHERE digest = ?", (digest,)).fetchone()
    assert detail.decode() == "the runner exited with code 3 (3 times in a row at node 'greet')"
    clock.advance(60_000)
    assert claimable(queued) == []  # parked: only an operator's resume goes on


def test_a_death_at_another_node_visit_starts_the_count_again(queued, clock):
    exits = dict(crash_backoff_ms=0, crash_limit=2)
    assert _die_at_greet(queued, clock, 1, **exits).receipt["placement"] == "requeued"
    (claimed,) = run_group(queued, claim_run())
    (started,) = run_group(queued, node_start(queued.conn, 1, claimed.receipt["leaseGeneration"], node_path="tell"))
    assert started.outcome == "accepted"
    (exited,) = run_group(queued, runner_exited(claimed.receipt["runnerEpoch"], outcome="crashed", **exits))
    assert exited.receipt["placement"] == "requeued" and exited.receipt["deaths"] == 1


def test_a_runner_the_server_stopped_is_no_death(queued, clock):
    for attempt in (1, 2, 3):
        (claimed,) = run_group(queued, claim_run())
        run_group(queued, node_start(queued.conn, attempt, claimed.receipt["leaseGeneration"]))
        (exited,) = run_group(queued, runner_exited(claimed.receipt["runnerEpoch"], outcome="exited", crash_limit=1))
        assert exited.receipt["placement"] == "requeued" and "deaths" not in exited.receipt

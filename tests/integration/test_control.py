"""Run control end to end: pause, resume, cancel and restart against a real server (WORKFLOWS.md, Run lifecycle)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.engine_util import (
    BLOCKING,
    CHECKPOINT,
    TENSTEP,
    blocked_in_wait,
    start,
    start_blocked,
    start_waiting,
    view,
    wait_status,
    write,
)
from tests.server_util import SCHEDULER_TICK, ServerProcess, check_state, gone, query, serving, stays, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


# Fails until its flag file exists: a failed run that a restart (same source, same input) can finish.
FLAKY = """
import os
from piworkflows.workflows import compute, define_workflow
def check(ctx):
    if not os.path.exists(ctx.input["flag"]):
        raise RuntimeError("the flag is missing")
    return {"ok": True}
workflow = define_workflow("flaky", "check", {"check": compute(check)})
"""

BOOM = """
from piworkflows.workflows import compute, define_workflow
workflow = define_workflow("boom", "a", {"a": compute(lambda ctx: 1 / 0)})
"""


CLIENT_ID = "client-control-tests"  # one client id: an idempotency key is scoped to its client


def control(server: ServerProcess, operation: str, run_id: str, key: str | None = None, revision: int | None = None):
    with server.client(client_id=CLIENT_ID) as client:
        return client.request(operation, {}, run_id=run_id, idempotency_key=key, expected_revision=revision)


def run_row(state_dir: Path, run_id: str) -> tuple:
    """(runs.status, paused, park_reason, queue_status)."""
    return query(
        state_dir,
        "SELECT r.status, r.paused, r.park_reason, q.queue_status FROM runs r "
        "JOIN run_queue q USING (run_id) WHERE run_id = ?",
        run_id,
    )[0]


def live_workers(state_dir: Path, run_id: str) -> list[tuple]:
    """(runner_epoch, pid) of the run's live runner record, if any."""
    return query(state_dir, "SELECT runner_epoch, pid FROM run_workers WHERE run_id = ? AND ended_at IS NULL", run_id)


def runner_count(state_dir: Path, run_id: str) -> int:
    return query(state_dir, "SELECT count(*) FROM run_workers WHERE run_id = ?", run_id)[0][0]


def test_pause_mid_node_parks_the_run_and_resume_reruns_only_the_interrupted_node(tmp_path, server, project):
    flag = tmp_path / "flag"
    run_id = start_blocked(server, project, flag)
    (pid,) = query(server.state_dir, "SELECT pid FROM run_workers WHERE run_id = ? AND ended_at IS NULL", run_id)[0]
    assert pid is not None and not gone(pid)

    paused = control(server, "run.pause", run_id)
    assert paused.outcome == "accepted", paused
    assert paused.receipt == {"runId": run_id, "status": "running", "paused": True}
    shown = view(server, run_id)
    assert shown["display"]["status"] == "paused" and shown["display"]["controls"] == ["resume", "cancel"]
    assert shown["state"]["paused"] is True and shown["piworkflows"]["parkReason"] == "paused"
    # All of it committed with the receipt: parked, claim released, runner record ended, attempt interrupted.
    assert run_row(server.state_dir, run_id) == ("running", 1, "paused", "parked")
    assert query(server.state_dir, "SELECT owner_id FROM leases WHERE resource_id = ?", run_id) == [(None,)]
    assert query(
        server.state_dir, "SELECT outcome FROM run_workers WHERE run_id = ? AND ended_at IS NOT NULL", run_id
    ) == [("cancelled",)]
    assert query(
        server.state_dir, "SELECT count(*) FROM run_workers WHERE run_id = ? AND ended_at IS NULL", run_id
    ) == [(0,)]
    assert query(
        server.state_dir,
        "SELECT attempt_status, error_code FROM node_attempts WHERE run_id = ? AND node_path = 'wait'",
        run_id,
    ) == [("interrupted", "paused")]
    wait_until(lambda: gone(pid), what="the paused run's runner gone")
    # A paused run is not admitted again: no new runner record while it stays paused.
    stays(
        lambda: runner_count(server.state_dir, run_id) == 1 and view(server, run_id)["display"]["status"] == "paused",
        what="paused without a runner",
    )
    check_state(server.state_dir)

    flag.write_text("go")
    resumed = control(server, "run.resume", run_id)
    assert resumed.outcome == "accepted", resumed
    assert resumed.receipt == {"runId": run_id, "status": "queued", "paused": False}
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"done": True}
    steps = [(s["nodeId"], s["visit"], s["attempt"], s["status"]) for s in done["state"]["steps"]]
    assert steps == [
        ("first", 1, 1, "completed"),
        ("wait", 1, 1, "interrupted"),
        ("wait", 1, 2, "completed"),
        ("last", 1, 1, "completed"),
    ]
    # The finished node ran once: one attempt, one step, one output.
    assert query(
        server.state_dir, "SELECT count(*) FROM node_attempts WHERE run_id = ? AND node_path = 'first'", run_id
    ) == [(1,)]
    workers = query(
        server.state_dir,
        "SELECT launch_command, outcome, ended_at IS NOT NULL FROM run_workers WHERE run_id = ? ORDER BY runner_epoch",
        run_id,
    )
    assert [w[0] for w in workers] == ["start", "resume"] and workers[0][1] == "cancelled"
    assert all(w[2] for w in workers)
    assert run_row(server.state_dir, run_id) == ("completed", 0, None, "done")
    check_state(server.state_dir)


def test_pause_while_waiting_at_a_checkpoint_holds_an_answered_run_until_resumed(server, project):
    run_id = start_waiting(server, project)
    runners = runner_count(server.state_dir, run_id)

    paused = control(server, "run.pause", run_id)
    assert paused.outcome == "accepted" and paused.receipt == {"runId": run_id, "status": "waiting", "paused": True}
    shown = view(server, run_id)
    assert shown["display"]["status"] == "paused" and shown["display"]["controls"] == ["resume", "cancel"]
    assert run_row(server.state_dir, run_id) == ("waiting", 1, None, "parked")
    # Resumed without an answer, it waits again for its checkpoint.
    resumed = control(server, "run.resume", run_id)
    assert resumed.outcome == "accepted" and resumed.receipt == {"runId": run_id, "status": "waiting", "paused": False}
    assert view(server, run_id)["display"]["controls"] == ["pause", "cancel", "answer"]
    assert run_row(server.state_dir, run_id) == ("waiting", 0, None, "parked")

    assert control(server, "run.pause", run_id).outcome == "accepted"
    with server.client() as client:
        answer = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id)
    assert answer.outcome == "accepted" and answer.receipt["status"] == "queued"
    # Answered but paused: queued and flagged, never admitted.
    stays(
        lambda: (
            run_row(server.state_dir, run_id) == ("queued", 1, None, "queued")
            and runner_count(server.state_dir, run_id) == runners
        ),
        what="answered run held by the pause",
    )
    assert view(server, run_id)["display"]["status"] == "paused"
    check_state(server.state_dir)

    resumed = control(server, "run.resume", run_id)
    assert resumed.outcome == "accepted" and resumed.receipt == {"runId": run_id, "status": "queued", "paused": False}
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {"answered": True}
    assert [s["nodeId"] for s in done["state"]["steps"]] == ["prepare", "ask", "yes"]
    check_state(server.state_dir)


def test_pause_of_a_queued_run_is_a_durable_flag_that_survives_a_server_restart(tmp_path, project):
    write(project, "tenstep", TENSTEP)
    with serving(tmp_path / "s", env={**SCHEDULER_TICK, "PI_WORKFLOWS_MAX_RUNNERS": "0"}) as server:
        kept, resumed_early = start(server, project, "tenstep"), start(server, project, "tenstep")
        for run_id in (kept, resumed_early):
            paused = control(server, "run.pause", run_id)
            assert paused.outcome == "accepted"
            assert paused.receipt == {"runId": run_id, "status": "queued", "paused": True}
            assert run_row(server.state_dir, run_id) == ("queued", 1, None, "queued")
            shown = view(server, run_id)
            assert shown["display"]["status"] == "paused" and shown["display"]["controls"] == ["resume", "cancel"]
        resumed = control(server, "run.resume", resumed_early)
        assert resumed.outcome == "accepted"
        assert resumed.receipt == {"runId": resumed_early, "status": "queued", "paused": False}
        assert run_row(server.state_dir, resumed_early) == ("queued", 0, None, "queued")
        shown = view(server, resumed_early)
        assert shown["display"]["status"] == "queued" and shown["display"]["controls"] == ["cancel"]
        assert query(server.state_dir, "SELECT count(*) FROM run_workers") == [(0,)]

    server = ServerProcess(tmp_path / "s", env=SCHEDULER_TICK).start()  # now with runners
    try:
        done = wait_status(server, resumed_early, "completed", "failed")
        assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {
            "kind": "final",
            "message": "sum=36",
        }
        stays(
            lambda: runner_count(server.state_dir, kept) == 0 and view(server, kept)["display"]["status"] == "paused",
            what="the paused run held across the restart",
        )
        assert control(server, "run.resume", kept).receipt == {"runId": kept, "status": "queued", "paused": False}
        assert wait_status(server, kept, "completed", "failed")["display"]["status"] == "completed"
    finally:
        server.stop()
    check_state(server.state_dir)


def test_pause_during_admission_and_back_to_back_pause_resume(tmp_path, server, project):
    """A pause that lands while the run is being admitted (claim taken, runner starting or at its first node)
    parks it just the same; a resume right behind a pause (the old runner still stopping) starts one new runner."""
    write(project, "blocking", BLOCKING)
    flag = tmp_path / "flag"
    flag.write_text("go")  # the wait node finishes as soon as it runs
    for round_ in range(6):
        run_id = start(server, project, "blocking", {"flag": str(flag)})
        with server.client(client_id=CLIENT_ID) as client:
            assert client.request("server.status").outcome == "accepted"  # connected before the race
            if round_ % 2:
                wait_until(lambda run_id=run_id: runner_count(server.state_dir, run_id), interval=0.001, what="claimed")
            paused = client.request("run.pause", {}, run_id=run_id)
        if paused.outcome == "conflict":  # it completed first
            assert paused.receipt["code"] == "winnerDecided" and paused.receipt["status"] == "completed"
            continue
        assert paused.outcome == "accepted", paused
        assert paused.receipt["status"] in ("queued", "running") and paused.receipt["paused"] is True
        wait_until(lambda: active_runners(server) == 0, what="no active runner")
        assert view(server, run_id)["display"]["status"] == "paused"
        assert query(
            server.state_dir, "SELECT count(*) FROM run_workers WHERE run_id = ? AND ended_at IS NULL", run_id
        ) == [(0,)]
        check_state(server.state_dir)
        assert control(server, "run.resume", run_id).outcome == "accepted"
        done = wait_status(server, run_id, "completed", "failed")
        assert done["display"]["status"] == "completed", done["state"].get("error")
        finished = [s["nodeId"] for s in done["state"]["steps"] if s["status"] == "completed"]
        assert finished == ["first", "wait", "last"]  # interrupted attempts aside, each node finished once
    check_state(server.state_dir)

    blocked = tmp_path / "blocked"
    run_id = start(server, project, "blocking", {"flag": str(blocked)})
    for _ in range(4):
        wait_until(lambda: blocked_in_wait(server, run_id), what="the wait node running")
        with server.client(client_id=CLIENT_ID) as client:
            assert client.request("run.pause", {}, run_id=run_id).outcome == "accepted"
            assert client.request("run.resume", {}, run_id=run_id).receipt["status"] == "queued"
        check_state(server.state_dir)
    wait_until(lambda: blocked_in_wait(server, run_id), what="the wait node running")
    workers = query(
        server.state_dir, "SELECT pid, outcome FROM run_workers WHERE run_id = ? ORDER BY runner_epoch", run_id
    )
    assert [w[1] for w in workers] == ["cancelled"] * 4 + [None]  # one live runner, the stopped ones ended
    wait_until(lambda: all(gone(pid) for pid, _ in workers[:-1]), what="the stopped runners gone")
    blocked.write_text("go")
    done = wait_status(server, run_id, "completed", "failed")
    assert [(s["nodeId"], s["status"]) for s in done["state"]["steps"]] == (
        [("first", "completed")] + [("wait", "interrupted")] * 4 + [("wait", "completed"), ("last", "completed")]
    )
    check_state(server.state_dir)


# Its runner dies on import (exit 3) until the flag file exists; the resolver (argv "resolve") compiles it fine.
CRASHY = """
import os, sys
from piworkflows.workflows import compute, define_workflow
if sys.argv[-1] == "run" and not os.path.exists(%r):
    os._exit(3)
workflow = define_workflow("crashy", "a", {"a": compute(lambda ctx: {"ok": True})})
"""


def test_resume_of_a_run_parked_for_no_progress(tmp_path, server, project):
    flag = tmp_path / "fixed"
    write(project, "crashy", CRASHY % str(flag))
    run_id = start(server, project, "crashy")
    parked = wait_until(lambda: (v := view(server, run_id))["piworkflows"]["parkReason"] and v, what="parked")
    assert parked["display"] == {
        "status": "queued",
        "activity": None,
        "controls": ["resume", "cancel"],
        "reason": "The worker exited before it saved workflow progress.",
    }
    assert run_row(server.state_dir, run_id) == ("running", 0, "runnerNoProgress", "parked")
    # Not restarted automatically.
    stays(lambda: runner_count(server.state_dir, run_id) == 1, what="no automatic restart")
    resumed = control(server, "run.resume", run_id)
    assert resumed.outcome == "accepted" and resumed.receipt == {"runId": run_id, "status": "queued", "paused": False}
    wait_until(lambda: run_row(server.state_dir, run_id)[2] == "runnerNoProgress", what="parked again")
    # Paused while parked: the flag only; the resume still takes it back to the queue.
    paused = control(server, "run.pause", run_id)
    assert paused.outcome == "accepted" and paused.receipt == {"runId": run_id, "status": "running", "paused": True}
    assert run_row(server.state_dir, run_id) == ("running", 1, "runnerNoProgress", "parked")
    assert view(server, run_id)["display"]["status"] == "paused"
    flag.write_text("fixed")
    assert control(server, "run.resume", run_id).receipt == {"runId": run_id, "status": "queued", "paused": False}
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {"ok": True}
    assert query(
        server.state_dir,
        "SELECT launch_command, outcome FROM run_workers WHERE run_id = ? ORDER BY runner_epoch",
        run_id,
    ) == [("start", "crashed"), ("resume", "crashed"), ("resume", "exited")]
    check_state(server.state_dir)


def test_a_paused_interactive_run_keeps_its_session_and_a_restart_needs_it_free(tmp_path, server, project):
    write(project, "tenstep", TENSTEP)
    write(project, "blocking", BLOCKING)

    def start_interactive(name: str, input_value=None):
        with server.client() as client:
            return client.request(
                "run.start",
                {
                    "projectPath": str(project),
                    "workflowName": name,
                    "input": input_value or {},
                    "executionMode": "interactive",
                    "originSessionId": "session-1",
                },
            )

    finished = start_interactive("tenstep").receipt["runId"]
    done = wait_status(server, finished, "completed")
    holder = start_interactive("blocking", {"flag": str(tmp_path / "never")})
    assert holder.outcome == "accepted", holder
    holder_id = holder.receipt["runId"]
    wait_until(lambda: blocked_in_wait(server, holder_id), what="the wait node running")
    assert control(server, "run.pause", holder_id).outcome == "accepted"
    # Paused, the run still holds its origin session: no new run and no restart into that session.
    refused = start_interactive("tenstep")
    assert refused.outcome == "conflict" and refused.receipt == {"code": "sessionReserved", "runId": holder_id}
    restart = control(server, "run.restart", finished, revision=done["runRevision"])
    assert restart.outcome == "conflict" and restart.receipt == {"code": "sessionReserved", "runId": holder_id}
    assert control(server, "run.cancel", holder_id).outcome == "accepted"
    restart = control(server, "run.restart", finished, revision=done["runRevision"])
    assert restart.outcome == "accepted" and restart.receipt["restartNumber"] == 1, restart
    child = wait_status(server, restart.receipt["runId"], "completed", "failed")
    assert child["display"]["status"] == "completed"
    assert (child["piworkflows"]["executionMode"], child["queue"]["originSessionId"]) == ("interactive", "session-1")
    check_state(server.state_dir)


def test_a_replayed_pause_after_a_resume_leaves_the_new_runner_alone(tmp_path, server, project):
    flag = tmp_path / "flag"
    run_id = start_blocked(server, project, flag)
    first = control(server, "run.pause", run_id, key="pause-once")
    assert first.outcome == "accepted"
    assert control(server, "run.resume", run_id).outcome == "accepted"
    wait_until(lambda: blocked_in_wait(server, run_id), what="the wait node running again")
    live = live_workers(server.state_dir, run_id)
    assert len(live) == 1

    replay = control(server, "run.pause", run_id, key="pause-once")  # e.g. a client retrying after a lost answer
    assert replay.outcome == "adopted" and replay.receipt == first.receipt
    # The replay commits nothing, so the live runner and its node attempt are untouched (the bug: the runner
    # is killed, the attempt ends 'interrupted'/'runnerExited', the run parks 'shutdown' and a third runner starts).
    stays(
        lambda: (
            live_workers(server.state_dir, run_id) == live
            and not gone(live[0][1])
            and view(server, run_id)["display"]["status"] == "running"
        ),
        what="the new runner alive",
    )
    flag.write_text("go")
    done = wait_status(server, run_id, "completed", "failed")
    assert [(s["nodeId"], s["status"]) for s in done["state"]["steps"]] == [
        ("first", "completed"),
        ("wait", "interrupted"),
        ("wait", "completed"),
        ("last", "completed"),
    ]
    check_state(server.state_dir)


def test_invalid_control_transitions_repeats_and_finished_runs(tmp_path, server, project):
    flag = tmp_path / "flag"
    run_id = start_blocked(server, project, flag)

    first = control(server, "run.pause", run_id, key="pause-1")
    repeat = control(server, "run.pause", run_id, key="pause-1")
    again = control(server, "run.pause", run_id, key="pause-2")
    assert first.outcome == "accepted" and first.receipt == {"runId": run_id, "status": "running", "paused": True}
    assert repeat.outcome == "adopted" and repeat.receipt == first.receipt and repeat.revision == first.revision
    assert again.outcome == "rejected" and again.receipt["code"] == "invalidTransition"
    assert view(server, run_id)["runRevision"] == first.revision  # neither the repeat nor the refusal wrote

    resumed = control(server, "run.resume", run_id, key="resume-1")
    assert resumed.outcome == "accepted" and resumed.receipt["status"] == "queued"
    assert control(server, "run.resume", run_id, key="resume-1").outcome == "adopted"
    wait_until(lambda: blocked_in_wait(server, run_id), what="the wait node running again")
    not_paused = control(server, "run.resume", run_id)
    assert not_paused.outcome == "rejected" and not_paused.receipt["code"] == "invalidTransition"
    assert view(server, run_id)["display"]["status"] == "running"

    flag.write_text("go")
    assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
    for operation in ("run.pause", "run.resume", "run.cancel"):
        late = control(server, operation, run_id)
        assert late.outcome == "conflict", (operation, late)
        assert late.receipt["code"] == "winnerDecided" and late.receipt["status"] == "completed", operation
    missing = control(server, "run.pause", "run-nope")
    assert missing.outcome == "notFound" and missing.receipt["code"] == "runNotFound"
    with server.client() as client:
        no_run = client.request("run.pause", {})
    assert no_run.outcome == "rejected" and no_run.receipt["code"] == "validationFailed"
    assert run_row(server.state_dir, run_id) == ("completed", 0, None, "done")
    check_state(server.state_dir)


def active_runners(server: ServerProcess) -> int:
    with server.client() as client:
        return client.request("server.status").receipt["activeRunners"]


def attempts_started(state_dir: Path, run_id: str) -> int:
    return query(state_dir, "SELECT count(*) FROM node_attempts WHERE run_id = ?", run_id)[0][0]


def test_cancel_racing_completion_has_exactly_one_winner(server, project):
    write(project, "tenstep", TENSTEP)
    outcomes = []
    # Cancel at a different point each round: before the first step, mid-run, once the last node started (a
    # real race with the run's finish: the database is polled directly and the client is already connected),
    # and after the end.
    for threshold in (0, 4, 8, 9, 9, 9, 10, 10, 10, 10, 10, 10, None):
        run_id = start(server, project, "tenstep")
        with server.client(client_id=CLIENT_ID) as client:
            assert client.request("server.status").outcome == "accepted"  # connected before the race
            if threshold is None:
                wait_status(server, run_id, "completed")
            else:
                wait_until(
                    lambda run_id=run_id, threshold=threshold: (
                        attempts_started(server.state_dir, run_id) >= threshold
                        or run_row(server.state_dir, run_id)[0] == "completed"
                    ),
                    interval=0.001,
                    what=f"{threshold} attempts",
                )
            cancel = client.request("run.cancel", {}, run_id=run_id)
        after_cancel = view(server, run_id)  # the writer is serial: this view is at or after the winner
        outcomes.append(cancel.outcome)
        if cancel.outcome == "accepted":
            assert cancel.receipt == {"runId": run_id, "status": "cancelled"}
            assert after_cancel["display"]["status"] == "cancelled" and after_cancel["state"].get("finalOutput") is None
            wait_until(lambda run_id=run_id: not live_workers(server.state_dir, run_id), what="runner ended")
            wait_until(lambda: active_runners(server) == 0, what="no active runner")
            settled = view(server, run_id)
            assert settled["display"]["status"] == "cancelled" and settled["state"].get("finalOutput") is None
            # A runner never writes after the cancel: no step finished or started later.
            assert settled["state"]["steps"] == after_cancel["state"]["steps"]
            assert settled["stepTotal"] == after_cancel["stepTotal"]
            assert all(s["status"] in ("completed", "cancelled") for s in settled["state"]["steps"])
            assert run_row(server.state_dir, run_id) == ("cancelled", 0, None, "cancelled")
        else:
            assert cancel.outcome == "conflict", cancel
            assert cancel.receipt["code"] == "winnerDecided" and cancel.receipt["status"] == "completed"
            assert after_cancel["display"]["status"] == "completed"
            assert after_cancel["state"].get("finalOutput") == {"kind": "final", "message": "sum=36"}
            assert all(s["status"] == "completed" for s in after_cancel["state"]["steps"])
            assert run_row(server.state_dir, run_id)[:3] == ("completed", 0, None)
        check_state(server.state_dir)
    assert outcomes[0] == "accepted" and outcomes[-1] == "conflict"  # before any step; after the end


def test_restart_makes_one_child_run_per_revision_with_lineage(tmp_path, server, project):
    write(project, "flaky", FLAKY)
    flag = tmp_path / "fixed"
    root = start(server, project, "flaky", {"flag": str(flag)})
    failed = wait_status(server, root, "completed", "failed")
    assert failed["display"]["status"] == "failed" and "the flag is missing" in failed["state"].get("error")
    flag.write_text("fixed")

    with server.client() as client:
        no_revision = client.request("run.restart", {}, run_id=root)
    assert no_revision.outcome == "rejected" and no_revision.receipt["code"] == "validationFailed"
    first = control(server, "run.restart", root, key="restart-1", revision=failed["runRevision"])
    assert first.outcome == "accepted", first
    child = first.receipt["runId"]
    assert child != root
    assert first.receipt == {
        "runId": child,
        "parentRunId": root,
        "rootRunId": root,
        "restartNumber": 1,
        "status": "queued",
    }
    retry = control(server, "run.restart", root, key="restart-1", revision=failed["runRevision"])
    assert retry.outcome == "adopted" and retry.receipt == first.receipt
    stale = control(server, "run.restart", root, key="restart-2", revision=failed["runRevision"])
    assert stale.outcome == "conflict" and stale.receipt["code"] == "staleRevision"
    reused = control(server, "run.restart", root, key="restart-1", revision=view(server, root)["runRevision"])
    assert reused.outcome == "conflict" and reused.receipt["code"] == "idempotencyKeyReused", reused
    assert query(server.state_dir, "SELECT run_id FROM runs WHERE parent_run_id = ?", root) == [(child,)]

    done = wait_status(server, child, "completed", "failed")
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {"ok": True}
    assert (
        done["state"]["input"] == {"flag": str(flag)}
        and done["state"]["definitionDigest"] == failed["state"]["definitionDigest"]
    )
    assert (done["piworkflows"]["lineage"], done["queue"]["parentRunId"], done["piworkflows"]["restartNumber"]) == (
        "restart",
        root,
        1,
    )
    assert query(
        server.state_dir, "SELECT lineage, parent_run_id, root_run_id, restart_number FROM runs WHERE run_id = ?", child
    ) == [("restart", root, root, 1)]
    assert view(server, root)["display"]["status"] == "failed"  # the parent keeps its outcome

    second = control(server, "run.restart", child, revision=done["runRevision"])
    assert second.outcome == "accepted", second
    grandchild = second.receipt["runId"]
    assert second.receipt == {
        "runId": grandchild,
        "parentRunId": child,
        "rootRunId": root,
        "restartNumber": 2,
        "status": "queued",
    }
    assert wait_status(server, grandchild, "completed", "failed")["display"]["status"] == "completed"
    assert query(
        server.state_dir,
        "SELECT lineage, parent_run_id, root_run_id, restart_number FROM runs WHERE run_id = ?",
        grandchild,
    ) == [("restart", child, root, 2)]
    check_state(server.state_dir)


def test_restart_of_an_unfinished_run_is_refused(tmp_path, server, project):
    flag = tmp_path / "flag"
    run_id = start_blocked(server, project, flag)
    running = control(server, "run.restart", run_id, revision=view(server, run_id)["runRevision"])
    assert running.outcome == "rejected" and running.receipt["code"] == "invalidTransition", running
    assert control(server, "run.pause", run_id).outcome == "accepted"
    paused = control(server, "run.restart", run_id, revision=view(server, run_id)["runRevision"])
    assert paused.outcome == "rejected" and paused.receipt["code"] == "invalidTransition", paused
    assert query(server.state_dir, "SELECT count(*) FROM runs") == [(1,)]
    cancelled = control(server, "run.cancel", run_id)
    assert cancelled.outcome == "accepted"
    assert view(server, run_id)["state"]["paused"] is False  # a finished run is not paused
    # Cancelled, it restarts (the refusal's advice: "cancel it first").
    restarted = control(server, "run.restart", run_id, revision=view(server, run_id)["runRevision"])
    assert restarted.outcome == "accepted" and restarted.receipt["restartNumber"] == 1
    flag.write_text("go")
    done = wait_status(server, restarted.receipt["runId"], "completed", "failed")
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {"done": True}
    check_state(server.state_dir)


def test_server_stop_with_runs_in_flight_and_a_paused_one(tmp_path, project):
    """test_engine covers one running run across a stop; here several, and a paused run stays paused."""
    write(project, "blocking", BLOCKING)
    flags = [tmp_path / f"flag{i}" for i in range(3)]
    server = ServerProcess(tmp_path / "s", env=SCHEDULER_TICK).start()
    try:
        run_ids = [start(server, project, "blocking", {"flag": str(flag)}) for flag in flags]
        for run_id in run_ids:
            wait_until(lambda run_id=run_id: blocked_in_wait(server, run_id), what="the wait node running")
        held = run_ids[2]
        assert control(server, "run.pause", held).outcome == "accepted"
    finally:
        assert server.stop() == 0
    for run_id in run_ids[:2]:
        assert run_row(server.state_dir, run_id) == ("running", 0, "shutdown", "parked")
    assert run_row(server.state_dir, held) == ("running", 1, "paused", "parked")
    assert query(server.state_dir, "SELECT count(*) FROM run_workers WHERE ended_at IS NULL") == [(0,)]
    check_state(server.state_dir)

    with serving(tmp_path / "s", env=SCHEDULER_TICK) as server:
        for flag in flags:
            flag.write_text("go")
        for run_id in run_ids[:2]:
            done = wait_status(server, run_id, "completed", "failed")
            assert done["display"]["status"] == "completed", done["state"].get("error")
            assert [s["status"] for s in done["state"]["steps"]] == [
                "completed",
                "interrupted",
                "completed",
                "completed",
            ]
        stays(
            lambda: view(server, held)["display"]["status"] == "paused" and runner_count(server.state_dir, held) == 1,
            what="the paused run held",
        )
        assert control(server, "run.resume", held).receipt == {"runId": held, "status": "queued", "paused": False}
        done = wait_status(server, held, "completed", "failed")
        assert done["display"]["status"] == "completed", done["state"].get("error")


# --- the CLI ------------------------------------------------------------------


def cli(server: ServerProcess, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pi-workflows`` for a user whose home is ``home``."""
    return server.cli(*args, env={"HOME": str(home)})


def test_the_cli_starts_and_waits(tmp_path, server, project):
    write(project, "tenstep", TENSTEP)
    write(project, "boom", BOOM)
    write(project, "ask", CHECKPOINT)
    home = tmp_path / "home"
    ok = cli(server, home, "run", "start", "tenstep", "--project", str(project), "--wait")
    assert ok.returncode == 0, ok.stderr
    run_id = ok.stdout.splitlines()[0]
    assert f"{run_id} completed" in ok.stdout and 'output: {"kind":"final","message":"sum=36"}' in ok.stdout
    bad = cli(server, home, "run", "start", "boom", "--project", str(project), "--wait")
    assert bad.returncode == 1 and " failed" in bad.stdout and "ZeroDivisionError" in bad.stdout
    waits = cli(server, home, "run", "start", "ask", "--project", str(project), "--wait")
    assert waits.returncode == 1 and " waiting" in waits.stdout
    write(project, "crashy", CRASHY % str(tmp_path / "never-fixed"))
    parked = cli(server, home, "run", "start", "crashy", "--project", str(project), "--wait")
    assert parked.returncode == 1 and " queued\n" in parked.stdout
    assert "  parked: The worker exited before it saved workflow progress." in parked.stdout
    usage = cli(server, home, "run", "start", "tenstep", "--project", str(project), "--input", "not json")
    assert usage.returncode == 2 and "not JSON" in usage.stderr
    no_project = cli(server, home, "run", "start", "tenstep", "--project", str(tmp_path / "nowhere"))
    assert no_project.returncode == 2
    assert query(server.state_dir, "SELECT count(*) FROM runs") == [(4,)]
    check_state(server.state_dir)


def test_the_cli_pauses_resumes_and_restarts(tmp_path, server, project):
    home = tmp_path / "home"
    flag = tmp_path / "flag"
    run_id = start_blocked(server, project, flag)

    paused = cli(server, home, "run", "pause", run_id)
    assert paused.returncode == 0 and paused.stdout.strip() == f"{run_id} paused", paused.stderr
    shown = cli(server, home, "run", "status", run_id)
    assert "  paused: The workflow is durably paused." in shown.stdout and "controls: resume, cancel" in shown.stdout
    twice = cli(server, home, "run", "pause", run_id)
    assert twice.returncode == 1 and "invalidTransition" in twice.stderr
    early = cli(server, home, "run", "restart", run_id)
    assert early.returncode == 1 and "invalidTransition" in early.stderr

    flag.write_text("go")
    resumed = cli(server, home, "run", "resume", run_id)
    assert resumed.returncode == 0 and resumed.stdout.strip() == f"{run_id} resumed (queued)", resumed.stderr
    assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
    late = cli(server, home, "run", "cancel", run_id)
    assert late.returncode == 1 and "winnerDecided" in late.stderr

    restarted = cli(server, home, "run", "restart", run_id)
    assert restarted.returncode == 0, restarted.stderr
    child = restarted.stdout.strip()
    assert child.startswith("run-") and child != run_id
    assert wait_status(server, child, "completed", "failed")["display"]["status"] == "completed"
    assert query(
        server.state_dir, "SELECT lineage, parent_run_id, restart_number FROM runs WHERE run_id = ?", child
    ) == [("restart", run_id, 1)]
    missing = cli(server, home, "run", "pause", "run-nope")
    assert missing.returncode == 1 and "runNotFound" in missing.stderr
    check_state(server.state_dir)


def test_the_cli_control_commands_without_a_server(tmp_path):
    stopped = ServerProcess(tmp_path / "none")  # never started: nothing listens on its socket
    for command in ("pause", "resume", "cancel", "restart"):
        result = cli(stopped, tmp_path / "home", "run", command, "run-x")
        assert result.returncode == 1 and "no server is running" in result.stderr, (command, result.stderr)
    assert not (tmp_path / "none" / "state.sqlite").exists()  # control commands never start a server

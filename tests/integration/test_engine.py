"""Runs executed end to end: scheduler, claims, runner children, routing, recovery."""

from __future__ import annotations

import os

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
from tests.server_util import SCHEDULER_TICK, ServerProcess, check_state, gone, query, serving, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


def test_a_ten_node_workflow_completes_with_its_output(server, project):
    write(project, "tenstep", TENSTEP)
    run_id = start(server, project, "tenstep")
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"kind": "final", "message": "sum=36"}
    assert [s["nodeId"] for s in done["state"]["steps"]] == [f"n{i}" for i in range(9)] + ["done"]
    assert all(s["status"] == "completed" for s in done["state"]["steps"])
    check_state(server.state_dir)


def test_failures_and_routing_errors_fail_the_run(server, project):
    write(
        project,
        "boom",
        "from piworkflows.workflows import *\n"
        'workflow = define_workflow("boom", "a", {"a": compute(lambda ctx: 1 / 0)})\n',
    )
    write(
        project,
        "lost",
        "from piworkflows.workflows import *\n"
        'workflow = define_workflow("lost", "a", {"a": compute(lambda ctx: {"r": "x"}), '
        '"b": compute(lambda ctx: 1)}, [switch("a", on="$.r", cases={"y": "b"})])\n',
    )
    boom = wait_status(server, start(server, project, "boom"), "completed", "failed")
    assert boom["display"]["status"] == "failed" and "ZeroDivisionError" in boom["state"].get("error")
    lost = wait_status(server, start(server, project, "lost"), "completed", "failed")
    assert lost["display"]["status"] == "failed" and lost["piworkflows"]["errorCode"] == "routingError"
    check_state(server.state_dir)


def test_max_steps_fails_a_looping_run(server, project):
    write(
        project,
        "loop",
        "from piworkflows.workflows import *\n"
        'workflow = define_workflow("loop", "a", {"a": compute(lambda ctx: 1), '
        '"b": compute(lambda ctx: 2)}, [edge("a", "b"), edge("b", "a")], '
        "max_steps=5)\n",
    )
    done = wait_status(server, start(server, project, "loop"), "completed", "failed")
    assert done["piworkflows"]["errorCode"] == "maxStepsExceeded"
    assert done["stepTotal"] == len(done["state"]["steps"]) == 5


def test_server_stop_parks_a_running_run_and_the_next_start_finishes_it(tmp_path, project):
    flag = tmp_path / "flag"
    server = ServerProcess(tmp_path / "s", env=SCHEDULER_TICK).start()
    run_id = start_blocked(server, project, flag)
    assert server.stop() == 0
    with serving(tmp_path / "s", env=SCHEDULER_TICK) as server:
        flag.write_text("go")
        done = wait_status(server, run_id, "completed", "failed")
        assert done["display"]["status"] == "completed", done["state"].get("error")
        nodes = [(s["nodeId"], s["status"]) for s in done["state"]["steps"]]
        assert nodes == [("first", "completed"), ("wait", "interrupted"), ("wait", "completed"), ("last", "completed")]


def test_kill_9_of_the_supervisor_mid_run_resumes_without_repeating_finished_nodes(tmp_path, project):
    flag = tmp_path / "flag"
    server = ServerProcess(tmp_path / "s", env=SCHEDULER_TICK).start()
    run_id = start_blocked(server, project, flag)
    runner = next(c for c in server.registry()["children"] if c["role"] == "runner")
    server.kill()
    with serving(tmp_path / "s", env=SCHEDULER_TICK) as server:
        # The takeover ended the old runner's process group (its identity matched).
        wait_until(lambda: gone(runner["pid"]), what="old runner gone")
        flag.write_text("go")
        done = wait_status(server, run_id, "completed", "failed")
        assert done["display"]["status"] == "completed", done["state"].get("error")
        firsts = [s for s in done["state"]["steps"] if s["nodeId"] == "first"]
        assert len(firsts) == 1  # a finished node is never executed again


def test_a_changed_source_parks_the_run(tmp_path, project):
    write(project, "blocking", BLOCKING)
    write(project, "tenstep", TENSTEP)
    flag = tmp_path / "flag"
    server = ServerProcess(tmp_path / "s", env={**SCHEDULER_TICK, "PI_WORKFLOWS_MAX_RUNNERS": "1"}).start()
    try:
        first = start(server, project, "blocking", {"flag": str(flag)})
        wait_until(lambda: blocked_in_wait(server, first), what="the wait node running")
        second = start(server, project, "tenstep")  # queued: the only runner slot is busy
        changed = TENSTEP.replace('"n0", nodes, edges)', '"n0", nodes, edges, max_steps=99)')  # a new definition
        assert changed != TENSTEP
        write(project, "tenstep", changed)
        flag.write_text("go")
        parked = wait_until(
            lambda: (v := view(server, second))["piworkflows"]["parkReason"] == "workflowSourceChanged" and v,
            what="parked",
        )
        assert parked["display"]["status"] == "queued" and parked["state"]["steps"] == []
        assert wait_status(server, first, "completed")["display"]["status"] == "completed"
    finally:
        server.stop()


def test_a_checkpoint_waits_without_runner_or_claim_and_one_answer_wins(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    waiting = wait_status(server, run_id, "waiting")
    assert waiting["display"]["controls"] == ["pause", "cancel", "answer"]
    phases = query(server, "SELECT r.status, q.queue_status FROM runs r JOIN run_queue q USING (run_id)")
    assert phases == [("waiting", "parked")]
    assert query(server, "SELECT count(*) FROM leases WHERE owner_id IS NOT NULL") == [(0,)]
    assert query(server, "SELECT count(*) FROM run_workers WHERE ended_at IS NULL") == [(0,)]
    with server.client() as client:
        first = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id)
        second = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": False}}, run_id=run_id)
        repeat = client.request(
            "checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id, idempotency_key="k-1"
        )
    assert first.outcome == "accepted" and first.receipt["status"] == "queued"
    assert second.outcome == "conflict" and second.receipt["code"] == "winnerDecided"
    assert repeat.outcome == "conflict"
    done = wait_status(server, run_id, "completed", "failed")
    assert done["state"].get("finalOutput") == {"answered": True}
    asks = [s for s in done["state"]["steps"] if s["nodeId"] == "ask"]
    assert len(asks) == 1 and asks[0]["status"] == "completed"  # answered checkpoints count once
    check_state(server.state_dir)


def test_the_cli_answers_a_checkpoint(server, project):
    run_id = start_waiting(server, project)
    result = server.cli("answer", run_id, "ask", '{"go": false}')
    assert result.returncode == 0, result.stderr
    assert wait_status(server, run_id, "completed")["state"]["finalOutput"] == {"answered": False}
    again = server.cli("answer", run_id, "ask", '{"go": true}')
    assert again.returncode == 1 and "winnerDecided" in again.stderr


def test_the_main_job_runs_the_demo_end_to_end(tmp_path, pi_command):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "piworkflows.demo", "--who", "tests"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path), "PI_WORKFLOWS_PI_COMMAND": pi_command[0]},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'completed: output {"kind":"final","message":"demo finished: 2 words"}' in result.stdout
    assert "summary/describe [compute] completed" in result.stdout
    assert "post [http] completed" in result.stdout
    # the agent demo: its agent step and decision on the real Pi, labelled as a scripted model
    assert "against a SCRIPTED model" in result.stdout
    assert '"message":"shipping: All 41 tests pass after the change."}' in result.stdout
    assert 'decide [decision] completed {"route":"ship"}' in result.stdout
    assert not (tmp_path / ".pi").exists()  # Pi's configuration and sessions stayed in the demo's temp dir


def test_cancel_wins_over_a_running_node_and_stops_its_runner(tmp_path, project):
    with serving(tmp_path / "s", env=SCHEDULER_TICK) as server:
        run_id = start_blocked(server, project, tmp_path / "never")
        runner = next(c for c in server.registry()["children"] if c["role"] == "runner")
        with server.client() as client:
            cancelled = client.request("run.cancel", {}, run_id=run_id, idempotency_key="cancel-1")
            repeat = client.request("run.cancel", {}, run_id=run_id, idempotency_key="cancel-1")
            late = client.request("run.cancel", {}, run_id=run_id)
        assert cancelled.outcome == "accepted" and cancelled.receipt == {"runId": run_id, "status": "cancelled"}
        assert repeat.outcome == "adopted" and repeat.receipt == cancelled.receipt
        assert late.outcome == "conflict" and late.receipt["code"] == "winnerDecided"
        wait_until(lambda: gone(runner["pid"]), what="runner group stopped")
        done = view(server, run_id)
        assert done["display"]["status"] == "cancelled"
        assert [s["status"] for s in done["state"]["steps"]] == ["completed", "cancelled"]


# The blocking node ignores SIGTERM first, as workflow code may.
STUBBORN = BLOCKING.replace(
    "def wait_for_flag(ctx):",
    "def wait_for_flag(ctx):\n    import signal\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)",
)


def test_server_stop_kills_a_runner_that_ignores_sigterm_after_the_grace(tmp_path, project):
    """Stopping a run's group is SIGTERM, then SIGKILL after stop_grace_ms: no runner outlives the server."""
    write(project, "blocking", STUBBORN)
    env = {**SCHEDULER_TICK, "PI_WORKFLOWS_STOP_GRACE_MS": "500"}
    server = ServerProcess(tmp_path / "s", env=env).start()
    run_id = start(server, project, "blocking", {"flag": str(tmp_path / "flag")})
    wait_until(lambda: blocked_in_wait(server, run_id), what="the wait node running")
    runner = next(c for c in server.registry()["children"] if c["role"] == "runner")
    assert server.stop() == 0
    assert gone(runner["pid"])
    with serving(tmp_path / "s", env=env) as server:
        (tmp_path / "flag").write_text("go")
        assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"


def test_cancel_of_a_waiting_or_finished_run(server, project):
    write(project, "ask", CHECKPOINT)
    write(project, "tenstep", TENSTEP)
    waiting = start(server, project, "ask")
    wait_status(server, waiting, "waiting")
    finished = start(server, project, "tenstep")
    wait_status(server, finished, "completed")
    with server.client() as client:
        assert client.request("run.cancel", {}, run_id=waiting).outcome == "accepted"
        late = client.request("run.cancel", {}, run_id=finished)
        answer = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=waiting)
    assert late.outcome == "conflict" and late.receipt["status"] == "completed"
    assert answer.outcome == "conflict"  # the cancelled checkpoint no longer waits
    assert view(server, waiting)["display"]["status"] == "cancelled"
    check_state(server.state_dir)

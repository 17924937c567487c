"""Children's logs reach server.log: their own log records (LOG frames, with role and pid) and, when a
child ends without the server ending it, how it ended and its last stderr lines. Never a payload.

An outbox worker child sends its log records as LOG frames (this test as its supervisor). Then a
real server each: a worker that crashes with a traceback on stderr, or is killed with SIGKILL,
leaves how it ended and its stderr lines; a runner that refuses a changed workflow source logs
why, with its pid; a runner that dies after its run made progress leaves how and its stderr lines.
"""

from __future__ import annotations

import logging
import os
import signal

import pytest

from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.outbox import PerformEffect
from piworkflows.protocol.internal.writer import LogRecord
from tests.engine_util import CHECKPOINT, effect_attempts, http_workflow, start, view, wait_status, write
from tests.server_util import ServerProcess, wait_until
from tests.worker_util import Supervisor

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]
ONE_WORKER = {"PI_WORKFLOWS_OUTBOX_WORKERS": "1"}
MARKER = "order-7f3a9c"  # in the run's input and the request body: never in server.log


def log_line(server: ServerProcess, *parts: str) -> str:
    """The server.log line that holds every part (waiting for it)."""
    return wait_until(
        lambda: next((line for line in server.server_log().splitlines() if all(p in line for p in parts)), None),
        what=f"a server.log line with {parts}",
    )


def test_an_outbox_worker_sends_its_own_log_records_as_log_frames():
    """The worker child alone, with this test as its supervisor: a performer that raises (a payload
    it cannot read) is logged (a log frame naming the effect and the exception type, not the
    payload) before the settlement reports the attempt ambiguous."""
    peer = Supervisor()
    try:
        task = {"effect_id": "effect-1", "performer": "shell.exec", "idempotency_key": "key-1"}
        peer.send(PerformEffect.kind, 0, {**task, "recovery_policy": "idempotent", "payload": {"order": MARKER}})
        logged, settled = peer.receive(), peer.receive()
        assert logged["k"] == LogRecord.kind and settled["k"] == EffectSettleFrame.kind
        record = LogRecord.model_validate(logged["b"])
        assert (record.level, record.message) == (
            logging.ERROR,
            "effect effect-1: the shell.exec performer failed (KeyError); the attempt is ambiguous",
        )
        assert (settled["b"]["settlement"], settled["b"]["error_code"]) == ("ambiguous", "performerFailed")
        assert MARKER not in record.message
    finally:
        assert peer.proc.stdin is not None
        peer.proc.stdin.close()  # end of file: the worker exits
        peer.proc.wait(timeout=30)


@pytest.mark.server_env(PIW_FAULTS="outbox.after_attempt_recorded=raise", **ONE_WORKER)
def test_an_outbox_worker_that_crashes_leaves_how_it_ended_and_its_stderr_lines(ledger, server, project):
    http_workflow(project, "idem")
    run_id = start(server, project, "idem", {"url": ledger.url + "/idem", "order": MARKER})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert effect_attempts(server, run_id) == [(1, "ambiguous"), (2, "applied")]  # the restarted worker sent it
    # how it ended (its traceback unwinds into an abort at interpreter shutdown: the stdin reader thread)
    ended = log_line(server, "outbox worker 0 (pid ", ") ended: the worker ")
    pid = ended.split("(pid ")[1].split(")")[0]
    assert int(pid) not in server.child_pids("outbox")
    log_line(server, f"outbox worker 0 (pid {pid}) stderr: Traceback (most recent call last):")
    log_line(server, f"outbox worker 0 (pid {pid}) stderr: piworkflows.faults.FaultInjected: outbox.after_attempt")
    log = server.server_log()
    assert MARKER not in log and ledger.url not in log


@pytest.mark.server_env(**ONE_WORKER)
def test_an_outbox_worker_killed_by_someone_else_is_logged_and_the_next_effect_gets_a_new_one(ledger, server, project):
    http_workflow(project, "idem")
    first_run = start(server, project, "idem", {"url": ledger.url + "/idem-1"})
    assert wait_status(server, first_run, "completed", "failed")["display"]["status"] == "completed"
    [first] = wait_until(lambda: server.child_pids("outbox"), what="the outbox worker")  # idle, not yet ended
    os.kill(first, signal.SIGKILL)
    log_line(server, f"(pid {first}) ended: the worker was killed by SIGKILL")
    second_run = start(server, project, "idem", {"url": ledger.url + "/idem-2"})
    assert wait_status(server, second_run, "completed", "failed")["display"]["status"] == "completed"
    assert effect_attempts(server, second_run) == [(1, "applied")]
    assert server.server_log().count(") ended: ") == 1


@pytest.mark.server_env(PI_WORKFLOWS_CHILD_IDLE_EXIT_MS="200", **ONE_WORKER)
def test_an_outbox_worker_with_nothing_to_do_ends_unreported_and_none_starts_before_an_effect(ledger, server, project):
    assert server.child_pids("outbox") == []  # an idle server starts none
    http_workflow(project, "idem")
    for n in range(2):  # each effect after the worker ended gets a new one
        run_id = start(server, project, "idem", {"url": ledger.url + f"/idem-{n}"})
        assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
        wait_until(lambda: server.child_pids("outbox") == [], what="the idle worker ended")
    assert ") ended: " not in server.server_log()  # ended by the server: not reported


def test_a_runners_own_log_record_reaches_server_log(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask", {"note": MARKER})
    wait_status(server, run_id, "waiting")
    changed = CHECKPOINT.replace('"false": "no"})])', '"false": "no"})], max_steps=99)')  # a new definition
    assert changed != CHECKPOINT
    write(project, "ask", changed)
    with server.client() as client:
        answered = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id)
    assert answered.outcome == "accepted", answered
    wait_until(lambda: view(server, run_id)["piworkflows"]["parkReason"] == "workflowSourceChanged", what="parked")
    line = log_line(server, f": {run_id} parks: the workflow file ")
    assert "piworkflows.runner" in line and " WARNING runner " in line
    pid = line.split(" WARNING runner ")[1].split(":")[0]
    assert pid.isdigit()
    assert MARKER not in server.server_log()


# The second node's runner dies once (after the first node's progress), saying why on stderr.
CRASH_ONCE = """
import os, sys
from piworkflows.workflows import compute, define_workflow, edge
def crash_once(ctx):
    if not os.path.exists(ctx.input["flag"]):
        open(ctx.input["flag"], "w").close()
        print("the helper table is missing", file=sys.stderr, flush=True)
        os._exit(3)
    return {"second": True}
workflow = define_workflow("crashonce", "first", {
    "first": compute(lambda ctx: {"first": True}),
    "second": compute(crash_once),
}, [edge("first", "second")])
"""


def test_a_runner_that_dies_after_progress_leaves_how_it_ended_and_its_stderr_lines(server, project, tmp_path):
    write(project, "crashonce", CRASH_ONCE)
    run_id = start(server, project, "crashonce", {"flag": str(tmp_path / "crashed")})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")  # requeued: the next runner finished it
    log_line(
        server,
        f"the runner of {run_id} ended before it was done: the runner exited with code 3 (the run: requeued in ",
    )
    log_line(server, f"runner of {run_id} stderr: the helper table is missing")

"""Races a hostile (or just busy) user makes: many commands at once against one state dir.

Through the CLI on real processes: parallel on-demand starts on a stopped state dir all connect to
the one server that won the lock; concurrent restarts of one finished run make one child (docs/STRESS.md,
Hostile inputs).
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.server_util import ServerProcess, alive, check_state, gone, make_server, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]


def test_parallel_on_demand_starts_connect_to_the_one_server_that_won(tmp_path: Path):
    server = make_server(tmp_path / "s", PI_WORKFLOWS_SCHEDULER_TICK_MS="100")
    starts = [
        subprocess.Popen(
            server.cli_command("run", "start", "builtin:shell-check", "--input", '{"command": "true"}'),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=server.env,
            stdin=subprocess.DEVNULL,
        )
        for _ in range(10)
    ]
    try:
        results = [(proc.wait(120), *proc.communicate()) for proc in starts]
        for code, out, err in results:
            assert code == 0, out + err
            assert out.startswith("run-"), out
        assert len({out for _, out, _ in results}) == 10
        status = json.loads(server.cli("server", "status", "--json").stdout)
        assert status["epoch"] == 1  # one server took the state dir; no loser started a second
        assert json.loads(server.cli("runs", "--json").stdout)["total"] == 10
    finally:
        stopped = server.cli("server", "stop")
        assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: not ServerProcess(server.state_dir).client(retry_for=0).running(), what="stopped")
    check_state(server.state_dir)


def test_concurrent_restarts_of_one_finished_run_make_one_child(server):
    done = server.cli("run", "start", "builtin:shell-check", "--input", '{"command": "true"}', "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.splitlines()[0]
    with server.client() as client:
        revision = client.request("run.status", {}, run_id=run_id).receipt["runRevision"]

    def restart(key: str) -> Any:
        with server.client(client_id="operator", retry_for=10) as client:
            return client.request("run.restart", {}, run_id=run_id, expected_revision=revision, idempotency_key=key)

    with ThreadPoolExecutor(10) as pool:
        same_key = list(pool.map(restart, ["restart-as-seen"] * 10))
    children = {response.receipt["runId"] for response in same_key}
    assert len(children) == 1, same_key
    assert sorted(r.outcome for r in same_key) == ["accepted"] + ["adopted"] * 9
    with ThreadPoolExecutor(10) as pool:
        other_keys = list(pool.map(restart, [f"other-{i}" for i in range(10)]))
    assert {(r.outcome, r.receipt["code"]) for r in other_keys} == {("conflict", "staleRevision")}
    # A later `run restart` sees the revision the first restart advanced: one more child, as asked
    # (its key names that revision, so a CLI that saw the same one would adopt this child).
    again = server.cli("run", "restart", run_id)
    assert again.returncode == 0 and again.stdout.strip() not in children, again.stdout + again.stderr
    listed = json.loads(server.cli("runs", "--json").stdout)
    assert listed["total"] == 3  # the run, the one child of the ten, the CLI's own


# A node (and the module, at import) that starts a process in a session of its own: it escapes the
# runner's group and holds its stdout and stderr.
DETACHES = """
import subprocess
from piworkflows.workflows import compute, define_workflow

AT_IMPORT = subprocess.Popen(["sleep", "600"], start_new_session=True)

def detach(ctx):
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    return {"pid": child.pid, "atImport": AT_IMPORT.pid}

workflow = define_workflow("detaches", "detach", {"detach": compute(detach)})
"""


def test_processes_a_runner_left_in_a_session_of_their_own_end_with_it(tmp_path: Path):
    project = tmp_path / "proj"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "detaches.workflow.py").write_text(DETACHES)
    server = ServerProcess(tmp_path / "s", env={"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100"}).start()
    try:
        done = server.cli("run", "start", "detaches", "--project", str(project), "--wait", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        output = json.loads(done.stdout.splitlines()[-1])["state"]["finalOutput"]
        left = [output["pid"], output["atImport"]]
        assert all(alive(pid) for pid in left)
    finally:
        started = time.monotonic()
        assert server.stop(timeout=60) == 0, server.output()
    assert time.monotonic() - started < 30  # it hung past 60 s on the leftovers' pipes
    wait_until(lambda: all(gone(pid) for pid in left), timeout=10, what="the detached processes ended")
    assert "holding its pipes; ended" in server.server_log()

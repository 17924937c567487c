"""Races a hostile (or just busy) user makes: many commands at once against one state dir.

Through the CLI on real processes: parallel on-demand starts on a stopped state dir all connect to
the one server that won the lock; concurrent restarts of one finished run make one child (docs/STRESS.md,
Hostile inputs).
"""

from __future__ import annotations

import json
import os
import signal
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


# A node (and the module, at import) that starts processes in a session of their own: they escape
# the runner's group; one holds its stdout and stderr, one let go of its stdio.
DETACHES = """
import subprocess
from piworkflows.workflows import compute, define_workflow

def sleeper(**stdio):
    return subprocess.Popen(["sleep", "600"], start_new_session=True, **stdio).pid

QUIET = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
AT_IMPORT = [sleeper(), sleeper(**QUIET)]

def detach(ctx):
    return {"pids": AT_IMPORT + [sleeper(), sleeper(**QUIET)]}

workflow = define_workflow("detaches", "detach", {"detach": compute(detach)})
"""

# A node that starts a quiet detached process, then ends its own runner (once: the file says so).
DETACHES_AND_DIES = """
import os, subprocess
from pathlib import Path
from piworkflows.workflows import compute, define_workflow

def detach(ctx):
    mark = Path(__file__).with_name("first-pid")
    if not mark.exists():
        pid = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
        mark.write_text(str(pid))
        os._exit(3)
    return {"first": int(mark.read_text())}

workflow = define_workflow("detaches-and-dies", "detach", {"detach": compute(detach)})
"""


def _project(tmp_path: Path, name: str, source: str) -> Path:
    project = tmp_path / "proj"
    (project / ".pi" / "workflows").mkdir(parents=True, exist_ok=True)
    (project / ".pi" / "workflows" / f"{name}.workflow.py").write_text(source)
    return project


def _detached_pids(server: ServerProcess, project: Path) -> list[int]:
    done = server.cli("run", "start", "detaches", "--project", str(project), "--wait", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    pids: list[int] = json.loads(done.stdout.splitlines()[-1])["state"]["finalOutput"]["pids"]
    assert len(pids) == 4 and all(alive(pid) for pid in pids)
    return pids


def test_processes_a_runner_left_in_a_session_of_their_own_end_with_it(tmp_path: Path):
    project = _project(tmp_path, "detaches", DETACHES)
    server = ServerProcess(tmp_path / "s", env={"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100"}).start()
    try:
        left = _detached_pids(server, project)
    finally:
        started = time.monotonic()
        assert server.stop(timeout=60) == 0, server.output()
    assert time.monotonic() - started < 30  # it hung past 60 s on the leftovers' pipes
    wait_until(lambda: all(gone(pid) for pid in left), timeout=10, what="the detached processes ended")
    assert "left behind: " in server.server_log()


def test_a_quiet_detached_process_ends_when_its_runner_dies(tmp_path: Path):
    project = _project(tmp_path, "detaches-and-dies", DETACHES_AND_DIES)
    env = {"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100", "PI_WORKFLOWS_RUNNER_CRASH_BACKOFF_MS": "0"}
    server = ServerProcess(tmp_path / "s", env=env).start()
    try:
        done = server.cli("run", "start", "detaches-and-dies", "--project", str(project), "--wait", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        first = json.loads(done.stdout.splitlines()[-1])["state"]["finalOutput"]["first"]
        # the server still runs: the process went with the runner it descends from
        wait_until(lambda: gone(first), timeout=10, what="the quiet detached process ended")
        assert f"{first} (sleep)" in server.server_log()
    finally:
        assert server.stop(timeout=60) == 0, server.output()


def test_server_stop_kill_ends_what_the_children_left_behind(tmp_path: Path):
    project = _project(tmp_path, "detaches", DETACHES)
    server = ServerProcess(tmp_path / "s", env={"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100"}).start()
    assert server.popen is not None
    try:
        left = _detached_pids(server, project)
        os.kill(server.popen.pid, signal.SIGSTOP)  # a supervisor that no longer answers
        killed = server.cli("server", "stop", "--timeout", "1", "--kill")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert "killed what its children left behind" in killed.stdout, killed.stdout
        wait_until(lambda: all(gone(pid) for pid in left), timeout=10, what="the detached processes ended")
    finally:
        if server.popen.poll() is None:
            server.kill()


def test_a_new_server_ends_what_a_dead_ones_children_left_behind(tmp_path: Path):
    project = _project(tmp_path, "detaches", DETACHES)
    server = ServerProcess(tmp_path / "s", env={"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100"}).start()
    left = _detached_pids(server, project)
    server.kill()  # the supervisor alone: the detached processes live on, reparented
    assert all(alive(pid) for pid in left)
    again = ServerProcess(server.state_dir, env=server.env).start()
    try:
        wait_until(lambda: all(gone(pid) for pid in left), timeout=10, what="the detached processes ended")
        assert "what an older server's children left behind" in again.server_log()
    finally:
        assert again.stop(timeout=60) == 0, again.output()

"""Races a hostile (or just busy) user makes: many commands at once against one state dir.

Through the CLI on real processes: parallel on-demand starts on a stopped state dir all connect to
the one server that won the lock (docs/STRESS.md, Hostile inputs).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.server_util import ServerProcess, check_state, make_server, wait_until

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

"""``pi-workflows state status|verify`` against a live server (the CLI never opens SQLite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine_util import TENSTEP, start, wait_status, write
from tests.server_util import ServerProcess, check_state

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "piworkflows.cli", "--state-dir", str(server.state_dir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=server.env)


def test_state_status_and_verify_through_the_cli(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    server = ServerProcess(tmp_path / "s").start()
    try:
        run_id = start(server, project, "tenstep")
        assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"

        status = json.loads(cli(server, "state", "status", "--json").stdout)
        assert status["counts"]["runs"] == {"completed": 1} and status["violations"] == {}
        assert status["fileBytes"] > 0 and status["pageCount"] > 0
        assert run_id not in json.dumps(status)  # ids only where an invariant is violated
        human = cli(server, "state", "status")
        assert human.returncode == 0 and "1 completed" in human.stdout and "invariants: all hold" in human.stdout

        verified = cli(server, "state", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "integrity_check ok, foreign_key_check ok" in verified.stdout
        assert json.loads(cli(server, "state", "verify", "--json").stdout) == {
            "ok": True, "integrity": [], "violations": {}}  # fmt: skip
        assert cli(server, "state", "verify", "--bogus").returncode == 2
    finally:
        assert server.stop() == 0, server.output()
    check_state(server.state_dir)
    stopped = cli(server, "state", "status")
    assert stopped.returncode == 1 and "no server is running" in stopped.stderr

"""The first command after a maintenance operation commits (prune apply, backup): nothing the writer
did to the file itself makes the next group fail."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.engine_util import TENSTEP, start, wait_status, write
from tests.server_util import ServerProcess, check_state

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


def test_every_command_right_after_prune_apply_and_backup_is_accepted(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    server = ServerProcess(tmp_path / "s").start()
    start_run = {"projectPath": str(project), "workflowName": "tenstep"}
    try:
        finished = [start(server, project, "tenstep") for _ in range(2)]
        for run_id in finished:
            assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
        cutoff = datetime.fromtimestamp(time.time() + 86_400, tz=UTC).isoformat()
        backups = tmp_path / "backups"
        # retry_for=0: an unavailable answer is seen, not retried away
        with server.client(retry_for=0) as client:
            pruned = client.request(
                "state.prune", {"before": cutoff, "apply": True, "backupPath": str(backups / "before-prune.sqlite")}
            )
            assert pruned.outcome == "accepted" and pruned.receipt["vacuumed"] is True, pruned
            after_prune = client.request("run.start", start_run)
            assert after_prune.outcome == "accepted", after_prune
            backed_up = client.request("state.backup", {"destination": str(backups / "b.sqlite")})
            assert backed_up.outcome == "accepted", backed_up
            after_backup = client.request("run.start", start_run)
            assert after_backup.outcome == "accepted", after_backup
    finally:
        assert server.stop() == 0, server.output()
    assert "GroupFailed" not in server.output() and "not committed" not in server.output()
    check_state(server.state_dir)

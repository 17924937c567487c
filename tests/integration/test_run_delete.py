"""``pi-workflows run delete``: one finished run tree deleted for good through the server, with
prune's blockers (named when they keep it), asked first on a terminal."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.engine_util import CHECKPOINT, TENSTEP, start, wait_status, write
from tests.server_util import ServerProcess, serving

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


def on_a_terminal(server: ServerProcess, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with a pseudo-terminal as stdin, answering its question with ``answer``."""
    primary, secondary = os.openpty()
    try:
        os.write(primary, answer.encode() + b"\n")
        command = server.cli_command(*args)
        return subprocess.run(command, stdin=secondary, capture_output=True, text=True, timeout=60, env=server.env)
    finally:
        os.close(primary)
        os.close(secondary)


def test_run_delete_removes_one_finished_tree_and_refuses_what_prune_would_keep(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    write(project, "ask", CHECKPOINT)
    with serving(tmp_path / "s") as server:
        root = start(server, project, "tenstep")
        assert wait_status(server, root, "completed", "failed")["display"]["status"] == "completed"
        restarted = server.cli("run", "restart", root)
        assert restarted.returncode == 0, restarted.stderr
        child = restarted.stdout.strip()
        assert wait_status(server, child, "completed", "failed")["display"]["status"] == "completed"
        waiting = start(server, project, "ask")
        wait_status(server, waiting, "waiting")

        not_root = server.cli("run", "delete", child, "--yes")
        assert not_root.returncode == 1 and f"belongs to the tree of run {root}" in not_root.stderr
        kept = server.cli("run", "delete", waiting, "--yes")
        assert kept.returncode == 1 and "deletionBlocked" in kept.stderr and "has not finished" in kept.stderr
        no_terminal = server.cli("run", "delete", root)  # stdin is not a terminal and no --yes
        assert no_terminal.returncode == 2 and "--yes" in no_terminal.stderr
        declined = on_a_terminal(server, "n", "run", "delete", root)
        assert declined.returncode == 1 and "nothing was deleted" in declined.stderr, declined.stdout
        assert "Delete run" in declined.stdout and "tenstep" in declined.stdout

        deleted = on_a_terminal(server, "y", "run", "delete", root)
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert f"deleted {root}: 2 runs" in deleted.stdout
        with server.client() as client:
            for run_id in (root, child):
                assert client.request("run.status", {}, run_id=run_id).receipt["code"] == "runNotFound"
            assert client.request("run.status", {}, run_id=waiting).outcome == "accepted"  # another tree stays
        again = server.cli("run", "delete", root, "--yes")
        assert again.returncode == 1 and "runNotFound" in again.stderr
        verified = server.cli("state", "verify")
        assert verified.returncode == 0, verified.stdout


def test_a_repeated_run_delete_request_adopts_its_answer(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    with serving(tmp_path / "s") as server:
        root = start(server, project, "tenstep")
        wait_status(server, root, "completed", "failed")
        with server.client(client_id="operator") as client:
            first = client.request("run.delete", {}, run_id=root, idempotency_key="delete-1")
            second = client.request("run.delete", {}, run_id=root, idempotency_key="delete-1")
        assert first.outcome == "accepted" and second.outcome == "adopted" and second.receipt == first.receipt
        assert first.receipt == {
            "runId": root,
            "deleted": {"trees": 1, "runs": 1, "blobs": first.receipt["deleted"]["blobs"]},
        }
        assert first.receipt["deleted"]["blobs"] >= 1  # the run's own input at least

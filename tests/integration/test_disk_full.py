"""A full (or failing) disk never ends the server: a write group that cannot commit is answered
``unavailable`` (``diskFull``) and nothing acknowledged is lost; the supervisor keeps supervising
through failed writes of host.json and of its log, says why in ``server status``, stops when asked,
and serves again by itself once space returns. Injected ``ENOSPC``/``EIO`` at each write site
(``PIW_FAULTS``), and a real full tmpfs where the test may mount one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.engine_util import TENSTEP, start, wait_status, write
from tests.server_util import ServerProcess, check_state, serving, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]


def run_start(server: ServerProcess, project: Path) -> dict:
    """One run.start answered as it is right now (no retry)."""
    with server.client(retry_for=0) as client:
        response = client.request("run.start", {"projectPath": str(project), "workflowName": "tenstep"})
    return {"outcome": response.outcome, "receipt": response.receipt}


def status(server: ServerProcess) -> dict:
    with server.client(retry_for=0) as client:
        response = client.request("server.status")
    assert response.outcome == "accepted", response
    return dict(response.receipt)


def test_write_groups_failing_with_enospc_are_answered_disk_full_and_the_server_comes_back(
    tmp_path: Path, project: Path
):
    write(project, "tenstep", TENSTEP)
    # Write groups 6 to 30 fail as on a full disk (the first five: the epoch and startup recovery).
    with serving(tmp_path / "s", env={"PIW_FAULTS": "writer.before_commit=enospc@6-30"}) as server:
        answers = [run_start(server, project) for _ in range(40)]  # each a write group
        refused = [a for a in answers if a["outcome"] != "accepted"]
        assert refused and all(a["outcome"] == "unavailable" and a["receipt"]["code"] == "diskFull" for a in refused)
        assert all(isinstance(a["receipt"]["freeBytes"], int) for a in refused)
        accepted = [a["receipt"]["runId"] for a in answers if a["outcome"] == "accepted"]
        for run_id in accepted:  # nothing acknowledged is lost; the runs finish once writes commit again
            assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
        assert status(server)["state"] == "running"
        log = server.server_log()
        assert log.count("writes fail: diskFull") == 1 and "writes commit again" in log


def test_server_status_says_disk_full_and_server_stop_works_while_nothing_commits(tmp_path: Path):
    server = ServerProcess(tmp_path / "s", env={"PIW_FAULTS": "writer.before_commit=enospc@6-100000"}).start()
    wait_until(lambda: status(server)["state"] == "unavailable", what="a failed write group")
    found = status(server)
    assert found["reason"]["code"] == "diskFull" and found["reason"]["freeBytes"] >= 0
    assert "full" in found["reason"]["message"]
    human = server.cli("server", "status")
    assert "unavailable" in human.stdout and "diskFull" in human.stdout, human.stdout
    stopped = server.cli("server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert server.popen.wait(30) == 0


def test_an_epoch_claim_that_expired_while_nothing_committed_is_replaced_in_place(tmp_path: Path, project: Path):
    """Claims live 1 s and are renewed every 300 ms; about 3 s of failed groups outlive the epoch
    claim. The server takes a new epoch by itself and a run started before goes on."""
    write(project, "tenstep", TENSTEP)
    env = {
        "PI_WORKFLOWS_CLAIM_TTL_MS": "1000",
        "PIW_FAULTS": "writer.before_commit=enospc@8-18",
        "PI_WORKFLOWS_OUTBOX_WORKERS": "0",
    }
    with serving(tmp_path / "s", env=env) as server:
        wait_until(lambda: status(server)["epoch"] == 2, timeout=60, what="a new server epoch")
        run_id = start(server, project, "tenstep")
        assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
        assert "taking a new epoch" in server.server_log()
        assert json.loads((server.state_dir / "host" / "host.json").read_text())["serverEpoch"] == 2


def test_host_json_that_cannot_be_written_is_kept_and_written_again(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    # The start's own writes (supervisor, writer, epoch) succeed; the next twenty fail.
    server = ServerProcess(tmp_path / "s", env={"PIW_FAULTS": "supervisor.registry_save=enospc@4-23"}).start()
    host = server.state_dir / "host"
    try:
        run_ids = [start(server, project, "tenstep") for _ in range(5)]
        for run_id in run_ids:
            assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
        wait_until(lambda: "host.json is written again" in server.server_log(), what="host.json written again")
        registry = json.loads((host / "host.json").read_text())  # never half written
        assert registry["supervisor"]["pid"] == server.popen.pid
        assert not (host / "host.json.tmp").exists()
        assert server.server_log().count("host.json could not be written") == 1
    finally:
        assert server.stop() == 0, server.output()
    check_state(server.state_dir)


@pytest.mark.parametrize("fault", ["enospc", "eio"])
def test_log_lines_that_cannot_be_written_are_counted_not_fatal(tmp_path: Path, project: Path, fault: str):
    write(project, "tenstep", TENSTEP)
    # Line 1 is "serving on"; the writer killed below makes more (line 2 is lost, whichever it is).
    server = ServerProcess(tmp_path / "s", env={"PIW_FAULTS": f"supervisor.log_write={fault}@2"}).start()
    try:
        writer = server.child_pid("writer")
        os.kill(writer, signal.SIGKILL)
        wait_until(
            lambda: server.child_pid("writer") not in (None, writer) and status(server)["state"] == "running",
            what="the writer back",
        )
        run_id = start(server, project, "tenstep")
        assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
    finally:
        assert server.stop() == 0, server.output()
    reason = "No space left on device" if fault == "enospc" else "Input/output error"
    log = server.server_log()
    assert f"1 log lines were lost ({reason})" in log and "the writer is back" in log
    assert "Traceback" not in server.output() and "Logging error" not in server.output()


def test_a_start_that_cannot_write_host_json_fails_clearly(tmp_path: Path):
    server = ServerProcess(tmp_path / "s", env={"PIW_FAULTS": "supervisor.registry_save=enospc@1"})
    started = server.cli("server", "start")
    assert started.returncode == 1 and "is full" in started.stderr and "Traceback" not in started.stderr
    assert "did not start" in server.server_log()
    assert not server.client(retry_for=0).running()


# --- a real full disk -------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path):
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        # room for a server and a ten-step run, which fill() then takes away: each commit also
        # writes the run view's ops, and the WAL grows past its autocheckpoint size while readers
        # hold it (32 MB were once full before fill() ran)
        ["mount", "-t", "tmpfs", "-o", "size=128m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def usage(disk: Path) -> str:
    """What the disk holds, for a failure's message: its free blocks and inodes, its largest files."""
    stat = os.statvfs(disk)
    files = []
    for path in disk.rglob("*"):
        with contextlib.suppress(OSError):  # gone meanwhile
            files.append((path.lstat().st_size, str(path.relative_to(disk))))
    files.sort(reverse=True)
    return f"free {stat.f_bavail} of {stat.f_blocks} blocks, {stat.f_favail} inodes; largest: {files[:8]}"


def fill(disk: Path) -> Path:
    """Take every free byte of the disk with one file."""
    filler = disk / "filler"
    try:
        f = open(filler, "wb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise AssertionError(f"cannot create the filler ({exc}): {usage(disk)}") from None
    with f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_a_full_tmpfs_is_survived_and_the_server_serves_again_once_space_returns(small_disk: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    with serving(small_disk / "s") as server:
        done = start(server, project, "tenstep")
        assert wait_status(server, done, "completed", "failed")["display"]["status"] == "completed"
        filler = fill(small_disk)
        accepted: list[str] = []

        def refused_for_disk_full() -> bool:
            answer = run_start(server, project)
            if answer["outcome"] == "accepted":
                accepted.append(answer["receipt"]["runId"])
                return False
            assert answer["outcome"] == "unavailable", answer
            return answer["receipt"]["code"] == "diskFull"

        wait_until(refused_for_disk_full, timeout=120, interval=0, what="a write group refused for a full disk")
        # (a small commit, such as the heartbeat's, may still fit in the WAL's space: until the next
        # one the status says what the last group met)
        found = status(server)
        assert found["state"] == "running" or found["reason"]["code"] == "diskFull", found
        filler.unlink()  # space returns: the server serves again by itself
        wait_until(lambda: run_start(server, project)["outcome"] == "accepted", what="writes commit again")
        wait_until(lambda: status(server)["state"] == "running", what="running again")
        for run_id in [done, *accepted]:  # nothing acknowledged was lost
            assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
        host = server.state_dir / "host"
        assert json.loads((host / "host.json").read_text())["supervisor"]["pid"] == server.popen.pid
        assert not (host / "host.json.tmp").exists()
    assert "Traceback" not in server.output()


def test_server_stop_works_on_a_full_tmpfs(small_disk: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    server = ServerProcess(small_disk / "s").start()
    fill(small_disk)
    wait_until(
        lambda: run_start(server, project)["outcome"] == "unavailable",
        timeout=120,
        interval=0,
        what="a refused write group",
    )
    stopped = server.cli("server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert server.popen.wait(30) == 0
    assert not (server.state_dir / "host" / "host.json.tmp").exists()

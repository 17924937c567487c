"""The workflow server daemon end to end: real supervisor and writer processes, real sockets.

Covers the issue "Workflow server daemon": the CLI lifecycle (start, status,
stop, run, usage errors, protocol schema), file modes and host.json
identities, the single-server lock (also through another working directory
and a symlink), the socket path limit, takeover after ``kill -9`` (identity
checked), writer crashes (in flight and after COMMIT), graceful signals, a
log without payloads, and ``ensure_running``.

Every server a test starts is ended by the ``cleanup`` fixture, also when the
test fails: foreground servers through their Popen, detached ones through the
identities in host.json (psutil, identity checked).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from piworkflows import canonical
from piworkflows.client import WorkflowClient
from piworkflows.paths import SOCKET_PATH_LIMIT, StatePaths
from piworkflows.protocol import client_v1
from piworkflows.settings import Settings
from piworkflows.supervisor.registry import Identity
from piworkflows.writer.process import spawn
from tests.server_util import FAST_ENV, ROOT, ServerProcess, alive, gone, query, wait_until
from tests.support import SERVER, take_epoch, token_hash

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

PIW = str(Path(sys.executable).with_name("pi-workflows"))
ALREADY_RUNNING = "already running"
# A process whose command line carries the writer's marker, for takeover tests.
MARKED_SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", "piworkflows.writer"]


# --- helpers -----------------------------------------------------------------


def paths_of(state_dir: Path) -> StatePaths:
    return StatePaths.resolve(state_dir)


def registry(state_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(paths_of(state_dir).registry.read_text())
    return data


def writer_entry(state_dir: Path) -> dict[str, Any] | None:
    try:
        children = registry(state_dir)["children"]
    except (FileNotFoundError, ValueError):
        return None
    return next((c for c in children if c["role"] == "writer"), None)


def write_registry(state_dir: Path, data: dict[str, Any]) -> None:
    path = paths_of(state_dir).registry
    tmp = path.with_name("host.json.test-tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)


def identity_entry(role: str, pid: int, marker: str, create_time: float | None = None) -> dict[str, Any]:
    created = psutil.Process(pid).create_time() if create_time is None else create_time
    return {"role": role, "pid": pid, "createTime": created, "marker": marker, "processGroup": False}


def lock_is_free(state_dir: Path) -> bool:
    """Try the server lock ourselves (released at once); no lock file means nobody holds it."""
    if not paths_of(state_dir).lock.exists():
        return True
    fd = os.open(paths_of(state_dir).lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def host_state(state_dir: Path) -> list[tuple]:
    return query(state_dir, "SELECT server_epoch, host_id, claim_token_hash, expires_at FROM workflow_host_state")


def status(state_dir: Path) -> client_v1.Response:
    with WorkflowClient(state_dir, retry_for=10) as client:
        return client.request("server.status")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def log_text(state_dir: Path) -> str:
    host = paths_of(state_dir).host_dir
    return "".join(p.read_text(errors="replace") for p in sorted(host.glob("server.log*")))


class Cleanup:
    """Ends every process a test started, whatever happened in the test."""

    def __init__(self, home: Path) -> None:
        self.env = {**os.environ, **FAST_ENV, "HOME": str(home)}
        self.servers: list[ServerProcess] = []
        self.state_dirs: list[Path] = []
        self.helpers: list[subprocess.Popen[bytes]] = []

    def server(self, state_dir: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> ServerProcess:
        server = ServerProcess(state_dir, env={"HOME": self.env["HOME"], **(env or {})}, cwd=cwd)
        self.servers.append(server)
        self.watch(state_dir)
        return server

    def watch(self, state_dir: Path) -> None:
        """A state dir whose host.json names processes to end at teardown (detached servers)."""
        self.state_dirs.append(Path(state_dir))

    def helper(self, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.helpers.append(proc)
        return proc

    def cli(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 90
    ) -> subprocess.CompletedProcess[str]:
        """The installed ``pi-workflows ARGS``."""
        return self._run([PIW, *args], env, cwd, timeout)

    def module(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 90
    ) -> subprocess.CompletedProcess[str]:
        """``python -m piworkflows.supervisor ARGS``."""
        return self._run([sys.executable, "-m", "piworkflows.supervisor", *args], env, cwd, timeout)

    def _run(
        self, argv: list[str], env: dict[str, str] | None, cwd: Path | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            env={**self.env, **(env or {})},
            cwd=cwd or ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def close(self) -> None:
        for server in self.servers:
            if server.popen is not None and server.popen.poll() is None:
                server.popen.kill()
                server.popen.wait(30)
        for state_dir in self.state_dirs:
            try:
                data = registry(state_dir)
            except (FileNotFoundError, ValueError):
                continue
            entries = ([data["supervisor"]] if data.get("supervisor") else []) + list(data.get("children", []))
            for entry in entries:
                proc = Identity(**entry).find()
                if proc is not None:
                    with contextlib.suppress(psutil.Error):
                        proc.kill()
                    wait_until(lambda p=proc: gone(p.pid, p.create_time()), what="leftover process ended")
        for proc in self.helpers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


@pytest.fixture
def cleanup(private_home: Path):
    tracker = Cleanup(private_home)
    try:
        yield tracker
    finally:
        tracker.close()


def start_cli_server(cleanup: Cleanup, state_dir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``pi-workflows server start``; returns host.json of the new server."""
    cleanup.watch(state_dir)
    started = cleanup.cli("--state-dir", str(state_dir), "server", "start", env=env)
    assert started.returncode == 0, started.stderr
    assert f"server started for {state_dir}" in started.stdout
    return registry(state_dir)


# --- 1. CLI lifecycle ----------------------------------------------------------


def test_cli_start_status_stop_and_status_when_stopped(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    reg = start_cli_server(cleanup, state_dir)
    sup = reg["supervisor"]
    writer = next(c for c in reg["children"] if c["role"] == "writer")
    assert alive(sup["pid"], sup["createTime"]) and alive(writer["pid"], writer["createTime"])
    assert psutil.Process(writer["pid"]).ppid() == sup["pid"]

    human = cleanup.cli("--state-dir", str(state_dir), "server", "status")
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith(f"running ({state_dir}), server epoch 1\n")
    assert "runs: 0 queued, 0 running, 0 parked, 0 waiting" in human.stdout

    as_json = cleanup.cli("--state-dir", str(state_dir), "server", "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.count("\n") == 1 and as_json.stdout.endswith("\n")
    receipt = json.loads(as_json.stdout)
    assert receipt["state"] == "running" and receipt["socketAvailable"] is True
    assert receipt["epoch"] == 1 == reg["serverEpoch"]
    client_v1.ServerStatusReceipt.model_validate(receipt)

    stopped = cleanup.cli("--state-dir", str(state_dir), "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "server stopped"
    # `server stop` returns once the supervisor has exited; the writer goes first.
    assert gone(sup["pid"], sup["createTime"])
    assert gone(writer["pid"], writer["createTime"])
    assert not paths_of(state_dir).socket.exists()
    assert lock_is_free(state_dir)
    assert host_state(state_dir)[0][:2] == (1, None)  # the claim was released

    not_running = cleanup.cli("--state-dir", str(state_dir), "server", "status")
    assert not_running.returncode == 1
    assert not_running.stdout.strip() == f"not running ({state_dir})"
    not_running_json = cleanup.cli("--state-dir", str(state_dir), "server", "status", "--json")
    assert not_running_json.returncode == 1
    assert json.loads(not_running_json.stdout) == {"socketAvailable": False, "state": "stopped"}

    stop_again = cleanup.cli("--state-dir", str(state_dir), "server", "stop")
    assert stop_again.returncode == 0, stop_again.stderr
    assert stop_again.stdout.strip() == f"not running ({state_dir})"

    # A new server starts on the released lock and takes the next epoch.
    reg2 = start_cli_server(cleanup, state_dir)
    assert reg2["serverEpoch"] == 2 and reg2["supervisor"]["pid"] != sup["pid"]
    assert json.loads(cleanup.cli("--state-dir", str(state_dir), "server", "status", "--json").stdout)["epoch"] == 2
    assert cleanup.cli("--state-dir", str(state_dir), "server", "stop").returncode == 0
    wait_until(lambda: gone(reg2["supervisor"]["pid"], reg2["supervisor"]["createTime"]), what="second server gone")


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (("server", "bogus"), "No such command"),
        (("--state-dir",), "requires an argument"),
        (("server", "status", "--bogus"), "No such option"),
        (("server", "stop", "--timeout", "soon"), "not a valid float"),
        (("bogus",), "No such command"),
        (("server", "stop", "--timeout", "-1"), ">=0"),
        (("state", "prune", "--before", "yesterday", "--dry-run"), "e.g. 2026-08-01T00:00:00Z"),
        (("state", "prune", "--before", "2026-08-01T00:00:00", "--dry-run"), "with a zone"),
        (("state", "prune", "--before", "2026-08-01T00:00:00Z", "--backup", "/abs/b.sqlite"), "--apply"),
        (("state", "reset", "--backup", "relative/dir"), "absolute"),
        (("run", "status", ""), "RUN_ID"),
        (("effect", "confirm", "effect-1", "--note", "n" * 2001), "note: String should have at most 2000 characters"),
    ],
    ids=[
        "unknown-server-command",
        "state-dir-without-value",
        "unknown-option",
        "bad-option-value",
        "unknown-group",
        "negative-timeout",
        "before-not-a-time",
        "before-without-zone",
        "backup-without-apply",
        "reset-relative",
        "empty-run-id",
        "note-too-long",
    ],
)
def test_cli_usage_errors_exit_2(cleanup: Cleanup, tmp_path: Path, args: tuple[str, ...], fix: str):
    """Whatever the CLI can check itself is a usage error with the fix, before anything is sent."""
    result = cleanup.cli(*args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Error:" in result.stderr and fix in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "home" / ".pi").exists()  # nothing was started in the default state dir


def test_cli_protocol_schema_names_every_operation(cleanup: Cleanup, tmp_path: Path):
    result = cleanup.cli("protocol", "schema", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == client_v1.SCHEMA
    served, not_served = set(document["operations"]), set(document["notYetServed"])
    assert served | not_served == set(client_v1.OPERATIONS) and not served & not_served
    assert {"server.status", "server.stop", "protocol.schema"} <= served
    for operation, shape in document["operations"].items():
        assert {"payload", "receipt", "stored"} <= set(shape), operation
    assert document["operations"]["server.stop"]["stored"] is True
    assert document["operations"]["server.status"]["stored"] is False
    assert set(document["messages"]) == {"Hello", "Request", "Response", "Event", "Refused"}


# --- 2. files, modes and host.json ---------------------------------------------


def test_files_modes_and_host_json_identities(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    server = cleanup.server(state_dir)
    old_umask = os.umask(0)  # the server must not rely on the caller's umask
    try:
        server.start()
    finally:
        os.umask(old_umask)
    paths = paths_of(state_dir)
    assert mode(paths.state_dir) == 0o700 and stat.S_ISDIR(paths.state_dir.lstat().st_mode)
    assert mode(paths.host_dir) == 0o700
    for path in (paths.database, paths.lock, paths.log, paths.registry):
        assert stat.S_ISREG(path.lstat().st_mode), path
        assert mode(path) == 0o600, path
    for path in (paths.wal, paths.shm):
        if path.exists():
            assert mode(path) == 0o600, path
    assert stat.S_ISSOCK(paths.socket.lstat().st_mode)
    assert mode(paths.socket) == 0o600

    response = status(state_dir)
    assert response.outcome == "accepted"
    reg = registry(state_dir)
    assert reg["serverEpoch"] == response.receipt["epoch"] == 1
    sup = reg["supervisor"]
    assert sup["role"] == "supervisor" and sup["pid"] == server.popen.pid
    assert sup["createTime"] == psutil.Process(sup["pid"]).create_time()
    assert any(sup["marker"] in part for part in psutil.Process(sup["pid"]).cmdline())
    [writer] = [c for c in reg["children"] if c["role"] == "writer"]
    assert writer["marker"] == "piworkflows.writer"
    assert len(reg["children"]) == 1  # the writer: outbox workers start for effects, runners for runs
    proc = psutil.Process(writer["pid"])
    assert writer["createTime"] == proc.create_time()
    assert proc.ppid() == sup["pid"]
    assert any("piworkflows.writer" in part for part in proc.cmdline())
    assert Identity(**writer).find() is not None and Identity(**sup).find() is not None

    assert server.stop() == 0
    assert not paths.socket.exists()
    assert mode(paths.registry) == 0o600 and mode(paths.database) == 0o600 and mode(paths.log) == 0o600


# --- 3. one server per state dir --------------------------------------------------


def test_second_server_is_refused_however_the_state_dir_is_named(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    first = cleanup.server(state_dir).start()
    link = tmp_path / "ln"
    os.symlink(state_dir, link)
    cleanup.watch(link)
    sock_before = os.stat(paths_of(state_dir).socket)
    reg_before = paths_of(state_dir).registry.read_text()
    epoch = status(state_dir).receipt["epoch"]

    attempts = {
        "module": lambda: cleanup.module("--state-dir", str(state_dir), "--foreground"),
        "cli-run": lambda: cleanup.cli("--state-dir", str(state_dir), "server", "run"),
        "cli-start": lambda: cleanup.cli("--state-dir", str(state_dir), "server", "start"),
        "module-other-cwd": lambda: cleanup.module("--state-dir", "s", "--foreground", cwd=tmp_path),
        "cli-run-other-cwd": lambda: cleanup.cli("--state-dir", "s", "server", "run", cwd=tmp_path),
        "cli-start-other-cwd": lambda: cleanup.cli("--state-dir", "s", "server", "start", cwd=tmp_path),
        "module-symlink": lambda: cleanup.module("--state-dir", str(link), "--foreground"),
        "cli-run-symlink": lambda: cleanup.cli("--state-dir", str(link), "server", "run"),
        "cli-start-symlink": lambda: cleanup.cli("--state-dir", str(link), "server", "start"),
        "cli-run-env": lambda: cleanup.cli("server", "run", env={"PI_WORKFLOWS_STATE_DIR": str(link)}, cwd=tmp_path),
    }
    for name, attempt in attempts.items():
        result = attempt()
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        assert ALREADY_RUNNING in result.stderr, (name, result.stderr)
        assert "pi-workflows server status" in result.stderr, name
        assert "Traceback" not in result.stderr, name
        assert first.popen.poll() is None, name

    # The first server is untouched and keeps serving.
    sock_after = os.stat(paths_of(state_dir).socket)
    assert (sock_after.st_ino, sock_after.st_ctime_ns) == (sock_before.st_ino, sock_before.st_ctime_ns)
    assert paths_of(state_dir).registry.read_text() == reg_before
    response = status(state_dir)
    assert response.outcome == "accepted" and response.receipt["epoch"] == epoch
    assert first.stop() == 0


# --- 4. socket path limit ------------------------------------------------------------


def state_dir_with_socket_length(parent: Path, length: int) -> Path:
    fixed = len(os.fsencode(parent)) + 1 + len("/host/host.sock")
    assert length - fixed >= 1, "tmp_path is too long for this test"
    state_dir = parent / ("d" * (length - fixed))
    assert len(os.fsencode(paths_of(state_dir).socket)) == length
    return state_dir


def test_socket_path_over_the_limit_fails_start_and_releases_the_lock(cleanup: Cleanup, tmp_path: Path):
    assert SOCKET_PATH_LIMIT == 107
    long_dir = state_dir_with_socket_length(tmp_path, SOCKET_PATH_LIMIT + 1)
    cleanup.watch(long_dir)

    # No database yet: the start fails before the writer, so none is created.
    result = cleanup.module("--state-dir", str(long_dir), "--foreground")
    assert result.returncode == 1, result.stderr
    assert "107" in result.stderr and "108 bytes" in result.stderr and "Traceback" not in result.stderr
    assert lock_is_free(long_dir)
    assert not paths_of(long_dir).database.exists()
    assert not paths_of(long_dir).socket.exists()

    # With an existing database (epoch 1 taken and released): still no epoch is taken.
    writer = spawn(long_dir, Settings())
    try:
        assert writer.link.request("server.take_epoch", take_epoch().body, timeout=30).outcome == "accepted"
        release = {"actor": SERVER, "server_epoch": 1, "claim_token_hash": token_hash("epoch-token")}
        assert writer.link.request("server.release_epoch", release, timeout=30).outcome == "accepted"
    finally:
        assert writer.stop() == 0
    before = host_state(long_dir)
    assert [row[:2] for row in before] == [(1, None)]

    for attempt in (
        lambda: cleanup.cli("--state-dir", str(long_dir), "server", "start"),
        lambda: cleanup.cli("--state-dir", str(long_dir), "server", "run"),
    ):
        result = attempt()
        assert result.returncode == 1, result.stderr
        assert "platform limit is 107 bytes" in result.stderr, result.stderr
        assert lock_is_free(long_dir)
        assert host_state(long_dir) == before  # no epoch taken, the claim stays released
        assert not paths_of(long_dir).socket.exists()


def test_socket_path_exactly_at_the_limit_serves(cleanup: Cleanup, tmp_path: Path):
    state_dir = state_dir_with_socket_length(tmp_path, SOCKET_PATH_LIMIT)
    server = cleanup.server(state_dir).start()
    assert status(state_dir).outcome == "accepted"
    assert server.stop() == 0


# --- 5. kill -9 of the supervisor and takeover -----------------------------------------


def killed_with_its_writer(cleanup: Cleanup, state_dir: Path) -> None:
    """A server started, then killed with SIGKILL; returns once its writer has gone too (it follows its parent),
    leaving host.json with the identities of an older epoch."""
    server = cleanup.server(state_dir).start()
    writer = writer_entry(state_dir)
    assert writer is not None
    server.kill()
    wait_until(lambda: gone(writer["pid"], writer["createTime"]), what="old writer gone")


def test_kill_9_supervisor_then_restart_takes_over(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    paths = paths_of(state_dir)
    first = cleanup.server(state_dir).start()
    epoch = status(state_dir).receipt["epoch"]
    old_writer = writer_entry(state_dir)
    assert old_writer is not None

    first.kill()
    assert paths.socket.exists()  # stale: nobody removed it
    keep = tmp_path / "old.sock"
    os.link(paths.socket, keep)  # keeps the old inode allocated, so "replaced" is observable
    old_ino = keep.stat().st_ino
    assert not WorkflowClient(state_dir, retry_for=0).running()

    second = cleanup.server(state_dir).start()
    response = status(state_dir)
    assert response.outcome == "accepted" and response.receipt["state"] == "running"
    assert response.receipt["epoch"] == epoch + 1
    assert registry(state_dir)["serverEpoch"] == epoch + 1
    assert registry(state_dir)["supervisor"]["pid"] == second.popen.pid
    assert host_state(state_dir)[0][0] == epoch + 1
    assert paths.socket.stat().st_ino != old_ino and stat.S_ISSOCK(paths.socket.lstat().st_mode)
    wait_until(lambda: gone(old_writer["pid"], old_writer["createTime"]), what="old writer gone")
    new_writer = writer_entry(state_dir)
    assert new_writer is not None and new_writer["pid"] != old_writer["pid"]
    assert psutil.Process(new_writer["pid"]).ppid() == second.popen.pid
    assert second.stop() == 0


def test_takeover_ends_only_leftovers_whose_identity_matches(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    killed_with_its_writer(cleanup, state_dir)

    matching = cleanup.helper(MARKED_SLEEPER)
    wrong_time = cleanup.helper(MARKED_SLEEPER)
    no_marker = cleanup.helper(["sleep", "60"])
    for proc in (matching, wrong_time, no_marker):
        wait_until(lambda p=proc: alive(p.pid) and psutil.Process(p.pid).cmdline()[:1] == [p.args[0]])
    # Reap the matching one as soon as it dies (the takeover waits until it is gone).
    reaper = threading.Thread(target=matching.wait, daemon=True)
    reaper.start()
    data = registry(state_dir)
    data["children"] = [
        identity_entry("writer", matching.pid, "piworkflows.writer"),
        identity_entry(
            "writer", wrong_time.pid, "piworkflows.writer", psutil.Process(wrong_time.pid).create_time() + 7
        ),
        identity_entry("writer", no_marker.pid, "piworkflows.writer"),
    ]
    write_registry(state_dir, data)

    second = cleanup.server(state_dir).start()
    reaper.join(timeout=30)
    assert matching.returncode == -signal.SIGTERM
    assert wrong_time.poll() is None and alive(wrong_time.pid)
    assert no_marker.poll() is None and alive(no_marker.pid)
    assert "ended leftover processes of an older server: writer" in log_text(state_dir)
    response = status(state_dir)
    assert response.outcome == "accepted" and response.receipt["epoch"] == 2
    assert second.stop() == 0
    assert wrong_time.poll() is None and no_marker.poll() is None  # a clean stop leaves them alone too


def test_failed_start_keeps_the_older_epochs_identities(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    killed_with_its_writer(cleanup, state_dir)
    leftover = cleanup.helper(MARKED_SLEEPER)
    wait_until(lambda: "piworkflows.writer" in psutil.Process(leftover.pid).cmdline())
    reaper = threading.Thread(target=leftover.wait, daemon=True)
    reaper.start()
    data = registry(state_dir)
    data["children"] = [identity_entry("writer", leftover.pid, "piworkflows.writer")]
    write_registry(state_dir, data)

    # A start refused before it takes over (a planted link where its log goes) ends nothing.
    log_path = state_dir / "host" / "server.log"
    log_path.rename(state_dir / "host" / "server.log.kept")
    log_path.symlink_to(tmp_path / "elsewhere.log")
    result = cleanup.module("--state-dir", str(state_dir), "--foreground")
    assert result.returncode == 1 and "symbolic link" in result.stderr, result.stderr
    assert leftover.poll() is None and not (tmp_path / "elsewhere.log").exists()
    log_path.unlink()

    second = cleanup.server(state_dir).start()
    reaper.join(timeout=30)
    try:
        assert leftover.returncode == -signal.SIGTERM, "the leftover of the older epoch was not ended"
    finally:
        assert second.stop() == 0


# --- 6. writer crashes ----------------------------------------------------------------


def test_kill_9_writer_while_clients_send_commands(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    server = cleanup.server(state_dir).start()
    supervisor = psutil.Process(server.popen.pid)
    old_writer = writer_entry(state_dir)
    assert old_writer is not None

    stop = threading.Event()
    answers: list[list[client_v1.Response]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def loop(index: int) -> None:
        try:
            with WorkflowClient(state_dir, retry_for=60, timeout=30) as client:
                while not stop.is_set():
                    answers[index].append(client.request("server.status"))
        except BaseException as exc:  # noqa: B036 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(answers))]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: errors or all(len(a) >= 3 for a in answers), what="clients busy")
        os.kill(old_writer["pid"], signal.SIGKILL)
        with WorkflowClient(state_dir, retry_for=0) as probe:  # no retry: what the socket answers right now
            answer = probe.request("server.status")
        # server.status is answered through the outage, saying why nothing can be committed
        assert answer.outcome == "accepted", answer
        if answer.receipt["state"] == "unavailable":
            assert answer.receipt["reason"]["code"] == "writerRestarting" and answer.receipt["queuedRuns"] is None
        new_writer = wait_until(
            lambda: (w := writer_entry(state_dir)) is not None and w["pid"] != old_writer["pid"] and w,
            what="writer restarted",
        )
        marks = [len(a) for a in answers]
        wait_until(
            lambda: errors or all(len(a) >= m + 3 for a, m in zip(answers, marks, strict=True)),
            what="clients served again",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    for answered in answers:
        assert answered and all(a.outcome == "accepted" for a in answered), [a.outcome for a in answered]
    assert server.popen.poll() is None and supervisor.is_running()
    assert gone(old_writer["pid"], old_writer["createTime"])
    assert alive(new_writer["pid"], new_writer["createTime"])
    assert psutil.Process(new_writer["pid"]).ppid() == server.popen.pid
    assert status(state_dir).receipt["epoch"] == 1  # the same server epoch throughout
    wait_until(lambda: status(state_dir).receipt["state"] == "running", what="the writer back")
    assert "the writer is back (restart 1)" in log_text(state_dir)
    assert server.stop() == 0


def test_stop_committed_before_a_writer_crash_is_adopted(cleanup: Cleanup, tmp_path: Path):
    """Commit 1 is the epoch; commit 2 is the server.stop, and the writer dies after COMMIT, before replying."""
    state_dir = tmp_path / "s"
    # No outbox pool and no retention: their startup recovery, claims and sweep would be commits too.
    env = {
        "PIW_FAULTS": "writer.after_commit=crash@2",
        "PI_WORKFLOWS_CLAIM_RENEW_MS": "60000",
        "PI_WORKFLOWS_OUTBOX_WORKERS": "0",
        "PI_WORKFLOWS_RETENTION": "false",
    }
    server = cleanup.server(state_dir, env=env).start()  # readiness only connects: no command, no commit
    old_writer = writer_entry(state_dir)
    assert old_writer is not None
    key = "stop-key-1"
    with WorkflowClient(state_dir, client_id="client-durable", retry_for=30) as client:
        response = client.request("server.stop", idempotency_key=key)
    assert response.outcome == "adopted", response
    assert response.receipt == {"stopping": True, "serverEpoch": 1}
    assert server.popen.wait(30) == 0
    assert gone(old_writer["pid"], old_writer["createTime"])
    assert not paths_of(state_dir).socket.exists()
    assert lock_is_free(state_dir)
    rows = query(
        state_dir,
        "SELECT client_id, operation, outcome, error FROM host_commands WHERE idempotency_key = ?",
        key,
    )
    assert rows == [("client-durable", "server.stop", "accepted", None)]
    assert query(state_dir, "SELECT count(*) FROM events WHERE event_type = 'server.stop_requested'") == [(1,)]
    # The writer restart kept the server epoch. (The restarted writer inherits PIW_FAULTS with a fresh count, so
    # its commit 2, the release of the claim at shutdown, also dies after COMMIT: the supervisor logs the release
    # as not confirmed, yet it committed.)
    assert host_state(state_dir) == [(1, None, None, None)]
    assert "the writer exited" in log_text(state_dir)


# --- 7. signals -----------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_gracefully_and_the_next_start_takes_the_next_epoch(
    cleanup: Cleanup, tmp_path: Path, signum: signal.Signals
):
    state_dir = tmp_path / "s"
    server = cleanup.server(state_dir).start()
    epoch = status(state_dir).receipt["epoch"]
    writer = writer_entry(state_dir)
    [(db_epoch, host_id, token, _expires)] = host_state(state_dir)
    assert db_epoch == epoch and host_id is not None and token is not None

    server.popen.send_signal(signum)
    assert server.popen.wait(30) == 0
    assert not paths_of(state_dir).socket.exists()
    assert gone(writer["pid"], writer["createTime"])
    assert lock_is_free(state_dir)
    assert host_state(state_dir) == [(epoch, None, None, None)]
    assert registry(state_dir)["children"] == []
    assert f"stopping: {signum.name}" in log_text(state_dir)

    again = cleanup.server(state_dir).start()
    assert status(state_dir).receipt["epoch"] == epoch + 1
    assert registry(state_dir)["serverEpoch"] == epoch + 1
    assert again.stop() == 0


# --- 8. the log ------------------------------------------------------------------------


def raw_exchange(state_dir: Path, line: bytes) -> list[bytes]:
    """Send one line after the hello; return what the server sends until it closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(paths_of(state_dir).socket))
        stream = sock.makefile("rb")
        assert json.loads(stream.readline())["type"] == "hello"
        sock.sendall(line)
        received = []
        while chunk := stream.readline():
            received.append(chunk)
        return received


def envelope(**fields: Any) -> dict[str, Any]:
    base = {
        "schema": client_v1.SCHEMA,
        "type": "request",
        "requestId": "req-1",
        "clientId": "client-log",
        "operation": "server.status",
        "idempotencyKey": "key-1",
        "payload": {},
    }
    return {**base, **fields}


def test_server_log_is_private_and_holds_no_payloads(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    server = cleanup.server(state_dir).start()
    with WorkflowClient(state_dir, retry_for=5) as client:
        refused = client.request("resourceManager.apply", {"secret": "XYZZY-42"})
        assert refused.outcome == "rejected" and refused.receipt["code"] == "notAvailable"
        invalid = client.request("server.status", {"secret": "XYZZY-44"})
        assert invalid.outcome == "rejected" and invalid.receipt["code"] == "validationFailed"
        assert "XYZZY-44" not in (invalid.error or "")
    malformed = [
        b"not json XYZZY-43\n",
        b'{"payload": "XYZZY-43", "type": "request"}\n',  # not canonical
        canonical.dumps(envelope(operation="XYZZY-43")).encode() + b"\n",
        canonical.dumps(envelope(requestId="")).encode()[:-1] + b',"x":"XYZZY-43"}\n',
        canonical.dumps(envelope(type="XYZZY-43")).encode() + b"\n",
    ]
    for line in malformed:
        assert raw_exchange(state_dir, line) == []  # closed without an answer
    assert server.stop() == 0  # flushes and closes the log

    paths = paths_of(state_dir)
    assert mode(paths.log) == 0o600
    text = log_text(state_dir)
    assert "serving on" in text and "closed a connection" in text  # the events were logged
    assert "XYZZY" not in text


@pytest.mark.parametrize(
    "line",
    [
        canonical.dumps(envelope(**{"XYZZY-45": 1})).encode() + b"\n",
        b'{"XYZZY-45": 1, "XYZZY-45": 2}\n',
    ],
    ids=["unknown-envelope-member", "duplicate-key"],
)
def test_server_log_holds_no_frame_text_from_object_keys(cleanup: Cleanup, tmp_path: Path, line: bytes):
    state_dir = tmp_path / "s"
    server = cleanup.server(state_dir).start()
    assert raw_exchange(state_dir, line) == []
    assert server.stop() == 0
    assert "XYZZY-45" not in log_text(state_dir)


# --- 9. ensure_running ------------------------------------------------------------------


def test_ensure_running_starts_a_server_when_none_runs(
    cleanup: Cleanup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name, value in FAST_ENV.items():
        monkeypatch.setenv(name, value)
    state_dir = tmp_path / "s"
    cleanup.watch(state_dir)
    client = WorkflowClient(state_dir, retry_for=10)
    try:
        assert not client.running()
        client.ensure_running()
        sup = registry(state_dir)["supervisor"]
        assert alive(sup["pid"], sup["createTime"])
        response = client.request("server.status")
        assert response.outcome == "accepted" and response.receipt["epoch"] == 1

        client.ensure_running()  # already running: connects, starts nothing
        assert registry(state_dir)["supervisor"] == sup
        assert client.request("server.stop").outcome == "accepted"
    finally:
        client.close()
    wait_until(lambda: gone(sup["pid"], sup["createTime"]), what="server gone")
    assert not paths_of(state_dir).socket.exists() and lock_is_free(state_dir)


# --- the stop handshake ------------------------------------------------------------------


def test_cli_stop_returns_only_after_the_server_has_exited(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    # Commit 3 is the release of the epoch claim during shutdown (1: epoch, 2: the stop); make it slow.
    env = {"PIW_FAULTS": "writer.before_commit=sleep:3000@3", "PI_WORKFLOWS_CLAIM_RENEW_MS": "60000"}
    reg = start_cli_server(cleanup, state_dir, env=env)
    sup = reg["supervisor"]
    stopped = cleanup.cli("--state-dir", str(state_dir), "server", "stop")
    assert stopped.returncode == 0 and stopped.stdout.strip() == "server stopped"
    try:
        assert gone(sup["pid"], sup["createTime"]), "the supervisor still runs after 'server stop' returned"
        assert lock_is_free(state_dir)
        restarted = cleanup.cli("--state-dir", str(state_dir), "server", "start")
        assert restarted.returncode == 0, restarted.stderr
    finally:
        wait_until(lambda: gone(sup["pid"], sup["createTime"]), what="old server gone")
        if WorkflowClient(state_dir, retry_for=0).running():
            cleanup.cli("--state-dir", str(state_dir), "server", "stop")


def test_a_stop_that_times_out_shows_stopping_and_kill_ends_every_recorded_process(cleanup: Cleanup, tmp_path: Path):
    state_dir = tmp_path / "s"
    # The shutdown hangs once the socket closed: the supervisor and its children live on.
    reg = start_cli_server(cleanup, state_dir, env={"PIW_FAULTS": "supervisor.socket_closed=sleep:60000"})
    recorded = [reg["supervisor"], *reg["children"]]
    writer = next(c for c in reg["children"] if c["role"] == "writer")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cleanup.cli("--state-dir", str(state_dir), *args)

    timed_out = cli("server", "stop", "--timeout", "1")
    assert timed_out.returncode == 1, timed_out.stdout
    assert "did not stop within 1 s" in timed_out.stderr
    assert f"pi-workflows --state-dir {state_dir} server stop --kill" in timed_out.stderr
    wait_until(lambda: not paths_of(state_dir).socket.exists(), what="the socket closed")
    assert all(alive(entry["pid"], entry["createTime"]) for entry in recorded)
    pids = [entry["pid"] for entry in [registry(state_dir)["supervisor"], *registry(state_dir)["children"]]]

    status = cli("server", "status")
    assert status.returncode == 1
    assert status.stdout.startswith(f"stopping (pids: {', '.join(map(str, pids))})"), status.stdout
    as_json = cli("server", "status", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {"pids": pids, "socketAvailable": False, "state": "stopping"}

    killed = cli("server", "stop", "--kill", "--timeout", "1")
    assert killed.returncode == 0, killed.stderr
    assert f"killed supervisor (pid {reg['supervisor']['pid']})" in killed.stdout
    assert f"killed writer (pid {writer['pid']})" in killed.stdout
    assert all(gone(entry["pid"], entry["createTime"]) for entry in recorded)
    assert lock_is_free(state_dir)
    after = cli("server", "status")
    assert after.returncode == 1 and after.stdout.strip() == f"not running ({state_dir})"
    assert cli("server", "start").returncode == 0  # the next server takes over
    assert cli("server", "stop").returncode == 0


def test_status_and_stop_kill_act_only_on_recorded_processes_whose_identity_matches(cleanup: Cleanup, tmp_path: Path):
    """host.json of a server whose supervisor is gone: a leftover child that matches is waited for, then
    killed; a reused pid (another create time) or a process without the marker is neither shown nor signalled."""
    state_dir = tmp_path / "s"
    paths_of(state_dir).host_dir.mkdir(parents=True)
    matching = cleanup.helper(MARKED_SLEEPER)
    wrong_time = cleanup.helper(MARKED_SLEEPER)
    no_marker = cleanup.helper(["sleep", "60"])
    for proc in (matching, wrong_time, no_marker):
        wait_until(lambda p=proc: alive(p.pid) and psutil.Process(p.pid).cmdline()[:1] == [p.args[0]])
    reaper = threading.Thread(target=matching.wait, daemon=True)  # our child: reaped as soon as it dies
    reaper.start()
    reused = psutil.Process(wrong_time.pid).create_time() + 7
    write_registry(
        state_dir,
        {
            "serverEpoch": 1,
            "supervisor": None,
            "children": [
                identity_entry("writer", matching.pid, "piworkflows.writer"),
                identity_entry("writer", wrong_time.pid, "piworkflows.writer", reused),
                identity_entry("writer", no_marker.pid, "piworkflows.writer"),
            ],
        },
    )

    status = cleanup.cli("--state-dir", str(state_dir), "server", "status", "--json")
    assert status.returncode == 1
    assert json.loads(status.stdout) == {"pids": [matching.pid], "socketAvailable": False, "state": "stopping"}
    waited = cleanup.cli("--state-dir", str(state_dir), "server", "stop", "--timeout", "0")
    assert waited.returncode == 1 and "did not stop within 0 s" in waited.stderr, waited.stderr
    killed = cleanup.cli("--state-dir", str(state_dir), "server", "stop", "--kill", "--timeout", "0")
    assert killed.returncode == 0, killed.stderr
    assert killed.stdout == f"killed writer (pid {matching.pid})\nserver stopped (killed)\n"
    reaper.join(timeout=30)
    assert matching.returncode == -signal.SIGKILL
    assert wrong_time.poll() is None and no_marker.poll() is None
    assert cleanup.cli("--state-dir", str(state_dir), "server", "status").stdout.strip() == f"not running ({state_dir})"

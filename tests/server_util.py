"""Real servers for integration tests: their environments, starting and stopping them, reading them.

The ``server`` fixture every integration module uses is in ``tests/integration/conftest.py``; it is
built from ``serving`` and ``marked_env`` here. Tests that restart a server on the same state dir
use ``ServerProcess`` (or ``serving``) themselves.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from piworkflows.client import WorkflowClient

ROOT = Path(__file__).resolve().parents[1]

# Short durations instead of faking time across processes (ARCHITECTURE.md, Time and identity).
FAST_ENV = {
    "PI_WORKFLOWS_CLAIM_TTL_MS": "3000",
    "PI_WORKFLOWS_CLAIM_RENEW_MS": "300",
    "PI_WORKFLOWS_WRITER_RESTART_MIN_MS": "20",
    "PI_WORKFLOWS_WRITER_RESTART_MAX_MS": "200",
    "PI_WORKFLOWS_STOP_GRACE_MS": "3000",
    "PI_WORKFLOWS_PARENT_CHECK_MS": "100",
    "PI_WORKFLOWS_OUTBOX_RESTART_MIN_MS": "20",
    "PI_WORKFLOWS_OUTBOX_RESTART_MAX_MS": "200",
    "PI_WORKFLOWS_EFFECT_RETRY_BASE_MS": "100",
    "PI_WORKFLOWS_EFFECT_RETRY_MAX_MS": "1000",
    "PI_WORKFLOWS_EFFECT_AWAIT_MS": "2000",
}

# Runners start within 100 ms of a run's start or answer (the scheduler's default tick is 1 s).
SCHEDULER_TICK = {"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100"}


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Poll until predicate() is truthy; return its value. Never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def stays(predicate: Callable[[], Any], seconds: float = 1.0, what: str = "condition") -> None:
    """A bounded check: predicate() holds at every poll until the deadline (a deadline, not a sleep)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding"
        time.sleep(0.05)


def alive(pid: int, create_time: float | None = None) -> bool:
    """The process runs (not a zombie) and, if given, has this create time."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and proc.create_time() != create_time:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def gone(pid: int, create_time: float | None = None) -> bool:
    """The process has ended (or is a zombie, or the pid is another process's now)."""
    return not alive(pid, create_time)


def query(server: ServerProcess | Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows read straight from a server's state database (or a state dir's), read-only."""
    state_dir = server.state_dir if isinstance(server, ServerProcess) else Path(server)
    uri = f"file:{state_dir / 'state.sqlite'}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        return conn.execute(sql, params).fetchall()


def check_state(state_dir: Path) -> None:
    """The spec's invariants plus SQLite's integrity and foreign-key checks, read-only."""
    from piworkflows.writer import invariants

    conn = sqlite3.connect(f"file:{Path(state_dir) / 'state.sqlite'}?mode=ro", uri=True)
    try:
        assert invariants.integrity(conn) == []
        assert invariants.violations(conn, int(time.time() * 1000)) == {}
    finally:
        conn.close()


class ServerProcess:
    """``python -m piworkflows.supervisor --foreground`` on a temporary state dir."""

    def __init__(self, state_dir: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.env = {**os.environ, **FAST_ENV, **(env or {})}
        self.cwd = cwd or ROOT
        self.popen: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}-stderr-{time.monotonic_ns()}.log"

    def start(self, wait: bool = True) -> ServerProcess:
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "piworkflows.supervisor", "--state-dir", str(self.state_dir), "--foreground"],
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        if wait:
            wait_until(self._serving_or_exited, what="server ready")
            if self.popen.poll() is not None:
                raise RuntimeError(f"server exited with {self.popen.returncode}: {self.output()}")
        return self

    def _serving_or_exited(self) -> bool:
        assert self.popen is not None
        return self.popen.poll() is not None or WorkflowClient(self.state_dir, retry_for=0).running()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, **kwargs: Any) -> WorkflowClient:
        return WorkflowClient(self.state_dir, **kwargs)

    def cli_command(self, *args: str) -> list[str]:
        """The command line of ``pi-workflows --state-dir STATE ARGS`` (run it with ``env=self.env``)."""
        return [sys.executable, "-m", "piworkflows.cli", "--state-dir", str(self.state_dir), *args]

    @contextmanager
    def cli_background(self, *args: str) -> Iterator[subprocess.Popen[str]]:
        """``pi-workflows --state-dir STATE ARGS`` in the background, its output in text pipes and SIGINT at
        its default action (as in a terminal, where Ctrl-C sends it); killed if it still runs when the
        block ends."""
        proc = subprocess.Popen(
            self.cli_command(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)

    def cli(
        self, *args: str, timeout: float = 60, text: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[Any]:
        """``pi-workflows --state-dir STATE ARGS`` in this server's environment, with ``env`` over it
        (``text=False``: bytes)."""
        return subprocess.run(
            self.cli_command(*args),
            capture_output=True,
            text=text,
            timeout=timeout,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
        )

    def server_log(self) -> str:
        path = self.state_dir / "host" / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def registry(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "host" / "host.json").read_text())
        return data

    def child_pid(self, role: str) -> int | None:
        for child in self.registry()["children"]:
            if child["role"] == role:
                return int(child["pid"])
        return None

    def child_pids(self, role: str) -> list[int]:
        """The children of this role that the supervisor has recorded in host.json."""
        return [int(child["pid"]) for child in self.registry()["children"] if child["role"] == role]

    def stop(self, timeout: float = 30.0) -> int:
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(30)


def make_server(state_dir: Path, **env: str) -> ServerProcess:
    """A server (not started) with a HOME of its own next to the state dir and no fault or state-dir
    setting from the test's environment: for a server that outlives one test (a module's)."""
    home = state_dir.parent / "home"
    home.mkdir(exist_ok=True)
    proc = ServerProcess(state_dir, env={"HOME": str(home), **env})
    for leak in ("PIW_FAULTS", "PI_WORKFLOWS_STATE_DIR"):
        proc.env.pop(leak, None)
    return proc


@contextmanager
def serving(state_dir: Path, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A started server that must stop cleanly (exit code 0) when the block ends; its state is checked
    after it stopped, unless the block raised."""
    proc = ServerProcess(state_dir, env=env).start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.output()
    check_state(proc.state_dir)


def marked_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings of the ``server_env(**env)`` marks on the test, its class and its module; the
    nearest mark wins where two set the same name."""
    env: dict[str, str] = {}
    for marker in reversed(list(request.node.iter_markers("server_env"))):
        env.update(marker.kwargs)
    return env

"""Start real servers for integration tests, with short durations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.02, what: str = "condition") -> Any:
    """Poll until predicate() is truthy; return its value. Never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def check_state(state_dir: Path) -> None:
    """The spec's invariants plus SQLite's integrity and foreign-key checks, read-only."""
    import sqlite3

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

    def cli(self, *args: str, timeout: float = 60, text: bool = True) -> subprocess.CompletedProcess[Any]:
        """``pi-workflows --state-dir STATE ARGS`` in this server's environment (``text=False``: bytes)."""
        return subprocess.run(
            self.cli_command(*args),
            capture_output=True,
            text=text,
            timeout=timeout,
            env=self.env,
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

    def stop(self, timeout: float = 30.0) -> int:
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(30)

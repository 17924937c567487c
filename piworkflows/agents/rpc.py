"""Pi in RPC mode as the agent host's child: its command line, its JSONL channel, its end.

::

    host ── {"id": ..., "type": "prompt" | "get_state" | "abort", ...} + LF ──> pi --mode rpc
         <── responses {"type": "response", "id", "command", "success", "data"?, "error"?}
             and events {"type": "agent_start" | "message_end" | ...}, one JSON object a line

Records are split on LF only (a JSON string may hold U+2028 or U+2029; docs/rpc.md, Framing).
Pi runs in the host's process group (the supervisor kills the group: both end), in the
project, with ``PI_OFFLINE=1`` and the workflow tool's socket, session and epoch.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from piworkflows.protocol.internal.agents import AgentLaunch

WORKFLOW_TOOL = Path(__file__).parent / "pi" / "workflow.ts"
STDERR_LINES = 20  # the tail of Pi's stderr kept to say why it ended
STDERR_LINE_CHARS = 512


def model_args(model: str | None) -> list[str]:
    """``provider/id[:thinking]`` as Pi's ``--provider P --model ID[:thinking]``; a bare id as
    ``--model``; none: Pi's own default."""
    if not model:
        return []
    provider, slash, model_id = model.partition("/")
    if not slash:
        return ["--model", model]
    return ["--provider", provider, "--model", model_id]


def pi_argv(launch: AgentLaunch, workflow_tool: Path = WORKFLOW_TOOL) -> list[str]:
    """The command line the host starts Pi with."""
    argv = [*launch.pi_command, "--mode", "rpc"]
    if launch.pi_session_file:
        argv += ["--session", launch.pi_session_file]
    argv += model_args(launch.contract.model)
    argv += ["--no-extensions", "-e", str(workflow_tool)]
    if launch.contract.allowed_tools is not None:
        argv += ["--tools", ",".join([*launch.contract.allowed_tools, "workflow"])]
    return argv + launch.pi_args


def pi_env(launch: AgentLaunch, base: dict[str, str] | None = None) -> dict[str, str]:
    """The host's environment (HOME, PI_CODING_AGENT_DIR ...) and the workflow tool's settings."""
    return {
        **(dict(os.environ) if base is None else base),
        "PI_OFFLINE": "1",
        "PI_WORKFLOWS_SOCKET": launch.socket_path,
        "PI_WORKFLOWS_SESSION_ID": launch.session_id,
        "PI_WORKFLOWS_EPOCH": str(launch.coordinator_epoch),
    }


class PiProcess:
    """A started Pi: ``send`` writes a command; each record it prints goes to ``deliver`` (a reader
    thread), then ``ended(returncode)`` once its stdout closed and it was reaped."""

    def __init__(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        deliver: Callable[[dict[str, Any]], None],
        ended: Callable[[int], None],
    ) -> None:
        # Raises OSError (FileNotFoundError, PermissionError ...) when it cannot be started.
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._write_lock = threading.Lock()
        self._ids = 0
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._stderr = threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True)
        self._stderr.start()
        threading.Thread(target=self._read, args=(self.proc.stdout, deliver, ended), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, command: dict[str, Any]) -> str:
        """Write one command (an ``id`` is added); its id. A Pi that is gone is ignored here: its end
        arrives through ``ended``."""
        with self._write_lock:
            self._ids += 1
            command_id = f"host-{self._ids}"
            line = json.dumps({"id": command_id, **command}, ensure_ascii=False).encode("utf-8") + b"\n"
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass
        return command_id

    def close_input(self) -> None:
        """End of input: Pi in RPC mode shuts down by itself."""
        with self._write_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass

    def kill(self) -> None:
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def last_stderr(self) -> str:
        """The last non-empty line Pi wrote to stderr ('' when none)."""
        self._stderr.join(1.0)
        return next((line for line in reversed(self.stderr_tail) if line.strip()), "")

    def _read(self, stream: IO[bytes], deliver: Callable[[dict[str, Any]], None], ended: Callable[[int], None]) -> None:
        partial = b""
        while data := stream.read1(1 << 16):  # type: ignore[attr-defined]
            *records, partial = (partial + data).split(b"\n")
            for raw in records:
                record = _record(raw)
                if record is not None:
                    deliver(record)
        ended(self.proc.wait())

    def _read_stderr(self, stream: IO[bytes]) -> None:
        partial = b""
        while data := stream.read1(1 << 16):  # type: ignore[attr-defined]
            *lines, partial = (partial + data).split(b"\n")
            for line in lines:
                self.stderr_tail.append(line.decode("utf-8", errors="replace")[:STDERR_LINE_CHARS])
        if partial:
            self.stderr_tail.append(partial.decode("utf-8", errors="replace")[:STDERR_LINE_CHARS])


def _record(raw: bytes) -> dict[str, Any] | None:
    """One RPC record (a trailing CR is dropped); None for a blank or non-object line."""
    try:
        record = json.loads(raw.removesuffix(b"\r"))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None

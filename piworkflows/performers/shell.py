"""``shell`` effects: run one command in its own process group.

::

    /bin/sh -c 'read _ && exec "$@" </dev/null' ...   spawned in a new session (its own group)
      └─ spawned(pid): the caller records the group leader's identity (host.json)
      └─ "go" on its stdin (a pipe): the shell execs the command with stdin /dev/null (same pid, same group)
    wait up to timeoutMs ── then SIGKILL to the whole group
    after the command exits, what it left running in its group is killed too

Output: ``{stdout, stderr, exitCode, signal, durationMs}``, each stream
bounded to ``maxOutputChars``. Each stream is also kept whole up to
``stream_max_bytes`` (the rest is read and dropped, and counted) and returned
as the outcome's ``streams``: the outbox worker stores them for ``run logs``.
A non-zero exit is ``rejected`` unless the node allows it (the result still
holds the output: the failed node keeps it). A timeout: idempotent effects
settle ``applied`` with the signal recorded and the node outcome
``timed_out``; manual ones become ``ambiguous`` (the command may have acted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from piworkflows.performers import Outcome, Stream

PERFORMER = "shell.exec"
DEFAULT_TIMEOUT_MS = 600_000
DEFAULT_MAX_OUTPUT_CHARS = 100_000
# The pipe is the shell's stdin: sh (dash) names only descriptors 0-9, and a passed pipe keeps its number.
_WAIT_FOR_GO = 'read _ && exec "$@" </dev/null'


def payload(spec: dict[str, Any], max_output_chars: int, allow_non_zero_exit: bool) -> dict[str, Any]:
    """The effect payload of a node's ``exec(ctx)`` result; refuses what cannot be run."""
    if not isinstance(spec, dict) or not isinstance(spec.get("command"), str) or not spec["command"]:
        raise ValueError("exec must return {command, args?, cwd?, env?, timeoutMs?} with a command")
    unknown = set(spec) - {"command", "args", "cwd", "env", "timeoutMs"}
    if unknown:
        raise ValueError(f"exec returned unknown fields: {sorted(unknown)}")
    args = spec.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError("exec args must be a list of strings")
    env = spec.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("exec env must map strings to strings")
    timeout_ms = spec.get("timeoutMs", DEFAULT_TIMEOUT_MS)
    if not isinstance(timeout_ms, int) or timeout_ms < 1:
        raise ValueError("exec timeoutMs must be a positive integer")
    value: dict[str, Any] = {
        "command": spec["command"],
        "args": args,
        "timeoutMs": timeout_ms,
        "maxOutputChars": max_output_chars,
        "allowNonZeroExit": allow_non_zero_exit,
    }
    if "cwd" in spec:
        value["cwd"] = str(spec["cwd"])
    if env:
        value["env"] = env
    return value


class _Capture(threading.Thread):
    """Reads a stream to its end, keeping at most ``limit`` bytes and counting all of them."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit, self.kept, self.seen = stream, limit, bytearray(), 0
        self.start()

    def run(self) -> None:
        while chunk := self.stream.read(1 << 16):
            self.seen += len(chunk)
            room = self.limit - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]

    def text(self, max_chars: int) -> str:
        """The start of the stream as the node's output shows it (a character is at most 4 bytes)."""
        return self.kept[: max_chars * 4].decode("utf-8", errors="replace")[:max_chars]

    def stream_kept(self) -> Stream:
        return Stream(bytes(self.kept), self.seen)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ShellPerformer:
    def __init__(self, stream_max_bytes: int) -> None:
        self.stream_max_bytes = stream_max_bytes  # settings.shell_stream_max_bytes

    def perform(self, payload: dict[str, Any], key: str, policy: str, spawned: Callable[[int], bool]) -> Outcome:
        max_chars = payload["maxOutputChars"]
        env = {**os.environ, **payload.get("env", {})}
        go_read, go_write = os.pipe()
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", _WAIT_FOR_GO, "pi-workflows-shell", payload["command"], *payload["args"]],
                stdin=go_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=payload.get("cwd"),
                env=env,
                start_new_session=True,
            )
        except OSError as exc:  # nothing ran: a definite failure
            os.close(go_write)
            return Outcome("rejected", error=f"the command could not start: {exc.strerror}", error_code="spawnFailed")
        finally:
            os.close(go_read)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Capture(proc.stdout, self.stream_max_bytes), _Capture(proc.stderr, self.stream_max_bytes)
        if not spawned(proc.pid):  # not recorded: it must not run
            os.close(go_write)
            _kill_group(proc.pid)
            proc.wait()
            # Nothing ran: an idempotent effect is tried again later (host.json may be writable then).
            return Outcome(
                "rejected" if policy == "manual" else "retry",
                error_code="spawnFailed",
                error="the command's process group could not be recorded",
            )
        started = time.monotonic()
        os.write(go_write, b"go\n")
        os.close(go_write)
        timed_out = False
        try:
            proc.wait(timeout=payload["timeoutMs"] / 1000)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        duration_ms = int((time.monotonic() - started) * 1000)
        _kill_group(proc.pid)  # whatever the command left running in its group
        out.join()
        err.join()
        code = proc.returncode
        streams = {"stdout": out.stream_kept(), "stderr": err.stream_kept()}
        stderr = err.text(max_chars)
        output = {
            "stdout": out.text(max_chars),
            "stderr": stderr,
            "exitCode": code if code >= 0 else None,
            "signal": signal.Signals(-code).name if code < 0 else None,
            "durationMs": duration_ms,
        }
        if timed_out:
            if policy == "manual":
                return Outcome(
                    "ambiguous",
                    error=f"the command timed out after {payload['timeoutMs']} ms",
                    error_code="timedOut",
                    streams=streams,
                )
            return Outcome("applied", result={"output": output, "nodeOutcome": "timed_out"}, streams=streams)
        if code != 0 and not payload["allowNonZeroExit"]:
            reason = f"exit code {code}" if code > 0 else f"signal {output['signal']}"
            tail = stderr[-2000:].strip()
            return Outcome(
                "rejected",
                result={"output": output, "nodeOutcome": "failed"},
                error_code="nonZeroExit",
                error=f"the command failed ({reason})" + (f": {tail}" if tail else ""),
                streams=streams,
            )
        return Outcome("applied", result={"output": output, "nodeOutcome": "ok"}, streams=streams)

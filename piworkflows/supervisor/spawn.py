"""Starting a framed child: one way for runners, resolvers and outbox workers.

::

    spawn_child(role, marker, module args)
      python -m <module args>   stdin/stdout: frames, stderr: a bounded tail (StderrTail)
      a lineage of its own in its environment (inherited by what it starts);
      its identity (pid, create time, marker) into host.json before it acts;
      not recorded (ChildNotRecorded): killed (its group), waited for, and the error raised;
      once it exited, what it left behind is ended (supervisor/leftovers.py)
    signal_group(pid, sig)          a signal to the group of a child spawned here (or identity-checked)
    GroupStopper.stop(proc, ...)    SIGTERM to its group now, SIGKILL after the grace if it is still there
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from piworkflows.clock import Clock
from piworkflows.settings import Settings
from piworkflows.supervisor.registry import ChildNotRecorded, Identity
from piworkflows.supervisor.seams import ChildRecorder
from piworkflows.supervisor.stderr import StderrTail


async def spawn_child(
    role: str,
    marker: str,
    args: Sequence[str],
    recorder: ChildRecorder,
    settings: Settings,
    *,
    own_group: bool,
    env: dict[str, str] | None = None,
) -> tuple[asyncio.subprocess.Process, StderrTail]:
    """The child and its stderr tail, recorded; ``own_group``: its own process group (stopping it
    stops everything it started)."""
    token, env = recorder.leftovers.issue(env)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=own_group,
        env=env,
    )
    assert proc.stderr is not None
    stderr = StderrTail(proc.stderr, settings.child_stderr_lines, settings.child_stderr_line_chars)
    try:
        recorder.record_child(Identity.of(role, proc.pid, marker, process_group=own_group))
    except ChildNotRecorded:
        try:
            if own_group:  # this supervisor's own child, not yet reaped: its pid is still its group
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
        await proc.wait()
        stderr.close()
        recorder.leftovers.ended(token)
        raise
    recorder.leftovers.watch(proc, token)
    return proc, stderr


def signal_group(pid: int, signum: int) -> None:
    """A signal to the group of a child this supervisor spawned itself (its own unreaped child, so
    its pid cannot name another process), or of one whose identity was checked first."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


class GroupStopper:
    """Stops spawned children's groups: SIGTERM now, SIGKILL after the grace if still there."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._timers: set[asyncio.Task[None]] = set()

    def stop(self, proc: asyncio.subprocess.Process, grace_ms: int, role: str) -> None:
        if proc.returncode is not None:
            return
        signal_group(proc.pid, signal.SIGTERM)

        async def kill_if_alive() -> None:
            await self.clock.sleep_ms(grace_ms)
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)

        timer = asyncio.create_task(kill_if_alive(), name=f"kill-{role}-{proc.pid}")
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

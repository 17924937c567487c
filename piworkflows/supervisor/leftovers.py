"""What a child left behind: the processes that still hold one of its stdio pipes after it exited.

::

    spawn_child ── its pipes' inodes ── watch(proc): the child exited (its returncode is set)
      ── child_stderr_drain_ms for its last words ── this user's processes whose /proc/<pid>/fd
      name one of those pipes: each SIGKILLed with its descendants, one server.log line
      ── the pipes close: the supervisor's reads of the child end, ``proc.wait()`` returns

A node or a module at import that starts ``subprocess.Popen(..., start_new_session=True)``
escapes the runner's (or resolver's) process group, so ending the group does not end it. Holding
the child's stdout it kept the supervisor waiting for an end of file that never came, and
``server stop`` hung (asyncio's ``wait()`` also waits for the pipes). Anything that holds a dead
child's own pipes was started by it. A process that closed or redirected its stdio is not found
this way (docs/workflows.md says so).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterable

import psutil

log = logging.getLogger("piworkflows.supervisor")

_POLL_S = 0.2  # without pidfds: how often a live child's exit is looked for (asyncio's wait() needs its pipes closed)
_WATCHES: set[asyncio.Task[None]] = set()


def pipe_inodes(proc: asyncio.subprocess.Process) -> frozenset[int]:
    """The inodes of the child's stdin, stdout and stderr pipes (this process holds their other ends)."""
    transport = proc._transport  # type: ignore[attr-defined]  # asyncio's own: its pipes' files
    inodes = set()
    for fd in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd)
        handle = pipe.get_extra_info("pipe") if pipe is not None else None
        if handle is not None:
            try:
                inodes.add(os.fstat(handle.fileno()).st_ino)
            except (OSError, ValueError):
                pass
    return frozenset(inodes)


def holders(inodes: Iterable[int], exclude: Iterable[int]) -> list[psutil.Process]:
    """This user's processes (but ``exclude``) with a descriptor on one of these pipes."""
    wanted = {f"pipe:[{inode}]" for inode in inodes}
    skip = {os.getpid(), *exclude}
    uid = os.getuid()
    found = []
    for process in psutil.process_iter(["uids"]):
        try:
            if process.pid in skip or process.info["uids"] is None or process.info["uids"].real != uid:
                continue
            fd_dir = f"/proc/{process.pid}/fd"
            if any(os.readlink(f"{fd_dir}/{fd}") in wanted for fd in os.listdir(fd_dir)):
                found.append(process)
        except (OSError, psutil.Error):
            continue  # gone meanwhile, or not ours to read
    return found


def end(processes: list[psutil.Process]) -> list[int]:
    """SIGKILL each process and its descendants; the pids it ended."""
    ended = []
    for process in processes:
        try:
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            family = [process]
        for member in family:
            try:
                member.send_signal(signal.SIGKILL)
                ended.append(member.pid)
            except psutil.Error:
                pass
    return ended


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the child has exited: its pidfd turns readable (Linux), else a poll of its returncode."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfds here, or it is gone already
        pidfd = None
    if pidfd is not None:
        loop, ended = asyncio.get_running_loop(), asyncio.Event()
        loop.add_reader(pidfd, ended.set)
        try:
            await ended.wait()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
    while proc.returncode is None:  # asyncio's watcher records it a moment later
        await asyncio.sleep(_POLL_S)


async def _watch(proc: asyncio.subprocess.Process, role: str, inodes: frozenset[int], drain_s: float) -> None:
    await _exited(proc)
    await asyncio.sleep(drain_s)  # what it wrote before it ended is read first
    found = await asyncio.get_running_loop().run_in_executor(None, holders, inodes, (proc.pid,))
    if found:
        ended = end(found)
        log.warning(
            "the %s %d left %d process(es) holding its pipes; ended: %s",
            role,
            proc.pid,
            len(found),
            ", ".join(map(str, ended)),
        )


def watch(proc: asyncio.subprocess.Process, role: str, drain_s: float) -> None:
    """Once ``proc`` has exited, end what still holds its pipes (a task of its own, kept here)."""
    task = asyncio.create_task(_watch(proc, role, pipe_inodes(proc), drain_s), name=f"leftovers-{role}-{proc.pid}")
    _WATCHES.add(task)
    task.add_done_callback(_WATCHES.discard)

"""Which server a process descends from: one environment variable every spawned child carries.

::

    PI_WORKFLOWS_LINEAGE=<state tag>.<supervisor pid>.<n>    one value per child the server spawns
      its descendants inherit it (unless they clear their environment)
    state tag: the first 16 hex digits of the SHA-256 of the state dir's path

The supervisor uses it to tell whose leftover an orphan is (supervisor/leftovers.py); the CLI's
``server stop --kill`` and a new supervisor's takeover use it to find what a dead server's
children left behind, wherever it was reparented. Linux (and psutil) read another process's
environment as it was at its exec; a process of another user is never read.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
from pathlib import Path

import psutil

ENV = "PI_WORKFLOWS_LINEAGE"
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def state_tag(state_dir: Path) -> str:
    return hashlib.sha256(os.fsencode(state_dir)).hexdigest()[:16]


def of(process: psutil.Process) -> str | None:
    """The process's lineage, or None (none, gone, a zombie, not ours to read)."""
    try:
        return process.environ().get(ENV)
    except (psutil.Error, OSError):
        return None


def find(tag: str) -> list[psutil.Process]:
    """This user's processes (but this one and its ancestors) that descend from a server of the state
    dir with this tag."""
    me = psutil.Process()
    skip = {me.pid, *(parent.pid for parent in me.parents())}
    uid, prefix = os.getuid(), tag + "."
    found = []
    for process in psutil.process_iter(["uids"]):
        uids = process.info["uids"]
        if process.pid in skip or uids is None or uids.real != uid:
            continue
        lineage = of(process)
        if lineage is not None and lineage.startswith(prefix):
            found.append(process)
    return found


def end(processes: list[psutil.Process]) -> list[int]:
    """SIGKILL each process and its descendants; the pids signalled."""
    ended = []
    for process in processes:
        try:
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            family = [process]
        for member in family:
            try:
                member.send_signal(signal.SIGKILL)  # psutil checks the pid was not reused
                ended.append(member.pid)
            except psutil.Error:
                pass
    return ended


def become_subreaper() -> bool:
    """Orphans among this process's descendants are reparented to it, not to init (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def direct_children() -> set[int]:
    """The pids of this process's children, each of its threads' (a reparented orphan may belong to
    any thread)."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {child.pid for child in psutil.Process().children()}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
        except OSError:
            continue  # a thread that ended meanwhile
    return pids

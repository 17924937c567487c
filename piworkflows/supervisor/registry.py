"""``host/host.json``: the exact identities of the server's processes.

::

    {"serverEpoch": 3,
     "supervisor": {"pid": 100, "createTime": 1767225600.12, "marker": "piworkflows.supervisor"},
     "children": [{"role": "writer", "pid": 101, "createTime": ..., "marker": "piworkflows.writer",
                   "processGroup": false}]}

Written atomically: a new temp file beside it (``O_EXCL``, never through a
link, 0600), fsync, ``os.replace``, fsync of ``host/``; a write that fails
(a full disk) removes its temp file and leaves the previous host.json as it
was. On takeover a new
supervisor ends the processes an older epoch recorded, but only through
``psutil.Process`` after pid, create time and command-line marker all match
(a pid read from disk may belong to an unrelated process by now). The CLI
reads it too: ``server status`` says ``stopping`` while a recorded process
lives, and ``server stop --kill`` ends them (``kill_recorded``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from piworkflows import faults
from piworkflows.errors import StatePathRefused
from piworkflows.paths import open_private, write_private


class ChildNotRecorded(OSError):
    """host.json could not be written (a full disk): the child must end before it does anything."""


@dataclass(frozen=True)
class Identity:
    role: str
    pid: int
    createTime: float
    marker: str
    processGroup: bool = False

    @classmethod
    def of(cls, role: str, pid: int, marker: str, process_group: bool = False) -> Identity:
        """The identity of a live process (pid, psutil create time); ``process_group``: it leads one."""
        return cls(role, pid, psutil.Process(pid).create_time(), marker, process_group)

    def find(self) -> psutil.Process | None:
        """The live process this identity names, or None (gone, reused pid, zombie)."""
        try:
            proc = psutil.Process(self.pid)
            if proc.create_time() != self.createTime or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            if not any(self.marker in part for part in proc.cmdline()):
                return None
            return proc
        except psutil.Error:
            return None


@dataclass
class Registry:
    serverEpoch: int = 0
    supervisor: Identity | None = None
    children: list[Identity] = field(default_factory=list)

    def set_child(self, identity: Identity) -> None:
        self.children = [c for c in self.children if c.pid != identity.pid] + [identity]

    def drop_child(self, pid: int) -> None:
        self.children = [c for c in self.children if c.pid != pid]

    def identities(self) -> list[Identity]:
        """The supervisor first, then its children."""
        return ([self.supervisor] if self.supervisor is not None else []) + list(self.children)

    @classmethod
    def load(cls, path: Path) -> Registry:
        try:
            with os.fdopen(open_private(path, os.O_RDONLY), "rb") as f:
                data: dict[str, Any] = json.loads(f.read())
            return cls(
                serverEpoch=int(data.get("serverEpoch", 0)),
                supervisor=Identity(**data["supervisor"]) if data.get("supervisor") else None,
                children=[Identity(**child) for child in data.get("children", [])],
            )
        except FileNotFoundError:
            return cls()
        except (ValueError, TypeError, KeyError, StatePathRefused):
            return cls()  # unreadable or not ours (a link): nothing can be matched, so nothing is signalled

    def save(self, path: Path) -> None:
        """Replace host.json whole, or raise OSError and leave it as it was."""
        data = json.dumps(asdict(self), sort_keys=True).encode()
        write_private(path, data, before_write=lambda: faults.hit(faults.SUPERVISOR_REGISTRY_SAVE))


def end_process(identity: Identity, grace_s: float) -> bool:
    """SIGTERM then SIGKILL the process (or its whole group) the identity names.

    Returns True if a matching process was found and ended.
    """
    proc = identity.find()
    if proc is None:
        return False
    try:
        if identity.processGroup:
            os.killpg(proc.pid, signal.SIGTERM)  # the leader's identity matched just now
        else:
            proc.terminate()
        _, alive = psutil.wait_procs([proc], timeout=grace_s)
        if alive:
            if identity.processGroup:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            psutil.wait_procs([proc], timeout=grace_s)
    except (psutil.Error, ProcessLookupError):
        pass
    return True


def live(path: Path) -> list[Identity]:
    """The processes host.json records that still live (each identity checked), supervisor first."""
    return [identity for identity in Registry.load(path).identities() if identity.find() is not None]


def kill_recorded(path: Path, grace_s: float) -> list[Identity]:
    """SIGKILL every process host.json records that still lives; returns those signalled.

    Each is signalled only right after its identity matched. The supervisor is
    stopped (SIGSTOP) first, so it starts no replacement and its children do
    not exit on their own while they are killed (a child leading a process
    group with its whole group); then the supervisor is killed. Waits up to
    ``grace_s`` for them to be gone.
    """
    supervisor = Registry.load(path).supervisor
    frozen = supervisor.find() if supervisor is not None else None
    if frozen is not None and not _signal(frozen.suspend):
        frozen = None
    killed = [identity for identity in Registry.load(path).children if _kill(identity)]
    if frozen is not None and supervisor is not None and _signal(frozen.kill):
        killed.insert(0, supervisor)
    deadline = time.monotonic() + grace_s
    while any(identity.find() is not None for identity in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def _kill(identity: Identity) -> bool:
    """SIGKILL the process (or the group it leads) the identity names, if it matches now."""
    proc = identity.find()
    if proc is None:
        return False
    if identity.processGroup:
        return _signal(lambda: os.killpg(proc.pid, signal.SIGKILL))
    return _signal(proc.kill)


def _signal(send: Callable[[], None]) -> bool:
    """Send; False if the process went meanwhile (psutil checks the pid was not reused)."""
    try:
        send()
    except (psutil.Error, ProcessLookupError):
        return False
    return True


def take_over(path: Path, grace_s: float) -> list[str]:
    """End every child an older server recorded (identity checked). Returns the roles ended.

    Called only while holding the lock, so the older supervisor itself is gone.
    """
    ended = []
    for identity in Registry.load(path).children:
        if end_process(identity, grace_s):
            ended.append(identity.role)
    return ended

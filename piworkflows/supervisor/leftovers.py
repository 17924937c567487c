"""What a child left behind: processes it started that outlive it, ended when it ends.

::

    enable()                        the supervisor becomes a child subreaper (Linux): an orphan
                                    anywhere below it is reparented to it, not to init
    issue(env) -> token, env        each child it spawns gets a lineage of its own
                                    (supervisor/lineage.py), inherited by what that child starts
    watch(proc, token)              the child exited ── ended(token) ── sweep
    sweep (a child ended, SIGCHLD)  each direct child that host.json does not record is an orphan:
                                      its lineage names a child that still lives  kept
                                      any other lineage, or none                  SIGKILLed with
                                                                                  its descendants
                                      a zombie                                    reaped
    final()                         at the stop, after the writer: every orphan is ended

A node or a module at import that starts ``subprocess.Popen(..., start_new_session=True)``
escapes the runner's (or resolver's) process group, so ending the group does not end it; held
pipes kept ``server stop`` waiting for ever. Whatever such a process does with its stdio, it is
reparented to the supervisor once its parent is gone and is ended when the child it descends
from ends. One that also cleared its environment cannot be traced: it is ended at the next
sweep. Without subreaping (not Linux) nothing is swept; ``server stop --kill`` and a takeover
still find what carries the state dir's lineage (docs/workflows.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
from collections.abc import Callable, Mapping

import psutil

from piworkflows.supervisor import lineage

log = logging.getLogger("piworkflows.supervisor")

_POLL_S = 0.2  # without pidfds: how often a live child's exit is looked for


class Leftovers:
    def __init__(self, tag: str, recorded: Callable[[], set[int]]) -> None:
        self.tag = tag
        self.recorded = recorded  # the pids host.json records: the supervisor's own children
        self.subreaper = False
        self._numbers = itertools.count(1)
        self._live: set[str] = set()  # lineages of the children that have not ended
        self._spawning: set[str] = set()  # of those, the children not yet recorded in host.json
        self._ended: set[int] = set()  # orphans signalled here and not yet reaped
        self._scheduled = False
        self._watches: set[asyncio.Task[None]] = set()
        self._own_cmdline: list[str] = []

    def enable(self) -> None:
        """Subreap, and sweep whenever a child exits (only in the server's own process: a test's
        in-process supervisor must not end the test's other children)."""
        self._own_cmdline = psutil.Process().cmdline()
        self.subreaper = lineage.become_subreaper()
        if not self.subreaper:
            log.warning("processes a node leaves behind cannot be followed here (no child subreaper)")
            return
        asyncio.get_running_loop().add_signal_handler(signal.SIGCHLD, self._schedule)

    def issue(self, env: Mapping[str, str] | None = None, spawning: bool = True) -> tuple[str, dict[str, str]]:
        """A new lineage (live until ``ended``) and the environment that carries it; ``spawning``:
        for a child about to be spawned, until ``watch`` says it is recorded."""
        token = f"{self.tag}.{os.getpid()}.{next(self._numbers)}"
        self._live.add(token)
        if spawning:
            self._spawning.add(token)
        return token, {**(os.environ if env is None else env), lineage.ENV: token}

    def ended(self, token: str) -> None:
        self._live.discard(token)
        self._spawning.discard(token)
        self._schedule()

    def watch(self, proc: asyncio.subprocess.Process, token: str) -> None:
        """``proc`` is recorded in host.json; once it has exited (and was reaped) its lineage has
        ended."""
        self._spawning.discard(token)

        async def watching() -> None:
            await _exited(proc)
            self.ended(token)

        task = asyncio.create_task(watching(), name=f"leftovers-{proc.pid}")
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    def _schedule(self) -> None:
        if self.subreaper and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._sweep)

    def _sweep(self) -> None:
        self._scheduled = False
        self._end(self._orphans(keep=self._live))

    def final(self, grace_s: float) -> None:
        """At the stop, after every child ended: end every orphan and wait for it (bounded)."""
        if not self.subreaper:
            return
        orphans = self._orphans(keep=set())
        self._end(orphans)
        psutil.wait_procs(orphans, timeout=grace_s)  # they are this process's children: reaped here

    def _orphans(self, keep: set[str]) -> list[psutil.Process]:
        """The live direct children host.json does not record, but those whose lineage is kept (a
        child that still runs started them, or is being spawned); zombies among them are reaped."""
        found = []
        for pid in lineage.direct_children() - self.recorded():
            try:
                process = psutil.Process(pid)
                zombie = process.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                continue
            if zombie:
                self._reap(pid)
            elif lineage.of(process) not in keep and not self._forked_here(process):
                found.append(process)
        return found

    def _forked_here(self, process: psutil.Process) -> bool:
        """A copy of this process that has not exec'd yet: the writer, spawned from a thread, in the
        moment before it carries its lineage."""
        try:
            return bool(process.cmdline() == self._own_cmdline)
        except psutil.Error:
            return True  # gone meanwhile: nothing to end

    def _reap(self, pid: int) -> None:
        """A zombie that is not a recorded child: one signalled here, or (while no child is being
        spawned: it would not be recorded yet) an orphan that ended on its own."""
        if pid not in self._ended and self._spawning:
            return
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        self._ended.discard(pid)

    def _end(self, orphans: list[psutil.Process]) -> None:
        if not orphans:
            return
        names = {}
        for process in orphans:
            try:
                names[process.pid] = process.name()
            except psutil.Error:
                names[process.pid] = "?"
        ended = lineage.end(orphans)
        self._ended.update(ended)
        log.warning(
            "ended what children of the server that ended left behind: %s",
            ", ".join(f"{pid} ({names[pid]})" if pid in names else str(pid) for pid in ended),
        )


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

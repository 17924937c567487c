"""Keeps exactly one writer process running for the supervisor's event loop.

::

    request(kind, body) ──> Link (socketpair) ──> writer ──> Reply
          │ writer down or restarting: Reply unavailable (never a guess)
    monitor: writer exited ──> backoff (doubling, bounded) ──> spawn again
             (a damaged, incompatible or refused file: no more restarts, an operator acts)
    health: what the writer can do now (its HEALTH frames; a failed start's reason)

Commands in flight when the writer dies are answered ``unavailable`` by the
Link; their clients retry with the same idempotency key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from piworkflows.errors import StateIncompatible
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.writer import Reply, ViewerAdvanced, ViewerWatched, WriterHealth
from piworkflows.protocol.link import AsyncLink
from piworkflows.settings import Settings
from piworkflows.supervisor.registry import Identity
from piworkflows.supervisor.seams import refusal
from piworkflows.writer.process import WriterProcess, WriterStartError, spawn

log = logging.getLogger("piworkflows.supervisor")

WRITER_MARKER = "piworkflows.writer"
RESTARTING = refusal("writerRestarting", "the writer is restarting")
# Reasons a writer cannot start that another start does not mend: an operator acts.
PERMANENT = frozenset({"stateIncompatible", "databaseCorrupt", "statePathRefused"})


class WriterChild:
    def __init__(
        self,
        paths: StatePaths,
        settings: Settings,
        on_spawn: Callable[[Identity | None], None],
        extra_env: dict[str, str] | None = None,
        on_viewer: Callable[[ViewerAdvanced | None], None] | None = None,
    ) -> None:
        self.paths = paths
        self.on_viewer = on_viewer  # run views the commits changed (None: all may have: a new writer)
        self.watched: list[str] = []  # the runs whose ops viewer.advanced carries (told to each new writer)
        self.settings = settings
        self.on_spawn = on_spawn  # records the child's identity in host.json (None: gone)
        self.extra_env = extra_env
        self.restarts = 0
        self.health = WriterHealth(code=None)  # what the live writer said it can do
        self.start_failure: WriterStartError | None = None  # why the last start failed (None: it did not)
        self._proc: WriterProcess | None = None
        self._stopping = False
        self._monitor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Spawn the first writer; StateIncompatible and start errors propagate."""
        self._proc = await self._spawn()
        self._monitor = asyncio.create_task(self._watch(), name="writer-monitor")

    async def _spawn(self) -> WriterProcess:
        def record(pid: int) -> None:  # in host.json before the writer is waited for
            self.on_spawn(Identity.of("writer", pid, WRITER_MARKER))

        def on_health(health: WriterHealth) -> None:  # on the loop: the link's reader calls it
            self.health = health

        proc = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: spawn(
                self.paths.state_dir,
                self.settings,
                self.extra_env,
                event_loop_link=True,
                on_started=record,
                on_health=on_health,
                on_viewer=self.on_viewer,
            ),
        )
        assert isinstance(proc.link, AsyncLink)
        self.health, self.start_failure = WriterHealth(code=None), None
        await proc.link.start()
        if self.watched:
            proc.link.tell(ViewerWatched.kind, ViewerWatched(runs=self.watched).model_dump())
        return proc

    @property
    def up(self) -> bool:
        return self._proc is not None and not self._stopping and not self._proc.link.closed

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        proc = self._proc
        if proc is None or self._stopping or proc.link.closed:
            return self._down_reply()
        assert isinstance(proc.link, AsyncLink)
        return await proc.link.request(kind, body)

    def watch(self, runs: list[str]) -> None:
        """The runs whose ops viewer.advanced should carry from now on (this writer and the next)."""
        self.watched = runs
        proc = self._proc
        if proc is not None and not self._stopping and not proc.link.closed:
            assert isinstance(proc.link, AsyncLink)
            proc.link.tell(ViewerWatched.kind, ViewerWatched(runs=runs).model_dump())

    def unavailable_reason(self) -> dict[str, Any] | None:
        """Why nothing can be committed now (server.status ``reason``), or None when it can."""
        if self.up:
            health = self.health
            if health.code is None:
                return None
            return {"code": health.code, "message": health.message or health.code, "freeBytes": health.free_bytes}
        failure = self.start_failure
        if failure is not None and failure.code is not None:
            return {"code": failure.code, "message": str(failure), "freeBytes": failure.free_bytes}
        return {"code": "writerRestarting", "message": "the writer is restarting", "freeBytes": None}

    def _down_reply(self) -> Reply:
        """The answer while no writer runs: why, when the last start said (nothing was committed)."""
        failure = self.start_failure
        if failure is None or failure.code not in ("diskFull", "ioError", "databaseCorrupt"):
            return RESTARTING
        details = {"freeBytes": failure.free_bytes} if failure.code == "diskFull" else {}
        return refusal(failure.code, str(failure), **details)

    @property
    def pid(self) -> int | None:
        return self._proc.popen.pid if self._proc else None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.settings.writer_restart_min_ms
        while not self._stopping:
            proc = self._proc
            assert proc is not None
            code = await loop.run_in_executor(None, proc.popen.wait)
            proc.link.close()  # answers what was in flight: unavailable
            if self._stopping:
                return
            self._proc = None
            self.on_spawn(None)
            log.error("the writer exited with %s; restarting in %d ms", code, delay)
            while not self._stopping:
                await asyncio.sleep(delay / 1000)
                delay = min(delay * 2, self.settings.writer_restart_max_ms)
                try:
                    self._proc = await self._spawn()
                except (StateIncompatible, WriterStartError, OSError) as exc:
                    self.on_spawn(None)  # the recorded writer is gone
                    failure = (
                        exc
                        if isinstance(exc, WriterStartError)
                        else WriterStartError(
                            str(exc), "stateIncompatible" if isinstance(exc, StateIncompatible) else None
                        )
                    )
                    if failure.code != (self.start_failure.code if self.start_failure else None):
                        log.error("the writer could not start: %s", failure)  # once per reason
                    self.start_failure = failure
                    if failure.code in PERMANENT:
                        log.error("no more writer restarts: the state database needs an operator")
                        return
                    continue
                self.restarts += 1
                delay = self.settings.writer_restart_min_ms
                log.info("the writer is back (restart %d)", self.restarts)
                if self.on_viewer is not None:
                    self.on_viewer(None)  # what the lost writer committed last may not have been told
                break

    async def stop(self) -> None:
        """Last in the shutdown order: close the pipe, the writer finishes its group and exits."""
        self._stopping = True
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.link.close()  # on the loop; the writer sees EOF, finishes its group and exits
            await asyncio.get_running_loop().run_in_executor(None, proc.reap, self.settings.stop_grace_ms / 1000)
        if self._monitor is not None:
            self._monitor.cancel()
            try:
                await self._monitor
            except asyncio.CancelledError:
                pass
        self.on_spawn(None)

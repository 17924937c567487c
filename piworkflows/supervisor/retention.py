"""Automatic retention (spec, Automatic retention): the server's own idle cleanup.

::

    lifecycle trigger (startup recovery done, a runner exited) or the idle retry timer
      ── due? (no completed sweep in the last retention_interval_ms of this process)
      ── idle? no runner active or pending, no maintenance command, no shutdown
      ── state.retain, one tree per transaction (rechecked at the writer), yield, idle again?
           the sweep walks the candidates oldest first with a cursor: a tree blocked once waits
           for the next sweep
           ... until none is eligible: the sweep completed
      ── idle: state.compact (WAL truncated; VACUUM only when it reclaims enough)
    stopped between trees, or work became active: still due (the next trigger continues)
    an error: one diagnostic, then the idle retry (never a tight loop)

No backup is made. Manual prune uses the same selection and deletion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from piworkflows.clock import Clock
from piworkflows.settings import Settings
from piworkflows.supervisor.seams import WriterRequests

log = logging.getLogger("piworkflows.supervisor")
SERVER = {"actor_class": "server"}


class Retention:
    def __init__(self, writer: WriterRequests, settings: Settings, clock: Clock, busy: Callable[[], bool]) -> None:
        self.writer = writer
        self.settings = settings
        self.clock = clock
        self.busy = busy  # the server stops, or a runner is active: not idle
        self.maintenance_in_flight = 0  # client backups and prunes in flight (maintenance())
        self.sweeps = 0  # completed sweeps of this process
        self._completed_at: int | None = None  # monotonic ms
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        if not self.settings.retention:
            return
        self._task = asyncio.create_task(self._loop(), name="retention")
        self.request()  # after startup recovery

    def request(self) -> None:
        """A lifecycle trigger; overlapping requests share the one task."""
        self._wake.set()

    @contextmanager
    def maintenance(self) -> Iterator[None]:
        """A client's backup or prune in flight keeps automatic retention away."""
        self.maintenance_in_flight += 1
        try:
            yield
        finally:
            self.maintenance_in_flight -= 1

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _due(self) -> bool:
        done = self._completed_at
        return done is None or self.clock.monotonic_ms() - done >= self.settings.retention_interval_ms

    async def _idle(self) -> bool:
        if self.busy() or self.maintenance_in_flight:
            return False
        pending = await self.writer.request("run.claimable", {"actor": SERVER, "limit": 1})
        return pending.outcome == "accepted" and not (pending.receipt or {}).get("runIds")

    async def _loop(self) -> None:
        while not self._stopping:
            await self.clock.woken(self._wake, self.settings.retention_idle_retry_ms)
            self._wake.clear()
            await self.step()

    async def step(self) -> bool:
        """One look: when a sweep is due and the server idle, sweep. True when a sweep completed;
        otherwise it stays due (the next trigger or the idle retry continues)."""
        if not self._due() or not await self._idle():
            return False
        try:
            if not await self._sweep():
                return False
        except Exception as exc:  # a cleanup error fails no workflow and stops nothing
            log.error(
                "retention failed (%s); trying again after %d ms",
                type(exc).__name__,
                self.settings.retention_idle_retry_ms,
            )
            return False
        self._completed_at = self.clock.monotonic_ms()
        self.sweeps += 1
        return True

    async def _sweep(self) -> bool:
        """Delete eligible trees one per transaction; True when none is left (completed)."""
        cutoff = self.clock.now_ms() - self.settings.retention_age_ms
        deleted, cursor = 0, None
        while True:
            body = {"actor": SERVER, "cutoff_ms": cutoff, "after": cursor}
            reply = await self.writer.request("state.retain", body)
            if reply.outcome != "accepted" or reply.receipt is None:
                raise RuntimeError(f"state.retain answered {reply.outcome}")
            if reply.receipt["deleted"] is None:
                break
            deleted, cursor = deleted + 1, reply.receipt["cursor"]
            await asyncio.sleep(0)  # yield: new work goes first
            if not await self._idle():
                log.info("retention paused after %d trees: work became active", deleted)
                return False
        if deleted:
            compacted = await self.writer.request("state.compact", {"actor": SERVER})
            receipt = compacted.receipt or {}
            log.info(
                "retention deleted %d trees; %s pages, %s free, vacuumed %s",
                deleted,
                receipt.get("pageCount"),
                receipt.get("freelistCount"),
                receipt.get("vacuumed"),
            )
        return True

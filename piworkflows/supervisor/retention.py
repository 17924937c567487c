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
import time
from typing import Any

from piworkflows.clock import woken

log = logging.getLogger("piworkflows.supervisor")
SERVER = {"actor_class": "server"}


class Retention:
    def __init__(self, supervisor: Any) -> None:
        self.supervisor = supervisor
        self.settings = supervisor.settings
        self.maintenance_in_flight = 0  # client backups and prunes the router has sent
        self.sweeps = 0  # completed sweeps of this process
        self._completed_at: float | None = None  # monotonic
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

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _due(self) -> bool:
        done = self._completed_at
        return done is None or time.monotonic() - done >= self.settings.retention_interval_ms / 1000

    async def _idle(self) -> bool:
        if self.supervisor.state != "running" or self.maintenance_in_flight or self.supervisor.scheduler.active:
            return False
        pending = await self.supervisor.writer.request("run.claimable", {"actor": SERVER, "limit": 1})
        return pending.outcome == "accepted" and not (pending.receipt or {}).get("runIds")

    async def _loop(self) -> None:
        while not self._stopping:
            await woken(self._wake, self.settings.retention_idle_retry_ms / 1000)
            self._wake.clear()
            if not self._due() or not await self._idle():
                continue  # still due: the next trigger or the idle retry continues
            try:
                if await self._sweep():
                    self._completed_at = time.monotonic()
                    self.sweeps += 1
            except Exception as exc:  # a cleanup error fails no workflow and stops nothing
                log.error(
                    "retention failed (%s); trying again after %d ms",
                    type(exc).__name__,
                    self.settings.retention_idle_retry_ms,
                )

    async def _sweep(self) -> bool:
        """Delete eligible trees one per transaction; True when none is left (completed)."""
        cutoff = int(time.time() * 1000) - self.settings.retention_age_ms
        deleted, cursor = 0, None
        while True:
            body = {"actor": SERVER, "cutoff_ms": cutoff, "after": cursor}
            reply = await self.supervisor.writer.request("state.retain", body)
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
            compacted = await self.supervisor.writer.request("state.compact", {"actor": SERVER})
            receipt = compacted.receipt or {}
            log.info(
                "retention deleted %d trees; %s pages, %s free, vacuumed %s",
                deleted,
                receipt.get("pageCount"),
                receipt.get("freelistCount"),
                receipt.get("vacuumed"),
            )
        return True

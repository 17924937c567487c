"""The deadline timer of protected human decisions (writer/decisions.py decides the winner).

::

    startup (before runs are claimed), a new decision, or its sleep ends
      ── decision.next (a read): the earliest open deadline
      ── when it is due, decision.expire: every due deadline resolved (timeout policy or expiry);
         the receipt names the next deadline (nothing due: nothing is committed)
      ── sleep until it, at most decision_timer_max_sleep_ms (wall clock: a deadline that passed
         while the server was down is resolved by the first sweep)
    a sweep the writer cannot answer (restarting): tried again after the shortest sleep

Outcomes follow commit time, not this timer: every command on a decision applies its due deadline
first, so the timer only bounds how long a due decision waits without any command.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from piworkflows.clock import Clock
from piworkflows.protocol.internal.decisions import DecisionExpire, DecisionNext
from piworkflows.settings import Settings
from piworkflows.supervisor.seams import WriterRequests

log = logging.getLogger("piworkflows.supervisor")
SERVER = {"actor_class": "server"}
RETRY_MS = 500  # a sweep the writer did not answer


class DecisionTimer:
    def __init__(
        self, writer: WriterRequests, settings: Settings, clock: Clock, resolved: Callable[[], None] = lambda: None
    ) -> None:
        self.writer = writer
        self.settings = settings
        self.clock = clock
        self.resolved = resolved  # runs were requeued (the scheduler claims them now, not at its next tick)
        self.sweeps = 0  # completed sweeps (tests wait on them)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """The first sweep now (a deadline that passed while the server was down), then the loop."""
        first_sleep_ms = await self._sweep()
        self._task = asyncio.create_task(self._loop(first_sleep_ms), name="decision-timer")

    def wake(self) -> None:
        """A decision was opened (its deadline may come before the one slept to)."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self, sleep_ms: int) -> None:
        while True:
            await self.clock.woken(self._wake, sleep_ms)
            self._wake.clear()
            sleep_ms = await self._sweep()

    async def _sweep(self) -> int:
        """decision.next, and decision.expire when a deadline is due; how long to sleep until the next."""
        longest = self.settings.decision_timer_max_sleep_ms
        try:
            reply = await self.writer.request(DecisionNext.kind, {"actor": SERVER})
            following = reply.receipt["nextDeadline"] if reply.outcome == "accepted" and reply.receipt else None
            if following is not None and following <= self.clock.now_ms():
                reply = await self.writer.request(DecisionExpire.kind, {"actor": SERVER})
        except Exception as exc:  # never the server's end: the next sweep tries again
            log.error("the decision deadlines could not be swept: %s", type(exc).__name__)
            return RETRY_MS
        if reply.outcome != "accepted" or reply.receipt is None:
            return min(RETRY_MS, longest)
        self.sweeps += 1
        resolved = reply.receipt.get("runIds")  # only decision.expire's
        if resolved:
            log.info("decision deadlines resolved in %d run(s)", len(resolved))
            self.resolved()
        following = reply.receipt["nextDeadline"]
        if following is None:
            return longest
        return max(0, min(longest, int(following) - self.clock.now_ms()))

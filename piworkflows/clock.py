"""Clocks passed into every long-running role, so tests can drive time.

``now_ms`` is wall-clock epoch milliseconds (stored times); ``monotonic_ms``
measures durations (active execution time, timeouts). The supervisor's
components also wait through their clock (``sleep_ms``, ``woken``): on a
``FakeClock`` a wait ends only when the test advances the clock past it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...

    async def sleep_ms(self, ms: float) -> None: ...

    async def woken(self, event: asyncio.Event, timeout_ms: float) -> bool: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    async def sleep_ms(self, ms: float) -> None:
        await asyncio.sleep(ms / 1000)

    async def woken(self, event: asyncio.Event, timeout_ms: float) -> bool:
        return await woken(event, timeout_ms / 1000)


class FakeClock:
    """A clock that moves only when a test says so; waits on it end when it moved past them."""

    def __init__(self, now_ms: int = 1_767_225_600_000) -> None:  # 2026-01-01T00:00:00Z
        self._now = now_ms
        self._mono = 0
        self._timers: list[tuple[int, asyncio.Event]] = []  # (monotonic deadline, set when reached)

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._mono

    def advance(self, ms: int) -> None:
        self._now += ms
        self._mono += ms
        for deadline, timer in self._timers:
            if deadline <= self._mono:
                timer.set()

    def next_wait_ms(self) -> int | None:
        """How far the earliest pending wait's end is (None: nothing waits on this clock)."""
        if not self._timers:
            return None
        return max(0, min(deadline for deadline, _ in self._timers) - self._mono)

    async def sleep_ms(self, ms: float) -> None:
        await self.woken(asyncio.Event(), ms)

    async def woken(self, event: asyncio.Event, timeout_ms: float) -> bool:
        if event.is_set():
            return True
        timer = asyncio.Event()
        entry = (self._mono + max(0, math.ceil(timeout_ms)), timer)
        if entry[0] <= self._mono:
            timer.set()
        self._timers.append(entry)
        waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(timer.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            self._timers.remove(entry)
        return event.is_set()

    async def drive(self, awaitable: Awaitable[T], yields: int = 50) -> T:
        """Await ``awaitable``, advancing the clock to the end of the earliest wait whenever
        nothing else can go on (``yields`` turns of the loop passed); for in-process tests."""
        task = asyncio.ensure_future(awaitable)
        idle = 0
        while not task.done():
            await asyncio.sleep(0)
            idle += 1
            if idle >= yields and not task.done():
                wait = self.next_wait_ms()
                if wait is None:
                    task.cancel()
                    raise RuntimeError("nothing waits on the clock and nothing else goes on")
                self.advance(wait)
                idle = 0
        return task.result()


async def woken(event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` at most ``seconds``; True if it was set. A cancel is never lost (Python
    3.11's ``asyncio.wait_for`` swallowed one that landed as the event was set, and a stopping
    loop went on waiting)."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True

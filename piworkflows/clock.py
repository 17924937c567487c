"""Clocks passed into every long-running role, so tests can drive time.

``now_ms`` is wall-clock epoch milliseconds (stored times); ``monotonic_ms``
measures durations (active execution time, timeouts).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, now_ms: int = 1_767_225_600_000) -> None:  # 2026-01-01T00:00:00Z
        self._now = now_ms
        self._mono = 0

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._mono

    def advance(self, ms: int) -> None:
        self._now += ms
        self._mono += ms


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

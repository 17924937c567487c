"""logs.RateLimit: at most N lines of a kind per interval, then one line counting the rest."""

from __future__ import annotations

import asyncio
import logging

import pytest

from piworkflows.supervisor.logs import RateLimit

pytestmark = pytest.mark.timeout(30)

LOGGER = "piworkflows.test.ratelimit"


async def poll(predicate, timeout: float = 10.0) -> None:
    """Wait on the running loop until predicate() holds (its timers fire meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def suppressed_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("suppressed")]


def test_lines_of_a_kind_are_limited_and_the_rest_counted_when_the_interval_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def main() -> None:
        limit = RateLimit(logging.getLogger(LOGGER), lines=3, interval=0.2)
        assert [limit.allow("malformed frame") for _ in range(1000)] == [True] * 3 + [False] * 997
        assert [limit.allow("idle") for _ in range(5)] == [True] * 3 + [False] * 2  # kinds are counted apart
        assert suppressed_lines(caplog) == []  # counted until the interval ends
        await poll(lambda: len(suppressed_lines(caplog)) == 2)
        assert sorted(suppressed_lines(caplog)) == [
            "suppressed 2 similar lines (idle)",
            "suppressed 997 similar lines (malformed frame)",
        ]
        assert [limit.allow("malformed frame") for _ in range(4)] == [True] * 3 + [False]  # a new interval

    asyncio.run(main())


def test_a_suppressed_count_is_reported_once_even_when_the_next_line_comes_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        limit = RateLimit(logging.getLogger(LOGGER), lines=1, interval=0.05)
        assert [limit.allow("k") for _ in range(3)] == [True, False, False]
        end = loop.time() + 0.05  # not before the interval's end
        while loop.time() < end:  # the loop is busy: the interval's timer cannot run first
            pass
        assert limit.allow("k")  # the next line ends the old interval itself
        assert suppressed_lines(caplog) == ["suppressed 2 similar lines (k)"]
        later = asyncio.Event()
        loop.call_at(end + 0.001, later.set)  # timers run in time order: the old interval's runs first
        await later.wait()
        assert suppressed_lines(caplog) == ["suppressed 2 similar lines (k)"]

    asyncio.run(main())

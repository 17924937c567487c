"""The decision deadline timer (supervisor/decision_timer.py) against a fake writer and a fake
clock: it reads before it writes, expires only what is due, sleeps until the next deadline (at
most its bound), and a new decision wakes it."""

from __future__ import annotations

import asyncio

import pytest

from piworkflows.clock import FakeClock
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.decision_timer import DecisionTimer

pytestmark = pytest.mark.timeout(30)


class Writer:
    """Deadlines of open decisions; decision.expire resolves the due ones."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.deadlines: dict[str, int] = {}  # run -> deadline
        self.kinds: list[str] = []

    async def request(self, kind: str, body: dict) -> Reply:
        self.kinds.append(kind)
        now = self.clock.now_ms()
        if kind == "decision.expire":
            due = sorted(run for run, at in self.deadlines.items() if at <= now)
            for run in due:
                del self.deadlines[run]
            return Reply(outcome="accepted", receipt={"runIds": due, "nextDeadline": self.next()})
        return Reply(outcome="accepted", receipt={"nextDeadline": self.next()})

    def next(self) -> int | None:
        return min(self.deadlines.values(), default=None)


async def settle() -> None:
    """Let the timer's task run until it waits again (a bounded number of turns)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_the_timer_expires_what_is_due_and_sleeps_until_the_next():
    async def scenario() -> None:
        clock = FakeClock()
        writer, requeued = Writer(clock), []
        timer = DecisionTimer(writer, Settings(decision_timer_max_sleep_ms=60_000), clock, lambda: requeued.append(1))
        writer.deadlines["run-past"] = clock.now_ms() - 5  # passed while the server was down
        await timer.start()
        assert writer.kinds == ["decision.next", "decision.expire"] and requeued == [1]
        await settle()
        assert clock.next_wait_ms() == 60_000  # nothing open: the longest sleep
        writer.deadlines["run-new"] = clock.now_ms() + 1_500
        timer.wake()  # a new decision
        await settle()
        assert writer.kinds[-1] == "decision.next" and clock.next_wait_ms() == 1_500  # nothing due: no write
        writes = writer.kinds.count("decision.expire")
        clock.advance(1_500)
        await settle()
        assert writer.kinds.count("decision.expire") == writes + 1 and writer.deadlines == {}
        assert requeued == [1, 1]
        await timer.stop()

    asyncio.run(scenario())

"""Automatic retention's rules, in-process: a fake writer and a fake clock drive its steps."""

from __future__ import annotations

import asyncio

import pytest

from piworkflows.clock import FakeClock
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.retention import Retention

pytestmark = pytest.mark.timeout(30)


class FakeWriter:
    """Answers run.claimable, state.retain (one tree per call) and state.compact; logs the order."""

    def __init__(self, trees: int) -> None:
        self.trees, self.calls, self.claimable = trees, [], []
        self.bodies: list[dict] = []
        self.on_retain = lambda: None

    async def request(self, kind: str, body: dict) -> Reply:
        self.calls.append(kind)
        self.bodies.append(body)
        if kind == "run.claimable":
            return Reply(outcome="accepted", receipt={"runIds": list(self.claimable)})
        if kind == "state.retain":
            self.on_retain()
            if not self.trees:
                return Reply(outcome="accepted", receipt={"deleted": None, "cursor": None})
            self.trees -= 1
            root = f"run-{self.trees}"
            return Reply(outcome="accepted", receipt={"deleted": root, "cursor": [self.trees, root]})
        return Reply(outcome="accepted", receipt={"vacuumed": False})


class Server:
    """What retention asks of the rest of the server: is it busy (stopping, a runner active)."""

    def __init__(self) -> None:
        self.stopping = False
        self.active_runners = 0

    def busy(self) -> bool:
        return self.stopping or self.active_runners > 0


def retention(trees: int) -> tuple[Retention, FakeWriter, Server, FakeClock]:
    writer, server, clock = FakeWriter(trees), Server(), FakeClock()
    return Retention(writer, Settings(), clock, server.busy), writer, server, clock


def test_a_sweep_deletes_one_tree_per_call_then_compacts_once():
    sweep, writer, _, clock = retention(3)
    assert asyncio.run(sweep._sweep()) is True
    retains = [c for c in writer.calls if c == "state.retain"]
    assert len(retains) == 4 and writer.trees == 0  # three trees, then "none left"
    assert writer.calls[-1] == "state.compact" and writer.calls.count("state.compact") == 1
    # idle is checked again between every two trees
    assert writer.calls[:4] == ["state.retain", "run.claimable", "state.retain", "run.claimable"]
    # the cutoff is the clock's now less the retention age
    cutoffs = {body["cutoff_ms"] for body in writer.bodies if "cutoff_ms" in body}
    assert cutoffs == {clock.now_ms() - Settings().retention_age_ms}


def test_work_that_becomes_active_stops_the_sweep_and_it_stays_due():
    sweep, writer, _, _ = retention(5)
    writer.on_retain = lambda: writer.claimable.append("run-new") if writer.trees == 4 else None
    assert asyncio.run(sweep._sweep()) is False  # stopped between trees
    assert writer.trees == 3 and "state.compact" not in writer.calls
    assert sweep._due()  # nothing completed: still due


def test_at_most_one_completed_sweep_per_interval_and_only_when_idle():
    async def scenario() -> list[bool]:
        sweep, writer, server, clock = retention(0)
        steps = [await sweep.step()]  # the startup trigger: one completed sweep
        steps.append(await sweep.step())  # a runner exited, but the interval has not passed
        clock.advance(Settings().retention_interval_ms - 1)
        steps.append(await sweep.step())  # a millisecond short of the interval
        clock.advance(1)
        server.active_runners = 1  # the interval passed, but a runner is active
        steps.append(await sweep.step())
        server.active_runners = 0
        with sweep.maintenance():  # a client's prune is in flight
            steps.append(await sweep.step())
        writer.claimable.append("run-queued")  # a run waits for a runner
        steps.append(await sweep.step())
        writer.claimable.clear()
        steps.append(await sweep.step())  # idle again: it sweeps
        assert sweep.sweeps == 2
        return steps

    assert asyncio.run(scenario()) == [True, False, False, False, False, False, True]


def test_a_failing_sweep_is_logged_and_stays_due(caplog: pytest.LogCaptureFixture):
    sweep, writer, _, _ = retention(2)

    async def refuse(kind: str, body: dict) -> Reply:
        if kind == "state.retain":
            return Reply(outcome="unavailable", receipt={"code": "diskFull"}, error="the disk is full")
        return Reply(outcome="accepted", receipt={"runIds": []})

    writer.request = refuse  # type: ignore[method-assign]
    assert asyncio.run(sweep.step()) is False
    assert sweep._due() and sweep.sweeps == 0
    assert "retention failed (RuntimeError)" in caplog.text


def test_the_loop_sweeps_on_a_trigger_and_on_the_idle_retry_of_the_clock():
    async def scenario() -> list[int]:
        sweep, writer, server, clock = retention(0)
        server.active_runners = 1  # busy at the startup trigger: it stays due
        sweep.start()
        await waiting_again(clock)
        seen = [sweep.sweeps]
        server.active_runners = 0
        clock.advance(Settings().retention_idle_retry_ms)  # no trigger, but the idle retry: it sweeps
        await waiting_again(clock)
        seen.append(sweep.sweeps)
        await sweep.stop()
        return seen

    assert asyncio.run(scenario()) == [0, 1]


async def waiting_again(clock: FakeClock) -> None:
    """Until the loop waits on the clock for a time still ahead (it handled what was due)."""
    while not clock.next_wait_ms():
        await asyncio.sleep(0)


def test_stop_ends_the_loop_even_when_a_wake_lands_with_the_cancel():
    """A trigger and the stop in the same turn of the loop: Python 3.11's wait_for returned the
    finished wait and swallowed the cancel, and the loop went on waiting (a shutdown that hung)."""

    async def scenario() -> bool:
        task, _, server, _ = retention(0)
        server.stopping = True  # never idle: the loop only waits for triggers
        task.start()
        for _ in range(5):
            await asyncio.sleep(0)  # the first trigger handled; the loop waits again
        task.request()
        stopping = asyncio.ensure_future(task.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
        return stopping in done

    assert asyncio.run(scenario()) is True

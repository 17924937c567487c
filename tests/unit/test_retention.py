"""Automatic retention's rules, in-process: a fake supervisor and a fake monotonic clock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor import retention as retention_module
from piworkflows.supervisor.retention import Retention

pytestmark = pytest.mark.timeout(30)


class FakeWriter:
    """Answers run.claimable, state.retain (one tree per call) and state.compact; logs the order."""

    def __init__(self, trees: int) -> None:
        self.trees, self.calls, self.claimable = trees, [], []
        self.on_retain = lambda: None

    async def request(self, kind: str, body: dict) -> Reply:
        self.calls.append(kind)
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


def retention(trees: int) -> tuple[Retention, FakeWriter, SimpleNamespace]:
    writer = FakeWriter(trees)
    supervisor = SimpleNamespace(
        settings=Settings(), writer=writer, state="running", scheduler=SimpleNamespace(active={})
    )
    return Retention(supervisor), writer, supervisor


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 1000.0}
    monkeypatch.setattr(retention_module.time, "monotonic", lambda: now["t"])
    return now


def test_a_sweep_deletes_one_tree_per_call_then_compacts_once():
    sweep, writer, _ = retention(3)
    assert asyncio.run(sweep._sweep()) is True
    retains = [c for c in writer.calls if c == "state.retain"]
    assert len(retains) == 4 and writer.trees == 0  # three trees, then "none left"
    assert writer.calls[-1] == "state.compact" and writer.calls.count("state.compact") == 1
    # idle is checked again between every two trees
    assert writer.calls[:4] == ["state.retain", "run.claimable", "state.retain", "run.claimable"]


def test_work_that_becomes_active_stops_the_sweep_and_it_stays_due(clock):
    sweep, writer, supervisor = retention(5)
    writer.on_retain = lambda: writer.claimable.append("run-new") if writer.trees == 4 else None
    assert asyncio.run(sweep._sweep()) is False  # stopped between trees
    assert writer.trees == 3 and "state.compact" not in writer.calls
    assert sweep._due()  # nothing completed: still due


def test_at_most_one_completed_sweep_per_interval_and_only_when_idle(clock):
    async def scenario() -> list[int]:
        sweep, writer, supervisor = retention(0)
        loop_ran = []
        sweep.start()
        for _ in range(20):  # the startup trigger: one completed sweep
            await asyncio.sleep(0)
        loop_ran.append(sweep.sweeps)
        sweep.request()  # a runner exited, but the interval has not passed
        for _ in range(20):
            await asyncio.sleep(0)
        loop_ran.append(sweep.sweeps)
        clock["t"] += Settings().retention_interval_ms / 1000  # a day later, but a runner is active
        supervisor.scheduler.active = {"run-1": object()}
        sweep.request()
        for _ in range(20):
            await asyncio.sleep(0)
        loop_ran.append(sweep.sweeps)
        supervisor.scheduler.active = {}  # idle again: the next trigger sweeps
        sweep.request()
        for _ in range(20):
            await asyncio.sleep(0)
        loop_ran.append(sweep.sweeps)
        await sweep.stop()
        return loop_ran

    assert asyncio.run(scenario()) == [1, 1, 1, 2]


def test_stop_ends_the_loop_even_when_a_wake_lands_with_the_cancel():
    """A trigger and the stop in the same turn of the loop: Python 3.11's wait_for returned the
    finished wait and swallowed the cancel, and the loop went on waiting (a shutdown that hung)."""

    async def scenario() -> bool:
        task, _, supervisor = retention(0)
        supervisor.state = "stopping"  # never idle: the loop only waits for triggers
        task.start()
        for _ in range(5):
            await asyncio.sleep(0)  # the first trigger handled; the loop waits again
        task.request()
        stopping = asyncio.ensure_future(task.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
        return stopping in done

    assert asyncio.run(scenario()) is True

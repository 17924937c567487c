"""The scheduler in-process: its admission and renewal steps against a fake writer on a fake clock
(supervisor/scheduler.py over the seams of supervisor/seams.py). Workflow runners are not started
here; where a step signals a runner's group, the group is a real sleeping process."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

import pytest

from piworkflows.clock import FakeClock
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.runner import EffectAwait
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.scheduler import RELAYS, EffectInFlight, RunnerHandle, Scheduler
from piworkflows.supervisor.stderr import StderrTail
from tests.seam_fakes import Recorder

pytestmark = pytest.mark.timeout(30)


class FakeWriter:
    """Claimable runs from a queue; run.claim accepted with a new runner epoch each; run.resume_state
    held until the test releases it (so admitted runs stay active and no runner starts)."""

    def __init__(self, queued: list[str]) -> None:
        self.queued = list(queued)
        self.restarts = 0
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, list[Reply]] = {}
        self.resume = asyncio.Event()
        self._epochs = 100

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        self.sent.append((kind, body))
        if self.answers.get(kind):
            return self.answers[kind].pop(0)
        if kind == "run.claimable":
            return Reply(outcome="accepted", receipt={"runIds": self.queued[: body["limit"]]})
        if kind == "run.claim":
            self.queued.remove(body["run_id"])
            self._epochs += 1
            return Reply(outcome="accepted", revision=1, receipt={"leaseGeneration": 1, "runnerEpoch": self._epochs})
        if kind == "run.resume_state":
            await self.resume.wait()
            return Reply(outcome="notFound", receipt={"code": "runNotFound"}, error="gone")
        if kind == "runner.orphans":
            return Reply(outcome="accepted", receipt={"runners": []})
        return Reply(outcome="accepted", receipt={})

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.sent]


class FakePool:
    def __init__(self) -> None:
        self.wakes = 0
        self.watched: dict[str, asyncio.Event] = {}

    def wake(self) -> None:
        self.wakes += 1

    def watch(self, effect_id: str) -> asyncio.Event:
        self.watched[effect_id] = asyncio.Event()
        return self.watched[effect_id]

    def unwatch(self, effect_id: str, settled: asyncio.Event) -> None:
        del self.watched[effect_id]


def scheduler(writer: FakeWriter, **settings: Any) -> tuple[Scheduler, FakeClock, list[str]]:
    clock, retention = FakeClock(), []
    chosen = Settings(**{"max_runners": 2, **settings})
    built = Scheduler(
        writer,
        Recorder(),
        FakePool(),
        chosen,
        clock,
        server_epoch=lambda: 7,
        request_retention=lambda: retention.append("looked"),
    )
    return built, clock, retention


async def stop_serving(built: Scheduler, writer: FakeWriter) -> None:
    """Let the admitted runs' launches end (their resume state is not found)."""
    tasks = [handle.task for handle in built.active.values() if handle.task is not None]
    writer.resume.set()
    await asyncio.gather(*tasks)


def test_admission_claims_runs_up_to_the_free_runner_capacity_under_this_epoch():
    async def scenario() -> None:
        writer = FakeWriter(["run-a", "run-b", "run-c"])
        built, _, _ = scheduler(writer)
        await built.admit()
        assert writer.sent[0] == ("run.claimable", {"actor": {"actor_class": "server"}, "limit": 2})
        claims = [body for kind, body in writer.sent if kind == "run.claim"]
        assert [c["run_id"] for c in claims] == ["run-a", "run-b"]
        assert all(c["server_epoch"] == 7 and c["launch_command"] == "start" for c in claims)
        assert len({c["claim_token_hash"] for c in claims}) == 2  # a new token each, only its hash sent
        assert set(built.active) == {"run-a", "run-b"}
        assert [h.runner_epoch for h in built.active.values()] == [101, 102]

        writer.sent.clear()
        await built.admit()  # no free capacity: the writer is not even asked
        assert writer.sent == [] and writer.queued == ["run-c"]
        await stop_serving(built, writer)

    asyncio.run(scenario())


def test_a_run_that_cannot_start_is_handed_back_and_frees_its_place():
    async def scenario() -> None:
        writer = FakeWriter(["run-a"])
        built, _, retention = scheduler(writer)
        await built.admit()
        await stop_serving(built, writer)  # its resume state is not found: no runner starts
        exited = [body for kind, body in writer.sent if kind == "runner.exited"]
        detail = BlobValue.of_text("the run's state could not be read for its runner (gone)").model_dump()
        assert exited == [
            {
                "actor": {"actor_class": "server"},
                "run_id": "run-a",
                "runner_epoch": 101,
                "outcome": "crashed",
                "stopped_by_server": False,
                "crash_limit": 3,
                "crash_backoff_ms": 1000,
                "park_detail": detail,
            }
        ]
        assert built.active == {} and retention == ["looked"]

    asyncio.run(scenario())


def test_a_claim_that_is_refused_launches_nothing():
    async def scenario() -> None:
        writer = FakeWriter(["run-a"])
        writer.answers["run.claim"] = [Reply(outcome="conflict", receipt={"code": "leaseHeld"}, error="held")]
        built, _, _ = scheduler(writer)
        await built.admit()
        assert built.active == {} and "run.resume_state" not in writer.kinds()

    asyncio.run(scenario())


def test_after_a_writer_restart_admission_first_closes_orphaned_runner_records_once():
    async def scenario() -> None:
        writer = FakeWriter([])
        built, _, _ = scheduler(writer)
        await built.admit()
        assert "runner.orphans" not in writer.kinds()  # no restart since the start

        writer.restarts = 1
        writer.answers["runner.orphans"] = [
            Reply(outcome="unavailable", receipt={"code": "writerRestarting"}, error="restarting"),
            Reply(outcome="accepted", receipt={"runners": [{"runId": "run-x", "runnerEpoch": 5}]}),
        ]
        await built.admit()  # the reconcile was not answered: asked again at the next step
        await built.admit()
        orphans = [body for kind, body in writer.sent if kind == "runner.orphans"]
        assert len(orphans) == 2 and orphans[-1]["server_epoch"] == 7
        exited = [body for kind, body in writer.sent if kind == "runner.exited"]
        assert exited == [
            {
                "actor": {"actor_class": "server"},
                "run_id": "run-x",
                "runner_epoch": 5,
                "outcome": "orphaned",
                "stopped_by_server": True,
            }
        ]
        writer.sent.clear()
        await built.admit()
        assert "runner.orphans" not in writer.kinds()  # reconciled for this restart

    asyncio.run(scenario())


def handle(run_id: str, **fields: Any) -> RunnerHandle:
    claim = {"owner_id": f"owner-{run_id}", "claim_token_hash": b"h" * 32, "lease_generation": 1}
    return RunnerHandle(run_id, 1, claim, 1, **fields)


def test_renewal_renews_each_live_runner_and_the_effect_it_applies():
    async def scenario() -> None:
        writer = FakeWriter([])
        built, _, _ = scheduler(writer)
        effect = EffectInFlight("effect-1", {"owner_id": "owner-e"}, 1)
        paused = EffectInFlight("effect-2", {"owner_id": "owner-p"}, 1)
        built.active = {
            "run-live": handle("run-live"),
            "run-done": handle("run-done", done=True),
            "run-acting": handle("run-acting", effect=effect),
            "run-paused": handle("run-paused", effect=paused, stop_after_effect=True),
        }
        await built.renew()
        renewed = [body["resource_id"] for kind, body in writer.sent if kind == "claim.renew"]
        # a finished run's claim went with its commit; a paused run keeps only its effect's claim
        assert renewed == ["run-live", "effect-1", "run-acting", "effect-2"]

    asyncio.run(scenario())


def test_a_runner_whose_claim_is_lost_is_killed_with_its_group():
    async def scenario() -> tuple[int, bool]:
        writer = FakeWriter([])
        built, _, _ = scheduler(writer)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True
        )
        built.active = {"run-a": handle("run-a", proc=proc)}
        writer.answers["claim.renew"] = [Reply(outcome="claimLost", receipt={"code": "claimExpired"}, error="lost")]
        await built.renew()
        return await proc.wait(), built.active["run-a"].stopping

    assert asyncio.run(scenario()) == (-signal.SIGKILL, True)


def test_a_stopped_runner_gets_sigterm_then_sigkill_after_the_grace_of_the_clock():
    async def scenario() -> tuple[int | None, int]:
        writer = FakeWriter([])
        built, clock, _ = scheduler(writer, stop_grace_ms=5000)
        script = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready'); "
        script += "sys.stdout.flush(); time.sleep(60)"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, start_new_session=True
        )
        assert proc.stdout is not None and await proc.stdout.readline() == b"ready\n"  # SIGTERM ignored from here
        built.active = {"run-a": handle("run-a", proc=proc)}
        built.stop_run("run-a")
        while clock.next_wait_ms() is None:  # the kill waits on the clock
            await asyncio.sleep(0)
        clock.advance(4999)
        pending = clock.next_wait_ms()  # still waiting: the SIGKILL comes with the grace's last millisecond
        clock.advance(1)
        return pending, await proc.wait()

    assert asyncio.run(scenario()) == (1, -signal.SIGKILL)


def test_a_runner_awaiting_a_pool_effect_is_answered_when_the_pool_settles_it_or_after_effect_await_ms():
    async def scenario() -> None:
        writer = FakeWriter([])
        built, clock, _ = scheduler(writer, effect_await_ms=2000)
        pool = built.pool
        assert isinstance(pool, FakePool)
        statuses = iter(["pending", "applied", "applying", "applying"])

        async def status(kind: str, body: dict[str, Any]) -> Reply:
            writer.sent.append((kind, body))
            return Reply(outcome="accepted", receipt={"items": [{"status": next(statuses)}]})

        writer.request = status  # type: ignore[method-assign]
        runner = handle("run-a")
        waiting = asyncio.ensure_future(
            built._await_effect(runner, {"k": EffectAwait.kind, "b": {"effect_id": "effect-1"}})
        )
        while "effect-1" not in pool.watched or runner.awaiting is None or len(writer.sent) < 1:
            await asyncio.sleep(0)
        pool.watched["effect-1"].set()  # the pool settled it
        settled = await waiting
        assert settled.receipt == {"effectId": "effect-1", "effectStatus": "applied"}
        assert clock.monotonic_ms() == 0 and pool.watched == {}

        # not settled: answered with its status after effect_await_ms of the clock
        answered = await clock.drive(
            built._await_effect(runner, {"k": EffectAwait.kind, "b": {"effect_id": "effect-1"}})
        )
        assert answered.receipt == {"effectId": "effect-1", "effectStatus": "applying"}
        assert clock.monotonic_ms() == 2000

    asyncio.run(scenario())


@pytest.mark.parametrize(("declared", "forwarded"), [(None, 123_000), (0, 0), (5000, 5000)])
def test_an_agent_request_gets_the_servers_budget_only_when_the_node_left_it_to_the_server(
    declared: int | None, forwarded: int
) -> None:
    async def scenario() -> dict[str, Any]:
        writer = FakeWriter([])
        built, _, _ = scheduler(writer, agent_timeout_ms=123_000)
        frame = {"k": "node.request_agent", "id": 4, "b": {"attempt_id": "attempt-1", "timeout_ms": declared}}
        reply = await RELAYS["node.request_agent"](built, handle("run-a"), frame)
        assert reply.outcome == "accepted"
        ((kind, body),) = writer.sent
        assert kind == "node.request_agent"
        return body

    body = asyncio.run(scenario())
    assert body["timeout_ms"] == forwarded
    assert (body["run_id"], body["claim"]["owner_id"]) == ("run-a", "owner-run-a")  # under the run's claim


def test_a_runner_the_server_stopped_whose_pipe_broke_is_logged_as_stopped_not_dead(caplog: pytest.LogCaptureFixture):
    """A cancel commits while the run's runner is being taken; the runner is gone by the time the
    launch is written, so the write breaks its pipe. That is the server's own stop, not a death."""

    async def scenario() -> None:
        writer = FakeWriter(["run-a"])
        resume = {"projectPath": "/p", "source": {"kind": "builtin", "id": "demo", "revision": "1"}}
        resume |= {"definitionDigest": "sha256:" + "0" * 64, "input": None, "steps": []}
        writer.answers["run.resume_state"] = [Reply(outcome="accepted", receipt=resume)]
        built, _, _ = scheduler(writer)
        # closes its stdin (a write to it breaks the pipe), then says so on stderr and waits
        script = "import os, sys, time; os.close(0); sys.stderr.write('closed\\n'); sys.stderr.flush(); time.sleep(60)"

        async def take_runner() -> asyncio.subprocess.Process:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                script,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            assert proc.stderr is not None and await proc.stderr.readline() == b"closed\n"
            built._stderr[proc.pid] = StderrTail(proc.stderr, 20, 200)
            built.stop_run("run-a")  # the cancel committed meanwhile
            return proc

        built._take_runner = take_runner  # type: ignore[method-assign]
        await built.admit()
        task = built.active["run-a"].task
        assert task is not None
        await task

    with caplog.at_level(logging.INFO, logger="piworkflows.supervisor"):
        asyncio.run(scenario())
    assert "the runner of run-a was stopped by the server" in caplog.text
    assert "died" not in caplog.text

"""The agent manager in-process: admission, forwarding and renewal against a fake writer on a fake
clock (supervisor/agents.py over the seams of supervisor/seams.py). No agent host is started here;
where a step signals a host's group, the group is a real sleeping process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from typing import Any

import pytest

from piworkflows.agents.pi import NEEDS_PI
from piworkflows.clock import FakeClock
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.agents import AgentManager, HostHandle
from tests.seam_fakes import Recorder

pytestmark = pytest.mark.timeout(30)


class FakeWriter:
    """Pending requests from a list; agent.open accepted with a new segment each (or as told)."""

    def __init__(self, pending: list[str]) -> None:
        self.pending = list(pending)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, list[Reply]] = {}

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        self.sent.append((kind, body))
        if self.answers.get(kind):
            return self.answers[kind].pop(0)
        if kind == "agent.claimable":
            items = [r for r in self.pending if r not in body["exclude_request_ids"]][: body["limit"]]
            return Reply(
                outcome="accepted", receipt={"requests": [{"requestId": r, "runId": "run-" + r} for r in items]}
            )
        if kind == "agent.open":
            self.pending.remove(body["request_id"])
            return Reply(
                outcome="accepted",
                revision=1,
                receipt={
                    "segmentId": body["segment_id"],
                    "leaseGeneration": 7,
                    "runId": "run-" + body["request_id"],
                    "attemptId": "attempt-1",
                    "requestId": body["request_id"],
                    "sessionId": "pis-1",
                    "piSessionFile": None,
                    "contract": {},
                    "pending": [],
                    "steps": [],
                    "timeoutMs": 0,
                    "elapsedMs": 0,
                    "projectPath": "/tmp",
                },
            )
        return Reply(outcome="accepted", receipt={})

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.sent]


def _manager(writer: FakeWriter, clock: FakeClock, **settings: Any) -> tuple[AgentManager, list[int]]:
    wakes: list[int] = []
    manager = AgentManager(
        writer,
        Recorder(),
        Settings(**settings),
        clock,
        server_epoch=lambda: 3,
        socket_path="/tmp/sock",
        wake_scheduler=lambda: wakes.append(1),
        resolvers=None,  # type: ignore[arg-type]  (nothing is validated here)
        runs=None,  # type: ignore[arg-type]
    )
    return manager, wakes


async def _settle(manager: AgentManager) -> None:
    """Until every host task the step started has ended."""
    tasks = [h.task for h in manager.active.values() if h.task is not None]
    if tasks:
        await asyncio.wait(tasks, timeout=10)


def test_without_pi_a_request_ends_its_segment_naming_the_fix(monkeypatch):
    """No Pi anywhere: no host is started, agent.exited carries the fix (the writer parks the run)."""
    monkeypatch.setattr("piworkflows.supervisor.agents.find_pi", lambda settings: None)
    writer = FakeWriter(["r1", "r2"])

    async def scenario() -> list[int]:
        manager, wakes = _manager(writer, FakeClock(), max_agents=1)
        await manager.admit()
        assert len(manager.active) == 1  # capacity 1: one segment opened
        await _settle(manager)
        assert not manager.active
        return wakes

    assert asyncio.run(scenario())  # the scheduler was woken
    assert writer.kinds() == ["agent.claimable", "agent.open", "agent.exited"]
    exited = writer.sent[-1][1]
    assert not exited["stopped_by_server"] and exited["detail"]["data"].decode() == NEEDS_PI


def test_a_timed_out_open_starts_no_host_and_wakes_the_scheduler():
    writer = FakeWriter(["r1"])
    writer.answers["agent.open"] = [Reply(outcome="accepted", revision=2, receipt={"timedOut": True})]

    async def scenario() -> list[int]:
        manager, wakes = _manager(writer, FakeClock(), max_agents=2)
        await manager.admit()
        assert not manager.active
        return wakes

    assert asyncio.run(scenario()) == [1]


def test_a_host_frame_goes_to_the_writer_under_the_segment_claim_with_a_message_key():
    writer = FakeWriter([])
    writer.answers["agent.turn"] = [Reply(outcome="accepted", revision=3, receipt={"requestStatus": "failed"})]

    async def scenario() -> tuple[Reply, Reply, list[int]]:
        manager, wakes = _manager(writer, FakeClock())
        claim = {"server_epoch": 3, "owner_id": "server-3", "claim_token_hash": b"h" * 32, "lease_generation": 7}
        handle = HostHandle("segment-1", "run-1", "r1", claim)
        frame = {
            "k": "agent.turn",
            "id": 5,
            "b": {"phase": "ended", "workflow_turn_id": "t", "workflow_message_id": "m"},
        }
        ended = await manager._forward(handle, frame)
        unknown = await manager._forward(handle, {"k": "node.start", "id": 6, "b": {}})
        return ended, unknown, wakes

    ended, unknown, wakes = asyncio.run(scenario())
    kind, body = writer.sent[-1]
    assert kind == "agent.turn" and body["segment_id"] == "segment-1" and body["claim"]["lease_generation"] == 7
    assert body["actor"] == {"actor_class": "runner", "actor_id": "agent:segment-1"}
    assert body["worker_message"]["message_id"] == "7:5" and body["worker_message"]["sender_scope"] == "segment-1"
    assert ended.outcome == "accepted" and wakes == [1]  # the request failed: the run goes on
    assert unknown.outcome == "rejected" and len(writer.sent) == 1  # not a host frame: never forwarded


def test_a_lost_segment_claim_ends_the_host_group():
    writer = FakeWriter([])
    writer.answers["claim.renew"] = [Reply(outcome="claimLost", receipt={"code": "claimExpired"})]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)

    async def scenario() -> HostHandle:
        manager, _ = _manager(writer, FakeClock(), stop_grace_ms=10)
        handle = HostHandle("segment-1", "run-1", "r1", {"lease_generation": 1})
        handle.proc = _AsyncProc(sleeper)  # type: ignore[assignment]
        manager.active["r1"] = handle
        await manager.renew()
        return handle

    handle = asyncio.run(scenario())
    assert handle.stopping
    assert sleeper.wait(timeout=10) == -signal.SIGTERM
    assert writer.kinds() == ["claim.renew"]


class _AsyncProc:
    """The two attributes the manager reads of a host process."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.pid = popen.pid
        self._popen = popen

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

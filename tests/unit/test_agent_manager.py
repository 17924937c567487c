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

from piworkflows import faults
from piworkflows.agents.pi import NEEDS_PI
from piworkflows.clock import FakeClock
from piworkflows.protocol.internal.agents import AgentContract, AgentLaunch, Executor, ExpectedOutput, request_id_of
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.agents import AgentManager, HostHandle
from piworkflows.supervisor.registry import ChildNotRecorded, Identity
from piworkflows.supervisor.seams import HubWiring
from piworkflows.supervisor.stderr import StderrTail
from tests.seam_fakes import Recorder

pytestmark = pytest.mark.timeout(30)


def contract(executor: Executor | None = None) -> dict[str, Any]:
    agreed = AgentContract(
        workflow_name="demo",
        node_path="fix",
        attempt_id="attempt-1",
        request_id=request_id_of("attempt-1"),
        visit_number=1,
        attempt_number=1,
        prompt="Fix it.",
        expected_output=ExpectedOutput(kind="description", description="what changed"),
        executor=executor or Executor(),
    )
    return agreed.model_dump(mode="json")


class FakeWriter:
    """Pending requests from a list; agent.open accepted with a new segment each (or as told)."""

    def __init__(self, pending: list[str]) -> None:
        self.pending = list(pending)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, list[Reply]] = {}
        self.contract = contract()
        self.runs: dict[str, str] = {}  # request id -> its run id (else "run-" + the request id)

    def run_of(self, request_id: str) -> str:
        return self.runs.get(request_id, "run-" + request_id)

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        self.sent.append((kind, body))
        if self.answers.get(kind):
            return self.answers[kind].pop(0)
        if kind == "agent.claimable":
            items = [r for r in self.pending if r not in body["exclude_request_ids"]][: body["limit"]]
            return Reply(
                outcome="accepted", receipt={"requests": [{"requestId": r, "runId": self.run_of(r)} for r in items]}
            )
        if kind == "agent.open":
            self.pending.remove(body["request_id"])
            return Reply(
                outcome="accepted",
                revision=1,
                receipt={
                    "segmentId": body["segment_id"],
                    "leaseGeneration": 7,
                    "runId": self.run_of(body["request_id"]),
                    "attemptId": "attempt-1",
                    "requestId": body["request_id"],
                    "sessionId": "pis-1",
                    "piSessionFile": None,
                    "contract": self.contract,
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
        HubWiring(writer, Recorder(), Settings(**settings), clock, lambda: 3, lambda: wakes.append(1)),
        socket_path="/tmp/sock",
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


def test_a_command_step_starts_its_host_without_looking_for_pi(monkeypatch):
    """executor=command(argv): no Pi is needed, so none is looked for; the launch names no Pi."""

    def no_pi(settings: Settings) -> str:
        raise AssertionError("a command step looked for Pi")

    async def unspawned(*args: Any, **kwargs: Any) -> Any:
        raise ChildNotRecorded("the test starts no host")

    launches: list[AgentLaunch] = []
    real_launch = AgentManager._launch

    def launch(manager: AgentManager, *args: Any) -> AgentLaunch:
        launches.append(real_launch(manager, *args))
        return launches[-1]

    monkeypatch.setattr("piworkflows.supervisor.agents.find_pi", no_pi)
    monkeypatch.setattr("piworkflows.supervisor.agents.spawn_child", unspawned)
    monkeypatch.setattr(AgentManager, "_launch", launch)
    writer = FakeWriter(["r1"])
    writer.contract = contract(Executor(kind="command", argv=["my-agent", "--print"]))

    async def scenario() -> None:
        manager, _ = _manager(writer, FakeClock())
        await manager.admit()
        await _settle(manager)

    asyncio.run(scenario())
    (launched,) = launches
    assert launched.pi_command == [] and launched.contract.executor.argv == ["my-agent", "--print"]
    assert writer.kinds() == ["agent.claimable", "agent.open", "agent.exited"]


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


class Hosts:
    """Stands in for spawn_child: each "host" is a real idle process in its own group, recorded; the
    relay stands in for the host's frames: it notes which host served which request and ends at
    once (closed or not, as ``close`` says)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, close: bool = True) -> None:
        self.spawned: list[tuple[asyncio.subprocess.Process, dict[str, str]]] = []
        self.served: dict[str, asyncio.subprocess.Process] = {}
        self.close = close
        monkeypatch.setattr("piworkflows.supervisor.agents.find_pi", lambda settings: "/bin/pi")
        monkeypatch.setattr("piworkflows.supervisor.agents.spawn_child", self.spawn)
        monkeypatch.setattr(AgentManager, "_relay", lambda manager, handle, launch: self.relay(handle))

    async def spawn(
        self, role: str, marker: str, args: Any, recorder: Recorder, settings: Settings, **kw: Any
    ) -> tuple[asyncio.subprocess.Process, StderrTail]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            f"import sys  # {marker}\nsys.stdin.buffer.read()",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stderr is not None
        recorder.record_child(Identity.of(role, proc.pid, marker, process_group=True))
        self.spawned.append((proc, kw["env"]))
        return proc, StderrTail(proc.stderr, 10, 200)

    async def relay(self, handle: HostHandle) -> None:
        assert handle.proc is not None and handle.proc.returncode is None  # a dead host is never launched
        self.served[handle.request_id] = handle.proc
        handle.closed = self.close

    def procs(self) -> list[asyncio.subprocess.Process]:
        return [proc for proc, _ in self.spawned]


async def _admit_one(manager: AgentManager) -> asyncio.subprocess.Process:
    """One admission served to its end; the host made ready meanwhile."""
    await manager.admit()
    await _settle(manager)
    return await _ready(manager)


async def _ready(manager: AgentManager) -> asyncio.subprocess.Process:
    assert manager._readying is not None
    await manager._readying
    assert manager._ready is not None
    return manager._ready.proc


def test_a_ready_host_serves_the_next_segment_and_is_replaced_and_killed_at_shutdown(monkeypatch):
    """The first segment spawns its host and makes another ready; the next segment is launched on
    the ready one (spawned before its request existed) and a new one is made ready; shutdown kills
    it, and host.json keeps no host."""
    hosts = Hosts(monkeypatch)
    writer = FakeWriter(["r1"])

    async def scenario() -> Recorder:
        manager, _ = _manager(writer, FakeClock(), max_agents=2)
        ready = await _admit_one(manager)
        assert hosts.served["r1"] is hosts.procs()[0] and ready is hosts.procs()[1]
        writer.pending.append("r2")
        await manager.admit()
        await _settle(manager)
        assert hosts.served["r2"] is ready and await _ready(manager) is hosts.procs()[2]
        await manager.stop()
        return manager.recorder  # type: ignore[return-value]

    recorder = asyncio.run(scenario())
    assert len(hosts.spawned) == 3 and all(proc.returncode is not None for proc in hosts.procs())
    assert recorder.recorded == []


def test_a_dead_ready_host_is_never_launched(monkeypatch):
    hosts = Hosts(monkeypatch)
    writer = FakeWriter(["r1"])

    async def scenario() -> None:
        manager, _ = _manager(writer, FakeClock())
        ready = await _admit_one(manager)
        ready.kill()
        await ready.wait()
        writer.pending.append("r2")
        await manager.admit()
        await _settle(manager)
        assert hosts.served["r2"] is hosts.procs()[2]  # a new one (the relay asserts it lives)
        assert ready.pid not in [i.pid for i in manager.recorder.recorded]  # type: ignore[attr-defined]
        await manager.stop()

    asyncio.run(scenario())


def test_after_a_host_failed_the_ready_host_armed_with_crash_points_is_replaced(monkeypatch):
    """Crash points fire in the first host only: a ready host spawned with PIW_FAULTS before a host
    failed is discarded, and the next segment's host (and the next ready one) run without them."""
    monkeypatch.setenv(faults.ENV, "agent.after_open")
    hosts = Hosts(monkeypatch, close=False)  # the host ends without closing its segment: a failure
    writer = FakeWriter(["r1"])

    async def scenario() -> None:
        manager, _ = _manager(writer, FakeClock())
        armed = await _admit_one(manager)
        writer.pending.append("r2")
        await manager.admit()
        await _settle(manager)
        assert armed.returncode is not None and hosts.served["r2"] is hosts.procs()[2]
        await _ready(manager)
        await manager.stop()

    asyncio.run(scenario())
    assert [faults.ENV in env for _, env in hosts.spawned] == [True, True, False, False]
    assert writer.kinds().count("agent.exited") == 2


def test_the_next_request_of_a_run_waits_until_its_last_host_ended(monkeypatch):
    """A closed segment's Pi may still write the session file: the run's next request is opened
    only after that host is gone (its end wakes the admission)."""
    hosts = Hosts(monkeypatch)
    writer = FakeWriter(["r2"])
    writer.runs["r2"] = "run-r1"

    async def scenario() -> list[str]:
        manager, _ = _manager(writer, FakeClock(), max_agents=4)
        manager.active["r1"] = HostHandle("segment-1", "run-r1", "r1", {"lease_generation": 1}, closed=True)
        await manager.admit()
        held = writer.kinds()
        manager.active.pop("r1")  # its host ended
        await manager.admit()
        await _settle(manager)
        await manager.stop()
        return held

    assert asyncio.run(scenario()) == ["agent.claimable"]
    assert writer.kinds()[1:3] == ["agent.claimable", "agent.open"] and "r2" in hosts.served


def test_a_committed_close_wakes_the_scheduler_before_the_host_ends():
    writer = FakeWriter([])

    async def scenario() -> tuple[HostHandle, list[int]]:
        manager, wakes = _manager(writer, FakeClock())
        handle = HostHandle("segment-1", "run-1", "r1", {"lease_generation": 7})
        await manager._forward(handle, {"k": "agent.close", "id": 9, "b": {"elapsed_ms": None}})
        return handle, wakes

    handle, wakes = asyncio.run(scenario())
    assert handle.closed and wakes == [1]


class _AsyncProc:
    """The two attributes the manager reads of a host process."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.pid = popen.pid
        self._popen = popen

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()


def test_a_ready_host_no_segment_took_ends_after_the_idle_exit_and_the_next_segment_spawns_its_own(monkeypatch):
    hosts = Hosts(monkeypatch)
    writer = FakeWriter(["r1"])

    async def scenario() -> Recorder:
        clock = FakeClock()
        manager, _ = _manager(writer, clock, child_idle_exit_ms=1000)
        ready = await _admit_one(manager)
        clock.advance(999)
        await asyncio.sleep(0)
        assert manager._ready is not None and ready.returncode is None  # not yet
        clock.advance(1)
        assert manager._expiring is not None
        await manager._expiring
        assert manager._ready is None and ready.returncode is not None
        writer.pending.append("r2")
        await manager.admit()
        await _settle(manager)
        assert hosts.served["r2"] is hosts.procs()[2]  # spawned for it
        await _ready(manager)
        await manager.stop()
        return manager.recorder  # type: ignore[return-value]

    recorder = asyncio.run(scenario())
    assert len(hosts.spawned) == 4 and all(proc.returncode is not None for proc in hosts.procs())
    assert recorder.recorded == []

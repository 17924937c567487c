"""The scheduler: admits claimable runs up to the runner capacity and serves their runners.

::

    wake (run.start, runner exit, tick) ── run.claimable ── run.claim (token in memory,
      hash in leases; runner epoch recorded before spawn) ── run.resume_state
      ── a runner process waiting for a launch, else spawn `python -m piworkflows.runner run`
         in its own process group (waiting and busy ones together at most max_runners; one
         spare started ahead; one no launch took for child_idle_exit_ms ends)
      ── host.json (group leader identity) ── runner.spawned (pid, create time)
      ── launch ── runner messages: claim + expected revision + message key attached,
         forwarded to the writer, replies relayed ── exit ── runner.exited (respawn rules;
         not sent when the run's end or wait already ended the runner record)
    runner frames (protocol/internal/runner.py) go through one table, RELAYS, by kind
    agents:  node.request_agent: a budget the node left to the server gets agent_timeout_ms
    effects: node.reserve_effect ── pool performers (shell, http): the outbox pool is woken; the
         runner sends effect.await, answered when the pool settled it (or after effect_await_ms)
         with its status, and reserves again to adopt the result
       ── an action body (performer "runner"): effect.claim for it (token here, a numbered
         attempt) ── effect.settle under that claim; a runner that dies applying: effect.abandon
    renewal: claim.renew for every live runner (and its applying effect) every
             claim_renew_ms, even while workflow code blocks (the runner does not take part)
    logs:    a runner's own log records (LOG frames) go to server.log with its pid; its last
             stderr lines are kept (supervisor/stderr.py): a runner that ends by itself
             without saying it is done (it died) has them written to server.log, and its
             last line (or how it died) goes with runner.exited as the park detail

At startup, and after the writer restarted, runner records that no runner of
this supervisor serves are closed as orphaned (older epochs; replies lost in a
writer crash): their runs become claimable again with a new generation.

The scheduler depends on narrow seams (supervisor/seams.py): the writer's
requests and restart count, host.json's child records, the outbox pool's
effect watch, the server epoch and retention's trigger; it waits on its Clock.
``admit()`` is one admission step and ``renew()`` one renewal pass; tests
drive them with a fake writer and a fake clock.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from piworkflows import canonical
from piworkflows.clock import Clock
from piworkflows.protocol import frames
from piworkflows.protocol.internal.agents import NodeRequestAgentFrame
from piworkflows.protocol.internal.base import BlobValue, new_claim
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.nodes import (
    NodeEffectReserveFrame,
    NodeFinishFrame,
    NodeStartFrame,
    NodeWaitFrame,
    RunFinishFrame,
)
from piworkflows.protocol.internal.runner import CompletedStep, EffectAwait, RunnerExiting, RunnerLaunch
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.writer import LogRecord, Reply
from piworkflows.settings import Settings
from piworkflows.states import EFFECT_STATUSES, EFFECT_WORK_STATUSES, RUNNER_PARK_REASONS
from piworkflows.supervisor.logs import log_failure, relay_child_log
from piworkflows.supervisor.registry import ChildNotRecorded, Identity
from piworkflows.supervisor.seams import ChildRecorder, EffectPool, WriterRestarts, refusal
from piworkflows.supervisor.spawn import GroupStopper, signal_group, spawn_child
from piworkflows.supervisor.stderr import StderrTail, exit_text, park_detail

log = logging.getLogger("piworkflows.supervisor")

RUNNER_MARKER = "piworkflows.runner"
RUNS_PER_PROCESS = 1000  # a runner process is recycled after this many runs (a Python start: ~0.4 s CPU)
SERVER = {"actor_class": "server"}


@dataclass
class RunnerHandle:
    run_id: str
    runner_epoch: int
    claim: dict[str, Any]
    revision: int
    proc: asyncio.subprocess.Process | None = None
    stopping: bool = False
    park_reason: str | None = None
    done: bool = False  # the runner said it is exiting this run (its process may serve another)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    effect: EffectInFlight | None = None  # the effect this runner is applying, claimed on its behalf
    stop_after_effect: bool = False  # paused while an effect applies: let it settle, then stop
    record_ended: bool = False  # a commit ended the runner record with the run's end or wait: no exit to record
    awaiting: asyncio.Event | None = None  # the runner waits for the pool to settle an effect
    failure: str | None = None  # the park detail: why no runner could be launched, or why it asked to park


@dataclass
class EffectInFlight:
    effect_id: str
    claim: dict[str, Any]
    revision: int


class Scheduler:
    def __init__(
        self,
        writer: WriterRestarts,
        recorder: ChildRecorder,
        pool: EffectPool,
        settings: Settings,
        clock: Clock,
        *,
        server_epoch: Callable[[], int],
        request_retention: Callable[[], None],
        wake_agents: Callable[[], None] = lambda: None,
        wake_decisions: Callable[[], None] = lambda: None,
        decision_routes: Callable[[str], list[dict[str, str]]] = lambda audience: [],
    ) -> None:
        self.writer = writer
        self.recorder = recorder  # host.json: runner process groups
        self.pool = pool  # performs shell and http effects; runners await its settlements
        self.settings = settings
        self.clock = clock
        self.server_epoch = server_epoch  # the epoch the scheduler's claims are taken under
        self.request_retention = request_retention  # a lifecycle trigger: a runner ended
        self.wake_agents = wake_agents  # a run may wait for an agent step now
        self.wake_decisions = wake_decisions  # a human decision was opened: its deadline timer
        self.decision_routes = decision_routes  # where an audience's decisions and notices go (channels)
        self.active: dict[str, RunnerHandle] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopper = GroupStopper(clock)  # kills after stop_grace_ms
        self._reconciled = writer.restarts  # the writer's restarts when runner records were last reconciled
        self._stopping = False
        # Runner children kept waiting (package imported) for the next launch: a Python start
        # costs well over 100 ms here. A process serves runs one at a time, is recycled after
        # RUNS_PER_PROCESS, and is ended when a run of it was stopped or it failed. Waiting and
        # busy ones together are at most max_runners (one spare beyond the busy ones is started
        # ahead), and one that no launch took for child_idle_exit_ms ends.
        self._ready: list[asyncio.subprocess.Process] = []
        self._ready_since: dict[int, int] = {}  # per waiting process: monotonic ms since it waits
        self._ready_changed = asyncio.Event()
        self._uses: dict[int, int] = {}  # runs served per waiting process
        self._stderr: dict[int, StderrTail] = {}  # per runner process: its last stderr lines
        self._spare_needed = asyncio.Event()
        self._capacity = self.settings.max_runners

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        return await self.writer.request(kind, {"actor": SERVER, **body})

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        await self._reconcile()
        self._reconciled = self.writer.restarts
        self._tasks = [
            asyncio.create_task(self._admission(), name="admission"),
            asyncio.create_task(self._renewal(), name="claim-renewal"),
            asyncio.create_task(self._keep_spares(), name="runner-spares"),
            asyncio.create_task(self._end_idle_runners(), name="runner-idle"),
        ]
        self.wake()

    async def _reconcile(self) -> bool:
        """Close the runner records no runner of this supervisor serves: those of older epochs
        (their groups were ended by the takeover), and this epoch's whose reply was lost when
        the writer crashed (a claim or an exit that committed unanswered). Runs in the
        admission task, so no launch interleaves with it."""
        live = [handle.runner_epoch for handle in self.active.values()]
        orphans = await self.request(
            "runner.orphans", {"server_epoch": self.server_epoch(), "active_runner_epochs": live}
        )
        if orphans.outcome != "accepted" or orphans.receipt is None:
            return False
        for orphan in orphans.receipt["runners"]:
            await self.request(
                "runner.exited",
                {
                    "run_id": orphan["runId"],
                    "runner_epoch": orphan["runnerEpoch"],
                    "outcome": "orphaned",
                    "stopped_by_server": True,
                },
            )
        return True

    async def _admission(self) -> None:
        while not self._stopping:
            await self.clock.woken(self._wake, self.settings.scheduler_tick_ms)
            self._wake.clear()
            await self.admit()

    async def admit(self) -> None:
        """One admission step: after a writer restart, close the runner records no runner serves;
        then claim claimable runs up to the free runner capacity and launch a runner for each."""
        restarts = self.writer.restarts
        if restarts != self._reconciled and await self._reconcile():
            self._reconciled = restarts
        free = self.settings.max_runners - len(self.active)
        if free <= 0 or self._stopping:
            return
        reply = await self.request("run.claimable", {"limit": free})
        for run_id in (reply.receipt or {}).get("runIds", []):
            if run_id not in self.active and not self._stopping:
                try:
                    await self._launch(run_id)
                except Exception as exc:  # one run's launch failure never stops the scheduler
                    log_failure(log, f"launching a runner for {run_id} failed", exc)

    async def _launch(self, run_id: str) -> None:
        claim = new_claim(self.server_epoch(), self.settings.claim_ttl_ms)
        claimed = await self.request(
            "run.claim",
            {
                "run_id": run_id,
                "server_epoch": claim["server_epoch"],
                "owner_id": claim["owner_id"],
                "launch_command": "start",
                "claim_token_hash": claim["claim_token_hash"],
                "ttl_ms": claim["ttl_ms"],
            },
        )
        if claimed.outcome != "accepted" or claimed.receipt is None or claimed.revision is None:
            return
        claim["lease_generation"] = claimed.receipt["leaseGeneration"]
        handle = RunnerHandle(run_id, claimed.receipt["runnerEpoch"], claim, claimed.revision)
        self.active[run_id] = handle
        handle.task = asyncio.create_task(self._serve(handle), name=f"runner-{run_id}")

    async def _serve(self, handle: RunnerHandle) -> None:
        outcome = "crashed"
        try:
            state = await self.request("run.resume_state", {"run_id": handle.run_id})
            if state.outcome != "accepted" or state.receipt is None:
                handle.failure = f"the run's state could not be read for its runner ({state.error or state.outcome})"
                return
            handle.proc = proc = await self._take_runner()
            self._stderr[proc.pid].take()  # what it said before this run is not this run's
            self._spare_needed.set()
            created = int(Identity.of("runner", proc.pid, RUNNER_MARKER).createTime * 1000)
            await self.request(
                "runner.spawned",
                {
                    "run_id": handle.run_id,
                    "runner_epoch": handle.runner_epoch,
                    "claim": handle.claim,
                    "pid": proc.pid,
                    "process_started_at": created,
                },
            )
            launch = RunnerLaunch(
                run_id=handle.run_id,
                lease_generation=handle.claim["lease_generation"],
                runner_epoch=handle.runner_epoch,
                project_path=state.receipt["projectPath"],
                source=RunSource.of_view(state.receipt["source"]),
                definition_digest=state.receipt["definitionDigest"],
                input=state.receipt["input"],
                steps=[_step(step) for step in state.receipt["steps"]],
            )
            outcome = await self._relay(handle, proc, launch)
        except ChildNotRecorded as exc:  # ended before it ran anything; the run waits for the next launch
            log.warning("no runner for %s: %s", handle.run_id, exc)
            handle.stopping = True
        except (ConnectionResetError, BrokenPipeError):  # its pipe closed under a write
            if handle.stopping:  # the server ended it (pause, cancel, a lost claim): no death
                log.info("the runner of %s was stopped by the server", handle.run_id)
            else:
                log.warning("the runner of %s died", handle.run_id)
        except Exception as exc:
            log_failure(log, f"the runner of {handle.run_id} failed", exc)
        finally:
            await self._finish(handle, outcome)

    async def _take_runner(self) -> asyncio.subprocess.Process:
        """A waiting runner process that is still alive, else a new one."""
        while self._ready:
            proc = self._ready.pop()
            self._ready_since.pop(proc.pid, None)
            if proc.returncode is None and psutil.pid_exists(proc.pid):
                return proc
            self._uses.pop(proc.pid, None)
            self._forget(proc)
        return await self._spawn_runner()

    async def _spawn_runner(self) -> asyncio.subprocess.Process:
        # its own process group: stopping the run stops the whole group
        proc, stderr = await spawn_child(
            "runner", RUNNER_MARKER, ("piworkflows.runner", "run"), self.recorder, self.settings, own_group=True
        )
        self._stderr[proc.pid] = stderr
        return proc

    def _forget(self, proc: asyncio.subprocess.Process) -> None:
        """A runner process that is gone: out of host.json, its stderr no longer read."""
        self.recorder.forget_child(proc.pid)
        tail = self._stderr.pop(proc.pid, None)
        if tail is not None:
            tail.close()

    async def _last_lines(self, proc: asyncio.subprocess.Process) -> list[str]:
        """What the runner said on stderr during its run (all of it, if it died: a bounded wait)."""
        tail = self._stderr.get(proc.pid)
        if tail is None:
            return []
        if proc.returncode is not None:
            await tail.drained(self.settings.child_stderr_drain_ms / 1000)
        return tail.take()

    def _busy(self, leaving: RunnerHandle | None = None) -> int:
        """Runner processes serving a run (``leaving``'s not counted)."""
        return sum(
            1
            for handle in self.active.values()
            if handle is not leaving and handle.proc is not None and handle.proc.returncode is None
        )

    def _wait_for_launch(self, proc: asyncio.subprocess.Process) -> None:
        self._ready.append(proc)
        self._ready_since[proc.pid] = self.clock.monotonic_ms()
        self._ready_changed.set()

    async def _keep_spares(self) -> None:
        """After a launch took a waiting process, start one spare while fewer than max_runners
        processes exist (none before the first run)."""
        while not self._stopping:
            await self._spare_needed.wait()
            self._spare_needed.clear()
            while not self._ready and self._busy() < self._capacity and not self._stopping:
                try:
                    self._wait_for_launch(await self._spawn_runner())
                except ChildNotRecorded:
                    break  # host.json cannot be written now: the next launch asks again

    async def _end_idle_runners(self) -> None:
        """A waiting process that no launch took for child_idle_exit_ms ends: an idle server keeps
        no runner."""
        limit = self.settings.child_idle_exit_ms
        while not self._stopping:
            now = self.clock.monotonic_ms()
            for proc in [p for p in self._ready if now - self._ready_since.get(p.pid, now) >= limit]:
                if proc not in self._ready:  # a launch took it while an earlier one was ending
                    continue
                self._ready.remove(proc)
                self._ready_since.pop(proc.pid, None)
                self._uses.pop(proc.pid, None)
                signal_group(proc.pid, signal.SIGKILL)  # waiting for a launch: nothing to park
                await proc.wait()
                self._forget(proc)
            since = [self._ready_since[p.pid] for p in self._ready if p.pid in self._ready_since]
            wait_ms = min(since) + limit - self.clock.monotonic_ms() if since else limit
            self._ready_changed.clear()
            await self.clock.woken(self._ready_changed, max(10, wait_ms))

    async def _relay(self, handle: RunnerHandle, proc: asyncio.subprocess.Process, launch: RunnerLaunch) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(frames.encode(launch.kind, 0, launch.model_dump()))
        await proc.stdin.drain()
        decoder = frames.FrameDecoder()
        while data := await proc.stdout.read(1 << 16):
            for frame in decoder.feed(data):
                if frame["k"] == LogRecord.kind:  # its own log record: to server.log, never answered
                    relay_child_log("runner", proc.pid, frame["b"])
                    continue
                relay = RELAYS.get(frame["k"])
                reply = await relay(self, handle, frame) if relay else refusal("unknownCommand", "not a runner message")
                if reply is None:  # the runner is done with its run
                    return "cancelled" if handle.stopping else "exited"
                proc.stdin.write(frames.encode(Reply.kind, frame["id"], reply.model_dump()))
                await proc.stdin.drain()
        code = await proc.wait()
        if handle.stopping:
            return "cancelled"
        return "exited" if code == 0 else "crashed"

    async def _exiting(self, handle: RunnerHandle, frame: dict[str, Any]) -> None:
        """The runner is done with its run; it may ask the run to park."""
        exiting = RunnerExiting.model_validate(frame["b"])
        handle.park_reason = exiting.park_reason or handle.park_reason
        handle.failure = exiting.detail or handle.failure  # the park's detail
        handle.done = True

    async def _request_agent(self, handle: RunnerHandle, frame: dict[str, Any]) -> Reply:
        """node.request_agent under the run's claim; a budget the node left to the server (None) is
        the server's default, filled in here (the runner knows no server settings)."""
        if frame["b"].get("timeout_ms") is None:
            frame = {**frame, "b": {**frame["b"], "timeout_ms": self.settings.agent_timeout_ms}}
        return await self._forward_run_message(handle, frame)

    async def _finish_node(self, handle: RunnerHandle, frame: dict[str, Any]) -> Reply:
        """node.finish; a notify node's audience gets its routes (its messages, reserved with it)."""
        audience = frame["b"].get("notify_audience")
        if audience is not None:
            frame = {**frame, "b": {**frame["b"], "routes": self.decision_routes(str(audience))}}
        return await self._forward_run_message(handle, frame)

    async def _wait_node(self, handle: RunnerHandle, frame: dict[str, Any]) -> Reply:
        """node.wait: a checkpoint's, or a human decision's (whose deadline the timer learns)."""
        decision = frame["b"].get("decision")
        if decision is not None:  # its deliveries are reserved with it, one per route of its audience
            frame = {**frame, "b": {**frame["b"], "routes": self.decision_routes(str(decision.get("audience")))}}
        reply = await self._forward_run_message(handle, frame)
        if reply.outcome == "accepted" and decision is not None:
            self.wake_decisions()
        return reply

    async def _reserve_effect(self, handle: RunnerHandle, frame: dict[str, Any]) -> Reply:
        """node.reserve_effect under the run's claim; a pending effect is then claimed for the runner
        (an action body acts itself) or left to the pool (woken; the runner awaits the settlement)."""
        reply = await self._forward_run_message(handle, frame)
        if reply.outcome in ("accepted", "adopted") and reply.receipt and reply.receipt["effectStatus"] == "pending":
            if frame["b"].get("performer") == "runner":  # an action body: the runner acts itself
                return await self._claim_effect(handle, reply.receipt["effectId"])
            self.pool.wake()  # the pool performs it; the runner awaits the settlement
        return reply

    async def _await_effect(self, handle: RunnerHandle, frame: dict[str, Any]) -> Reply:
        """Until the pool settles the effect (or it becomes ambiguous), at most effect_await_ms;
        the answer is its status now (the runner adopts a settled one by reserving again)."""
        effect_id = EffectAwait.model_validate(frame["b"]).effect_id
        handle.awaiting = settled = self.pool.watch(effect_id)
        try:
            status = await self._effect_status(effect_id)
            if status in EFFECT_WORK_STATUSES and not handle.stopping:
                await self.clock.woken(settled, self.settings.effect_await_ms)
                status = await self._effect_status(effect_id)
        finally:
            handle.awaiting = None
            self.pool.unwatch(effect_id, settled)
        if status is None:
            return refusal("unavailable", "the effect cannot be read now")
        return Reply(outcome="accepted", receipt={"effectId": effect_id, "effectStatus": status})

    async def _effect_status(self, effect_id: str) -> str | None:
        reply = await self.request(
            "effect.list", {"effect_id": effect_id, "statuses": sorted(EFFECT_STATUSES), "limit": 1}
        )
        items = (reply.receipt or {}).get("items") if reply.outcome == "accepted" else None
        return items[0]["status"] if items else None

    async def _claim_effect(self, handle: RunnerHandle, effect_id: str) -> Reply:
        """The runner performs its node's effect: claim it for it (a numbered attempt, before it acts)."""
        claim = new_claim(self.server_epoch(), self.settings.claim_ttl_ms)
        reply = await self.request(
            "effect.claim",
            {
                "effect_id": effect_id,
                "owner_id": claim["owner_id"],
                "claim_token_hash": claim["claim_token_hash"],
                "ttl_ms": claim["ttl_ms"],
            },
        )
        if reply.outcome == "accepted" and reply.receipt is not None and reply.revision is not None:
            claim["lease_generation"] = reply.receipt["leaseGeneration"]
            handle.effect = EffectInFlight(effect_id, claim, reply.revision)
            return Reply(outcome="accepted", receipt={**reply.receipt, "effectStatus": "applying"})
        return reply

    async def _settle_effect(self, handle: RunnerHandle, frame: dict[str, Any]) -> Reply:
        """effect.settle of the action body's attempt, under the effect's claim."""
        body = dict(frame["b"])
        effect = handle.effect
        if effect is None or body.get("effect_id") != effect.effect_id:
            return refusal("invalidTransition", "no such effect in flight")
        body.update(claim=effect.claim, expected_revision=effect.revision)
        reply = await self.request(EffectSettleFrame.kind, body)
        if reply.outcome in ("accepted", "adopted"):
            handle.effect = None
            if handle.stop_after_effect:
                self._stop_handle(handle)
        return reply

    async def _forward_run_message(self, handle: RunnerHandle, frame: dict[str, Any]) -> Reply:
        """The writer command of the frame's kind: the runner's fields under the run's claim, at the
        revision the runner last saw, deduplicated by the message key."""
        kind, body = frame["k"], dict(frame["b"])
        message = canonical.dumps_bytes(
            {"kind": kind, "body": {k: v for k, v in body.items() if not isinstance(v, (bytes, dict))}}
        )
        body.update(
            actor={"actor_class": "runner", "actor_id": f"runner-{handle.runner_epoch}"},
            run_id=handle.run_id,
            claim=handle.claim,
            expected_revision=handle.revision,
            worker_message={
                "sender_scope": handle.run_id,
                "message_kind": kind,
                "run_id": handle.run_id,
                "message_id": f"{handle.runner_epoch}:{frame['id']}",
                "fingerprint": hashlib.sha256(message).digest(),
            },
        )
        reply = await self.writer.request(kind, body)
        if reply.outcome in ("accepted", "adopted") and reply.revision is not None:
            handle.revision = reply.revision
            handle.record_ended = "runStatus" in (reply.receipt or {})
        return reply

    async def _finish(self, handle: RunnerHandle, outcome: str) -> None:
        if handle.effect is not None:  # the runner died applying it: the attempt is uncertain
            abandoned = await self.request(
                "effect.abandon", {"effect_id": handle.effect.effect_id, "claim": handle.effect.claim}
            )
            if abandoned.outcome != "accepted":
                log.warning("an abandoned effect was not recorded: %s", abandoned.outcome)
            handle.effect = None
        proc = handle.proc
        lines: list[str] = []
        returncode: int | None = None
        if proc is not None:
            lines, returncode = await self._last_lines(proc), proc.returncode
            uses = self._uses.pop(proc.pid, 0) + 1
            reusable = handle.done and not handle.stopping and not self._stopping and proc.returncode is None
            if reusable and uses < RUNS_PER_PROCESS and len(self._ready) + self._busy(handle) < self._capacity:
                self._uses[proc.pid] = uses
                self._wait_for_launch(proc)  # its workflow code is done; it waits for the next launch
            else:
                if proc.returncode is None:
                    signal_group(proc.pid, signal.SIGKILL)
                    await proc.wait()
                self._forget(proc)
        if handle.record_ended:  # the run ended or waits: that commit ended the runner record
            self.active.pop(handle.run_id, None)
            self.wake()
            self.wake_agents()
            self.request_retention()
            return
        body: dict[str, Any] = {
            "run_id": handle.run_id,
            "runner_epoch": handle.runner_epoch,
            "outcome": outcome,
            "stopped_by_server": handle.stopping,
            "crash_limit": self.settings.runner_crash_limit,
            "crash_backoff_ms": self.settings.runner_crash_backoff_ms,
        }
        if handle.park_reason in RUNNER_PARK_REASONS:
            body["park_reason"] = handle.park_reason
        detail = None if handle.stopping else handle.failure or park_detail(lines, returncode)
        if detail is not None:
            body["park_detail"] = BlobValue.of_text(detail).model_dump()
        reply = await self.request("runner.exited", body)
        if reply.outcome not in ("accepted", "rejected"):
            log.warning("the exit of a runner was not recorded: %s", reply.outcome)
        elif (reply.receipt or {}).get("parkReason") == "runnerNoProgress" or (
            proc is not None and not handle.done and not handle.stopping  # it died: the run goes on
        ):
            self._log_ended(handle.run_id, reply, lines, returncode)
        self.active.pop(handle.run_id, None)
        self.wake()
        self.request_retention()  # a lifecycle trigger: retention looks when all is idle

    def _log_ended(self, run_id: str, exited: Reply, lines: list[str], returncode: int | None) -> None:
        """A runner that ended before it saved progress, or died: how, and its last stderr lines
        (those of a runner that finished its run, or that the server stopped, stay out of server.log)."""
        ended = exit_text("runner", returncode) if returncode is not None else "the runner stopped"
        receipt = exited.receipt or {}
        if receipt.get("parkReason") == "runnerNoProgress":
            log.warning("%s parked runnerNoProgress: %s before it saved progress", run_id, ended)
        else:  # the run is requeued (or it finished meanwhile: placement)
            placement = f" (the run: {receipt['placement']})" if receipt.get("placement") else ""
            if "availableAt" in receipt:  # a death in a row at one node: the run waits out a backoff
                wait_ms = receipt["availableAt"] - self.clock.now_ms()
                placement = (
                    f" (the run: requeued in {max(wait_ms, 0)} ms; death {receipt['deaths']} of "
                    f"{self.settings.runner_crash_limit} at one node before it parks)"
                )
            log.warning("the runner of %s ended before it was done: %s%s", run_id, ended, placement)
        for line in lines:
            log.warning("runner of %s stderr: %s", run_id, line)

    async def _renewal(self) -> None:
        while not self._stopping:
            await self.clock.sleep_ms(self.settings.claim_renew_ms)
            await self.renew()

    async def renew(self) -> None:
        """One renewal pass: claim.renew for every live runner's run (and the effect it applies);
        a runner whose claim is lost is killed (it must not write; it is never reused)."""
        for handle in list(self.active.values()):
            if handle.done:
                continue  # its run ended or waits: the claim was released with that commit
            if handle.effect is not None:
                await self.request(
                    "claim.renew", {"resource_id": handle.effect.effect_id, "claim": handle.effect.claim}
                )
            if handle.stop_after_effect:
                continue  # paused: the run's claim was released with the pause
            reply = await self.request("claim.renew", {"resource_id": handle.run_id, "claim": handle.claim})
            proc = handle.proc
            if reply.outcome == "claimLost" and not handle.done and proc is not None and proc.returncode is None:
                handle.stopping = True
                signal_group(proc.pid, signal.SIGKILL)

    def stop_run(self, run_id: str, let_effect_settle: bool = False) -> None:
        """After a committed cancel or pause: stop the run's runner group (it is never reused).
        A pause lets an action body's applying effect settle first (the pool's effects settle
        by themselves; the next runner adopts them)."""
        handle = self.active.get(run_id)
        if handle is None:
            return
        if let_effect_settle and handle.effect is not None:
            handle.stop_after_effect = True
            return
        handle.effect = None  # a cancel's commit already made its applying effect ambiguous
        self._stop_handle(handle)

    def _stop_handle(self, handle: RunnerHandle) -> None:
        """SIGTERM to the runner's group, then SIGKILL after stop_grace_ms if it is still there.

        The process is this supervisor's own unreaped child, so its pid cannot name another one.
        """
        handle.stopping = True
        if handle.awaiting is not None:
            handle.awaiting.set()  # its runner stops: no need to wait for the effect
        if handle.proc is not None:
            self._stopper.stop(handle.proc, self.settings.stop_grace_ms, "runner")

    async def stop(self) -> None:
        """Shutdown: stop every runner group; their runs park at the last durable boundary."""
        self._stopping = True
        self._wake.set()
        for handle in list(self.active.values()):
            self._stop_handle(handle)
        tasks = [h.task for h in self.active.values() if h.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.stop_grace_ms / 1000)
        for task in self._tasks:
            task.cancel()
        spares, self._ready = self._ready, []
        self._ready_since.clear()
        for proc in spares:  # waiting for a launch: nothing to park
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
            self._forget(proc)


Relay = Callable[[Scheduler, RunnerHandle, dict[str, Any]], Awaitable[Reply | None]]

# How each runner frame is served (protocol/internal/runner.py RUNNER_FRAMES, one to one): a reply
# for the runner, or None when the runner is done with its run.
RELAYS: dict[str, Relay] = {
    NodeStartFrame.kind: Scheduler._forward_run_message,
    NodeFinishFrame.kind: Scheduler._finish_node,
    NodeWaitFrame.kind: Scheduler._wait_node,
    RunFinishFrame.kind: Scheduler._forward_run_message,
    NodeRequestAgentFrame.kind: Scheduler._request_agent,
    NodeEffectReserveFrame.kind: Scheduler._reserve_effect,
    EffectSettleFrame.kind: Scheduler._settle_effect,
    EffectAwait.kind: Scheduler._await_effect,
    RunnerExiting.kind: Scheduler._exiting,
}


def _step(step: dict[str, Any]) -> CompletedStep:
    """A step of run.resume_state's receipt as the launch carries it."""
    return CompletedStep(
        node_path=step["nodePath"],
        visit_number=step["visit"],
        attempt_number=step["attempt"],
        outcome=step["outcome"],
        output=step["output"],
        interrupted=step["interrupted"],
        error=step.get("error"),
        error_code=step.get("errorCode"),
    )

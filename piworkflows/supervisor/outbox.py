"""The outbox pool, supervisor side: slots that claim due effects for their worker children.

::

    start ── effect.recover (pool effects applying under dead claims end uncertain)
          ── one task per slot: a slot without a worker asks effect.due (a read, nothing
             claimed) and starts its worker only when one is due (`python -m
             piworkflows.outbox`, own process group, host.json, then its ready frame; one
             that could not start: the slot backs off, nothing was claimed)
          ── effect.claim (token here, hash in leases; the numbered attempt is recorded)
             ── none due: wait for a notice (wake) or the next retry time
          ── perform ──> worker ── spawned {pid}: the command group into host.json first
          ── blob.put_part (a command's stream, in parts) ──> blob.put / blob.put_part ── reply
          ── effect.settle ──> effect.settle under the claim (retry: pending at a backoff time;
             the streams it names linked to the run), deduped in worker_messages ── waiters
             (runners awaiting the effect) told
       (the frames: protocol/internal/outbox.py; a worker's are handled through one table, HANDLERS)
    worker gone ── its command groups killed ── effect.abandon (a backoff time for an
             idempotent retry; manual: ambiguous) ── the next effect's worker after a growing delay
    idle:    a worker with no effect for child_idle_exit_ms ends (its input closed): an idle
             server has no outbox workers
    renewal: claim.renew for every applying effect every claim_renew_ms
    cancel of a run: the command groups of its effects are killed (the cancel's commit
             already made them ambiguous and released their claims)
    logs:    a worker's own log records (LOG frames) go to server.log with its pid; its
             stderr is a pipe of which the last lines are kept (supervisor/stderr.py) and
             written to server.log when the worker ends without the pool ending it

The pool depends on narrow seams (supervisor/seams.py): the writer's requests,
host.json's child records, the server epoch and the scheduler's wake, and waits
on its Clock. ``claim(slot)`` is one claim step and ``renew()`` one renewal
pass; tests drive them with a fake writer and a fake clock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from piworkflows import faults
from piworkflows.outbox.retry import next_attempt_at
from piworkflows.protocol import frames
from piworkflows.protocol.internal.base import new_claim
from piworkflows.protocol.internal.content import BlobPut, BlobPutPart, BlobPutPartFrame
from piworkflows.protocol.internal.effects import EffectDue, EffectSettleFrame
from piworkflows.protocol.internal.outbox import CommandSpawned, PerformEffect, WorkerReady
from piworkflows.protocol.internal.writer import LogRecord, Reply
from piworkflows.supervisor.logs import log_failure, relay_child_log
from piworkflows.supervisor.registry import ChildNotRecorded, Identity
from piworkflows.supervisor.seams import ChildHub, HubWiring, ask_while_unavailable
from piworkflows.supervisor.spawn import signal_group, spawn_child
from piworkflows.supervisor.stderr import StderrTail, exit_text

log = logging.getLogger("piworkflows.supervisor")

WORKER_MARKER = "piworkflows.outbox"
SERVER = {"actor_class": "server"}
_STEADY_MS = 10_000  # a worker that lived this long restarts after the shortest delay again


class WorkerNotReady(Exception):
    """A new worker died or stayed silent before its ready frame."""


@dataclass
class Claimed:
    effect_id: str
    run_id: str | None
    claim: dict[str, Any]
    revision: int
    attempt: int


@dataclass(frozen=True)
class ClaimStep:
    """What one claim step found: an effect claimed (its perform frame), or how long the
    slot waits for a notice before it asks again (0: a notice came while it asked, or ``due``)."""

    task: PerformEffect | None
    wait_ms: float = 0
    due: bool = False  # a slot without a worker looked (effect.due): one is due, its worker starts


@dataclass
class Slot:
    index: int
    proc: asyncio.subprocess.Process | None = None
    frames: deque[dict[str, Any] | None] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    effect: Claimed | None = None
    commands: list[Identity] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    cancelled: bool = False  # its worker was ended for a cancel, not by a failure
    idle: bool = False  # waiting for a notice or the next retry time
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    spawns: int = 0
    delay_ms: int = 0  # before its next worker after one died young (growing; the pool sets the first)
    starting: bool = False  # its worker is being started (until it said it is ready)
    started_at: int = 0  # monotonic ms: when its worker started
    idle_since: int = 0  # monotonic ms: when its worker last had an effect (or started)
    retiring: bool = False  # its worker is ended for having had nothing to do, not by a failure
    stderr: StderrTail | None = None  # the worker's last stderr lines
    broke: bool = False  # the worker closed its channel by itself (it exited or died) or sent a bad frame

    @property
    def actor(self) -> dict[str, str]:
        return {"actor_class": "outbox", "actor_id": f"outbox-{self.index}"}


class OutboxPool(ChildHub):
    def __init__(self, wiring: HubWiring) -> None:
        super().__init__(wiring)  # host.json records the workers and their command groups
        self.slots = [
            Slot(i, delay_ms=self.settings.outbox_restart_min_ms) for i in range(self.settings.outbox_workers)
        ]
        self._notices = 0  # post-commit notices so far
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._rng = random.Random()

    async def request(self, kind: str, body: dict[str, Any], actor: dict[str, str] = SERVER) -> Reply:
        return await self.writer.request(kind, {"actor": actor, **body})

    def _stopped(self) -> bool:
        return self._stopping

    def wake(self) -> None:
        """A post-commit notice: an effect may be due. One idle slot looks (no herd of claims);
        a busy slot looks by itself when it is done, and a slot that was asking asks again."""
        self._notices += 1
        idle = [slot for slot in self.slots if slot.idle and not slot.wakeup.is_set()]
        if idle:  # one whose worker lives first: no new worker while one waits
            max(idle, key=self._alive).wakeup.set()

    async def start(self) -> None:
        if not self.slots:
            return
        await self.recover()
        self._tasks = [asyncio.create_task(self._run_slot(slot), name=f"outbox-{slot.index}") for slot in self.slots]
        self._tasks.append(asyncio.create_task(self._renewal(), name="outbox-renewal"))
        self.wake()

    async def recover(self) -> None:
        """Pool effects left applying by an older server epoch (or a stalled claim) end uncertain."""
        reply = await self.request("effect.recover", {})
        for effect_id in (reply.receipt or {}).get("effects", {}):
            self._notify(effect_id)

    # --- runners awaiting an effect ---------------------------------------------------

    def watch(self, effect_id: str) -> asyncio.Event:
        """Set when the pool settled or abandoned the effect."""
        settled = asyncio.Event()
        self._waiters.setdefault(effect_id, set()).add(settled)
        return settled

    def unwatch(self, effect_id: str, settled: asyncio.Event) -> None:
        waiting = self._waiters.get(effect_id)
        if waiting is not None:
            waiting.discard(settled)
            if not waiting:
                del self._waiters[effect_id]

    def _notify(self, effect_id: str) -> None:
        for settled in self._waiters.pop(effect_id, set()):
            settled.set()
        self.wake_scheduler()  # a run that waited for the effect may be claimable again

    # --- slots ------------------------------------------------------------------------

    async def _run_slot(self, slot: Slot) -> None:
        """Claim due effects one after another. The slot starts a worker only once an effect is
        due and ends it once it had nothing to do for child_idle_exit_ms: an idle pool has no
        workers. A worker that died is replaced for the next due effect, at the earliest after a
        delay that grows while workers keep dying young."""
        while not self._stopping:
            task = await self._claim_next(slot)
            if task is None:
                return  # the pool stops
            try:
                settled = await self._perform(slot, task)
            except Exception as exc:  # one slot's failure never stops the pool
                log_failure(log, f"outbox worker {slot.index} failed", exc)
                settled = False
            if settled:
                slot.idle_since = self.clock.monotonic_ms()
                continue
            lived = self.clock.monotonic_ms() - slot.started_at
            await self._worker_gone(slot)  # the attempt may have acted: abandoned
            if self._stopping:
                return
            if slot.cancelled:  # ended on purpose: the next effect at once
                slot.cancelled = False
                continue
            if lived > _STEADY_MS:
                slot.delay_ms = self.settings.outbox_restart_min_ms
            else:
                slot.delay_ms = min(self.settings.outbox_restart_max_ms, slot.delay_ms * 2)
            log.warning(
                "outbox worker %d exited; the next effect gets a new one after %d ms", slot.index, slot.delay_ms
            )
            await self.clock.sleep_ms(slot.delay_ms)

    def _covered(self, slot: Slot) -> bool:
        """Another slot's worker is starting, or waits for a notice: no second worker for one effect."""
        return any(other.starting or (other.idle and self._alive(other)) for other in self.slots if other is not slot)

    async def _start_worker(self, slot: Slot) -> None:
        """The slot's worker, for an effect that is due; one that could not start (not recorded in
        host.json, dead or silent before it was ready) is ended, and the slot waits its delay."""
        slot.starting = True
        try:
            await self._spawn(slot)
            return
        except Exception as exc:  # ChildNotRecorded, WorkerNotReady, or no process started
            log_failure(log, f"outbox worker {slot.index} not started", exc)
        finally:
            slot.starting = False
        await self._worker_gone(slot)
        await self.clock.sleep_ms(slot.delay_ms)
        slot.delay_ms = min(self.settings.outbox_restart_max_ms, slot.delay_ms * 2)

    async def _spawn(self, slot: Slot) -> None:
        # The worker reads this server's settings from its environment, as the writer does. A
        # restarted worker runs without fault rules: a crash point fires once per slot.
        env = {**os.environ, **self.settings.to_env()}
        if slot.spawns:
            env.pop(faults.ENV, None)
        slot.spawns += 1
        proc, stderr = await spawn_child(
            "outbox", WORKER_MARKER, (WORKER_MARKER,), self.recorder, self.settings, own_group=True, env=env
        )
        slot.proc, slot.frames, slot.arrived, slot.stderr, slot.broke = proc, deque(), asyncio.Event(), stderr, False
        slot.started_at = slot.idle_since = self.clock.monotonic_ms()
        slot.reader = asyncio.create_task(self._read(slot, proc), name=f"outbox-{slot.index}-reader")
        try:
            async with asyncio.timeout(self.settings.child_ready_timeout_ms / 1000):
                first = await self._next_frame(slot)
        except TimeoutError:
            first = None
        if first is None or first["k"] != WorkerReady.kind:
            raise WorkerNotReady(f"the worker (pid {proc.pid}) did not say it was ready")

    async def _read(self, slot: Slot, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        decoder = frames.FrameDecoder()
        try:
            while data := await proc.stdout.read(1 << 16):
                for frame in decoder.feed(data):
                    if frame["k"] == LogRecord.kind:  # its own log record: to server.log, never to the slot
                        relay_child_log("outbox worker", proc.pid, frame["b"])
                    else:
                        slot.frames.append(frame)
                slot.arrived.set()
        except Exception as exc:  # a malformed frame: the worker is not trusted any more
            log_failure(log, f"outbox worker {slot.index} sent a bad frame", exc)
            signal_group(proc.pid, signal.SIGKILL)
        finally:
            slot.broke = True  # ended by itself unless the pool ended it (cancel, stop)
            slot.frames.append(None)  # end of the worker
            slot.arrived.set()
            slot.wakeup.set()  # idle, the slot sees its worker gone at once

    async def _next_frame(self, slot: Slot) -> dict[str, Any] | None:
        while not slot.frames:
            slot.arrived.clear()
            await slot.arrived.wait()
        return slot.frames.popleft()

    def _alive(self, slot: Slot) -> bool:
        return slot.proc is not None and slot.proc.returncode is None and not slot.frames

    async def _perform(self, slot: Slot, task: PerformEffect) -> bool:
        """The claimed effect to the worker, and its frames handled until it is settled (False:
        the worker ended first)."""
        proc = slot.proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.write(frames.encode(task.kind, 0, task.model_dump()))
        await proc.stdin.drain()
        while True:
            frame = await self._next_frame(slot)
            if frame is None:
                return False  # the worker died applying: _worker_gone abandons the attempt
            handler = HANDLERS.get(frame["k"])
            if handler is None:
                continue
            reply = await handler(self, slot, frame["b"])
            if reply is None:  # settled: the worker is free for the next effect
                return True
            proc.stdin.write(frames.encode(Reply.kind, frame["id"], reply.model_dump()))
            await proc.stdin.drain()

    async def _claim_next(self, slot: Slot) -> PerformEffect | None:
        """Claim one due effect; with none due, wait for a notice or the next retry time. Meanwhile
        a worker that had nothing to do for child_idle_exit_ms ends, and one that ended by itself
        is seen off (None: the pool stops)."""
        while not self._stopping:
            if slot.proc is not None and not self._alive(slot):
                await self._worker_gone(slot)  # ended while idle: a new one comes with the next effect
                continue
            if slot.proc is None:
                step = await self.look(slot)
                if step.due and not self._covered(slot):
                    await self._start_worker(slot)
                    continue
                if step.due:  # a waiting worker (or one starting) of another slot claims it
                    self.wake()
                    step = ClaimStep(None, self.settings.outbox_idle_check_ms)
            else:
                step = await self.claim(slot)
                if step.task is not None:
                    return step.task
            if not step.wait_ms:
                continue  # a notice came while this slot asked: ask again
            wait_ms = step.wait_ms
            if slot.proc is not None:
                left = slot.idle_since + self.settings.child_idle_exit_ms - self.clock.monotonic_ms()
                if left <= 0:
                    await self._retire(slot)
                    continue
                wait_ms = min(wait_ms, left)
            slot.idle = True
            await self.clock.woken(slot.wakeup, wait_ms)
            slot.idle = False
            slot.wakeup.clear()
        return None

    async def _retire(self, slot: Slot) -> None:
        """A worker with nothing to do ends: its input closes and it exits (it holds no effect)."""
        proc = slot.proc
        slot.retiring = True
        try:
            if proc is not None and proc.stdin is not None:
                proc.stdin.close()
                try:
                    async with asyncio.timeout(self.settings.stop_grace_ms / 1000):
                        await proc.wait()
                except TimeoutError:
                    pass  # _worker_gone kills it
            await self._worker_gone(slot)
        finally:
            slot.retiring = False

    async def _ready_again(self, slot: Slot, body: dict[str, Any]) -> Reply:
        """A worker says ready once, before its first effect: saying it again breaks the protocol."""
        raise frames.FrameError(f"outbox worker {slot.index} said it was ready while applying an effect")

    async def _spawned(self, slot: Slot, body: dict[str, Any]) -> Reply:
        """Accepted once the command group is recorded; else the worker ends it."""
        if self._record_command(slot, CommandSpawned.model_validate(body).pid):
            return Reply(outcome="accepted")
        return Reply(outcome="rejected", error="the command group was not recorded")

    async def claim(self, slot: Slot) -> ClaimStep:
        """One claim step: ask the writer for one due effect under a new claim for the slot (the
        numbered attempt is recorded with it). None due: how long to wait, at most
        outbox_idle_check_ms, less when the next retry is due sooner."""
        notices = self._notices
        claim = new_claim(self.server_epoch(), self.settings.claim_ttl_ms)
        asked = {k: claim[k] for k in ("owner_id", "claim_token_hash", "ttl_ms")}
        reply = await self.request("effect.claim", asked, slot.actor)
        receipt = reply.receipt or {}
        if reply.outcome == "accepted" and reply.revision is not None:
            claim["lease_generation"] = receipt["leaseGeneration"]
            slot.effect = Claimed(
                receipt["effectId"], receipt.get("runId"), claim, reply.revision, receipt["attemptNumber"]
            )
            self.wake()  # more may be due: one more idle slot looks
            task = PerformEffect(
                effect_id=receipt["effectId"],
                performer=receipt["performer"],
                idempotency_key=receipt["idempotencyKey"],
                recovery_policy=receipt["recoveryPolicy"],
                payload=receipt["payload"],
            )
            return ClaimStep(task)
        if self._notices != notices:
            return ClaimStep(None)
        return ClaimStep(None, self._wait_ms(receipt.get("nextDueAt") if receipt.get("code") == "nothingDue" else None))

    async def look(self, slot: Slot) -> ClaimStep:
        """One look of a slot without a worker: effect.due, which claims nothing. One is due: the
        slot starts its worker; else how long it waits, as after a claim step that found none."""
        notices = self._notices
        reply = await self.request(EffectDue.kind, {}, slot.actor)
        receipt = reply.receipt or {}
        if reply.outcome == "accepted" and receipt.get("due"):
            return ClaimStep(None, due=True)
        if self._notices != notices:
            return ClaimStep(None)
        return ClaimStep(None, self._wait_ms(receipt.get("nextDueAt")))

    def _wait_ms(self, next_due_at: int | None) -> float:
        """How long an idle slot waits for a notice: outbox_idle_check_ms at most, less when the
        next retry is due sooner."""
        wait_ms: float = self.settings.outbox_idle_check_ms
        if next_due_at is not None:
            wait_ms = min(wait_ms, max(5, next_due_at - self.clock.now_ms()))
        return wait_ms

    def _record_command(self, slot: Slot, pid: int) -> bool:
        """The performer's command group, in host.json before it runs anything."""
        if slot.effect is None or self._stopping:
            return False
        try:
            identity = Identity.of("command", pid, "", process_group=True)
        except psutil.Error:
            return False
        try:
            self.recorder.record_child(identity)
        except ChildNotRecorded:
            return False  # the worker ends the group: nothing ran
        slot.commands.append(identity)
        return True

    def _end_commands(self, slot: Slot) -> None:
        for identity in slot.commands:
            if identity.find() is not None:
                signal_group(identity.pid, signal.SIGKILL)
            self.recorder.forget_child(identity.pid)
        slot.commands.clear()

    async def _upload(self, slot: Slot, body: dict[str, Any]) -> Reply:
        """A part of a value the worker stores (a command's stream) to the writer: one that is the
        whole value goes as blob.put; the answer says ``complete`` once the value is stored."""
        part = BlobPutPartFrame.model_validate(body).part
        whole = part.whole()
        if whole is None:
            reply = await self.request(BlobPutPart.kind, {"part": part.model_dump()}, slot.actor)
        else:
            reply = await self.request(BlobPut.kind, {"blob": whole.model_dump()}, slot.actor)
            if reply.outcome in ("accepted", "adopted"):
                reply = reply.model_copy(update={"receipt": {**(reply.receipt or {}), "complete": True}})
        if reply.outcome not in ("accepted", "adopted", "unavailable"):
            log.warning("a command's output was not stored: %s", (reply.receipt or {}).get("code", reply.outcome))
        return reply

    async def _settle(self, slot: Slot, frame_body: dict[str, Any]) -> None:
        """effect.settle of the worker's attempt under the effect's claim; ends the exchange."""
        report = EffectSettleFrame.model_validate(frame_body)
        effect = slot.effect
        if effect is None or report.effect_id != effect.effect_id:
            log.warning("outbox worker %d reported an effect it does not hold", slot.index)
            return
        body: dict[str, Any] = {
            **report.model_dump(),
            "claim": effect.claim,
            "expected_revision": effect.revision,
        }
        if report.settlement == "retry":
            body["retry_at"] = next_attempt_at(
                self.clock.now_ms(),
                effect.attempt,
                self.settings.effect_retry_base_ms,
                self.settings.effect_retry_max_ms,
                self._rng,
            )
        body["worker_message"] = {
            "sender_scope": effect.effect_id,
            "message_kind": report.kind,
            "message_id": f"{effect.claim['lease_generation']}:settle",
            "fingerprint": report.fingerprint(),
            "run_id": effect.run_id,
        }
        # the writer restarts: the same report again (deduplicated), until it answers or the pool stops
        body["actor"] = slot.actor
        reply = await ask_while_unavailable(
            self.writer, report.kind, body, self.settings, self.clock, within_ms=None, stopping=self._stopped
        )
        if reply.outcome not in ("accepted", "adopted", "claimLost"):
            log.warning("an effect settlement was not recorded: %s", reply.outcome)
        slot.effect = None
        self._end_commands(slot)
        self._notify(effect.effect_id)

    async def _worker_gone(self, slot: Slot) -> None:
        self._end_commands(slot)
        proc, slot.proc = slot.proc, None
        if proc is not None:
            by_itself = slot.broke and not (slot.cancelled or slot.retiring or self._stopping)
            if by_itself and proc.returncode is None:  # it closed its channel: let it finish exiting
                try:
                    async with asyncio.timeout(self.settings.child_stderr_drain_ms / 1000):
                        await proc.wait()
                except TimeoutError:
                    pass
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
            self.recorder.forget_child(proc.pid)
            await self._end_stderr(slot, proc, by_itself)
        effect, slot.effect = slot.effect, None
        if effect is not None:  # the attempt may or may not have acted
            retry_at = next_attempt_at(
                self.clock.now_ms(),
                effect.attempt,
                self.settings.effect_retry_base_ms,
                self.settings.effect_retry_max_ms,
                self._rng,
            )
            body = {"actor": SERVER, "effect_id": effect.effect_id, "claim": effect.claim, "retry_at": retry_at}
            # the writer restarts: ask again (a repeat finds it abandoned), also while the pool stops
            reply = await ask_while_unavailable(
                self.writer, "effect.abandon", body, self.settings, self.clock, within_ms=self.settings.stop_grace_ms
            )
            if reply.outcome not in ("accepted", "claimLost"):
                log.warning("an abandoned effect was not recorded: %s", reply.outcome)
            self._notify(effect.effect_id)
            self.wake()

    async def _end_stderr(self, slot: Slot, proc: asyncio.subprocess.Process, by_itself: bool) -> None:
        """A worker that ended without the pool ending it leaves how it ended and its last stderr
        lines in server.log."""
        stderr, slot.stderr = slot.stderr, None
        if stderr is None:
            return
        if by_itself and proc.returncode is not None:
            await stderr.drained(self.settings.child_stderr_drain_ms / 1000)
            log.warning(
                "outbox worker %d (pid %d) ended: %s", slot.index, proc.pid, exit_text("worker", proc.returncode)
            )
            for line in stderr.take():
                log.warning("outbox worker %d (pid %d) stderr: %s", slot.index, proc.pid, line)
        stderr.close()

    async def _renewal(self) -> None:
        while not self._stopping:
            await self.clock.sleep_ms(self.settings.claim_renew_ms)
            await self.renew()

    async def renew(self) -> None:
        """One renewal pass: claim.renew for every applying effect; a slot whose effect is no
        longer its own (a cancel ended it) ends its command groups."""
        for slot in self.slots:
            effect = slot.effect
            if effect is None:
                continue
            reply = await self.request("claim.renew", {"resource_id": effect.effect_id, "claim": effect.claim})
            if reply.outcome == "claimLost" and slot.effect is effect:
                self._end_commands(slot)

    def cancel_run(self, run_id: str) -> None:
        """After a committed cancel: the workers applying the run's effects are killed with their
        command groups (an http request has none: only its worker's end stops it). Each slot
        restarts its worker at once; the cancel already made the effect ambiguous."""
        for slot in self.slots:
            if slot.effect is not None and slot.effect.run_id == run_id:
                self._end_commands(slot)
                slot.cancelled = True
                if slot.proc is not None and slot.proc.returncode is None:
                    signal_group(slot.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        """Shutdown: no new claims; applying effects get stop_grace_ms to settle, then the workers
        and their command groups end and what was still applying ends uncertain (idempotent:
        retried after the next start; manual: ambiguous)."""
        self._stopping = True
        for slot in self.slots:
            slot.wakeup.set()
        deadline = self.clock.monotonic_ms() + self.settings.stop_grace_ms
        while any(slot.effect is not None for slot in self.slots) and self.clock.monotonic_ms() < deadline:
            await self.clock.sleep_ms(20)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for slot in self.slots:
            await self._worker_gone(slot)


Handler = Callable[[OutboxPool, Slot, dict[str, Any]], Awaitable[Reply | None]]

# How each frame from a worker is handled (protocol/internal/outbox.py WORKER_FRAMES, one to one):
# a reply for the worker, or None once the effect is settled.
HANDLERS: dict[str, Handler] = {
    WorkerReady.kind: OutboxPool._ready_again,
    CommandSpawned.kind: OutboxPool._spawned,
    BlobPutPartFrame.kind: OutboxPool._upload,
    EffectSettleFrame.kind: OutboxPool._settle,
}

"""The outbox pool, supervisor side: slots that claim due effects for their worker children.

::

    start ── effect.recover (pool effects applying under dead claims end uncertain)
          ── one task per slot: spawn `python -m piworkflows.outbox` (own process group,
             host.json) ── wait for a notice (wake) or the next retry time
          ── effect.claim (token here, hash in leases; the numbered attempt is recorded)
          ── perform ──> worker ── spawned {pid}: the command group into host.json first
          ── blob.put_part (a command's stream, in parts) ──> blob.put / blob.put_part ── reply
          ── effect.settle ──> effect.settle under the claim (retry: pending at a backoff time;
             the streams it names linked to the run), deduped in worker_messages ── waiters
             (runners awaiting the effect) told
       (the frames: protocol/internal/outbox.py; a worker's are handled through one table, HANDLERS)
    worker gone ── its command groups killed ── effect.abandon (a backoff time for an
             idempotent retry; manual: ambiguous) ── respawn after a growing delay
    renewal: claim.renew for every applying effect every claim_renew_ms
    cancel of a run: the command groups of its effects are killed (the cancel's commit
             already made them ambiguous and released their claims)
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from piworkflows import faults
from piworkflows.clock import woken
from piworkflows.outbox.retry import next_attempt_at
from piworkflows.protocol import frames
from piworkflows.protocol.internal.base import new_claim
from piworkflows.protocol.internal.content import BlobPut, BlobPutPart, BlobPutPartFrame
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.outbox import CommandSpawned, PerformEffect
from piworkflows.protocol.internal.writer import Reply
from piworkflows.supervisor.logs import log_failure
from piworkflows.supervisor.registry import ChildNotRecorded, Identity

log = logging.getLogger("piworkflows.supervisor")

WORKER_MARKER = "piworkflows.outbox"
SERVER = {"actor_class": "server"}
_STEADY_S = 10.0  # a worker that lived this long restarts after the shortest delay again


@dataclass
class Claimed:
    effect_id: str
    run_id: str | None
    claim: dict[str, Any]
    revision: int
    attempt: int


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

    @property
    def actor(self) -> dict[str, str]:
        return {"actor_class": "outbox", "actor_id": f"outbox-{self.index}"}


class OutboxPool:
    def __init__(self, supervisor: Any) -> None:
        self.supervisor = supervisor
        self.settings = supervisor.settings
        self.slots = [Slot(i) for i in range(self.settings.outbox_workers)]
        self._notices = 0  # post-commit notices so far
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._rng = random.Random()

    async def request(self, kind: str, body: dict[str, Any], actor: dict[str, str] = SERVER) -> Reply:
        reply: Reply = await self.supervisor.writer.request(kind, {"actor": actor, **body})
        return reply

    def wake(self) -> None:
        """A post-commit notice: an effect may be due. One idle slot looks (no herd of claims);
        a busy slot looks by itself when it is done, and a slot that was asking asks again."""
        self._notices += 1
        for slot in self.slots:
            if slot.idle and not slot.wakeup.is_set():
                slot.wakeup.set()
                return

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

    def watch(self, effect_id: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(effect_id, set()).add(future)
        return future

    def unwatch(self, effect_id: str, future: asyncio.Future[None]) -> None:
        waiting = self._waiters.get(effect_id)
        if waiting is not None:
            waiting.discard(future)
            if not waiting:
                del self._waiters[effect_id]

    def _notify(self, effect_id: str) -> None:
        for future in self._waiters.pop(effect_id, set()):
            if not future.done():
                future.set_result(None)
        self.supervisor.scheduler.wake()  # a run that waited for the effect may be claimable again

    # --- slots ------------------------------------------------------------------------

    async def _run_slot(self, slot: Slot) -> None:
        delay = self.settings.outbox_restart_min_ms
        while not self._stopping:
            began = time.monotonic()
            try:
                await self._spawn(slot)
                await self._serve(slot)
            except ChildNotRecorded as exc:
                log.warning("outbox worker %d not started: %s", slot.index, exc)
            except Exception as exc:  # one slot's failure never stops the pool
                log_failure(log, f"outbox worker {slot.index} failed", exc)
            await self._worker_gone(slot)
            if self._stopping:
                return
            if slot.cancelled:  # ended on purpose: back at once
                slot.cancelled = False
                continue
            steady = time.monotonic() - began > _STEADY_S
            delay = (
                self.settings.outbox_restart_min_ms if steady else min(self.settings.outbox_restart_max_ms, delay * 2)
            )
            log.warning("outbox worker %d exited; restarting in %d ms", slot.index, delay)
            await asyncio.sleep(delay / 1000)

    async def _spawn(self, slot: Slot) -> None:
        # The worker reads this server's settings from its environment, as the writer does. A
        # restarted worker runs without fault rules: a crash point fires once per slot.
        env = {**os.environ, **self.settings.to_env()}
        if slot.spawns:
            env.pop(faults.ENV, None)
        slot.spawns += 1
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            WORKER_MARKER,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            self.supervisor.record_child(Identity.of("outbox", proc.pid, WORKER_MARKER, process_group=True))
        except ChildNotRecorded:
            _kill_group(proc.pid)
            await proc.wait()
            raise
        slot.proc, slot.frames, slot.arrived = proc, deque(), asyncio.Event()
        slot.reader = asyncio.create_task(self._read(slot, proc), name=f"outbox-{slot.index}-reader")

    async def _read(self, slot: Slot, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        decoder = frames.FrameDecoder()
        try:
            while data := await proc.stdout.read(1 << 16):
                slot.frames.extend(decoder.feed(data))
                slot.arrived.set()
        except Exception as exc:  # a malformed frame: the worker is not trusted any more
            log_failure(log, f"outbox worker {slot.index} sent a bad frame", exc)
            _kill_group(proc.pid)
        finally:
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

    async def _serve(self, slot: Slot) -> None:
        proc = slot.proc
        assert proc is not None and proc.stdin is not None
        while not self._stopping:
            task = await self._claim_next(slot)
            if task is None:
                if self._alive(slot):
                    continue
                return
            proc.stdin.write(frames.encode(task.kind, 0, task.model_dump()))
            await proc.stdin.drain()
            while True:
                frame = await self._next_frame(slot)
                if frame is None:
                    return  # the worker died applying: _worker_gone abandons the attempt
                handler = HANDLERS.get(frame["k"])
                if handler is None:
                    continue
                reply = await handler(self, slot, frame["b"])
                if reply is None:  # settled: the worker is free for the next effect
                    break
                proc.stdin.write(frames.encode(Reply.kind, frame["id"], reply.model_dump()))
                await proc.stdin.drain()

    async def _claim_next(self, slot: Slot) -> PerformEffect | None:
        """Claim one due effect; with none due, wait for a notice or the next retry time (None:
        the pool stops or the worker is gone)."""
        while not self._stopping and self._alive(slot):
            notices = self._notices
            claim = new_claim(self.supervisor.epoch, self.settings.claim_ttl_ms)
            asked = {k: claim[k] for k in ("owner_id", "claim_token_hash", "ttl_ms")}
            reply = await self.request("effect.claim", asked, slot.actor)
            receipt = reply.receipt or {}
            if reply.outcome == "accepted" and reply.revision is not None:
                claim["lease_generation"] = receipt["leaseGeneration"]
                slot.effect = Claimed(
                    receipt["effectId"], receipt.get("runId"), claim, reply.revision, receipt["attemptNumber"]
                )
                self.wake()  # more may be due: one more idle slot looks
                return PerformEffect(
                    effect_id=receipt["effectId"],
                    performer=receipt["performer"],
                    idempotency_key=receipt["idempotencyKey"],
                    recovery_policy=receipt["recoveryPolicy"],
                    payload=receipt["payload"],
                )
            if self._notices != notices:
                continue  # a notice came while this slot asked: ask again
            wait_s = self.settings.outbox_idle_check_ms / 1000
            if receipt.get("code") == "nothingDue" and receipt.get("nextDueAt") is not None:
                wait_s = min(wait_s, max(0.005, (receipt["nextDueAt"] - time.time() * 1000) / 1000))
            slot.idle = True
            await woken(slot.wakeup, wait_s)
            slot.idle = False
            slot.wakeup.clear()
        return None

    async def _spawned(self, slot: Slot, body: dict[str, Any]) -> Reply:
        """Accepted once the command group is recorded; else the worker ends it."""
        if self._record_command(slot, CommandSpawned.model_validate(body).pid):
            return Reply(outcome="accepted")
        return Reply(outcome="rejected", error="the command group was not recorded")

    def _record_command(self, slot: Slot, pid: int) -> bool:
        """The performer's command group, in host.json before it runs anything."""
        if slot.effect is None or self._stopping:
            return False
        try:
            identity = Identity.of("command", pid, "", process_group=True)
        except psutil.Error:
            return False
        try:
            self.supervisor.record_child(identity)
        except ChildNotRecorded:
            return False  # the worker ends the group: nothing ran
        slot.commands.append(identity)
        return True

    def _end_commands(self, slot: Slot) -> None:
        for identity in slot.commands:
            if identity.find() is not None:
                _kill_group(identity.pid)
            self.supervisor.forget_child(identity.pid)
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
                int(time.time() * 1000),
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
        reply = await self.request(report.kind, body, slot.actor)
        while reply.outcome == "unavailable" and not self._stopping:  # the writer restarts: the same
            await asyncio.sleep(self.settings.writer_restart_min_ms / 1000)  # report again (deduped)
            reply = await self.request(report.kind, body, slot.actor)
        if reply.outcome not in ("accepted", "adopted", "claimLost"):
            log.warning("an effect settlement was not recorded: %s", reply.outcome)
        slot.effect = None
        self._end_commands(slot)
        self._notify(effect.effect_id)

    async def _worker_gone(self, slot: Slot) -> None:
        self._end_commands(slot)
        proc = slot.proc
        if proc is not None:
            if proc.returncode is None:
                _kill_group(proc.pid)
                await proc.wait()
            self.supervisor.forget_child(proc.pid)
        effect, slot.effect = slot.effect, None
        if effect is not None:  # the attempt may or may not have acted
            retry_at = next_attempt_at(
                int(time.time() * 1000),
                effect.attempt,
                self.settings.effect_retry_base_ms,
                self.settings.effect_retry_max_ms,
                self._rng,
            )
            body = {"effect_id": effect.effect_id, "claim": effect.claim, "retry_at": retry_at}
            reply = await self.request("effect.abandon", body)
            for _ in range(50):  # the writer restarts: ask again (a repeat finds it abandoned)
                if reply.outcome != "unavailable":
                    break
                await asyncio.sleep(self.settings.writer_restart_min_ms / 1000)
                reply = await self.request("effect.abandon", body)
            if reply.outcome not in ("accepted", "claimLost"):
                log.warning("an abandoned effect was not recorded: %s", reply.outcome)
            self._notify(effect.effect_id)
            self.wake()

    async def _renewal(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.settings.claim_renew_ms / 1000)
            for slot in self.slots:
                effect = slot.effect
                if effect is None:
                    continue
                reply = await self.request("claim.renew", {"resource_id": effect.effect_id, "claim": effect.claim})
                if reply.outcome == "claimLost" and slot.effect is effect:
                    self._end_commands(slot)  # the effect is no longer this slot's (a cancel ended it)

    def cancel_run(self, run_id: str) -> None:
        """After a committed cancel: the workers applying the run's effects are killed with their
        command groups (an http request has none: only its worker's end stops it). Each slot
        restarts its worker at once; the cancel already made the effect ambiguous."""
        for slot in self.slots:
            if slot.effect is not None and slot.effect.run_id == run_id:
                self._end_commands(slot)
                slot.cancelled = True
                if slot.proc is not None and slot.proc.returncode is None:
                    _kill_group(slot.proc.pid)

    async def stop(self) -> None:
        """Shutdown: no new claims; applying effects get stop_grace_ms to settle, then the workers
        and their command groups end and what was still applying ends uncertain (idempotent:
        retried after the next start; manual: ambiguous)."""
        self._stopping = True
        for slot in self.slots:
            slot.wakeup.set()
        deadline = time.monotonic() + self.settings.stop_grace_ms / 1000
        while any(slot.effect is not None for slot in self.slots) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for slot in self.slots:
            await self._worker_gone(slot)


Handler = Callable[[OutboxPool, Slot, dict[str, Any]], Awaitable[Reply | None]]

# How each frame from a worker is handled (protocol/internal/outbox.py WORKER_FRAMES, one to one):
# a reply for the worker, or None once the effect is settled.
HANDLERS: dict[str, Handler] = {
    CommandSpawned.kind: OutboxPool._spawned,
    BlobPutPartFrame.kind: OutboxPool._upload,
    EffectSettleFrame.kind: OutboxPool._settle,
}


def _kill_group(pid: int) -> None:
    """A group this supervisor spawned itself (its own handle), or one identity-checked first."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

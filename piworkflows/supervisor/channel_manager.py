"""A channel manager: one Telegram adapter child of one configured profile, supervisor side
(supervisor/channels.py starts, stops and restarts managers as the configuration says).

::

    manager ── spawn `python -m piworkflows.channels` (own group, host.json) ── channel.claim
           (a new lease generation; the durable cursor) ── configure {token, cursor} ──> adapter
      updates {offset, next, items} ──> channel.updates under the lease ── ack {cursor} ──> adapter
            (staleCursor: the adapter is restarted to poll from the durable cursor)
      effects: effect.claim {channel} (the numbered attempt recorded) ── perform ──> adapter
            ── performed ──> effect.settle (applied | rejected | retry with notActed | ambiguous)
      renewal: claim.renew of the lease and of the applying effect every claim_renew_ms
      adapter gone ── its group killed ── effect.abandon of an effect in flight (a send becomes
            ambiguous) ── restarted after channel_restart_min_ms doubling to channel_restart_max_ms;
            exit 3 (the token refused): stopped until a reload

The token goes only into the adapter's configure frame; server.log names channels, never chats,
users, texts or tokens.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from piworkflows import faults
from piworkflows.clock import Clock
from piworkflows.outbox.retry import next_attempt_at
from piworkflows.protocol import frames
from piworkflows.protocol.internal.base import BlobValue, Frame, new_claim
from piworkflows.protocol.internal.channels import EXIT_UNAUTHORIZED, Ack, Configure, Fault, Perform, Performed, Updates
from piworkflows.protocol.internal.writer import LogRecord, Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.channel_config import Profile
from piworkflows.supervisor.logs import log_failure, relay_child_log
from piworkflows.supervisor.registry import ChildNotRecorded
from piworkflows.supervisor.seams import ChildRecorder, WriterRequests, ask_while_unavailable
from piworkflows.supervisor.spawn import signal_group, spawn_child
from piworkflows.supervisor.stderr import exit_text

log = logging.getLogger("piworkflows.supervisor")

ADAPTER_MARKER = "piworkflows.channels"
SERVER = {"actor_class": "server"}
_STEADY_MS = 10_000  # an adapter that lived this long restarts after the shortest delay again


@dataclass
class InFlight:
    """The effect the adapter is performing: its claim, revision and numbered attempt."""

    effect_id: str
    claim: dict[str, Any]
    revision: int
    policy: str
    attempt: int
    done: asyncio.Future[Performed]


@dataclass
class ChannelManager:
    profile: Profile
    writer: WriterRequests
    recorder: ChildRecorder
    settings: Settings
    clock: Clock
    server_epoch: Callable[[], int]
    wake_scheduler: Callable[[], None]
    state: str = "starting"
    last_poll_at: int | None = None  # when a batch of updates last committed
    last_fault: str | None = None
    proc: asyncio.subprocess.Process | None = None
    lease: dict[str, Any] | None = None
    effect: InFlight | None = None
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    spawns: int = 0
    stopping: bool = False
    allow: dict[str, Any] = field(default_factory=dict)  # the allow lists channel.updates carries
    _rng: random.Random = field(default_factory=random.Random)

    @property
    def channel_id(self) -> str:
        return self.profile.channel_id

    @property
    def actor(self) -> dict[str, str]:
        return {"actor_class": "channel", "actor_id": self.channel_id}

    async def ask(self, kind: str, body: dict[str, Any], actor: dict[str, str] | None = None) -> Reply:
        return await ask_while_unavailable(
            self.writer,
            kind,
            {"actor": actor or self.actor, **body},
            self.settings,
            self.clock,
            within_ms=None,
            stopping=lambda: self.stopping,
        )

    def start(self) -> None:
        self.task = asyncio.create_task(self._supervise(), name=f"channel-{self.channel_id}")

    async def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()
        if self.proc is not None and self.proc.returncode is None:
            signal_group(self.proc.pid, signal.SIGKILL)
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        self.state = "stopped"

    # --- the adapter's life -----------------------------------------------------------------

    async def _supervise(self) -> None:
        delay = self.settings.channel_restart_min_ms
        while not self.stopping:
            began = self.clock.monotonic_ms()
            code = None
            try:
                code = await self._serve_once()
            except ChildNotRecorded as exc:
                log.warning("channel %s: adapter not started: %s", self.channel_id, exc)
            except Exception as exc:  # one channel's failure never stops the server
                log_failure(log, f"channel {self.channel_id} failed", exc)
            await self._adapter_gone()
            if self.stopping:
                return
            if code == EXIT_UNAUTHORIZED:
                self.state = "fatal"
                log.warning("channel %s: the bot token was refused; stopped until channels reload", self.channel_id)
                return
            steady = self.clock.monotonic_ms() - began > _STEADY_MS
            delay = (
                self.settings.channel_restart_min_ms if steady else min(self.settings.channel_restart_max_ms, delay * 2)
            )
            self.state = "backoff"
            log.warning("channel %s: adapter exited; restarting in %d ms", self.channel_id, delay)
            await self.clock.sleep_ms(delay)

    async def _serve_once(self) -> int | None:
        env = {**os.environ, **self.settings.to_env()}
        if self.spawns:
            env.pop(faults.ENV, None)  # a restarted adapter runs without fault rules
        self.spawns += 1
        self.state = "starting"
        proc, stderr = await spawn_child(
            "channel", ADAPTER_MARKER, (ADAPTER_MARKER,), self.recorder, self.settings, own_group=True, env=env
        )
        self.proc = proc
        try:
            cursor = await self._claim_channel()
            if cursor is None:
                return None
            self._write(
                Configure(
                    channel_id=self.channel_id,
                    base_url=self.profile.base_url,
                    token=self.profile.token,
                    cursor=cursor,
                    poll_timeout_s=self.settings.telegram_poll_timeout_s,
                    request_timeout_ms=self.settings.telegram_request_timeout_ms,
                )
            )
            self.state = "running"
            effects = asyncio.create_task(self._effects(), name=f"channel-{self.channel_id}-effects")
            renewal = asyncio.create_task(self._renewal(), name=f"channel-{self.channel_id}-renewal")
            try:
                await self._read(proc)
            finally:
                effects.cancel()
                renewal.cancel()
                await asyncio.gather(effects, renewal, return_exceptions=True)
            code = await proc.wait()
            if not self.stopping:  # it ended by itself: how, and its last stderr lines, to server.log
                await stderr.drained(self.settings.child_stderr_drain_ms / 1000)
                log.warning("channel %s: %s", self.channel_id, exit_text("adapter", code))
                for line in stderr.take():
                    log.warning("channel %s adapter (pid %d) stderr: %s", self.channel_id, proc.pid, line)
            return code
        finally:
            stderr.close()

    async def _claim_channel(self) -> int | None:
        claim = new_claim(self.server_epoch(), self.settings.claim_ttl_ms)
        asked = {k: claim[k] for k in ("owner_id", "claim_token_hash", "ttl_ms")}
        reply = await self.ask("channel.claim", {"channel_id": self.channel_id, **asked})
        if reply.outcome != "accepted" or reply.receipt is None:
            log.warning("channel %s: its lease was not taken: %s", self.channel_id, reply.outcome)
            return None
        claim["lease_generation"] = reply.receipt["leaseGeneration"]
        self.lease = claim
        return int(reply.receipt["cursor"])

    def _write(self, frame: Frame) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(frames.encode(frame.kind, 0, frame.model_dump()))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        decoder = frames.FrameDecoder()
        try:
            while data := await proc.stdout.read(1 << 16):
                for frame in decoder.feed(data):
                    await self._frame(proc, frame)
        except Exception as exc:  # a malformed frame: the adapter is not trusted any more
            log_failure(log, f"channel {self.channel_id}: the adapter sent a bad frame", exc)
            signal_group(proc.pid, signal.SIGKILL)

    async def _frame(self, proc: asyncio.subprocess.Process, frame: dict[str, Any]) -> None:
        kind, body = frame["k"], frame["b"]
        if kind == LogRecord.kind:
            relay_child_log(f"channel {self.channel_id} adapter", proc.pid, body)
        elif kind == Updates.kind:
            await self._updates(proc, Updates.model_validate(body))
        elif kind == Performed.kind:
            performed = Performed.model_validate(body)
            if self.effect is not None and self.effect.effect_id == performed.effect_id:
                if not self.effect.done.done():
                    self.effect.done.set_result(performed)
        elif kind == Fault.kind:
            fault = Fault.model_validate(body)
            self.last_fault = fault.fault
            log.warning("channel %s: %s %s", self.channel_id, fault.fault, fault.detail)

    async def _updates(self, proc: asyncio.subprocess.Process, batch: Updates) -> None:
        """One batch under the lease; the ack only after it committed. A lease that expired while
        the channel was idle is taken again (a new generation) and the batch sent once more."""
        for _ in range(2):
            assert self.lease is not None
            body = {
                "channel_id": self.channel_id,
                "claim": self.lease,
                "offset": batch.offset,
                "next_offset": batch.next_offset,
                "items": [item.model_dump() for item in batch.items],
                "allow": self.allow,
            }
            reply = await self.ask("channel.updates", body)
            code = (reply.receipt or {}).get("code")
            if reply.outcome == "accepted" and reply.receipt is not None:
                self.last_poll_at = self.clock.now_ms()
                self._write(Ack(cursor=reply.receipt["cursor"]))
                if reply.receipt["runIds"]:
                    self.wake_scheduler()
                return
            if (
                code in ("claimExpired", "staleGeneration", "notClaimed")
                and await self._claim_channel() == batch.offset
            ):
                continue
            break
        log.warning("channel %s: updates not recorded (%s); the adapter polls again", self.channel_id, code)
        signal_group(proc.pid, signal.SIGKILL)  # a new adapter polls from the durable cursor

    # --- effects ------------------------------------------------------------------------------

    def wake(self) -> None:
        self.wakeup.set()

    async def _effects(self) -> None:
        """One channel effect at a time: claim (the attempt recorded), perform, settle."""
        while not self.stopping:
            self.wakeup.clear()
            claim = new_claim(self.server_epoch(), self.settings.claim_ttl_ms)
            asked = {k: claim[k] for k in ("owner_id", "claim_token_hash", "ttl_ms")}
            reply = await self.ask("effect.claim", {"channel_id": self.channel_id, **asked})
            receipt = reply.receipt or {}
            if reply.outcome != "accepted" or reply.revision is None:
                wait_ms: float = self.settings.outbox_idle_check_ms
                if receipt.get("nextDueAt") is not None:
                    wait_ms = min(wait_ms, max(5, receipt["nextDueAt"] - self.clock.now_ms()))
                await self.clock.woken(self.wakeup, wait_ms)
                continue
            claim["lease_generation"] = receipt["leaseGeneration"]
            payload = receipt["payload"]
            self.effect = effect = InFlight(
                receipt["effectId"],
                claim,
                reply.revision,
                receipt["recoveryPolicy"],
                receipt["attemptNumber"],
                asyncio.get_running_loop().create_future(),
            )
            self._write(
                Perform(
                    effect_id=effect.effect_id,
                    attempt=receipt["attemptNumber"],
                    method=payload["method"],
                    body=payload["body"],
                )
            )
            performed = await effect.done
            await self._settle(effect, performed)

    async def _settle(self, effect: InFlight, performed: Performed) -> None:
        body: dict[str, Any] = {
            "effect_id": effect.effect_id,
            "claim": effect.claim,
            "expected_revision": effect.revision,
            "error_code": performed.error_code,
        }
        if performed.error:
            body["error"] = BlobValue.of_text(performed.error).model_dump()
        if performed.outcome == "applied":
            result = performed.result or {}
            body |= {"settlement": "applied", "result": BlobValue.of_json(result).model_dump()}
            if "messageId" in result:
                body["external_ref"] = f"{result['chatId']}:{result['messageId']}"
        elif performed.outcome == "rejected":
            body["settlement"] = "rejected"
        elif performed.outcome == "failed" or effect.policy == "idempotent":
            now = self.clock.now_ms()
            if performed.retry_after_ms is not None:  # Telegram's flood wait: exactly then
                retry_at = now + performed.retry_after_ms
            else:
                base, most = self.settings.effect_retry_base_ms, self.settings.effect_retry_max_ms
                retry_at = next_attempt_at(now, effect.attempt, base, most, self._rng)
            body |= {"settlement": "retry", "retry_at": retry_at, "not_acted": performed.not_acted}
        else:
            body["settlement"] = "ambiguous"  # a send that may have acted: only an operator decides
        reply = await self.ask("effect.settle", body)
        if reply.outcome not in ("accepted", "adopted"):
            log.warning("channel %s: a message's settlement was not recorded: %s", self.channel_id, reply.outcome)
        self.effect = None

    async def _renewal(self) -> None:
        while True:
            await self.clock.sleep_ms(self.settings.claim_renew_ms)
            if self.lease is not None:
                await self.writer.request(
                    "claim.renew", {"actor": SERVER, "resource_id": self.channel_id, "claim": self.lease}
                )
            effect = self.effect
            if effect is not None:
                await self.writer.request(
                    "claim.renew", {"actor": SERVER, "resource_id": effect.effect_id, "claim": effect.claim}
                )

    async def _adapter_gone(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
            self.recorder.forget_child(proc.pid)
        effect, self.effect = self.effect, None
        if effect is not None:  # the call may or may not have reached Telegram
            body = {"effect_id": effect.effect_id, "claim": effect.claim, "retry_at": self.clock.now_ms()}
            reply = await ask_while_unavailable(
                self.writer,
                "effect.abandon",
                {"actor": self.actor, **body},
                self.settings,
                self.clock,
                within_ms=self.settings.stop_grace_ms,
            )
            if reply.outcome not in ("accepted", "claimLost"):
                log.warning("channel %s: an abandoned message was not recorded: %s", self.channel_id, reply.outcome)

"""The agent manager: admits pending agent requests up to ``max_agents`` and serves their hosts.

::

    wake (a run waits for an agent, a host ended, tick) ── agent.claimable
      ── agent.open (C3: a recording segment leased here: token in memory, hash in leases;
         a spent budget times the attempt out instead)
      ── Pi found? (PI_WORKFLOWS_PI_COMMAND, the installed copy, PATH) else agent.exited with
         the fix: the run parks agentNoProgress (a command step, executor=command(argv), runs
         its own program instead: no Pi is looked for)
      ── a ready host (spawned earlier, its imports done, waiting for its launch) or a new one:
         `python -m piworkflows.agents` in its own process group (Pi runs in it), host.json
         (identity); another host is made ready for the next segment ── launch AgentLaunch
      ── host frames (protocol/internal/agents.py HOST_FRAMES): the segment and its claim
         attached, deduplicated by the message key, forwarded as the writer command of the
         same kind; replies relayed
      ── agent.close committed: the scheduler is woken (the run goes on while Pi exits); the
         run's next request waits until this host's group is gone (Pi writes the session file
         until it exits)
      ── the host ends ── its group killed (a command or Pi it left) ── agent.exited unless it
         closed its segment (the open turn lost, the interval at its last sample); the run parks
         agentNoProgress with the host's failure (HostFailure, in Pi's words) when nothing was
         committed after C3, Pi is missing or refused the step, or agent_host_failure_limit hosts
         in a row finished no turn; else the request's next host waits out a doubling backoff
    renewal: claim.renew of every live segment every claim_renew_ms; a lost claim kills the host
    pause and cancel of a run: its host group is stopped (SIGTERM, SIGKILL after
         agent_abort_grace_ms); the commit already changed the rows
    ready host: one, from the first admitted request on (a host's start is mostly Python's
         imports); replaced when taken; killed when no segment took it for child_idle_exit_ms
         and at shutdown; spawned with the crash points only while no host has failed, and a
         dead one is never launched
    logs:    a host's own log records (LOG frames) go to server.log with its pid; the stderr lines
             and the failure of a host that died go there too; the failure (else the last stderr
             line) is the park's detail

The manager depends on narrow seams (supervisor/seams.py) and waits on its Clock; ``admit()``
is one admission step and ``renew()`` one renewal pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shlex
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from piworkflows import canonical, faults
from piworkflows.agents.pi import NEEDS_PI, find_pi
from piworkflows.paths import ensure_private_dir
from piworkflows.protocol import frames
from piworkflows.protocol.internal.agents import (
    HOST_EXIT_LASTING,
    HOST_FRAMES,
    AgentContract,
    AgentLaunch,
    HostFailure,
    PendingStep,
)
from piworkflows.protocol.internal.base import BlobValue, new_claim
from piworkflows.protocol.internal.writer import LogRecord, Reply
from piworkflows.supervisor import interactions
from piworkflows.supervisor.logs import log_failure, relay_child_log
from piworkflows.supervisor.registry import ChildNotRecorded
from piworkflows.supervisor.seams import (
    ChildHub,
    HubWiring,
    RunControl,
    WorkflowResolvers,
    ask_while_unavailable,
    refusal,
)
from piworkflows.supervisor.spawn import GroupStopper, signal_group, spawn_child
from piworkflows.supervisor.stderr import StderrTail, exit_text

log = logging.getLogger("piworkflows.supervisor")

HOST_MARKER = "piworkflows.agents"
SERVER = {"actor_class": "server"}
HOST_KINDS = frozenset(frame.kind for frame in HOST_FRAMES)


@dataclass
class HostHandle:
    segment_id: str
    run_id: str
    request_id: str
    claim: dict[str, Any]
    proc: asyncio.subprocess.Process | None = None
    stderr: StderrTail | None = None
    closed: bool = False  # agent.close committed: no agent.exited to send
    stopping: bool = False  # the server ends it (pause, cancel, shutdown, a lost claim)
    turned: bool = False  # a model turn's end was committed: the host made progress
    failure: str | None = None  # why it ended early, as it said (HostFailure)
    lasting: bool = False  # it ended so that another host cannot help (Pi missing or refusing)
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def actor(self) -> dict[str, str]:
        return {"actor_class": "runner", "actor_id": f"agent:{self.segment_id}"}


@dataclass
class ReadyHost:
    """A host spawned ahead of its segment, blocked on reading its launch."""

    proc: asyncio.subprocess.Process
    stderr: StderrTail
    faults: bool  # spawned with the crash points (PIW_FAULTS): only the first host may fire them


class AgentManager(ChildHub):
    def __init__(
        self,
        wiring: HubWiring,
        *,
        socket_path: str,
        resolvers: WorkflowResolvers,
        runs: RunControl,
        tmp_dir: Path | None = None,
    ) -> None:
        super().__init__(wiring)  # host.json records agent host groups; a settled request wakes its run
        self.socket_path = socket_path  # the workflow tool in Pi submits here (client.v1)
        self.tmp_dir = tmp_dir  # TMPDIR of the hosts and their Pi (StatePaths.pi_tmp); None: inherited
        self.resolvers = resolvers  # judge the submissions a crash left validating
        self.runs = runs
        self.active: dict[str, HostHandle] = {}  # by request id
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopper = GroupStopper(self.clock)
        self._stopping = False
        self._failures = 0  # hosts that ended without closing their segment, not stopped by the server
        # by request: hosts in a row that ended without finishing a turn, and when the next may start
        self._unproductive: dict[str, int] = {}
        self._not_before: dict[str, int] = {}
        self._ready: ReadyHost | None = None
        self._readying: asyncio.Task[None] | None = None
        self._expiring: asyncio.Task[None] | None = None  # ends the ready host no segment took

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        return await self.writer.request(kind, {"actor": SERVER, **body})

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        """Judge what a crash left validating, then admit requests."""
        await self.revalidate()
        if self.settings.max_agents <= 0:
            return
        self._tasks = [
            asyncio.create_task(self._admission(), name="agent-admission"),
            asyncio.create_task(self._renewal(), name="agent-renewal"),
        ]
        self.wake()

    async def revalidate(self) -> None:
        """Submissions recorded validating before the server stopped (none is judged now): each is
        validated and settled, so its request is accepted or pending again (its tool is gone)."""
        reply = await self.request("interaction.validating", {"limit": 256})
        for item in (reply.receipt or {}).get("submissions", []):
            try:
                settled = await interactions.settle(
                    self.writer, self.resolvers, self.runs, item, item["output"], self.settings.agent_max_rejections
                )
            except Exception as exc:  # one submission's failure never stops the start
                log_failure(log, f"validating submission {item['submissionId']} again failed", exc)
                continue
            log.info("%s: a submission left validating was judged again: %s", item["runId"], settled.outcome)

    async def _admission(self) -> None:
        while not self._stopping:
            await self.clock.woken(self._wake, self.settings.scheduler_tick_ms)
            self._wake.clear()
            await self.admit()

    async def admit(self) -> None:
        """One admission step: open a segment for each claimable request up to the free capacity
        and start its host."""
        free = self.settings.max_agents - len(self.active)
        if free <= 0 or self._stopping:
            return
        reply = await self.request("agent.claimable", {"limit": free, "exclude_request_ids": sorted(self.active)[:256]})
        now = self.clock.now_ms()
        for item in (reply.receipt or {}).get("requests", []):
            if item["requestId"] in self.active or self._stopping:
                continue
            if self._not_before.get(item["requestId"], 0) > now:
                continue  # its last host ended without a turn: the backoff runs (woken by the tick)
            if any(handle.run_id == item["runId"] for handle in self.active.values()):
                continue  # its run's last host still ends (its Pi may write the session file): woken then
            try:
                await self._open(item["requestId"])
            except Exception as exc:  # one request's failure never stops the manager
                log_failure(log, f"starting the agent host of {item['requestId']} failed", exc)

    async def _open(self, request_id: str) -> None:
        claim = new_claim(self.server_epoch(), self.settings.claim_ttl_ms)
        segment_id = "segment-" + uuid.uuid4().hex
        opened = await self.request(
            "agent.open",
            {
                "request_id": request_id,
                "segment_id": segment_id,
                "server_epoch": claim["server_epoch"],
                "owner_id": claim["owner_id"],
                "claim_token_hash": claim["claim_token_hash"],
                "ttl_ms": claim["ttl_ms"],
            },
        )
        receipt = opened.receipt or {}
        if opened.outcome != "accepted" or "segmentId" not in receipt:
            if receipt.get("timedOut"):
                self.wake_scheduler()  # the attempt timed out: its run goes on
            return
        claim["lease_generation"] = receipt["leaseGeneration"]
        handle = HostHandle(segment_id, receipt["runId"], request_id, claim)
        self.active[request_id] = handle
        handle.task = asyncio.create_task(self._serve(handle, receipt), name=f"agent-{segment_id}")

    def _launch(
        self, handle: HostHandle, receipt: dict[str, Any], contract: AgentContract, pi: str | None
    ) -> AgentLaunch:
        if contract.model is None and self.settings.agent_model:
            contract = contract.model_copy(update={"model": self.settings.agent_model})
        return AgentLaunch(
            segment_id=handle.segment_id,
            run_id=handle.run_id,
            attempt_id=receipt["attemptId"],
            request_id=handle.request_id,
            session_id=receipt["sessionId"],
            pi_session_file=receipt.get("piSessionFile"),
            project_path=receipt["projectPath"],
            contract=contract,
            pending=[
                PendingStep(workflow_message_id=s["workflowMessageId"], text=s["text"]) for s in receipt["pending"]
            ],
            steps=receipt["steps"],
            pi_command=[pi] if pi is not None else [],
            pi_args=shlex.split(self.settings.pi_args or ""),
            socket_path=self.socket_path,
            coordinator_epoch=handle.claim["lease_generation"],
            timeout_ms=receipt["timeoutMs"],
            elapsed_ms=receipt["elapsedMs"],
            sample_ms=self.settings.active_sample_ms,
            flush_ms=self.settings.agent_flush_ms,
            start_timeout_ms=self.settings.agent_start_timeout_ms,
            abort_grace_ms=self.settings.agent_abort_grace_ms,
            retry_settle_ms=self.settings.agent_retry_settle_ms,
        )

    async def _serve(self, handle: HostHandle, receipt: dict[str, Any]) -> None:
        detail: str | None = None
        try:
            contract = AgentContract.model_validate(receipt["contract"])
            pi = find_pi(self.settings) if contract.executor.kind == "pi" else None
            if pi is None and contract.executor.kind == "pi":
                detail = NEEDS_PI
                return
            launch = self._launch(handle, receipt, contract, pi)
            handle.proc, handle.stderr = await self._take_host()
            detail = await self._relay(handle, launch)
        except ChildNotRecorded as exc:  # ended before it ran anything; the request waits for the next host
            log.warning("no agent host for %s: %s", handle.run_id, exc)
            handle.stopping = True
        except (ConnectionResetError, BrokenPipeError):
            log.warning("the agent host of %s died", handle.run_id)
        except Exception as exc:
            log_failure(log, f"the agent host of {handle.run_id} failed", exc)
        finally:
            await self._finish(handle, detail)

    async def _take_host(self) -> tuple[asyncio.subprocess.Process, StderrTail]:
        """The ready host when it is alive and may run (crash points only while no host failed),
        else a new one; another is made ready for the next segment."""
        ready, self._ready = self._ready, None
        if ready is not None and (ready.proc.returncode is not None or (ready.faults and self._failures)):
            await self._discard(ready)
            ready = None
        host = (ready.proc, ready.stderr) if ready is not None else await self._spawn_host()
        if self._readying is None or self._readying.done():
            self._readying = asyncio.create_task(self._make_ready(), name="agent-ready-host")
        return host

    async def _spawn_host(self) -> tuple[asyncio.subprocess.Process, StderrTail]:
        return await spawn_child(
            "agent host", HOST_MARKER, (HOST_MARKER,), self.recorder, self.settings, own_group=True, env=self._env()
        )

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self.settings.to_env()}
        if self.tmp_dir is not None:
            ensure_private_dir(self.tmp_dir)
            env["TMPDIR"] = str(self.tmp_dir)
        if self._failures:  # like a restarted outbox worker: a crash point fires in the first host only
            env.pop(faults.ENV, None)
        return env

    async def _make_ready(self) -> None:
        if self._stopping or self._ready is not None:
            return
        armed = faults.ENV in self._env()
        try:
            proc, stderr = await self._spawn_host()
        except Exception as exc:  # the next segment spawns its own host
            log_failure(log, "making an agent host ready failed", exc)
            return
        self._ready = ready = ReadyHost(proc, stderr, armed)
        if self._stopping:
            await self._discard_ready()
            return
        self._expiring = asyncio.create_task(self._expire(ready), name="agent-ready-host-expiry")

    async def _expire(self, ready: ReadyHost) -> None:
        """The ready host ends when no segment took it for child_idle_exit_ms (the next segment
        spawns its own)."""
        await self.clock.sleep_ms(self.settings.child_idle_exit_ms)
        if self._ready is ready and not self._stopping:
            await self._discard_ready()

    async def _discard_ready(self) -> None:
        ready, self._ready = self._ready, None
        if ready is not None:
            await self._discard(ready)

    async def _discard(self, ready: ReadyHost) -> None:
        signal_group(ready.proc.pid, signal.SIGKILL)  # it waits for its launch: nothing to lose
        await ready.proc.wait()
        self.recorder.forget_child(ready.proc.pid)
        ready.stderr.close()

    async def _relay(self, handle: HostHandle, launch: AgentLaunch) -> str | None:
        """Serve the host's frames until it ends; returns why it ended when that is news for the
        run (its last stderr line, or how it died)."""
        proc = handle.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(frames.encode(launch.kind, 0, launch.model_dump()))
        await proc.stdin.drain()
        decoder = frames.FrameDecoder()
        while data := await proc.stdout.read(1 << 16):
            for frame in decoder.feed(data):
                if frame["k"] == LogRecord.kind:
                    relay_child_log("agent host", proc.pid, frame["b"])
                    continue
                if frame["k"] == HostFailure.kind:
                    handle.failure = HostFailure.model_validate(frame["b"]).why
                    continue
                reply = await self._forward(handle, frame)
                proc.stdin.write(frames.encode(Reply.kind, frame["id"], reply.model_dump()))
                await proc.stdin.drain()
        code = await proc.wait()
        lines: list[str] = []
        if handle.stderr is not None:
            await handle.stderr.drained(self.settings.child_stderr_drain_ms / 1000)
            lines = handle.stderr.take()
        if handle.closed or handle.stopping:
            return None
        handle.lasting = code in HOST_EXIT_LASTING
        for line in lines:
            log.warning("agent host of %s stderr: %s", handle.run_id, line)
        ended = exit_text("agent host", code)
        said = f": {handle.failure}" if handle.failure else ""
        log.warning("the agent host of %s ended: %s%s", handle.run_id, ended, said)
        return handle.failure or (lines[-1] if lines else ended)

    async def _forward(self, handle: HostHandle, frame: dict[str, Any]) -> Reply:
        """The writer command of the frame's kind under the segment's claim, deduplicated by the
        message key (a repeat after a writer restart finds it done)."""
        kind, body = frame["k"], dict(frame["b"])
        if kind not in HOST_KINDS:
            return refusal("unknownCommand", "not an agent host message")
        message = canonical.dumps_bytes(
            {"kind": kind, "body": {k: v for k, v in body.items() if not isinstance(v, (bytes, dict, list))}}
        )
        body.update(
            actor=handle.actor,
            segment_id=handle.segment_id,
            claim=handle.claim,
            worker_message={
                "sender_scope": handle.segment_id,
                "message_kind": kind,
                "run_id": handle.run_id,
                "message_id": f"{handle.claim['lease_generation']}:{frame['id']}",
                "fingerprint": hashlib.sha256(message).digest(),
            },
        )
        reply = await ask_while_unavailable(
            self.writer, kind, body, self.settings, self.clock, within_ms=self.settings.claim_ttl_ms
        )
        if reply.outcome in ("accepted", "adopted"):
            if kind == "agent.turn" and body.get("phase") == "ended":
                handle.turned = True
            if kind == "agent.close":
                handle.closed = True
                self.wake_scheduler()  # the run is claimable again (its next request waits for this host)
            elif self._settled(reply):
                self.wake_scheduler()  # the step ended (accepted, failed, timed out): the run goes on
        return reply

    @staticmethod
    def _settled(reply: Reply) -> bool:
        receipt = reply.receipt or {}
        return bool(receipt.get("timedOut")) or receipt.get("requestStatus") in ("accepted", "failed")

    async def _finish(self, handle: HostHandle, detail: str | None) -> None:
        proc = handle.proc
        if proc is not None:
            # Even after the host exited: what it left in its group (a command it ran, a Pi that
            # outlived a kill -9 of the host) ends with it. The group id stays taken while any
            # member lives, so it names no other process.
            signal_group(proc.pid, signal.SIGKILL)
            if proc.returncode is None:
                await proc.wait()
            self.recorder.forget_child(proc.pid)
        if handle.stderr is not None:
            handle.stderr.close()
        if not handle.closed:
            if proc is not None and not handle.stopping:
                self._failures += 1
            body: dict[str, Any] = {
                "segment_id": handle.segment_id,
                "stopped_by_server": handle.stopping,
                "no_progress": not handle.stopping and self._given_up(handle),
            }
            if detail is not None and not handle.stopping:
                body["detail"] = BlobValue.of_text(detail[:2000]).model_dump()
            reply = await ask_while_unavailable(
                self.writer,
                "agent.exited",
                {"actor": SERVER, **body},
                self.settings,
                self.clock,
                within_ms=self.settings.stop_grace_ms,
            )
            if reply.outcome not in ("accepted", "adopted", "rejected"):
                log.warning("the end of an agent host was not recorded: %s", reply.outcome)
            elif (reply.receipt or {}).get("parkReason") == "agentNoProgress":
                log.warning("%s parked agentNoProgress: %s", handle.run_id, detail or "the agent host ended")
                self._forgive(handle.request_id)  # a resume starts the count again
        else:
            self._forgive(handle.request_id)
        self.active.pop(handle.request_id, None)
        self.wake()
        self.wake_scheduler()

    def _given_up(self, handle: HostHandle) -> bool:
        """Count a host that ended on its own (not closed, not stopped); whether its run parks: Pi
        missing or refusing, or agent_host_failure_limit hosts in a row that finished no turn.
        Otherwise the next host waits agent_host_backoff_ms, doubled for each in a row."""
        in_a_row = 1 if handle.turned else self._unproductive.get(handle.request_id, 0) + 1
        self._unproductive[handle.request_id] = in_a_row
        if handle.lasting or in_a_row >= self.settings.agent_host_failure_limit:
            return True
        delay = self.settings.agent_host_backoff_ms * 2 ** (in_a_row - 1)
        self._not_before[handle.request_id] = self.clock.now_ms() + delay
        log.warning(
            "%s: agent host %d of %d in a row ended without progress; the next starts in %d ms",
            handle.run_id,
            in_a_row,
            self.settings.agent_host_failure_limit,
            delay,
        )
        return False

    def _forgive(self, request_id: str) -> None:
        self._unproductive.pop(request_id, None)
        self._not_before.pop(request_id, None)

    async def _renewal(self) -> None:
        while not self._stopping:
            await self.clock.sleep_ms(self.settings.claim_renew_ms)
            await self.renew()

    async def renew(self) -> None:
        """One renewal pass: claim.renew of every live segment; a lost claim ends its host."""
        for handle in list(self.active.values()):
            if handle.closed or handle.stopping:
                continue
            reply = await self.request("claim.renew", {"resource_id": handle.segment_id, "claim": handle.claim})
            if reply.outcome == "claimLost":
                self._stop_handle(handle)

    def stop_run(self, run_id: str) -> None:
        """After a committed pause or cancel: end the run's host (Pi with it)."""
        for handle in list(self.active.values()):
            if handle.run_id == run_id:
                self._stop_handle(handle)

    def _stop_handle(self, handle: HostHandle) -> None:
        handle.stopping = True
        if handle.proc is not None:
            self._stopper.stop(handle.proc, self.settings.stop_grace_ms, "agent")

    async def stop(self) -> None:
        """Shutdown: every host ends; its segment closes and the step resumes after the restart."""
        self._stopping = True
        self._wake.set()
        for handle in list(self.active.values()):
            self._stop_handle(handle)
        tasks = [h.task for h in self.active.values() if h.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.stop_grace_ms / 1000 + 1)
        if self._readying is not None:
            await self._readying  # a spawn under way ends with its host discarded
        if self._expiring is not None:
            self._expiring.cancel()
        await self._discard_ready()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

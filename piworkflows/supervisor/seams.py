"""What the supervisor's components need of each other: small Protocols, a refusal, one retry.

::

    Scheduler ── WriterRestarts, ChildRecorder, EffectPool, callbacks (epoch, retention)
    OutboxPool, AgentManager, Channels ── ChildHubs: HubWiring (WriterRequests, ChildRecorder,
        callbacks: epoch, wake the scheduler)
    Retention ── WriterRequests, a callback (busy)
    Router ── WriterStatus, WorkflowResolvers, ServerHost, RunControl
    each takes a Clock (piworkflows/clock.py); the Supervisor (main.py) wires them

A component never reaches into another one's attributes; the supervisor
passes the narrow thing it needs. ``ask_while_unavailable`` is the one retry
of an ``unavailable`` answer (the writer restarting, a write group that could
not commit); ``refusal`` the one way to build a refused ``Reply`` from an
error code (``errors.CODES`` gives its outcome).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from piworkflows.clock import Clock
from piworkflows.errors import CommandError
from piworkflows.protocol.internal.resolver import Resolution, Validation, WorkflowListing, WorkflowShown
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.leftovers import Leftovers
from piworkflows.supervisor.registry import Identity


class WriterRequests(Protocol):
    """Sends one command to the writer and returns its reply (``unavailable`` when none runs)."""

    async def request(self, kind: str, body: dict[str, Any]) -> Reply: ...


class WriterRestarts(WriterRequests, Protocol):
    @property
    def restarts(self) -> int:
        """How many times the writer was started again; replies of a crashed one may be lost."""
        ...


class WriterStatus(WriterRequests, Protocol):
    def unavailable_reason(self) -> dict[str, Any] | None:
        """Why nothing can be committed now (server.status ``reason``), or None when it can."""
        ...


class ChildRecorder(Protocol):
    """host.json: a child is recorded before it acts (ChildNotRecorded: the caller ends it); and
    what it leaves behind is ended with it (``leftovers``)."""

    leftovers: Leftovers

    def record_child(self, identity: Identity) -> None: ...

    def forget_child(self, pid: int) -> None: ...


@dataclass(frozen=True)
class HubWiring:
    """What every hub of child processes (the outbox pool, the agent manager, the channels) is
    given: the writer, host.json (children are recorded before they act), the settings, a clock,
    the epoch its claims are taken under, and a way to wake the scheduler (a run that waited on
    the hub's work may be claimable again). The supervisor builds it (main.py)."""

    writer: WriterRequests
    recorder: ChildRecorder
    settings: Settings
    clock: Clock
    server_epoch: Callable[[], int]
    wake_scheduler: Callable[[], None]


class ChildHub:
    """A hub of child processes, holding its wiring as attributes."""

    def __init__(self, wiring: HubWiring) -> None:
        self.writer = wiring.writer
        self.recorder = wiring.recorder
        self.settings = wiring.settings
        self.clock = wiring.clock
        self.server_epoch = wiring.server_epoch
        self.wake_scheduler = wiring.wake_scheduler


class EffectPool(Protocol):
    """The outbox pool as a runner awaiting one of its effects sees it."""

    def wake(self) -> None: ...

    def watch(self, effect_id: str) -> asyncio.Event: ...

    def unwatch(self, effect_id: str, settled: asyncio.Event) -> None: ...


class WorkflowResolvers(Protocol):
    """Resolver children: workflow code is loaded there, never in the supervisor."""

    async def resolve(self, project_path: str, workflow_name: str, input_value: Any) -> Resolution: ...

    async def show(self, project_path: str, workflow_name: str) -> WorkflowShown: ...

    async def list_workflows(self, project_path: str) -> WorkflowListing: ...

    async def validate(
        self,
        project_path: str,
        source: RunSource,
        definition_digest: str,
        node_path: str,
        output: Any,
        answer: bool = False,
    ) -> Validation: ...


@dataclass(frozen=True)
class Load:
    """What server.status counts besides the writer's figures."""

    active_runners: int
    connections: int
    max_connections: int
    fd_limit: int | None


class ServerHost(Protocol):
    """The server as the router answers from it."""

    @property
    def state(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    def request_stop(self, reason: str) -> None: ...

    def load(self) -> Load: ...

    def maintenance(self) -> AbstractContextManager[None]:
        """Held while a client's backup or prune is in flight: automatic retention keeps away."""
        ...


class RunControl(Protocol):
    """What a committed client command sets going (after its commit, never before)."""

    def wake_scheduler(self) -> None: ...

    def wake_outbox(self) -> None: ...

    def stop_run(self, run_id: str, let_effect_settle: bool = False) -> None: ...

    def stop_agent_host(self, run_id: str) -> None: ...

    def cancel_effects(self, run_id: str) -> None: ...


class ChannelControl(Protocol):
    """The server's channels as the router drives them (supervisor/channels.py)."""

    async def status(self) -> Reply: ...

    async def reload(self) -> dict[str, Any]: ...

    def wake(self) -> None: ...


def refusal(code: str, message: str, **details: Any) -> Reply:
    """A refused reply: the outcome is the code's (errors.CODES), the receipt names the code."""
    error = CommandError(code, message, **details)
    return Reply(outcome=error.outcome, receipt=error.receipt(), error=error.message)


async def ask_while_unavailable(
    writer: WriterRequests,
    kind: str,
    body: dict[str, Any],
    settings: Settings,
    clock: Clock,
    *,
    within_ms: int | None,
    stopping: Callable[[], bool] = lambda: False,
) -> Reply:
    """Send the command; while the answer is ``unavailable`` (the writer restarts, or a write group
    could not commit) send the same body again, after writer_restart_min_ms doubling up to
    writer_restart_max_ms. The body carries its key (a client receipt, a worker message, a claim),
    so a repeat of a command that did commit is adopted or finds it done. Gives up with the last
    answer after ``within_ms`` (None: never) or once ``stopping()``."""
    deadline = None if within_ms is None else clock.monotonic_ms() + within_ms
    delay = settings.writer_restart_min_ms
    reply = await writer.request(kind, body)
    while reply.outcome == "unavailable" and not stopping():
        if deadline is not None and clock.monotonic_ms() >= deadline:
            break
        await clock.sleep_ms(delay if deadline is None else min(delay, max(0, deadline - clock.monotonic_ms())))
        delay = min(delay * 2, settings.writer_restart_max_ms)
        reply = await writer.request(kind, body)
    return reply

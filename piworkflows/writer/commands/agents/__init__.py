"""Agent steps on Pi: the writer's side of docs/agents.md, C2 to C12 (their rows: writer/agent_steps.py).

::

    runner      node.request_agent (C2, run claim)   -> request pending, initial step, run waits
    supervisor  agent.claimable / agent.open (C3)    -> a recording segment leased to it
    agent host  agent.bind_session (C4) | agent.branch (C5) | agent.message_sent (C6)
                | agent.turn (C7 started, C9 ended) | agent.close (C12)
                    -> on the segment, under its claim: one revision and one event each
                agent.record (C8)                    -> session tables only
    supervisor  agent.exited (the host is gone)      -> the segment closes; no progress parks
    model       interaction.submit (C10) | interaction.update -> on the run, fenced by the epoch
    supervisor  interaction.settle (C11)             -> on the run: the verdict

One package for the one domain of protocol/internal/agents.py: ``requests``
(C2, C3), ``segments`` (a host's reports and its exit), ``turns`` (C7, C9),
``interactions`` (C10, C11, updates), ``base`` (the segment claim, shared checks).

A host's command names its segment and carries the segment's claim (the
supervisor attaches it): the contract verifies and renews it, and the segment
must still be ``recording``. ``agent.record`` is the exception to the contract's
shape: a capture batch is journalled by ``session_events`` and fenced by the
segment's contiguous ``event_count``, and docs/storage.md forbids a generic
event per flush, so it is a plain Handler that verifies and renews the claim
itself and writes neither a revision nor an ``events`` row (a sample that
spends the budget still writes the run's ``agent.timed_out`` event). The
interaction commands target the run, ``fenced_by_transition``: a waiting run
has no claim; the coordinator epoch and the request's revision fence them.
"""

from __future__ import annotations

from typing import Any

from piworkflows.writer.commands.agents import interactions, requests, segments, turns
from piworkflows.writer.contract import Handler

HANDLERS: tuple[Handler[Any], ...] = (
    *requests.HANDLERS,
    *segments.HANDLERS,
    *turns.HANDLERS,
    *interactions.HANDLERS,
)

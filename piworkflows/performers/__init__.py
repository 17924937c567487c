"""Performers: the code that applies one kind of outside effect.

One interface, so whoever performs effects (the runner today, the outbox
worker pool later) changes nothing in workflow semantics::

    reserve (writer) -> claim: numbered attempt recorded (writer) -> perform -> settle (writer)

A performer gets the effect's canonical payload, its idempotency key and its
recovery policy, and returns an ``Outcome``: how the attempt settles and the
result stored on the effect. It never touches SQLite. ``spawned`` is called
with the leader pid of every process group the performer starts, before that
group runs anything; the caller records its identity (host.json) and may
refuse (then the group is killed and nothing ran).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# applied / rejected / ambiguous: as docs/workflows.md's effect table says. retry: the attempt
# definitely did not act (a connection refused, a 5xx answer to an idempotent request): the
# writer schedules the next attempt under the same key (or rejects: retriesExhausted).
Settlement = Literal["applied", "rejected", "ambiguous", "retry"]
NodeOutcome = Literal["ok", "failed", "timed_out"]


@dataclass(frozen=True)
class Stream:
    """An output stream of a command: the bytes kept (at most the cap) and how many it wrote."""

    kept: bytes
    seen_bytes: int


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended. ``result`` (JSON) is stored on an applied effect:
    ``{"output": node output, "nodeOutcome": "ok" | "timed_out"}``, and on a rejected one
    whose attempt still produced output (a shell command's non-zero exit): the failed node keeps it.
    ``streams``: a command's complete output streams by name, which the outbox worker stores
    before it settles."""

    settlement: Settlement
    result: Any = None
    error: str | None = None
    error_code: str | None = None
    external_ref: str | None = None
    streams: dict[str, Stream] = field(default_factory=dict)


class Performer(Protocol):
    def perform(self, payload: dict[str, Any], key: str, policy: str, spawned: Callable[[int], bool]) -> Outcome: ...


def node_result(outcome: Outcome) -> tuple[NodeOutcome, Any, str | None]:
    """What the node makes of a settled effect: (outcome, output, error text)."""
    result = outcome.result or {}
    if outcome.settlement == "applied":
        return result.get("nodeOutcome", "ok"), result.get("output"), None
    return "failed", result.get("output"), outcome.error or f"the effect was {outcome.settlement}"

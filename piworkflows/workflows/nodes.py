"""Node and edge declarations: what ``define_workflow`` receives.

Each declaration keeps its callables (run only in a runner child) apart from
its static fields (``static()``), which enter the definition snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

NodeFn = Callable[[Any], Any]


@dataclass(frozen=True)
class EffectDecl:
    """How an outside effect recovers after a crash: retried under its key, or an operator decides."""

    effect_type: str
    recovery_policy: str  # "idempotent" | "manual"
    max_attempts: int = 5  # idempotent: numbered attempts before it is rejected (retriesExhausted)


def idempotent_effect(effect_type: str, max_attempts: int = 5) -> EffectDecl:
    """Retried automatically under the same key (backoff with jitter) after an uncertain or
    retryable attempt, at most ``max_attempts`` attempts in all."""
    return EffectDecl(effect_type, "idempotent", max_attempts)


def manual_effect(effect_type: str) -> EffectDecl:
    """Never repeated without an operator: an uncertain attempt becomes ambiguous."""
    return EffectDecl(effect_type, "manual", 1)


@dataclass(frozen=True)
class Node:
    kind: str

    def static(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True)
class ComputeNode(Node):
    run: NodeFn = field(default=lambda ctx: None)


@dataclass(frozen=True)
class NotifyNode(Node):
    notify_kind: str = "progress"
    message: NodeFn | str = ""

    def static(self) -> dict[str, Any]:
        return {**super().static(), "notifyKind": self.notify_kind}


@dataclass(frozen=True)
class ActionNode(Node):
    effect: EffectDecl = field(default_factory=lambda: idempotent_effect("action"))
    run: NodeFn = field(default=lambda ctx: None)

    def static(self) -> dict[str, Any]:
        effect = self.effect
        declared: dict[str, Any] = {"effectType": effect.effect_type, "recovery": effect.recovery_policy}
        if effect.max_attempts != 5 and effect.recovery_policy == "idempotent":
            declared["maxAttempts"] = effect.max_attempts
        return {**super().static(), **declared}


@dataclass(frozen=True)
class ShellNode(ActionNode):
    exec: NodeFn = field(default=lambda ctx: {})
    parse: NodeFn | None = None
    allow_non_zero_exit: bool = False
    max_output_chars: int = 100_000

    def static(self) -> dict[str, Any]:
        return {
            **super().static(),
            "allowNonZeroExit": self.allow_non_zero_exit,
            "maxOutputChars": self.max_output_chars,
            "parses": self.parse is not None,
        }


@dataclass(frozen=True)
class HttpNode(ActionNode):
    request: NodeFn | Mapping[str, Any] = field(default_factory=dict)
    timeout_ms: int = 30_000

    def static(self) -> dict[str, Any]:
        return {**super().static(), "timeoutMs": self.timeout_ms}


@dataclass(frozen=True)
class CheckpointNode(Node):
    summary: NodeFn | str = ""
    run: NodeFn | None = None


@dataclass(frozen=True)
class IncludeNode(Node):
    """A child workflow composed into the same run (no child run, no second queue row)."""

    child: Any = None  # a Workflow
    input: NodeFn | None = None


def compute(run: NodeFn) -> ComputeNode:
    """A pure function of the context; its return value is the output."""
    return ComputeNode("compute", run)


def notify(kind: str = "progress", message: NodeFn | str = "") -> NotifyNode:
    """A durable message to the origin session; it starts no model turn."""
    return NotifyNode("notify", kind, message)


def action(effect: EffectDecl, run: NodeFn) -> ActionNode:
    """Work with an outside effect, reserved durably before ``run`` acts."""
    return ActionNode("action", effect, run)


def shell(
    effect: EffectDecl,
    exec: NodeFn,
    parse: NodeFn | None = None,
    allow_non_zero_exit: bool = False,
    max_output_chars: int = 100_000,
) -> ShellNode:
    """Run a command: ``exec(ctx)`` returns ``{command, args, cwd?, env?, timeoutMs?}``.

    Output: ``{stdout, stderr, exitCode, signal, durationMs}`` (or ``parse`` of it).
    """
    return ShellNode("shell", effect, lambda ctx: None, exec, parse, allow_non_zero_exit, max_output_chars)


def http(effect: EffectDecl, request: NodeFn | Mapping[str, Any], timeout_ms: int = 30_000) -> HttpNode:
    """One HTTP request performed by the outbox pool, sent with the effect's key as
    ``Idempotency-Key``. ``request(ctx)`` (or a dict) gives ``{method, url, headers?, body?}``; a
    header value may name a secret, ``{"secret": "NAME"}``, resolved when the request is sent.
    A literal ``Authorization`` header is refused. Output: ``{status, headers, body}``."""
    return HttpNode("http", effect, lambda ctx: None, request, timeout_ms)


def checkpoint(summary: NodeFn | str, run: NodeFn | None = None) -> CheckpointNode:
    """Ask for input and wait (no runner, no claim); the answer is the node's output."""
    return CheckpointNode("checkpoint", summary, run)


def include_workflow(child: Any, input: NodeFn | None = None) -> IncludeNode:
    """Compose ``child`` into this run under a mount name (``includes={mount: ...}``)."""
    return IncludeNode("workflow", child, input)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str | None = None  # a plain edge
    on: str | None = None  # a switch: the path read from the output or result
    cases: Mapping[str, str] = field(default_factory=dict)

    def targets(self) -> list[str]:
        return [self.target] if self.target is not None else list(self.cases.values())

    def static(self) -> dict[str, Any]:
        if self.target is not None:
            return {"from": self.source, "to": self.target}
        return {"from": self.source, "on": self.on, "cases": dict(self.cases)}


def edge(source: str, target: str) -> Edge:
    return Edge(source, target)


def switch(source: str, on: str, cases: Mapping[str, str]) -> Edge:
    """Route on ``$.field`` / ``$output.field`` (the accepted output) or ``$result.outcome``."""
    return Edge(source, on=on, cases=dict(cases))

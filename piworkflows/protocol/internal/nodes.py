"""A runner's node transitions and checkpoint answers (writer/commands/nodes.py)."""

from __future__ import annotations

import hashlib
from typing import ClassVar

from pydantic import Field, model_validator

from piworkflows import canonical
from piworkflows.protocol.internal.base import BlobValue, Claim, Command, Frame, Id, Model
from piworkflows.protocol.internal.channels import ChannelRoute
from piworkflows.protocol.internal.decisions import DecisionAsk
from piworkflows.protocol.internal.values import (
    NodeEffectPerformer,
    NodeKind,
    NodeOutcome,
    RecoveryPolicy,
    RunFinishStatus,
    TerminalRunStatus,
)
from piworkflows.states import MEDIA_JSON, MEDIA_TEXT


def attempt_id_of(run_id: str, node_path: str, visit_number: int, attempt_number: int) -> str:
    """Deterministic: one id per run, node path, visit and attempt number."""
    ident = canonical.dumps_bytes([run_id, node_path, visit_number, attempt_number])
    return "attempt-" + hashlib.sha256(ident).hexdigest()[:32]


class NextAttempt(Model):
    """The next node's attempt, started in the same transaction that finishes this one."""

    node_kind: NodeKind
    visit_number: int = Field(ge=1)
    attempt_number: int = Field(default=1, ge=1)


class UnderRunClaim(Command):
    """What the supervisor attaches to a runner's frame before it forwards it to the writer
    (``supervisor/scheduler.py``): the run, its claim and the revision the runner last saw. A
    runner holds no claim token: its frames carry only the fields of the ``...Frame`` models
    below, and each command here is its frame plus these."""

    run_id: Id
    claim: Claim
    expected_revision: int = Field(ge=1)


class NodeStartFrame(Frame):
    """A runner begins a node: a new attempt and step, under the run's claim."""

    kind: ClassVar[str] = "node.start"
    node_path: str = Field(min_length=1, max_length=1024)
    node_kind: NodeKind
    visit_number: int = Field(ge=1)
    attempt_number: int = Field(default=1, ge=1)


class NodeStart(UnderRunClaim, NodeStartFrame):
    """node.start as the writer gets it: the runner's frame under the run's claim."""

    def attempt_id(self) -> str:
        return attempt_id_of(self.run_id, self.node_path, self.visit_number, self.attempt_number)


class NodeFinishFrame(Frame):
    """A runner ends a node: its outcome and output, and where the run goes next.

    ``error`` is the node's error when it failed. ``run_error`` is the run's
    when it fails here: a routing error, max_steps, or the failed node that
    ends it, named (without it a failed node's error is the run's).
    """

    kind: ClassVar[str] = "node.finish"
    attempt_id: Id
    outcome: NodeOutcome
    output: BlobValue | None = None
    error: BlobValue | None = None
    error_code: str | None = Field(default=None, max_length=64)
    next_node: str | None = Field(default=None, min_length=1, max_length=1024)
    end_status: TerminalRunStatus | None = None
    start_next: NextAttempt | None = None  # start next_node's attempt in the same commit (one round trip)
    run_error: BlobValue | None = None
    notify_audience: str | None = Field(default=None, min_length=1, max_length=64)  # a notify node's

    @model_validator(mode="after")
    def _shape(self) -> NodeFinishFrame:
        if (self.next_node is None) == (self.end_status is None):
            raise ValueError("a finished node names either the next node or how the run ends")
        if self.output is not None and self.output.media_type != MEDIA_JSON:
            raise ValueError("a node output is JSON")
        if any(e is not None and e.media_type != MEDIA_TEXT for e in (self.error, self.run_error)):
            raise ValueError("a node or run error is text")
        if self.outcome == "ok" and self.error is not None:
            raise ValueError("a successful node carries no error (a run that fails on its route has run_error)")
        if self.run_error is not None and self.end_status in (None, "completed"):
            raise ValueError("run_error is the error of a run that ends here without completing")
        if self.start_next is not None and self.next_node is None:
            raise ValueError("start_next starts the next node")
        return self


class NodeFinish(UnderRunClaim, NodeFinishFrame):
    """node.finish as the writer gets it: the runner's frame under the run's claim, and for a notify
    node with an audience that audience's routes (one telegram.notify message each)."""

    routes: list[ChannelRoute] = Field(default_factory=list, max_length=64)


class RunFinishFrame(Frame):
    """A runner ends its run where no node is active: the route after an answered checkpoint or a
    settled agent step (completed with its output, a routing error, or the step's own failure or
    timeout when no edge routes it), or workflow code outside any node's own execution that
    failed (the module's load): ``failed``/``timed_out`` with the code and an error naming the
    node or file."""

    kind: ClassVar[str] = "run.finish"
    end_status: RunFinishStatus
    output: BlobValue | None = None
    error: BlobValue | None = None
    error_code: str | None = Field(default=None, min_length=1, max_length=64)

    @model_validator(mode="after")
    def _shape(self) -> RunFinishFrame:
        if self.end_status == "completed":
            if self.output is None or self.output.media_type != MEDIA_JSON or self.error or self.error_code:
                raise ValueError("a completed run has a JSON output and no error")
        elif self.error is None or self.error.media_type != MEDIA_TEXT or self.error_code is None or self.output:
            raise ValueError("a failed or timed-out run has an error text and an error code, and no output")
        return self


class RunFinish(UnderRunClaim, RunFinishFrame):
    """run.finish as the writer gets it: the runner's frame under the run's claim."""


class NodeWaitFrame(Frame):
    """A checkpoint asks for input, or a human decision for its human: the run waits with no runner
    and no claim."""

    kind: ClassVar[str] = "node.wait"
    attempt_id: Id
    request: BlobValue  # what the answerer sees (JSON: a checkpoint's summary; a decision's request, choices)
    decision: DecisionAsk | None = None  # a human_decision node's (and only its)


class NodeWait(UnderRunClaim, NodeWaitFrame):
    """node.wait as the writer gets it: the runner's frame under the run's claim, and for a human
    decision the routes of its audience (the supervisor's channels configuration): one delivery
    each, reserved in the same commit."""

    routes: list[ChannelRoute] = Field(default_factory=list, max_length=64)


class NodeEffectReserveFrame(Frame):
    """A runner reserves its action, shell or http node's effect, or adopts it after a crash.

    The key is deterministic: run id, effect type, full compiled node path and
    node visit number; every attempt of one visit shares it.
    """

    kind: ClassVar[str] = "node.reserve_effect"
    attempt_id: Id
    effect_type: str = Field(min_length=1, max_length=128)
    recovery_policy: RecoveryPolicy
    performer: NodeEffectPerformer
    payload: BlobValue
    max_attempts: int = Field(default=5, ge=1, le=1000)


class NodeEffectReserve(UnderRunClaim, NodeEffectReserveFrame):
    """node.reserve_effect as the writer gets it: the runner's frame under the run's claim."""


class CheckpointAnswer(Command):
    """The answer to a waiting checkpoint: it becomes the node's output, in the same run."""

    kind: ClassVar[str] = "checkpoint.answer"
    run_id: Id
    expected_revision: int | None = Field(default=None, ge=1)
    node_path: str = Field(min_length=1, max_length=1024)
    answer: BlobValue

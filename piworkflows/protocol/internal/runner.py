"""Frames between the supervisor and a runner child (runner/run.py, supervisor/scheduler.py).

::

    supervisor ── launch RunnerLaunch ──> runner
    runner ── node.start | node.finish | node.wait | run.finish | node.reserve_effect
              (nodes.py: the runner's part; the supervisor adds the run, its claim and the
              expected revision and forwards the writer command of the same name) ──> supervisor
           ── node.request_agent (agents.py: an agent step; forwarded the same way)
           ── effect.settle (effects.py: an action body's attempt; forwarded under the effect's claim)
           ── effect.await EffectAwait (answered by the supervisor when the pool settled it)
           <── reply Reply (each of the above)
    runner ── exiting RunnerExiting ──> supervisor (the runner is done with the run)

``RUNNER_FRAMES`` lists what a runner sends; the scheduler relays them through
one table with exactly these keys (``tests/unit/test_registry.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from piworkflows.protocol.internal.agents import NodeRequestAgentFrame
from piworkflows.protocol.internal.base import Frame, Id, Model
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.nodes import (
    NodeEffectReserveFrame,
    NodeFinishFrame,
    NodeStartFrame,
    NodeWaitFrame,
    RunFinishFrame,
)
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.values import NodeOutcome, RunnerParkReason


class CompletedStep(Model):
    """A finished attempt of the run so far, in step order: an interrupted one counts as a step and
    its visit continues with the next attempt number."""

    node_path: str
    visit_number: int
    attempt_number: int
    outcome: NodeOutcome
    output: Any = None
    interrupted: bool
    error: str | None = None  # a failed step's error (its start), and code: a run that ends with it names them
    error_code: str | None = None


class RunnerLaunch(Frame):
    """pi-workflows.runner-launch.v1: everything a runner child needs, and nothing secret."""

    kind: ClassVar[str] = "launch"
    run_id: Id
    lease_generation: int
    runner_epoch: int
    project_path: str
    source: RunSource
    definition_digest: str  # "sha256:<hex>"
    input: Any = None
    steps: list[CompletedStep] = Field(default_factory=list)


class EffectAwait(Frame):
    """A runner waits while the outbox pool performs its node's effect: answered with the effect's
    status once the pool settled it (or after effect_await_ms); the runner then reserves again."""

    kind: ClassVar[str] = "effect.await"
    effect_id: Id


class RunnerExiting(Frame):
    """The runner is done with its run (it may serve the next launch); ``park_reason`` when it asks
    the run to park: its code changed, or an effect only an operator can resolve."""

    kind: ClassVar[str] = "exiting"
    park_reason: RunnerParkReason | None = None
    detail: str | None = Field(default=None, max_length=2000)  # why it parks, in words (what changed)


# What a runner sends, by kind.
RUNNER_FRAMES: dict[str, type[Frame]] = {
    model.kind: model
    for model in (
        NodeStartFrame,
        NodeFinishFrame,
        NodeWaitFrame,
        RunFinishFrame,
        NodeRequestAgentFrame,
        NodeEffectReserveFrame,
        EffectSettleFrame,
        EffectAwait,
        RunnerExiting,
    )
}

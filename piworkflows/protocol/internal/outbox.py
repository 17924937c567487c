"""Frames between the supervisor's outbox pool and an outbox worker child (outbox/worker.py,
supervisor/outbox.py).

::

    worker ── ready WorkerReady ──> pool              (once, at its start: it reads its input now)
    pool ── perform PerformEffect ──> worker          (an effect claimed for it: its attempt is recorded)
    worker ── spawned CommandSpawned ──> pool         (a command group, into host.json before it runs)
           <── reply Reply (accepted: recorded; else the worker ends the group: nothing ran)
    worker ── blob.put_part BlobPutPartFrame ──> pool (content.py: a command's stream, in parts,
           <── reply Reply                              forwarded as blob.put_part or blob.put)
    worker ── effect.settle EffectSettleFrame ──> pool (effects.py: forwarded under the effect's claim)

``POOL_FRAMES`` lists what the pool sends a worker and ``WORKER_FRAMES`` what a
worker sends; each side handles them through one table with exactly these keys
(``tests/unit/test_registry.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import Frame, Id
from piworkflows.protocol.internal.content import BlobPutPartFrame
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.values import PoolPerformer, RecoveryPolicy


class PerformEffect(Frame):
    """An effect the pool claimed for this worker: one attempt, with its numbered attempt recorded
    before the worker acts. The worker holds no claim token."""

    kind: ClassVar[str] = "perform"
    effect_id: Id
    performer: PoolPerformer
    idempotency_key: str
    recovery_policy: RecoveryPolicy
    payload: dict[str, Any]


class WorkerReady(Frame):
    """The worker started (its performers imported) and reads its input: an effect handed to it now
    is read. One that dies before saying so surely did not act on the effect it was handed."""

    kind: ClassVar[str] = "ready"


class CommandSpawned(Frame):
    """A performer started a process group (its leader): the pool records its identity in host.json
    before the group runs anything, and answers whether it did."""

    kind: ClassVar[str] = "spawned"
    pid: int = Field(ge=1)


# What the pool sends a worker, and what a worker sends, by kind.
POOL_FRAMES: dict[str, type[Frame]] = {PerformEffect.kind: PerformEffect}
WORKER_FRAMES: dict[str, type[Frame]] = {
    model.kind: model for model in (WorkerReady, CommandSpawned, BlobPutPartFrame, EffectSettleFrame)
}

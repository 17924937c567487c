"""Protected human decisions (writer/commands/decisions.py): what a human_decision node asks, a
human's answer, and the server's deadline sweep.

::

    runner ── node.wait {attempt_id, request, decision: DecisionAsk} ──> writer: a human_decisions row
    operator / human ── decision.answer {run, node_path, choice, input?} ──> one winner (or its name)
    server ── decision.next {} ──> the earliest deadline of a decision still open (a read)
    server ── decision.expire {} ──> every due deadline: its timeout policy, or expiry
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import BlobValue, Command, Id, Model, ReadCommand

MAX_DECISION_TEXT = 4000  # characters of a text input (workflows/compiler.py checks the default's)


class DecisionAsk(Model):
    """A human_decision node's wait: who may answer, and what happens at its deadline."""

    audience: str = Field(min_length=1, max_length=64)
    after_ms: int | None = Field(default=None, gt=0)  # the deadline, from the wait's commit
    default_response: BlobValue | None = None  # {choice, input?}: the timeout policy (none: it expires)


class DecisionAnswer(Command):
    """A verified human's answer to a waiting decision: actor class operator (the CLI) or human (a
    person's Pi); a model's or an undeclared client's answer is refused and never competes."""

    kind: ClassVar[str] = "decision.answer"
    run_id: Id
    expected_revision: int | None = Field(default=None, ge=1)
    node_path: str = Field(min_length=1, max_length=1024)
    decision_id: Id | None = None
    choice: str = Field(min_length=1, max_length=128)
    input: str | None = Field(default=None, min_length=1, max_length=MAX_DECISION_TEXT)


class DecisionNext(ReadCommand):
    """When the server's deadline timer must sweep next: the earliest open deadline (a read, so a
    timer with nothing due commits nothing)."""

    kind: ClassVar[str] = "decision.next"


class DecisionExpire(Command):
    """The server's sweep (its timer and startup): every decision whose deadline passed gets its
    timeout policy's response, or expires when it has none."""

    kind: ClassVar[str] = "decision.expire"

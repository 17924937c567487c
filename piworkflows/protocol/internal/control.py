"""Control commands on a run: cancel, pause, resume, restart (writer/commands/control.py)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import Command, Id


class RunControl(Command):
    """A control command on a run, at the client's expected revision if it names one."""

    run_id: Id
    expected_revision: int | None = Field(default=None, ge=1)


class RunCancel(RunControl):
    """Cancel a run: the terminal state and its receipt commit before the runner is stopped."""

    kind: ClassVar[str] = "run.cancel"


class RunPause(RunControl):
    """Pause: park at the last durable boundary, release the claim, stop the runner, with the receipt."""

    kind: ClassVar[str] = "run.pause"


class RunResume(RunControl):
    """Resume a paused run (or one parked for runnerNoProgress/workflowSourceChanged): queued again."""

    kind: ClassVar[str] = "run.resume"


class RunRestart(RunControl):
    """A finished run gets a child run (lineage restart) with the same definition and input."""

    kind: ClassVar[str] = "run.restart"
    expected_revision: int = Field(ge=1)  # required: the parent's runRevision
    child_run_id: Id

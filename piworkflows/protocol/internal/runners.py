"""Admission, runner records and claim renewal (writer/commands/runners.py)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from piworkflows.protocol.internal.base import BlobValue, Claim, Command, Digest, Id, ReadCommand
from piworkflows.protocol.internal.values import LaunchCommand, RunnerOutcome, RunnerParkReason
from piworkflows.states import MEDIA_TEXT

MAX_PARK_DETAIL_BYTES = 1024  # a dead runner's last stderr line (settings bound it to fewer characters)


class RunClaim(Command):
    """Admission: a new claim generation on a claimable run, its runner epoch recorded before spawn."""

    kind: ClassVar[str] = "run.claim"
    run_id: Id
    server_epoch: int = Field(ge=1)
    owner_id: Id
    claim_token_hash: Digest
    ttl_ms: int = Field(ge=1)
    launch_command: LaunchCommand


class RunnerSpawned(Command):
    """The runner process exists: its exact identity, right after the spawn."""

    kind: ClassVar[str] = "runner.spawned"
    run_id: Id
    runner_epoch: int = Field(ge=1)
    claim: Claim
    pid: int = Field(ge=1)
    process_started_at: int = Field(ge=0)


class RunnerExited(Command):
    """A runner ended: its outcome, and where the run goes (the respawn rules)."""

    kind: ClassVar[str] = "runner.exited"
    run_id: Id
    runner_epoch: int = Field(ge=1)
    outcome: RunnerOutcome
    stopped_by_server: bool  # pause, cancel, shutdown or a supervisor crash: never "no progress"
    # the runner refused to run changed code, or met an effect only an operator can resolve
    park_reason: RunnerParkReason | None = None
    # a runner that died: its last stderr line (the exception class and message), kept with a
    # runnerNoProgress park as the runner.exited event's payload
    park_detail: BlobValue | None = None
    # a runner that died (outcome crashed) after the run advanced: the run is queued again after
    # crash_backoff_ms, doubled for each death in a row at the same node visit; at crash_limit
    # deaths there it parks runnerNoProgress instead, the count in its detail
    crash_limit: int = Field(default=3, ge=1)
    crash_backoff_ms: int = Field(default=1000, ge=0)

    @model_validator(mode="after")
    def _short_text(self) -> RunnerExited:
        if self.park_detail is not None and (
            self.park_detail.media_type != MEDIA_TEXT or len(self.park_detail.data) > MAX_PARK_DETAIL_BYTES
        ):
            raise ValueError(f"a park detail is text of at most {MAX_PARK_DETAIL_BYTES} bytes")
        return self


class ClaimRenew(Command):
    """The supervisor keeps a runner's claim alive while workflow code blocks."""

    kind: ClassVar[str] = "claim.renew"
    resource_id: Id
    claim: Claim


class ResumeState(ReadCommand):
    """What a runner needs to continue a run from its last durable boundary."""

    kind: ClassVar[str] = "run.resume_state"
    run_id: Id


class ClaimableRuns(ReadCommand):
    """Runs the scheduler may claim, in admission order."""

    kind: ClassVar[str] = "run.claimable"
    limit: int = Field(default=16, ge=1, le=256)


class OrphanedRunners(ReadCommand):
    """Runner records no live runner serves: of older server epochs (startup recovery), or of
    this epoch but not among ``active_runner_epochs`` (a reply lost when the writer crashed)."""

    kind: ClassVar[str] = "runner.orphans"
    server_epoch: int = Field(ge=1)
    active_runner_epochs: list[int] = Field(default_factory=list, max_length=4096)

"""Frames between the supervisor and a runner child (runner/run.py, supervisor/scheduler.py)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from piworkflows.protocol.internal.base import Id, Model
from piworkflows.protocol.internal.runs import RunSource


class RunnerLaunch(Model):
    """pi-workflows.runner-launch.v1: everything a runner child needs, and nothing secret."""

    run_id: Id
    lease_generation: int
    runner_epoch: int
    project_path: str
    source: RunSource
    definition_digest: str  # "sha256:<hex>"
    input: Any = None
    steps: list[dict[str, Any]] = Field(default_factory=list)  # completed attempts, in order

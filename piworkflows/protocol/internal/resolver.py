"""Frames between the supervisor and a resolver child (runner/resolve.py, supervisor/resolver.py)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from piworkflows.protocol.internal.base import Model
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.values import WorkflowOrigin


class ResolveRequest(Model):
    """To a resolver child: find, load and compile a workflow; compute its title."""

    project_path: str
    workflow_name: str
    input: Any = None


class Resolution(Model):
    """From a resolver child: the compiled definition and source identity, or why not (``message``:
    for a module that failed to load, the file, line and what went wrong, workflows/failures.py)."""

    ok: bool
    code: str | None = None  # when not ok: workflowNotFound | invalidDefinition | titleFailed
    message: str | None = None
    workflow_name: str | None = None
    snapshot: bytes | None = None  # canonical JSON of the definition snapshot
    digest: str | None = None  # "sha256:<hex>" of the snapshot
    source: RunSource | None = None
    title: str | None = None
    max_steps: int | None = None


MAX_LISTED_WORKFLOWS = 256


class WorkflowShowRequest(Model):
    """To a resolver child: find, load and compile a workflow, to describe it (no input, no title)."""

    project_path: str
    workflow_name: str


class WorkflowShown(Model):
    """From a resolver child: the workflow that ``workflow_name`` finds, or why not (as Resolution)."""

    ok: bool
    code: str | None = None  # when not ok: workflowNotFound | invalidDefinition
    message: str | None = None
    workflow_name: str | None = None
    origin: WorkflowOrigin | None = None
    source: dict[str, str] | None = None  # as the run view shows it: kind, path and sha256, or id and revision
    description: str | None = None
    digest: str | None = None  # "sha256:<hex>" of the snapshot
    snapshot: dict[str, Any] | None = None  # the definition snapshot


class WorkflowListRequest(Model):
    """To a resolver child: every workflow source of the project, the user dir and the built-ins."""

    project_path: str


class LoadError(Model):
    """A workflow module that failed to load or compile (workflows/failures.py): ``text`` is the
    report (the file and line, then the offending line and caret, the missing module or the
    workflow file's frames)."""

    file: str
    line: int | None
    message: str
    text: str


class ListedWorkflow(Model):
    """One ``*.workflow.py`` file: ``shadowed_by`` names the origin whose file of the same name a
    run.start would find first; ``error`` says why it does not load (then no description)."""

    name: str
    origin: WorkflowOrigin
    source: dict[str, str] | None  # as WorkflowShown.source; None when the file cannot be read
    description: str | None = None
    shadowed_by: WorkflowOrigin | None = None
    error: LoadError | None = None


class WorkflowListing(Model):
    """From a resolver child: the workflows by name, then origin in resolve order; at most
    ``MAX_LISTED_WORKFLOWS`` (``truncated`` when there are more)."""

    project_directory: str
    user_directory: str
    items: list[ListedWorkflow] = Field(max_length=MAX_LISTED_WORKFLOWS)
    truncated: bool = False


RESOLVER_FRAMES: dict[str, tuple[type[Model], type[Model]]] = {
    "resolve": (ResolveRequest, Resolution),
    "show": (WorkflowShowRequest, WorkflowShown),
    "list": (WorkflowListRequest, WorkflowListing),
}

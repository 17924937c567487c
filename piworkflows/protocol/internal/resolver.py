"""Frames between the supervisor and a resolver child (runner/resolve.py, supervisor/resolver.py).

::

    supervisor ── resolve ResolveRequest ──────────> resolver child
               <── resolution Resolution ─────────
               ── show WorkflowShowRequest ───────>
               <── shown WorkflowShown ───────────
               ── list WorkflowListRequest ───────>
               <── listing WorkflowListing ───────
               ── validate ValidateRequest ───────>   an agent step's submitted output, judged
               <── validation Validation ─────────    by the run's own workflow code

``RESOLVER_FRAMES`` lists the requests by kind; each names the model of its
answer. The child answers them through one table with exactly these keys
(``tests/unit/test_registry.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import Frame, Model
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.values import WorkflowOrigin

MAX_LISTED_WORKFLOWS = 256


class Resolution(Frame):
    """From a resolver child: the compiled definition and source identity, or why not (``message``:
    for a module that failed to load, the file, line and what went wrong, workflows/failures.py)."""

    kind: ClassVar[str] = "resolution"
    ok: bool
    code: str | None = None  # when not ok: workflowNotFound | invalidDefinition | titleFailed
    message: str | None = None
    workflow_name: str | None = None
    snapshot: bytes | None = None  # canonical JSON of the definition snapshot
    digest: str | None = None  # "sha256:<hex>" of the snapshot
    source: RunSource | None = None
    title: str | None = None
    max_steps: int | None = None


class WorkflowShown(Frame):
    """From a resolver child: the workflow that ``workflow_name`` finds, or why not (as Resolution)."""

    kind: ClassVar[str] = "shown"
    ok: bool
    code: str | None = None  # when not ok: workflowNotFound | invalidDefinition
    message: str | None = None
    workflow_name: str | None = None
    origin: WorkflowOrigin | None = None
    source: dict[str, str] | None = None  # as the run view shows it: kind, path and sha256, or id and revision
    description: str | None = None
    digest: str | None = None  # "sha256:<hex>" of the snapshot
    snapshot: dict[str, Any] | None = None  # the definition snapshot


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


class WorkflowListing(Frame):
    """From a resolver child: the workflows by name, then origin in resolve order; at most
    ``MAX_LISTED_WORKFLOWS`` (``truncated`` when there are more)."""

    kind: ClassVar[str] = "listing"
    project_directory: str
    user_directory: str
    items: list[ListedWorkflow] = Field(max_length=MAX_LISTED_WORKFLOWS)
    truncated: bool = False


class Validation(Frame):
    """From a resolver child: an agent step's output accepted (``output``: as the node keeps it, a
    pydantic model's ``model_dump(mode="json")``) or refused with ``error``, short text the model
    can act on (never a traceback). ``code`` when refused: ``validationFailed`` (the output is
    wrong), ``validatorFailed`` (the workflow code could not judge it) or ``workflowSourceChanged``
    (the run's code changed since it started: it is not run)."""

    kind: ClassVar[str] = "validation"
    ok: bool
    output: Any = None
    error: str | None = None
    code: str | None = None


class ResolverRequest(Frame):
    """A request to a resolver child; ``answer`` is the model of the frame it answers with."""

    answer: ClassVar[type[Frame]]


class ResolveRequest(ResolverRequest):
    """To a resolver child: find, load and compile a workflow; compute its title."""

    kind: ClassVar[str] = "resolve"
    answer: ClassVar[type[Frame]] = Resolution
    project_path: str
    workflow_name: str
    module_timeout_ms: int = Field(default=10_000, ge=1)  # the module's load, named when it takes longer
    input: Any = None


class WorkflowShowRequest(ResolverRequest):
    """To a resolver child: find, load and compile a workflow, to describe it (no input, no title)."""

    kind: ClassVar[str] = "show"
    answer: ClassVar[type[Frame]] = WorkflowShown
    project_path: str
    workflow_name: str
    module_timeout_ms: int = Field(default=10_000, ge=1)  # the module's load, named when it takes longer


class WorkflowListRequest(ResolverRequest):
    """To a resolver child: every workflow source of the project, the user dir and the built-ins."""

    kind: ClassVar[str] = "list"
    answer: ClassVar[type[Frame]] = WorkflowListing
    project_path: str
    # how long one module may take to load before it is listed as "did not load within ..." (the
    # others are still listed); the whole request has resolve_timeout_ms
    module_timeout_ms: int = Field(default=10_000, ge=1)


class ValidateRequest(ResolverRequest):
    """To a resolver child: judge an agent step's submitted output (or a checkpoint's answer) with
    the run's workflow (loaded from its source as a runner loads it; a changed source or digest is
    refused)."""

    kind: ClassVar[str] = "validate"
    answer: ClassVar[type[Frame]] = Validation
    project_path: str
    source: RunSource
    definition_digest: str  # "sha256:<hex>"
    node_path: str = Field(min_length=1, max_length=1024)
    output: Any = None  # the submitted JSON value
    checkpoint_answer: bool = False  # the output is a checkpoint's answer: only its route is checked


# What a resolver child answers, by kind.
RESOLVER_FRAMES: dict[str, type[ResolverRequest]] = {
    model.kind: model for model in (ResolveRequest, WorkflowShowRequest, WorkflowListRequest, ValidateRequest)
}

"""The resolver child: find, load and compile workflows, outside the server.

::

    supervisor ── resolve ResolveRequest ──────> resolver child   discovery.resolve, load,
               <── resolution Resolution ──────                   compile, title(ctx)
               ── show WorkflowShowRequest ────>                   the same, no title
               <── shown WorkflowShown ────────
               ── list WorkflowListRequest ────>                   discovery.every_source,
               <── listing WorkflowListing ────                   each loaded and compiled
               ── validate ValidateRequest ────>                   the run's workflow, its agent
               <── validation Validation ──────                   step's checks (runner/validate.py)

(the frames: protocol/internal/resolver.py; each request is answered through one table, HANDLERS)

Workflow code (the module, its title function, an agent step's validate) runs only here, never in the
CLI, the supervisor or the writer. A module runs in a fresh namespace from
the bytes that were hashed, once per child and source (``discovery.compiled``);
the child answers requests until stdin closes, and the supervisor recycles it
after a bounded number of them. A module that fails to load is reported with
its file and line (``workflows/failures.py``); in a listing it is one item
with its error, never the end of the list, and so is one that takes longer than
the listing's ``module_timeout_ms`` to load (it hangs at import: SIGALRM ends its load).
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from piworkflows import canonical, faults
from piworkflows.protocol import domain, frames
from piworkflows.protocol.child_log import relay_logs
from piworkflows.protocol.internal.base import Frame
from piworkflows.protocol.internal.resolver import (
    MAX_LISTED_WORKFLOWS,
    RESOLVER_FRAMES,
    ListedWorkflow,
    LoadError,
    Resolution,
    ResolveRequest,
    ResolverRequest,
    ValidateRequest,
    WorkflowListing,
    WorkflowListRequest,
    WorkflowShown,
    WorkflowShowRequest,
)
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.runner.validate import validate
from piworkflows.states import WORKFLOW_ORIGINS
from piworkflows.workflows import CompiledWorkflow, WorkflowDefinitionError, discovery, failures
from piworkflows.workflows.compiler import NAME
from piworkflows.workflows.context import NodeContext

LISTED_TEXT = 1500  # a listed module's report
LISTING_BYTES = 640 * 1024  # no item is added past this many bytes of items: the answer fits one message
# What loading workflow code may raise: anything, a sys.exit() in module code too.
LOAD_FAILURES = (Exception, SystemExit)


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _compiled(
    workflow_name: str, project_path: str, module_timeout_ms: int
) -> tuple[discovery.ResolvedSource, CompiledWorkflow]:
    """The source ``workflow_name`` finds and its compiled workflow, or _Refused saying why not (a
    module that takes more than ``module_timeout_ms`` to load is named)."""
    try:
        source = discovery.resolve(workflow_name, Path(project_path))
    except discovery.WorkflowNotFound as exc:
        raise _Refused("workflowNotFound", str(exc)) from None
    except (OSError, WorkflowDefinitionError) as exc:  # unreadable, or a built-in without REVISION
        raise _Refused("invalidDefinition", str(exc)) from None
    try:
        with _within(module_timeout_ms):
            return source, discovery.compiled(source)
    except _TookTooLong:
        message = (
            f"the workflow module {source.path} did not load within {module_timeout_ms / 1000:g} s "
            "(a statement at import that blocks?); fix it, then try again"
        )
        raise _Refused("invalidDefinition", message) from None
    except LOAD_FAILURES as exc:
        invalid = isinstance(exc, WorkflowDefinitionError)
        prefix = "the workflow definition is invalid: " if invalid else "the workflow module failed to load: "
        raise _Refused("invalidDefinition", prefix + failures.describe(exc, source).text) from None


def resolve(request: ResolveRequest) -> Resolution:
    try:
        source, compiled = _compiled(request.workflow_name, request.project_path, request.module_timeout_ms)
    except _Refused as refused:
        return Resolution(ok=False, code=refused.code, message=str(refused))
    title = None
    if compiled.workflow.title is not None:
        try:
            title = domain.text(str(compiled.workflow.title(NodeContext(input=request.input))))[:1000]
        except LOAD_FAILURES as exc:
            message = "the title function failed: " + failures.describe(exc, source).text
            if not isinstance(request.input, dict):  # the likely cause, shown: not the title's fault
                message = f"{_not_an_object(request.input)}: the title function expects an object ({message})"
            return Resolution(ok=False, code="titleFailed", message=message)
    return Resolution(
        ok=True,
        workflow_name=compiled.workflow.name,
        snapshot=compiled.snapshot_bytes,
        digest=compiled.digest,
        source=RunSource.of_identity(source.identity),
        title=title,
        max_steps=compiled.workflow.max_steps,
    )


def _not_an_object(value: Any) -> str:
    """The run input that is no JSON object, shown (cut) with its JSON type."""
    kinds = {list: "a JSON array", str: "a JSON string", bool: "a JSON boolean", type(None): "JSON null"}
    kind = kinds.get(type(value), "a JSON number")
    text = canonical.dumps(value)
    shown = text if len(text) <= 80 else text[:77] + "..."
    return f'the run input is {shown}, {kind}, not an object: pass e.g. --input \'{{"key": "value"}}\''


def show(request: WorkflowShowRequest) -> WorkflowShown:
    try:
        source, compiled = _compiled(request.workflow_name, request.project_path, request.module_timeout_ms)
    except _Refused as refused:
        return WorkflowShown(ok=False, code=refused.code, message=str(refused))
    return WorkflowShown(
        ok=True,
        workflow_name=compiled.workflow.name,
        origin=source.origin,  # validated: one of WORKFLOW_ORIGINS
        source=source.identity.to_json(),
        description=compiled.workflow.description,
        digest=compiled.digest,
        snapshot=compiled.snapshot,
    )


def list_workflows(request: WorkflowListRequest) -> WorkflowListing:
    """Every source by name, then origin; each but the first of a name is shadowed by the first.
    At most MAX_LISTED_WORKFLOWS items and about LISTING_BYTES of them (``truncated`` when more)."""
    project = Path(request.project_path)
    found = sorted(discovery.every_source(project), key=lambda item: (item[1], WORKFLOW_ORIGINS.index(item[0])))
    first_origin: dict[str, str] = {}
    items: list[ListedWorkflow] = []
    size = 0
    for origin, name, path in found:
        winner = first_origin.setdefault(name, origin)
        if len(items) == MAX_LISTED_WORKFLOWS or size > LISTING_BYTES:
            break
        items.append(_listed(origin, name, path, None if winner == origin else winner, request.module_timeout_ms))
        size += len(items[-1].model_dump_json())
    directories = discovery.directories(project)
    return WorkflowListing(
        project_directory=str(directories["project"]),
        user_directory=str(directories["user"]),
        items=items,
        truncated=len(items) < len(found),
    )


class _TookTooLong(BaseException):
    """A module's load ran out of its time (a BaseException: workflow code's ``except Exception``
    does not swallow it)."""


@contextlib.contextmanager
def _within(timeout_ms: int) -> Iterator[None]:
    """Interrupt the code inside after ``timeout_ms`` (SIGALRM: the resolver's main thread runs it)."""

    def expired(signum: int, frame: Any) -> None:
        raise _TookTooLong

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout_ms / 1000)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _listed(origin: str, name: str, path: Path, shadowed_by: str | None, module_timeout_ms: int) -> ListedWorkflow:
    listed: dict[str, Any] = {"name": name, "origin": origin, "shadowed_by": shadowed_by, "source": None}
    if not NAME.match(name):
        message = f"{name!r} is not a workflow name ([A-Za-z_][A-Za-z0-9_-]*); rename the file"
        return ListedWorkflow(
            **listed, error=LoadError(file=str(path), line=None, message=message, text=f"{path}: {message}")
        )
    try:
        source = discovery.read(origin, name, path)
    except (OSError, WorkflowDefinitionError) as exc:
        message = str(exc)
        return ListedWorkflow(
            **listed, error=LoadError(file=str(path), line=None, message=message, text=f"{path}: {message}")
        )
    listed["source"] = source.identity.to_json()
    try:
        with _within(module_timeout_ms):
            compiled = discovery.compiled(source)
    except _TookTooLong:
        message = f"{name}: did not load within {module_timeout_ms / 1000:g} s (it hangs at import?)"
        return ListedWorkflow(
            **listed, error=LoadError(file=str(path), line=None, message=message, text=f"{path}: {message}")
        )
    except LOAD_FAILURES as exc:
        failure = failures.describe(exc, source, max_text=LISTED_TEXT)
        return ListedWorkflow(
            **listed, error=LoadError(file=failure.file, line=failure.line, message=failure.message, text=failure.text)
        )
    return ListedWorkflow(**listed, description=compiled.workflow.description)


# How each request is answered (protocol/internal/resolver.py RESOLVER_FRAMES, one to one).
HANDLERS: dict[str, Callable[[Any], Frame]] = {
    ResolveRequest.kind: resolve,
    WorkflowShowRequest.kind: show,
    WorkflowListRequest.kind: list_workflows,
    ValidateRequest.kind: validate,
}


def answer(kind: str, body: Any) -> Frame:
    """The answer to one request frame."""
    request: ResolverRequest = RESOLVER_FRAMES[kind].model_validate(body)
    answered = HANDLERS[kind](request)
    if kind == ValidateRequest.kind:
        faults.hit(faults.VALIDATOR_BEFORE_VERDICT)
    return answered


def main() -> int:
    """Answer request frames on stdin, one answer frame each, until stdin closes."""
    stdin, stdout = cast(io.BufferedReader, sys.stdin.buffer), sys.stdout.buffer
    relay_logs(stdout)  # the package's own log records, as LOG frames before an answer
    sys.stdout = sys.stderr  # workflow code that prints cannot corrupt the answer frames
    decoder = frames.FrameDecoder()
    while data := stdin.read1(1 << 16):
        for frame in decoder.feed(data):
            result = answer(frame["k"], frame["b"])
            try:
                data = frames.encode(result.kind, frame["id"], result.model_dump())
            except frames.Unencodable:  # text of workflow code with a lone surrogate: shown as U+FFFD
                data = frames.encode(result.kind, frame["id"], domain.texts(result.model_dump()))
            stdout.write(data)
            stdout.flush()
    return 0

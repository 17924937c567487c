"""The resolver child: find, load and compile one workflow, outside the server.

::

    supervisor ── ResolveRequest (a frame on stdin) ──> resolver child
               <── Resolution (a frame on stdout) ─────  discovery.resolve, load,
                                                          compile, title(ctx)

Workflow code (the module, its title function) runs only here, never in the
CLI, the supervisor or the writer. A module runs in a fresh namespace from
the bytes that were hashed, once per child and source (``discovery.compiled``);
the child answers requests until stdin closes, and the supervisor recycles it
after a bounded number of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from piworkflows.protocol import frames
from piworkflows.protocol.internal import Resolution, ResolveRequest, RunSource
from piworkflows.workflows import WorkflowDefinitionError, discovery
from piworkflows.workflows.context import NodeContext

RESOLUTION = "resolution"


def resolve(request: ResolveRequest) -> Resolution:
    try:
        source = discovery.resolve(request.workflow_name, Path(request.project_path))
        compiled = discovery.compiled(source)
    except discovery.WorkflowNotFound as exc:
        return Resolution(ok=False, code="workflowNotFound", message=str(exc))
    except WorkflowDefinitionError as exc:
        return Resolution(ok=False, code="invalidDefinition", message=str(exc))
    except Exception as exc:  # the module itself failed to load (syntax error, import error)
        message = f"the workflow module failed to load: {type(exc).__name__}"
        return Resolution(ok=False, code="invalidDefinition", message=message)
    title = None
    if compiled.workflow.title is not None:
        try:
            title = str(compiled.workflow.title(NodeContext(input=request.input)))[:1000]
        except Exception as exc:
            return Resolution(ok=False, code="titleFailed", message=f"the title function failed: {type(exc).__name__}")
    identity = source.identity
    return Resolution(
        ok=True,
        workflow_name=compiled.workflow.name,
        snapshot=compiled.snapshot_bytes,
        digest=compiled.digest,
        source=RunSource(
            source_kind=identity.source_kind,
            source_path=identity.source_path,
            source_sha256=identity.source_sha256,
            builtin_id=identity.builtin_id,
            builtin_revision=identity.builtin_revision,
        ),
        title=title,
        max_steps=compiled.workflow.max_steps,
    )


def main() -> int:
    """Answer ResolveRequests on stdin, one Resolution each, until stdin closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # workflow code that prints cannot corrupt the answer frames
    decoder = frames.FrameDecoder()
    while data := stdin.read1(1 << 16):
        for frame in decoder.feed(data):
            resolution = resolve(ResolveRequest.model_validate(frame["b"]))
            stdout.write(frames.encode(RESOLUTION, frame["id"], resolution.model_dump()))
            stdout.flush()
    return 0

"""Run a resolver child for run.start: workflow code never runs in the supervisor.

::

    resolve(project, workflow, input) ── spawn `python -m piworkflows.runner resolve`
        ── record identity (host.json) ── ResolveRequest on stdin
        <── Resolution on stdout, or a timeout: the child is killed
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Protocol

from piworkflows.protocol import frames
from piworkflows.protocol.internal import Resolution, ResolveRequest
from piworkflows.settings import Settings
from piworkflows.supervisor.registry import Identity

RESOLVER_MARKER = "piworkflows.runner"


class ChildRecorder(Protocol):
    def record_child(self, identity: Identity) -> None: ...

    def forget_child(self, pid: int) -> None: ...


async def resolve(
    recorder: ChildRecorder, settings: Settings, project_path: str, workflow_name: str, input_value: Any
) -> Resolution:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "piworkflows.runner", "resolve",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    recorder.record_child(Identity.of("resolver", proc.pid, RESOLVER_MARKER))
    try:
        request = ResolveRequest(project_path=project_path, workflow_name=workflow_name, input=input_value)
        out, _ = await asyncio.wait_for(
            proc.communicate(frames.encode("resolve", 1, request.model_dump())),
            timeout=settings.resolve_timeout_ms / 1000,
        )
        received = frames.FrameDecoder().feed(out)
        if len(received) != 1:
            return Resolution(ok=False, code="invalidDefinition", message="the workflow could not be resolved")
        return Resolution.model_validate(received[0]["b"])
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return Resolution(ok=False, code="invalidDefinition", message="loading the workflow took too long")
    except frames.FrameError:
        return Resolution(ok=False, code="invalidDefinition", message="the workflow could not be resolved")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        recorder.forget_child(proc.pid)

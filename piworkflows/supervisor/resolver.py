"""Resolver children for run.start, workflow.show, workflow.list and agent submissions: workflow
code never runs in the supervisor.

::

    Resolvers.resolve(project, workflow, input), .show(project, workflow), .list_workflows(project),
             .validate(project, source, digest, node path, output)
        an idle child (`python -m piworkflows.runner resolve`, package imported)
        or a new one ── request frame on stdin ──> <── answer frame (protocol/internal/resolver.py)
        ── back to the idle set; killed instead on a timeout or a broken answer,
           and recycled after ``MAX_USES`` requests; at most ``settings.resolvers``
           children exist, further requests wait for one; a request may take
           resolve_timeout_ms (validate_timeout_ms for a validation)
        ── an idle child that had no request for child_idle_exit_ms ends (an idle
           server keeps none: the first request after costs a child's start)

A run.start of a source already resolved skips the child: the supervisor runs
discovery itself (files and their bytes only, never workflow code: the same
first hit, shadowing included, and the same identity, a file's SHA-256 or a
built-in's declared revision) and, when that identity is one a child resolved
before for a workflow without a title function (nothing in the answer then
depends on the input), answers with that child's resolution (``_kept``, the
last ``KEPT`` sources). Anything else, a failure included, goes to a child.

A bare Python start costs well over 100 ms here, so children answer many
requests. Every child is in host.json while it lives; an idle child exits by
itself when the supervisor is gone (its stdin closes). A child's own log
records (LOG frames before its answer) go to server.log with its pid; its last
stderr lines are kept (supervisor/stderr.py) and written to server.log when it
is ended for a timeout or a broken answer (it died, or hung).
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

from piworkflows import faults
from piworkflows.protocol import frames
from piworkflows.protocol.internal.base import MAX_FRAME_BYTES, Frame
from piworkflows.protocol.internal.resolver import (
    Resolution,
    ResolveRequest,
    ResolverRequest,
    ValidateRequest,
    Validation,
    WorkflowListing,
    WorkflowListRequest,
    WorkflowShown,
    WorkflowShowRequest,
)
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.writer import LogRecord
from piworkflows.settings import Settings
from piworkflows.supervisor.logs import relay_child_log
from piworkflows.supervisor.seams import ChildRecorder
from piworkflows.supervisor.spawn import spawn_child
from piworkflows.supervisor.stderr import StderrTail, exit_text
from piworkflows.workflows import WorkflowDefinitionError, discovery

log = logging.getLogger("piworkflows.supervisor")

RESOLVER_MARKER = "piworkflows.runner"
MAX_USES = 1000
KEPT = 64  # resolutions kept by source identity
UNRESOLVED = "the workflow code could not be loaded (its resolver child broke)"
UNVALIDATED = "the output could not be validated (the workflow code's child broke)"


class Unanswered(Exception):
    """The child took too long or broke (it was ended); the message says which."""


class _Child:
    def __init__(self, proc: asyncio.subprocess.Process, stderr: StderrTail) -> None:
        self.proc = proc
        self.stderr = stderr
        self.uses = 0
        self.idle_since = 0.0  # the event loop's clock: when it answered its last request


class Resolvers:
    def __init__(self, recorder: ChildRecorder, settings: Settings) -> None:
        self.recorder = recorder
        self.settings = settings
        self._idle: list[_Child] = []
        self._slots = asyncio.Semaphore(settings.resolvers)
        self._failures = 0  # children that broke or hung so far
        self._kept: OrderedDict[tuple[str, RunSource], Resolution] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None

    async def _spawn(self) -> _Child:
        # Like a restarted outbox worker, a child started after one broke runs without fault rules:
        # a crash point fires in the resolvers started before the first failure only.
        env = None if not self._failures else {k: v for k, v in os.environ.items() if k != faults.ENV}
        proc, stderr = await spawn_child(
            "resolver",
            RESOLVER_MARKER,
            ("piworkflows.runner", "resolve"),
            self.recorder,
            self.settings,
            own_group=False,
            env=env,
        )
        return _Child(proc, stderr)

    async def resolve(self, project_path: str, workflow_name: str, input_value: Any) -> Resolution:
        found = _discovered(project_path, workflow_name)
        key = (str(found.path), RunSource.of_identity(found.identity)) if found is not None else None
        if key is not None and (kept := self._kept.get(key)) is not None:
            self._kept.move_to_end(key)
            return kept
        request = ResolveRequest(
            project_path=project_path, workflow_name=workflow_name, input=input_value, module_timeout_ms=self._module_ms
        )
        answer = await self._ask_definition(request)
        assert isinstance(answer, Resolution)
        if key is not None and answer.ok and answer.title is None and answer.source == key[1]:
            self._kept[key] = answer  # no title function: the answer is the source's alone
            if len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return answer

    async def show(self, project_path: str, workflow_name: str) -> WorkflowShown:
        request = WorkflowShowRequest(
            project_path=project_path, workflow_name=workflow_name, module_timeout_ms=self._module_ms
        )
        answer = await self._ask_definition(request)
        assert isinstance(answer, WorkflowShown)
        return answer

    async def _ask_definition(self, request: ResolveRequest | WorkflowShowRequest) -> Frame:
        """The child's answer about one workflow; a child that could not answer makes it an invalid
        definition with the reason (its load error, a timeout, its exit)."""
        try:
            return await self._ask(request)
        except Unanswered as exc:
            return request.answer.model_validate({"ok": False, "code": "invalidDefinition", "message": str(exc)})

    @property
    def _module_ms(self) -> int:
        """How long one module may take to load: a third of the request's time, so that a module
        that hangs is named (and, in a listing, the others still listed)."""
        return max(1, self.settings.resolve_timeout_ms // 3)

    async def list_workflows(self, project_path: str) -> WorkflowListing:
        """Every workflow of the project, the user dir and the built-ins; Unanswered if the child
        took too long (a module that hangs) or broke."""
        answer = await self._ask(WorkflowListRequest(project_path=project_path, module_timeout_ms=self._module_ms))
        assert isinstance(answer, WorkflowListing)
        return answer

    async def validate(
        self,
        project_path: str,
        source: RunSource,
        definition_digest: str,
        node_path: str,
        output: Any,
        answer: bool = False,
    ) -> Validation:
        """The run's workflow code judges an agent step's submitted output, or the route of a
        checkpoint's ``answer`` (runner/validate.py); Unanswered if it took longer than
        validate_timeout_ms or the child broke (the caller rejects the submission
        ``validatorFailed``)."""
        request = ValidateRequest(
            project_path=project_path,
            source=source,
            definition_digest=definition_digest,
            node_path=node_path,
            output=output,
            checkpoint_answer=answer,
        )
        verdict = await self._ask(request, self.settings.validate_timeout_ms, "validating the output")
        assert isinstance(verdict, Validation)
        return verdict

    async def _ask(
        self, request: ResolverRequest, timeout_ms: int | None = None, doing: str = "loading the workflow code"
    ) -> Frame:
        limit = self.settings.resolve_timeout_ms if timeout_ms is None else timeout_ms
        async with self._slots:
            child = self._idle.pop() if self._idle else await self._spawn()
            child.stderr.take()  # what it said for earlier requests was theirs
            try:
                async with asyncio.timeout(limit / 1000):
                    answer = await self._exchange(child, request)
            except TimeoutError:
                await self._end(child, failed=True)
                raise Unanswered(f"{doing} took too long (more than {limit} ms)") from None
            except (OSError, EOFError, asyncio.IncompleteReadError, frames.FrameError, ValueError):
                await self._end(child, failed=True)
                raise Unanswered(UNRESOLVED if request.kind != ValidateRequest.kind else UNVALIDATED) from None
            child.uses += 1
            if child.uses >= MAX_USES:
                await self._end(child)
            else:
                child.idle_since = asyncio.get_running_loop().time()
                self._idle.append(child)
                if self._reaper is None or self._reaper.done():
                    self._reaper = asyncio.create_task(self._end_idle(), name="resolver-idle")
            return answer

    async def _end_idle(self) -> None:
        """End each idle child once it had no request for child_idle_exit_ms."""
        limit = self.settings.child_idle_exit_ms / 1000
        loop = asyncio.get_running_loop()
        while self._idle:
            await asyncio.sleep(max(0.0, min(c.idle_since for c in self._idle) + limit - loop.time()))
            now = loop.time()
            ended = [c for c in self._idle if now - c.idle_since >= limit]
            self._idle = [c for c in self._idle if c not in ended]
            for child in ended:
                await self._end(child)

    async def _exchange(self, child: _Child, request: ResolverRequest) -> Frame:
        assert child.proc.stdin is not None and child.proc.stdout is not None
        child.proc.stdin.write(frames.encode(request.kind, child.uses + 1, request.model_dump()))
        await child.proc.stdin.drain()
        while True:  # its log records, then the answer
            (length,) = struct.unpack(">I", await child.proc.stdout.readexactly(4))
            if length > MAX_FRAME_BYTES:
                raise frames.FrameError("oversized answer")
            payload = await child.proc.stdout.readexactly(length)
            (frame,) = frames.FrameDecoder().feed(struct.pack(">I", length) + payload)
            if frame["k"] != LogRecord.kind:
                return request.answer.model_validate(frame["b"])
            relay_child_log("resolver", child.proc.pid, frame["b"])

    async def _end(self, child: _Child, failed: bool = False) -> None:
        """End the child; one that ``failed`` a request leaves its last stderr lines in server.log
        (a child that broke gets the drain time to finish exiting, so its exit status is its own)."""
        if failed and child.proc.returncode is None:
            try:
                async with asyncio.timeout(self.settings.child_stderr_drain_ms / 1000):
                    await child.proc.wait()
            except TimeoutError:
                pass
        if child.proc.returncode is None:
            child.proc.kill()
        returncode = await child.proc.wait()
        self.recorder.forget_child(child.proc.pid)
        if failed:
            self._failures += 1
            await child.stderr.drained(self.settings.child_stderr_drain_ms / 1000)
            log.warning("resolver %d failed a request: %s", child.proc.pid, exit_text("resolver", returncode))
            for line in child.stderr.take():
                log.warning("resolver %d stderr: %s", child.proc.pid, line)
        child.stderr.close()

    async def close(self) -> None:
        """At shutdown: end the idle children."""
        if self._reaper is not None:
            self._reaper.cancel()
        idle, self._idle = self._idle, []
        for child in idle:
            await self._end(child)


def _discovered(project_path: str, workflow_name: str) -> discovery.ResolvedSource | None:
    """The source a child would find for ``workflow_name`` (read, not run), or None where the
    child is to say why not."""
    try:
        return discovery.resolve(workflow_name, Path(project_path))
    except (discovery.WorkflowNotFound, OSError, WorkflowDefinitionError):
        return None

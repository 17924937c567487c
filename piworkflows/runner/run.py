"""The runner child: executes one run's workflow code, one node at a time.

::

    supervisor ── launch (RunnerLaunch: source identity, digest, input, completed steps) ──> runner
    runner ── node.start ──> supervisor (claim + expected revision attached) ──> writer
           <── reply ──────
    runner ── node.finish (outcome, output or error, next node or end) ──> ... ──> writer
    runner ── exiting ──> and waits for the next launch (the supervisor recycles it)

The runner holds no claim token and never opens SQLite. It refuses changed
code: a source whose SHA-256 (or built-in revision) or definition digest
differs from the run's makes it exit asking to park the run
``workflowSourceChanged``. A reply other than accepted (a stale claim) ends
it at once.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any, BinaryIO

from piworkflows.protocol import frames
from piworkflows.protocol.internal import BlobValue, Reply, RunnerLaunch
from piworkflows.workflows import CompiledWorkflow, discovery, routing
from piworkflows.workflows.context import NodeContext
from piworkflows.workflows.nodes import CheckpointNode, ComputeNode, NotifyNode

LAUNCH, EXITING = "launch", "exiting"


class Channel:
    def __init__(self, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self.stdin, self.stdout = stdin, stdout
        self.decoder = frames.FrameDecoder()
        self.pending: list[dict[str, Any]] = []
        self.ids = 0

    def receive(self) -> dict[str, Any]:
        while not self.pending:
            data = self.stdin.read1(1 << 16)  # type: ignore[attr-defined]
            if not data:
                raise SystemExit(0)  # the supervisor is gone
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def send(self, kind: str, body: dict[str, Any]) -> int:
        self.ids += 1
        self.stdout.write(frames.encode(kind, self.ids, body))
        self.stdout.flush()
        return self.ids

    def request(self, kind: str, body: dict[str, Any]) -> Reply:
        self.send(kind, body)
        return Reply.model_validate(self.receive()["b"])


def load_checked(launch: RunnerLaunch) -> CompiledWorkflow | None:
    """The run's workflow, or None if its code changed since the run started."""
    source = launch.source
    if source.source_kind == "file":
        assert source.source_path is not None
        path = Path(source.source_path)
        data = path.read_bytes() if path.is_file() else b""
        if hashlib.sha256(data).digest() != source.source_sha256:
            return None
        resolved = discovery.ResolvedSource(
            discovery.SourceIdentity("file", source.source_path, source.source_sha256),
            path.name.removesuffix(discovery.SUFFIX), path, data,
        )  # fmt: skip
    else:
        assert source.builtin_id is not None
        try:
            resolved = discovery.resolve(source.builtin_id, Path(launch.project_path))
        except discovery.WorkflowNotFound:
            return None
        if resolved.identity.builtin_revision != source.builtin_revision:
            return None
    compiled = discovery.load(resolved).compile()
    return compiled if compiled.digest == launch.definition_digest else None


def execute(node: Any, ctx: NodeContext) -> Any:
    if isinstance(node, ComputeNode):
        return node.run(ctx)
    if isinstance(node, NotifyNode):
        message = node.message(ctx) if callable(node.message) else node.message
        return {"kind": node.notify_kind, "message": str(message)}
    raise NotImplementedError(f"{node.kind} nodes are not executable by this build's runner yet")


def _scope(path: str) -> str:
    """The mount scope of a full node path: "a/b/node" -> "a/b/", "node" -> ""."""
    return path.rsplit("/", 1)[0] + "/" if "/" in path else ""


def make_context(
    compiled: CompiledWorkflow, run_input: Any, outputs: dict[str, Any], results: dict[str, Any], scope: str
) -> NodeContext:
    """A node sees its own workflow: sibling outputs by local name, its include's input."""
    if scope:
        mount = scope[:-1]
        include = compiled.mounts[mount]
        parent = make_context(compiled, run_input, outputs, results, _scope(mount))
        scoped_input = include.input(parent) if include.input is not None else {}
    else:
        scoped_input = run_input
    return NodeContext(
        input=scoped_input,
        outputs={k[len(scope) :]: v for k, v in outputs.items() if k.startswith(scope)},
        results={k[len(scope) :]: v for k, v in results.items() if k.startswith(scope)},
    )


def run(channel: Channel, launch: RunnerLaunch) -> dict[str, Any]:
    """Execute the run from its last durable boundary; returns the exiting message."""
    compiled = load_checked(launch)
    if compiled is None:
        return {"parkReason": "workflowSourceChanged"}
    outputs: dict[str, Any] = {}
    results: dict[str, Any] = {}
    visits: dict[str, int] = {}
    retries: dict[tuple[str, int], int] = {}  # an interrupted visit continues with its next attempt number
    path: str | None = compiled.start_at
    for step in launch.steps:
        if step["interrupted"]:
            retries[(step["nodePath"], step["visit"])] = step["attempt"]
            continue
        visits[step["nodePath"]] = max(visits.get(step["nodePath"], 0), step["visit"])
        results[step["nodePath"]] = {"outcome": step["outcome"], "output": step["output"]}
        if step["outcome"] == "ok":
            outputs[step["nodePath"]] = step["output"]
        path = routing.route(compiled, step["nodePath"], step["outcome"], step["output"]).next_node
    executed = len(launch.steps)  # interrupted attempts count: each took a step
    max_steps = compiled.workflow.max_steps
    while path is not None:
        node = compiled.nodes[path]
        visit = visits.get(path, 0) + 1
        attempt = retries.get((path, visit), 0) + 1
        started = channel.request(
            "node.start", {"node_path": path, "node_kind": node.kind, "visit_number": visit, "attempt_number": attempt}
        )
        if started.outcome not in ("accepted", "adopted") or started.receipt is None:
            return {}  # fenced: a stale runner stops at once
        visits[path] = visit
        executed += 1
        finish: dict[str, Any] = {"attempt_id": started.receipt["attemptId"]}
        ctx = make_context(compiled, launch.input, outputs, results, _scope(path))
        if isinstance(node, CheckpointNode):
            request: dict[str, Any] = {"summary": str(node.summary(ctx) if callable(node.summary) else node.summary)}
            if node.run is not None:
                request["details"] = node.run(ctx)
            channel.request("node.wait", {**finish, "request": BlobValue.of_json(request).model_dump()})
            return {}  # the run waits with no runner; the answer completes the node and requeues the run
        try:
            output = execute(node, ctx)
            value = BlobValue.of_json(output)
            finish.update(outcome="ok", output=value.model_dump())
            outputs[path] = results[path] = output
            route = routing.route(compiled, path, "ok", output)
        except Exception as exc:  # the node failed; its error is text, never a traceback
            finish.update(outcome="failed", error=BlobValue.of_text(f"{type(exc).__name__}: {exc}"[:4000]).model_dump())
            results[path] = {"outcome": "failed"}
            route = routing.route(compiled, path, "failed")
        if route.routing_error is not None:
            finish.update(end_status="failed", error_code="routingError",
                          error=BlobValue.of_text(route.routing_error).model_dump())  # fmt: skip
        elif route.next_node is not None and executed >= max_steps:
            finish.update(end_status="failed", error_code="maxStepsExceeded",
                          error=BlobValue.of_text(f"the run reached max_steps={max_steps}").model_dump())  # fmt: skip
        elif route.next_node is not None:
            finish["next_node"] = route.next_node
        else:
            finish["end_status"] = route.end_status
        finished = channel.request("node.finish", finish)
        if finished.outcome not in ("accepted", "adopted"):
            return {}
        path = finish.get("next_node")
    return {}


def main() -> int:
    """Serve launches one after another (one run each) until stdin closes."""
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    sys.stdout = sys.stderr  # workflow code that prints cannot corrupt the channel
    while True:
        frame = channel.receive()  # SystemExit(0) when the supervisor closes stdin
        if frame["k"] != LAUNCH:
            return 2
        channel.send(EXITING, run(channel, RunnerLaunch.model_validate(frame["b"])))

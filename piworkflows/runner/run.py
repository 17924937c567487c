"""The runner child: executes one run's workflow code, one node at a time.

::

    supervisor ── launch (RunnerLaunch: source identity, digest, input, completed steps) ──> runner
    runner ── node.start ──> supervisor (claim + expected revision attached) ──> writer
           <── reply ──────
    runner ── node.finish (outcome, output or error, next node or end) ──> ... ──> writer
    runner ── node.wait (a checkpoint) | node.request_agent (an agent step, runner/agent.py):
              the run waits with no runner; its answer or accepted output requeues it
    runner ── run.finish (no node active: the route of an answered checkpoint or a settled agent
              step ends the run, or the module failed to load here) ──> ... ──> writer
    runner ── exiting ──> and waits for the next launch (the supervisor recycles it)

Every frame is a model of ``protocol/internal/runner.py`` (the node frames of
``nodes.py``), sent under its model's kind.

The runner holds no claim token and never opens SQLite. It refuses changed
code: a source whose SHA-256 (or built-in revision) or definition digest
differs from the run's makes it exit asking to park the run
``workflowSourceChanged`` (and says so in server.log: its own log records go to
the supervisor as LOG frames, protocol/child_log.py). A reply other than accepted (a stale claim) ends
it at once. Workflow code that fails outside a node's own execution (the
module's load, the route after an answer, an include's input) fails the run
with an error naming the file or node; the runner never dies of it.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path
from typing import Any, BinaryIO

from piworkflows import canonical, performers
from piworkflows.performers import Outcome
from piworkflows.performers import http as http_performer
from piworkflows.performers import shell as shell_performer
from piworkflows.protocol import domain, frames
from piworkflows.protocol.child_log import relay_logs
from piworkflows.protocol.internal.base import BlobValue, Frame
from piworkflows.protocol.internal.decisions import DecisionAsk
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.nodes import (
    NodeEffectReserveFrame,
    NodeFinishFrame,
    NodeStartFrame,
    NodeWaitFrame,
    RunFinishFrame,
)
from piworkflows.protocol.internal.runner import CompletedStep, EffectAwait, RunnerExiting, RunnerLaunch
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.writer import Reply
from piworkflows.runner import agent
from piworkflows.states import EFFECT_WORK_STATUSES, RUN_FINISH_STATUSES
from piworkflows.workflows import CompiledWorkflow, discovery, failures, routing
from piworkflows.workflows.context import NodeContext
from piworkflows.workflows.nodes import (
    ActionNode,
    AgentNode,
    CheckpointNode,
    ComputeNode,
    HttpNode,
    HumanDecisionNode,
    NotifyNode,
    ShellNode,
)

log = logging.getLogger("piworkflows.runner")


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

    def send(self, frame: Frame) -> int:
        self.ids += 1
        self.stdout.write(frames.encode(frame.kind, self.ids, frame.model_dump()))
        self.stdout.flush()
        return self.ids

    def request(self, frame: Frame) -> Reply:
        self.send(frame)
        return Reply.model_validate(self.receive()["b"])


def source_of(source: RunSource, project_path: str) -> discovery.ResolvedSource | None:
    """The run's source as its bytes are now (its file may have changed since the run started:
    ``load_checked`` judges by the definition), or None when its file or built-in is gone."""
    if source.source_kind == "file":
        assert source.source_path is not None
        path = Path(source.source_path)
        if not path.is_file():
            return None
        data = path.read_bytes()
        return discovery.ResolvedSource(
            discovery.SourceIdentity("file", source.source_path, hashlib.sha256(data).digest()),
            path.name.removesuffix(discovery.SUFFIX),
            path,
            data,
        )
    assert source.builtin_id is not None
    try:
        return discovery.resolve(source.builtin_id, Path(project_path))
    except discovery.WorkflowNotFound:
        return None


def load_checked(resolved: discovery.ResolvedSource | None, definition_digest: str) -> CompiledWorkflow | None:
    """The run's workflow, or None when its definition changed since the run started. A source
    whose compiled definition is the same (a comment, a function's body) goes on: the definition
    (nodes, edges, effects) is what the run's stored steps were recorded against."""
    if resolved is None:
        return None
    compiled = discovery.compiled(resolved)
    return compiled if compiled.digest == definition_digest else None


def source_changed(source: RunSource, resolved: discovery.ResolvedSource | None, definition_digest: str) -> str:
    """Why a run cannot go on with its source as it is now: what changed, in words."""
    name = (
        f"builtin:{source.builtin_id}" if source.source_kind == "builtin" else f"the workflow file {source.source_path}"
    )
    if resolved is None:
        return f"{name} is gone since the run started"
    now = discovery.compiled(resolved).digest
    return (
        f"{name} changed since the run started, and its definition (nodes, edges, effects) with it: "
        f"{definition_digest[:19]}... then, {now[:19]}... now"
    )


def _same_source(source: RunSource, resolved: discovery.ResolvedSource) -> bool:
    identity = resolved.identity
    if source.source_kind == "file":
        return identity.source_sha256 == source.source_sha256
    return identity.builtin_revision == source.builtin_revision


def _source_name(launch: RunnerLaunch) -> str:
    """The module a run's source names: its file, or builtin:<id>."""
    source = launch.source
    return f"builtin:{source.builtin_id}" if source.source_kind == "builtin" else str(source.source_path)


EFFECT_AMBIGUOUS = "effectAmbiguous"
Ended = tuple[str, Any, "str | None", "str | None"]  # node outcome, output, error text, error code


class WorkflowCodeFailed(Exception):
    """Workflow code failed outside a node's own execution: the run fails with this code and text."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


def effect_request(node: ActionNode, ctx: NodeContext) -> tuple[str, dict[str, Any]]:
    """Who performs the node's effect, and its payload (built by the node's own code, here)."""
    if isinstance(node, ShellNode):
        spec = node.exec(ctx)
        return shell_performer.PERFORMER, shell_performer.payload(spec, node.max_output_chars, node.allow_non_zero_exit)
    if isinstance(node, HttpNode):
        request = node.request(ctx) if callable(node.request) else node.request
        return http_performer.PERFORMER, http_performer.payload(request, node.timeout_ms)
    return "runner", {}


def perform_effect(channel: Channel, node: ActionNode, ctx: NodeContext, attempt_id: str) -> Ended | str | None:
    """An effect node: reserve its effect, then adopt how it stands, or perform one attempt (an
    action body), or await the outbox pool's settlement (shell, http).

    Returns how the node ended, ``EFFECT_AMBIGUOUS`` (the run parks for an
    operator), or None (fenced, cancelled, or the writer restarts: the next runner continues).
    """
    effect = node.effect
    try:
        performer, payload = effect_request(node, ctx)
        reserve = NodeEffectReserveFrame(
            attempt_id=attempt_id,
            effect_type=effect.effect_type,
            recovery_policy=effect.recovery_policy,
            performer=performer,
            max_attempts=effect.max_attempts,
            payload=BlobValue.of_json(payload),
        )
    except Exception as exc:  # the request could not be built: nothing was reserved
        return "failed", None, _error_text(exc), None
    while True:
        reserved = channel.request(reserve)
        if reserved.outcome == "conflict" and (reserved.receipt or {}).get("code") == "effectKeyConflict":
            # another request holds this visit's key (the node built other arguments): a definite refusal
            return "failed", None, reserved.error or "the effect could not be reserved", "effectKeyConflict"
        if reserved.outcome not in ("accepted", "adopted") or reserved.receipt is None:
            return None
        receipt = reserved.receipt
        status = receipt["effectStatus"]
        if status in EFFECT_WORK_STATUSES and performer != "runner":
            while status in EFFECT_WORK_STATUSES:  # the pool performs it; the run's claim stays renewed meanwhile
                waited = channel.request(EffectAwait(effect_id=receipt["effectId"]))
                if waited.outcome != "accepted" or waited.receipt is None:
                    return None
                status = waited.receipt["effectStatus"]
            continue  # reserve again: adopt the settled result through the one path a new runner takes
        break
    if status == "applied":
        outcome = Outcome("applied", result=receipt.get("result"))
    elif status == "rejected":
        outcome = Outcome(
            "rejected", result=receipt.get("result"), error=receipt.get("error"), error_code=receipt.get("errorCode")
        )
    elif status == "ambiguous":
        return EFFECT_AMBIGUOUS
    elif status == "applying" and "attemptNumber" in receipt:  # the supervisor claimed it for this runner
        outcome = _run_action(node, ctx)
        settle = EffectSettleFrame(
            effect_id=receipt["effectId"],
            settlement=outcome.settlement,
            result=BlobValue.of_json(outcome.result) if outcome.result is not None else None,
            error=BlobValue.of_text(outcome.error) if outcome.error is not None else None,
            error_code=outcome.error_code if outcome.error is not None else None,
        )
        settled = channel.request(settle)
        if settled.outcome not in ("accepted", "adopted"):
            return None
    else:
        return None  # cancelled with its run, or applying under another claim
    node_outcome, output, error = performers.node_result(outcome)
    if isinstance(node, ShellNode) and node.parse is not None and node_outcome == "ok":
        try:
            output = node.parse(output)
        except Exception as exc:
            return "failed", None, _error_text(exc), None
    return node_outcome, output, error, outcome.error_code


def _run_action(node: ActionNode, ctx: NodeContext) -> Outcome:
    """An action body acts itself: what it returns is the result; an exception is a definite failure."""
    try:
        output = node.run(ctx)
        canonical.dumps(output)
    except Exception as exc:
        return Outcome("rejected", error=_error_text(exc), error_code="actionFailed")
    return Outcome("applied", result={"output": output, "nodeOutcome": "ok"})


def _error_text(exc: BaseException) -> str:
    """A node's error is text, never a traceback."""
    return f"{type(exc).__name__}: {exc}"[:4000]


def execute(node: Any, ctx: NodeContext) -> Ended:
    """A compute or notify node's own code: its output, or its failure as text."""
    try:
        if isinstance(node, ComputeNode):
            return "ok", node.run(ctx), None, None
        if isinstance(node, NotifyNode):
            message = node.message(ctx) if callable(node.message) else node.message
            return "ok", {"kind": node.notify_kind, "message": str(message)}, None, None
        raise NotImplementedError(f"{node.kind} nodes are not executable by this build's runner yet")
    except Exception as exc:
        return "failed", None, _error_text(exc), None


def ask(channel: Channel, node: CheckpointNode, ctx: NodeContext, attempt_id: str) -> Ended | None:
    """A checkpoint: its request (summary, details) and node.wait, then None (the run waits with no
    runner; the answer completes the node and requeues the run); its own code failing fails it."""
    try:
        request: dict[str, Any] = {"summary": str(node.summary(ctx) if callable(node.summary) else node.summary)}
        if node.run is not None:
            request["details"] = node.run(ctx)
        value = BlobValue.of_json(request)
    except Exception as exc:
        return "failed", None, _error_text(exc), None
    channel.request(NodeWaitFrame(attempt_id=attempt_id, request=value))
    return None


def ask_human(channel: Channel, node: HumanDecisionNode, ctx: NodeContext, attempt_id: str) -> Ended | None:
    """A human decision: its request (``request(ctx)`` and the choices) and node.wait with who may
    answer and its deadline, then None (the run waits with no runner); its own code failing fails it."""
    try:
        asked = node.request(ctx) if callable(node.request) else dict(node.request or {})
        if not isinstance(asked, dict):
            raise TypeError(f"request= returned {type(asked).__name__}, not a dict ({{title, summary, ...}})")
        value = BlobValue.of_json({"request": asked, "choices": node.static()["choices"]})
        timeout = node.on_timeout or {}
        response = timeout.get("response")
        decision = DecisionAsk(
            audience=node.audience,
            after_ms=timeout.get("after_ms"),
            default_response=BlobValue.of_json(dict(response)) if response is not None else None,
        )
    except Exception as exc:
        return "failed", None, _error_text(exc), None
    channel.request(NodeWaitFrame(attempt_id=attempt_id, request=value, decision=decision))
    return None


def ask_agent(
    channel: Channel,
    node: AgentNode,
    ctx: NodeContext,
    compiled: CompiledWorkflow,
    path: str,
    attempt_id: str,
    visit: int,
    attempt_number: int,
) -> Ended | None:
    """An agent or decision step: node.request_agent, then None (the run waits with no runner; an
    accepted output completes the node and requeues the run); its prompt failing fails it."""
    try:
        frame = agent.request_frame(node, ctx, compiled, path, attempt_id, visit, attempt_number)
    except Exception as exc:
        return "failed", None, _error_text(exc), None
    channel.request(frame)
    return None


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
        try:
            scoped_input = include.input(parent) if include.input is not None else {}
        except Exception as exc:
            raise WorkflowCodeFailed(
                "inputFailed", f"the input function of include '{mount}' failed: {_error_text(exc)}"
            ) from exc
    else:
        scoped_input = run_input
    return NodeContext(
        input=scoped_input,
        outputs={k[len(scope) :]: v for k, v in outputs.items() if k.startswith(scope)},
        results={k[len(scope) :]: v for k, v in results.items() if k.startswith(scope)},
    )


def _text(text: str) -> BlobValue:
    return BlobValue.of_text(text)


def _finish_after(step: CompletedStep, route: routing.Route) -> RunFinishFrame:
    """How the run ends after a step a runner did not finish: completed with its output (an answered
    checkpoint, an accepted agent step), or as the step ended when nothing routes its failure (an
    agent step that failed or timed out), with its error and code."""
    if route.end_status == "completed":
        return RunFinishFrame(end_status="completed", output=BlobValue.of_json(step.output))
    status = route.end_status if route.end_status in RUN_FINISH_STATUSES else "failed"
    error = step.error or step.outcome.replace("_", " ")
    return RunFinishFrame(
        end_status=status,
        error=_text(f"node '{step.node_path}': {error}"),
        error_code=step.error_code or "nodeFailed",
    )


def end_run(channel: Channel, finish: RunFinishFrame) -> RunnerExiting:
    """run.finish: the run ends here, no node being active; the runner exits whatever the reply."""
    channel.request(finish)
    return RunnerExiting()


def run(channel: Channel, launch: RunnerLaunch) -> RunnerExiting:
    """Execute the run from its last durable boundary; returns the exiting message."""
    resolved = None
    try:
        resolved = source_of(launch.source, launch.project_path)
        compiled = load_checked(resolved, launch.definition_digest)
    except Exception as exc:  # the module raised here (or compiles no longer): the run cannot go on
        said = failures.describe(exc, resolved).text if resolved else f"{_source_name(launch)}: {_error_text(exc)}"
        text = f"the workflow module failed to load: {said}"  # the report starts with the file (and line)
        return end_run(channel, RunFinishFrame(end_status="failed", error_code="loadFailed", error=_text(text)))
    if compiled is None:
        detail = source_changed(launch.source, resolved, launch.definition_digest)
        log.warning("%s parks: %s", launch.run_id, detail)
        return RunnerExiting(park_reason="workflowSourceChanged", detail=detail)
    assert resolved is not None
    if not _same_source(launch.source, resolved):
        log.info("%s: its workflow source changed, its definition did not: it goes on", launch.run_id)
    outputs: dict[str, Any] = {}
    results: dict[str, Any] = {}
    visits: dict[str, int] = {}
    retries: dict[tuple[str, int], int] = {}  # an interrupted visit continues with its next attempt number
    route, last = routing.Route(next_node=compiled.start_at), None
    for step in launch.steps:
        if step.interrupted:
            retries[(step.node_path, step.visit_number)] = step.attempt_number
            continue
        visits[step.node_path] = max(visits.get(step.node_path, 0), step.visit_number)
        results[step.node_path] = {"outcome": step.outcome, "output": step.output}
        if step.outcome == "ok":
            outputs[step.node_path] = step.output
        route, last = routing.route(compiled, step.node_path, step.outcome, step.output), step
    if route.routing_error is not None:  # the output of the last step (a checkpoint, an agent) matches no route
        failed = RunFinishFrame(end_status="failed", error_code="routingError", error=_text(route.routing_error))
        return end_run(channel, failed)
    if route.next_node is None:  # the last step (answered, or settled by the writer) ends the workflow
        assert last is not None  # with no step taken the route is the start node
        return end_run(channel, _finish_after(last, route))
    path: str | None = route.next_node
    executed = len(launch.steps)  # interrupted attempts count: each took a step
    max_steps = compiled.workflow.max_steps
    started_attempt: str | None = None  # the next node's attempt, started by the previous finish
    while path is not None:
        node = compiled.nodes[path]
        visit = visits.get(path, 0) + 1
        if started_attempt is None:
            started = channel.request(NodeStartFrame(node_path=path, **_attempt_fields(node, visit, retries, path)))
            if started.outcome not in ("accepted", "adopted") or started.receipt is None:
                return RunnerExiting()  # fenced: a stale runner stops at once
            if "runStatus" in started.receipt:
                return RunnerExiting()  # the run had no step left: the writer ended it (maxStepsExceeded)
            started_attempt = started.receipt["attemptId"]
        attempt_id, started_attempt = started_attempt, None
        visits[path] = visit
        executed += 1
        finish: dict[str, Any] = {"attempt_id": attempt_id}
        try:
            ctx = make_context(compiled, launch.input, outputs, results, _scope(path))
        except WorkflowCodeFailed as failure:  # not the node's own code: no outcome edge to follow
            channel.request(
                NodeFinishFrame(
                    **finish,
                    outcome="failed",
                    error=_text(failure.text),
                    error_code=failure.code,
                    end_status="failed",
                    run_error=_text(f"node '{path}': {failure.text}"),
                )
            )
            return RunnerExiting()
        ended: Ended | str | None
        if isinstance(node, CheckpointNode):
            ended = ask(channel, node, ctx, attempt_id)
        elif isinstance(node, HumanDecisionNode):
            ended = ask_human(channel, node, ctx, attempt_id)
        elif isinstance(node, AgentNode):
            attempt_number = retries.get((path, visit), 0) + 1
            ended = ask_agent(channel, node, ctx, compiled, path, attempt_id, visit, attempt_number)
        elif isinstance(node, ActionNode):
            ended = perform_effect(channel, node, ctx, attempt_id)
        else:
            ended = execute(node, ctx)
        if ended is None:
            return RunnerExiting()  # waiting, fenced, cancelled, or the writer restarts: the next runner continues
        if isinstance(ended, str):  # the one text perform_effect returns
            return RunnerExiting(park_reason=EFFECT_AMBIGUOUS)
        node_outcome, output, error, error_code = ended
        if node_outcome == "ok" or output is not None:  # a failed shell node keeps its command's output
            try:
                finish["output"] = BlobValue.of_json(output)
            except domain.OutsideDomain as exc:  # JSON, but not a value a run keeps: where, and why
                node_outcome, error = "failed", f"the output is outside the protocol's value domain: {exc}"
            except Exception as exc:  # not JSON
                node_outcome, error = "failed", _error_text(exc)
        if node_outcome == "ok":
            finish["outcome"] = "ok"
            if isinstance(node, NotifyNode) and node.audience is not None:
                finish["notify_audience"] = node.audience
            outputs[path] = results[path] = output
            route = routing.route(compiled, path, "ok", output)
        else:
            error = error or node_outcome.replace("_", " ")
            finish.update(outcome=node_outcome, error=_text(error))
            if error_code:
                finish["error_code"] = error_code
            results[path] = {"outcome": node_outcome}
            route = routing.route(compiled, path, node_outcome)
        if route.routing_error is not None:
            finish.update(end_status="failed", error_code="routingError", run_error=_text(route.routing_error))
        elif route.next_node is not None and executed >= max_steps:
            finish.update(
                end_status="failed",
                error_code="maxStepsExceeded",
                run_error=_text(f"the run reached max_steps={max_steps}"),
            )
        elif route.next_node is not None:  # the next node's attempt starts in the same commit
            after = route.next_node
            finish.update(
                next_node=after,
                start_next=_attempt_fields(compiled.nodes[after], visits.get(after, 0) + 1, retries, after),
            )
        else:
            finish["end_status"] = route.end_status
            if node_outcome != "ok":  # the node's failure ends the run: the run's error names it
                finish["run_error"] = _text(f"node '{path}': {error}")
        finished = channel.request(NodeFinishFrame(**finish))
        if finished.outcome not in ("accepted", "adopted") or finished.receipt is None:
            return RunnerExiting()
        if "runStatus" in finished.receipt:
            return RunnerExiting()  # the run ended (also when the writer found no step left for the next node)
        started_attempt = finished.receipt.get("nextAttemptId")
        path = finish.get("next_node")
    return RunnerExiting()


def _attempt_fields(node: Any, visit: int, retries: dict[tuple[str, int], int], path: str) -> dict[str, Any]:
    """A node attempt: an interrupted visit continues with its next attempt number."""
    return {"node_kind": node.kind, "visit_number": visit, "attempt_number": retries.get((path, visit), 0) + 1}


def main() -> int:
    """Serve launches one after another (one run each) until stdin closes."""
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    relay_logs(sys.stdout.buffer)
    sys.stdout = sys.stderr  # workflow code that prints cannot corrupt the channel
    while True:
        frame = channel.receive()  # SystemExit(0) when the supervisor closes stdin
        if frame["k"] != RunnerLaunch.kind:
            return 2
        channel.send(run(channel, RunnerLaunch.model_validate(frame["b"])))

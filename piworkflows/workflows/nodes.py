"""Node and edge declarations: what ``define_workflow`` receives.

Each declaration keeps its callables (run only in a runner child) apart from
its static fields (``static()``), which enter the definition snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pydantic

NodeFn = Callable[[Any], Any]


@dataclass(frozen=True)
class EffectDecl:
    """How an outside effect recovers after a crash: retried under its key, or an operator decides."""

    effect_type: str
    recovery_policy: str  # "idempotent" | "manual"
    max_attempts: int = 5  # idempotent: numbered attempts before it is rejected (retriesExhausted)


def idempotent_effect(effect_type: str, max_attempts: int = 5) -> EffectDecl:
    """Retried automatically under the same key (backoff with jitter) after an uncertain or
    retryable attempt, at most ``max_attempts`` attempts in all."""
    return EffectDecl(effect_type, "idempotent", max_attempts)


def manual_effect(effect_type: str) -> EffectDecl:
    """Never repeated without an operator: an uncertain attempt becomes ambiguous."""
    return EffectDecl(effect_type, "manual", 1)


@dataclass(frozen=True)
class Node:
    kind: str

    def static(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True)
class ComputeNode(Node):
    run: NodeFn = field(default=lambda ctx: None)


@dataclass(frozen=True)
class NotifyNode(Node):
    notify_kind: str = "progress"
    message: NodeFn | str = ""
    audience: str | None = None  # a channels.json audience: the message is also sent there

    def static(self) -> dict[str, Any]:
        shown = {**super().static(), "notifyKind": self.notify_kind}
        return shown if self.audience is None else {**shown, "audience": self.audience}


@dataclass(frozen=True)
class ActionNode(Node):
    effect: EffectDecl = field(default_factory=lambda: idempotent_effect("action"))
    run: NodeFn = field(default=lambda ctx: None)

    def static(self) -> dict[str, Any]:
        effect = self.effect
        declared: dict[str, Any] = {"effectType": effect.effect_type, "recovery": effect.recovery_policy}
        if effect.max_attempts != 5 and effect.recovery_policy == "idempotent":
            declared["maxAttempts"] = effect.max_attempts
        return {**super().static(), **declared}


@dataclass(frozen=True)
class ShellNode(ActionNode):
    exec: NodeFn = field(default=lambda ctx: {})
    parse: NodeFn | None = None
    allow_non_zero_exit: bool = False
    max_output_chars: int = 100_000

    def static(self) -> dict[str, Any]:
        return {
            **super().static(),
            "allowNonZeroExit": self.allow_non_zero_exit,
            "maxOutputChars": self.max_output_chars,
            "parses": self.parse is not None,
        }


@dataclass(frozen=True)
class HttpNode(ActionNode):
    request: NodeFn | Mapping[str, Any] = field(default_factory=dict)
    timeout_ms: int = 30_000

    def static(self) -> dict[str, Any]:
        return {**super().static(), "timeoutMs": self.timeout_ms}


@dataclass(frozen=True)
class CheckpointNode(Node):
    summary: NodeFn | str = ""
    run: NodeFn | None = None


@dataclass(frozen=True)
class TextInput:
    """A text a human writes with a choice (``choice(label, input=text_input(name, prompt))``)."""

    name: str
    prompt: str


@dataclass(frozen=True)
class Choice:
    label: str
    input: TextInput | None = None


@dataclass(frozen=True, eq=False)
class HumanDecisionNode(Node):
    """A protected checkpoint: only a verified human answers (``pi-workflows decide``); a
    deadline with a default response (``on_timeout``) is the timeout policy, without one it
    expires. Output ``{choice, input?, resolution}``."""

    audience: str = ""
    choices: Mapping[str, Choice] = field(default_factory=dict)
    on_timeout: Mapping[str, Any] | None = None  # {"after_ms": n, "response"?: {"choice", "input"?}}
    request: NodeFn | Mapping[str, Any] | None = None  # {title?, summary?, ...} shown to the human

    def static(self) -> dict[str, Any]:
        choices = {
            key: {"label": c.label, "input": {"name": c.input.name, "prompt": c.input.prompt} if c.input else None}
            for key, c in self.choices.items()
        }
        timeout = None
        if self.on_timeout is not None:
            timeout = {"afterMs": self.on_timeout["after_ms"], "response": self.on_timeout.get("response")}
        return {**super().static(), "audience": self.audience, "choices": choices, "onTimeout": timeout}


@dataclass(frozen=True)
class IncludeNode(Node):
    """A child workflow composed into the same run (no child run, no second queue row)."""

    child: Any = None  # a Workflow
    input: NodeFn | None = None


def compute(run: NodeFn) -> ComputeNode:
    """A pure function of the context; its return value is the output."""
    return ComputeNode("compute", run)


def notify(kind: str = "progress", message: NodeFn | str = "", audience: str | None = None) -> NotifyNode:
    """A durable message to the origin session; it starts no model turn. With ``audience`` (a
    channels.json audience) it is also sent to that audience's chats, through the same effects
    (numbered attempts; an interrupted send is ambiguous, never repeated without an operator)."""
    return NotifyNode("notify", kind, message, audience)


def action(effect: EffectDecl, run: NodeFn) -> ActionNode:
    """Work with an outside effect, reserved durably before ``run`` acts."""
    return ActionNode("action", effect, run)


def shell(
    effect: EffectDecl,
    exec: NodeFn,
    parse: NodeFn | None = None,
    allow_non_zero_exit: bool = False,
    max_output_chars: int = 100_000,
) -> ShellNode:
    """Run a command: ``exec(ctx)`` returns ``{command, args, cwd?, env?, timeoutMs?}``.

    Output: ``{stdout, stderr, exitCode, signal, durationMs}`` (or ``parse`` of it).
    """
    return ShellNode("shell", effect, lambda ctx: None, exec, parse, allow_non_zero_exit, max_output_chars)


def http(effect: EffectDecl, request: NodeFn | Mapping[str, Any], timeout_ms: int = 30_000) -> HttpNode:
    """One HTTP request performed by the outbox pool, sent with the effect's key as
    ``Idempotency-Key``. ``request(ctx)`` (or a dict) gives ``{method, url, headers?, body?}``; a
    header value may name a secret, ``{"secret": "NAME"}``, resolved when the request is sent.
    A literal ``Authorization`` header is refused. Output: ``{status, headers, body}``."""
    return HttpNode("http", effect, lambda ctx: None, request, timeout_ms)


def checkpoint(summary: NodeFn | str, run: NodeFn | None = None) -> CheckpointNode:
    """Ask for input and wait (no runner, no claim); the answer is the node's output."""
    return CheckpointNode("checkpoint", summary, run)


def text_input(name: str, prompt: str) -> TextInput:
    """The text a choice asks for: ``name`` names it, ``prompt`` (1-4000 characters) asks for it."""
    return TextInput(name, prompt)


def choice(label: str, input: TextInput | None = None) -> Choice:
    """One answer of a human decision: its label (1-64 characters) and, optionally, a text it asks for."""
    return Choice(label, input)


def human_decision(
    audience: str,
    choices: Mapping[str, Choice],
    on_timeout: Mapping[str, Any] | None = None,
    request: NodeFn | Mapping[str, Any] | None = None,
) -> HumanDecisionNode:
    """A protected decision for the humans of ``audience``; the run waits with no runner and no
    claim until a human answers, the deadline applies ``on_timeout``'s response (``{"after_ms": n,
    "response": {"choice": key, "input"?: text}}``), the run is cancelled, or (no response) the
    deadline expires it (the node ends timed_out, ``decisionExpired``)."""
    return HumanDecisionNode("human_decision", audience, dict(choices), on_timeout, request)


def include_workflow(child: Any, input: NodeFn | None = None) -> IncludeNode:
    """Compose ``child`` into this run under a mount name (``includes={mount: ...}``)."""
    return IncludeNode("workflow", child, input)


class _ServerDefault:
    """``timeout_ms=DEFAULT``: the server's default budget (``PI_WORKFLOWS_AGENT_TIMEOUT_MS``)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _ServerDefault()
SERVER_DEFAULT_TIMEOUT = "default"  # how DEFAULT reads in the definition snapshot


@dataclass(frozen=True)
class AssistantMessage:
    """An agent step whose output is the model's visible final reply (at most ``max_chars``)."""

    max_chars: int | None = None


@dataclass(frozen=True)
class ExecutorDecl:
    """Who performs an agent step: Pi (``pi()``), or another command-line agent (``command(argv)``)."""

    kind: str  # "pi" | "command"
    argv: Sequence[str] | None = None

    def static(self) -> dict[str, Any]:
        return {"kind": self.kind} if self.argv is None else {"kind": self.kind, "argv": list(self.argv)}


def pi() -> ExecutorDecl:
    """The step runs on Pi in RPC mode (the default executor)."""
    return ExecutorDecl("pi")


def command(argv: Sequence[str]) -> ExecutorDecl:
    """The step runs ``argv`` (no shell) in the project: the step message on its stdin, its stdout
    the output (parsed as JSON unless the output is a description or an assistant message),
    validated as a Pi submission is. One run per attempt: a non-zero exit, unusable stdout or a
    rejected output fails the step (docs/authoring.md, command)."""
    return ExecutorDecl("command", argv)


def is_pydantic_model(value: Any) -> bool:
    """A pydantic model class (an ``expected_output`` enforced by ``model_validate``)."""
    return isinstance(value, type) and issubclass(value, pydantic.BaseModel)


def decision_schema(choices: Sequence[str]) -> dict[str, Any]:
    """A decision's output: exactly ``{"route": <one of the choices>}``."""
    return {
        "type": "object",
        "properties": {"route": {"enum": list(choices)}},
        "required": ["route"],
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class AgentNode(Node):
    """An agent or decision step (docs/authoring.md, Agent steps): work for a model, whose
    output is submitted through the workflow tool (or is its reply, for an assistant message)."""

    prompt: NodeFn | str = ""
    expected_output: Any = None  # a description, a JSON Schema dict, a pydantic model class, AssistantMessage
    validate: Callable[[Any], Any] | None = None
    timeout_ms: int | None | _ServerDefault = DEFAULT
    allowed_tools: Sequence[str] | None = None
    model: str | None = None
    session: str = "run"
    executor: ExecutorDecl = field(default_factory=pi)
    choices: Sequence[str] | None = None  # a decision: the output is {"route": one of these}

    @property
    def validates(self) -> bool:
        """Workflow code judges a submission too (its ``validate`` or a pydantic model)."""
        return self.validate is not None or is_pydantic_model(self.expected_output)

    def expected_static(self) -> dict[str, Any]:
        """``expectedOutput`` of the snapshot: ``{kind, description | schema | maxChars}``."""
        expected = self.expected_output
        if self.choices is not None:
            return {"kind": "schema", "schema": decision_schema(self.choices)}
        if isinstance(expected, AssistantMessage):
            return {"kind": "assistant-message", "maxChars": expected.max_chars}
        if isinstance(expected, Mapping):
            return {"kind": "schema", "schema": dict(expected)}
        if is_pydantic_model(expected):
            return {"kind": "schema", "schema": expected.model_json_schema()}
        return {"kind": "description", "description": expected}

    def static(self) -> dict[str, Any]:
        timeout = self.timeout_ms
        declared: dict[str, Any] = {
            "expectedOutput": self.expected_static(),
            "validates": self.validates,
            "model": self.model,
            "allowedTools": list(self.allowed_tools) if self.allowed_tools is not None else None,
            "session": self.session,
            "timeoutMs": SERVER_DEFAULT_TIMEOUT if timeout is DEFAULT else (timeout or 0),
            "executor": self.executor.static(),
        }
        if self.choices is not None:
            declared["choices"] = list(self.choices)
        return {**super().static(), **declared}


def agent(
    prompt: NodeFn | str,
    expected_output: Any,
    validate: Callable[[Any], Any] | None = None,
    timeout_ms: int | None | _ServerDefault = DEFAULT,
    allowed_tools: Sequence[str] | None = None,
    model: str | None = None,
    session: str = "run",
    executor: ExecutorDecl | None = None,
) -> AgentNode:
    """Work for a model: ``prompt`` (text, or a function of ctx) becomes the step message; the
    step ends when the workflow tool accepts its output (which becomes the node's output).

    ``expected_output``: a text description (any JSON value is accepted), a JSON Schema dict
    (enforced), a pydantic model class (its JSON Schema is shown, ``model_validate`` enforces it
    and the output is its ``model_dump(mode="json")``), or ``assistant_message(max_chars)`` (the
    model's final visible reply is the output; no ``validate``).

    ``validate(output)`` runs in a supervised child after the schema checks: it returns None or
    True to accept, False or an error text to reject (the text goes back to the model), or
    raises to reject with ``ExcType: message``; it cannot change the output.

    ``timeout_ms``: the active-time budget (model turns only); ``DEFAULT`` the server's
    (``PI_WORKFLOWS_AGENT_TIMEOUT_MS``), None no limit. ``allowed_tools``: Pi's tools for the
    step (the workflow tool is always added). ``model``: ``"provider/id[:thinking]"`` (else the
    workflow's ``agent_model``, then ``PI_WORKFLOWS_AGENT_MODEL``, then Pi's default).
    ``session``: ``"run"`` continues the run's Pi session, ``"fresh"`` starts one for the step.
    """
    return AgentNode(
        "agent",
        prompt=prompt,
        expected_output=expected_output,
        validate=validate,
        timeout_ms=timeout_ms,
        allowed_tools=allowed_tools,
        model=model,
        session=session,
        executor=executor if executor is not None else pi(),
    )


def decision(
    question: NodeFn | str,
    choices: Sequence[str],
    model: str | None = None,
    timeout_ms: int | None | _ServerDefault = DEFAULT,
    session: str = "run",
) -> AgentNode:
    """An agent step that picks one of ``choices``: its output is ``{"route": <choice>}``, so
    ``switch(node, on="$.route", cases={choice: next, ...})`` routes it (covering every choice)."""
    return AgentNode("decision", prompt=question, timeout_ms=timeout_ms, model=model, session=session, choices=choices)


def assistant_message(max_chars: int | None = None) -> AssistantMessage:
    """``expected_output=``: the model's final visible reply (at most ``max_chars``) is the output."""
    return AssistantMessage(max_chars)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str | None = None  # a plain edge
    on: str | None = None  # a switch: the path read from the output or result
    cases: Mapping[str, str] = field(default_factory=dict)

    def targets(self) -> list[str]:
        return [self.target] if self.target is not None else list(self.cases.values())

    def static(self) -> dict[str, Any]:
        if self.target is not None:
            return {"from": self.source, "to": self.target}
        return {"from": self.source, "on": self.on, "cases": dict(self.cases)}


def edge(source: str, target: str) -> Edge:
    return Edge(source, target)


def switch(source: str, on: str, cases: Mapping[str, str]) -> Edge:
    """Route on ``$.field`` / ``$output.field`` (the accepted output) or ``$result.outcome``."""
    return Edge(source, on=on, cases=dict(cases))

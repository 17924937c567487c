"""``define_workflow`` and the compiler: validation, flattening, snapshot, digest.

::

    define_workflow(name, start_at, nodes, edges, includes, exits, max_steps, title, description,
                    agent_model)
        │  every rule checked here, before any run exists; the error names the
        │  node, edge or mount at fault (WorkflowDefinitionError)
        ▼
    CompiledWorkflow
        nodes   {full node path: Node}   included nodes as "mount/node"
        routes  {full node path: Edge}   at most one outgoing edge per node
        snapshot  pi-workflows.definition-snapshot.v1 (static fields only)
        digest    "sha256:<hex>" of the canonical snapshot

The description is for people finding workflows (``pi-workflows workflows``):
kept beside the snapshot, so changing it changes no definition digest.

Persisted node identities are the full compiled paths, so an effect key
(run id + effect type + full path + visit) of an included node never
collides with the parent's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from piworkflows import canonical
from piworkflows.performers import http as http_performer
from piworkflows.states import AGENT_SESSIONS
from piworkflows.workflows.nodes import (
    DEFAULT,
    ActionNode,
    AgentNode,
    AssistantMessage,
    Choice,
    Edge,
    EffectDecl,
    ExecutorDecl,
    HttpNode,
    HumanDecisionNode,
    IncludeNode,
    Node,
    NotifyNode,
    TextInput,
    is_pydantic_model,
)

SNAPSHOT_SCHEMA = "pi-workflows.definition-snapshot.v1"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
RESERVED_WORKFLOW_NAMES = frozenset({"answer", "cancel", "list", "pause", "resume", "status"})
SWITCH_PATH = re.compile(r"\$(?:output)?(?:\.[A-Za-z_][A-Za-z0-9_-]*)+\Z|\$result\.outcome\Z")
DEFAULT_MAX_STEPS = 100
MAX_DESCRIPTION = 1000
# An agent model, "provider/id[:thinking]" (Pi's --provider and --model; the id may hold "/" or ":").
AGENT_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[^\s/:][^\s]*(?<!:)\Z")
MAX_AGENT_MODEL = 256
DECISION_ROUTE_PATHS = ("$.route", "$output.route")
HUMAN_CHOICE_PATHS = ("$.choice", "$output.choice")
MAX_CHOICE_LABEL = 64  # characters of a human decision's choice label (a Telegram button)
MAX_DECISION_TEXT = 4000  # characters of a text input's prompt, and of a default response's input
MAX_AUDIENCE = 64


class WorkflowDefinitionError(ValueError):
    """An invalid workflow definition; the message names what is wrong and where."""


@dataclass(frozen=True)
class Workflow:
    """A validated definition (``define_workflow``'s result, a module's ``workflow``)."""

    name: str
    start_at: str
    nodes: Mapping[str, Node]
    edges: tuple[Edge, ...]
    includes: Mapping[str, IncludeNode] = field(default_factory=dict)
    exits: Mapping[str, str] = field(default_factory=dict)  # exit name -> node name
    max_steps: int = DEFAULT_MAX_STEPS
    title: Callable[[Any], str] | None = None
    description: str | None = None
    agent_model: str | None = None  # the default model of its agent steps

    def compile(self) -> CompiledWorkflow:
        nodes: dict[str, Node] = {}
        routes: dict[str, Edge] = {}
        mounts: dict[str, IncludeNode] = {}
        entry = _flatten(self, "", nodes, routes, mounts)
        snapshot = {
            "schema": SNAPSHOT_SCHEMA,
            "name": self.name,
            "startAt": entry,
            "maxSteps": self.max_steps,
            "nodes": {path: node.static() for path, node in nodes.items()},
            "edges": [routes[path].static() for path in sorted(routes)],
            "mounts": {path: {"workflow": include.child.name} for path, include in sorted(mounts.items())},
        }
        if self.agent_model is not None:  # only when set: the digests of workflows without agents stay
            snapshot["agentModel"] = self.agent_model
        data = canonical.dumps_bytes(snapshot)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        return CompiledWorkflow(self, entry, nodes, routes, mounts, snapshot, digest)


@dataclass(frozen=True)
class CompiledWorkflow:
    workflow: Workflow
    start_at: str
    nodes: Mapping[str, Node]
    routes: Mapping[str, Edge]
    mounts: Mapping[str, IncludeNode]  # mount path ("a", "a/b") -> its include (child input)
    snapshot: dict[str, Any]
    digest: str

    @property
    def snapshot_bytes(self) -> bytes:
        return canonical.dumps_bytes(self.snapshot)


def define_workflow(
    name: str,
    start_at: str,
    nodes: Mapping[str, Node],
    edges: list[Edge] | tuple[Edge, ...] = (),
    includes: Mapping[str, IncludeNode] | None = None,
    exits: Mapping[str, Mapping[str, str]] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    title: Callable[[Any], str] | None = None,
    description: str | None = None,
    agent_model: str | None = None,
) -> Workflow:
    """Declare a workflow; every compile-time rule is checked now. ``description``: what it does
    and the input it expects, in a sentence or two (listed by ``pi-workflows workflows``).
    ``agent_model``: the model of its agent steps that name none (``"provider/id[:thinking]"``)."""
    _check_name(name, "workflow")
    if name in RESERVED_WORKFLOW_NAMES:
        raise WorkflowDefinitionError(
            f"workflow name {name!r} is reserved ({', '.join(sorted(RESERVED_WORKFLOW_NAMES))}); choose another"
        )
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
        raise WorkflowDefinitionError(f"workflow {name!r}: max_steps must be a positive integer")
    if description is not None and (not isinstance(description, str) or len(description) > MAX_DESCRIPTION):
        raise WorkflowDefinitionError(
            f"workflow {name!r}: description must be text of at most {MAX_DESCRIPTION} characters"
        )
    if agent_model is not None and not _is_agent_model(agent_model):
        raise WorkflowDefinitionError(
            f"workflow {name!r}: agent_model={agent_model!r} must be 'provider/id' or 'provider/id:thinking'"
        )
    includes = dict(includes or {})
    for node_name, node in nodes.items():
        _check_name(node_name, "node")
        if not isinstance(node, Node) or isinstance(node, IncludeNode):
            raise WorkflowDefinitionError(
                f"node {node_name!r}: not a node (use compute, notify, action, shell, http, checkpoint, agent "
                "or decision; include_workflow goes under includes=)"
            )
        _check_effect_node(node_name, node)
        _check_agent_node(node_name, node)
        _check_human_decision(node_name, node)
        _check_notify(node_name, node)
    for mount, include in includes.items():
        _check_name(mount, "mount")
        if mount in nodes:
            raise WorkflowDefinitionError(f"mount {mount!r} has the name of a node")
        if not isinstance(include, IncludeNode) or not isinstance(include.child, Workflow):
            raise WorkflowDefinitionError(f"mount {mount!r}: use include_workflow(child_workflow, input=...)")
    exit_nodes: dict[str, str] = {}
    for exit_name, spec in (exits or {}).items():
        _check_name(exit_name, "exit")
        source = spec.get("from") if isinstance(spec, Mapping) else None
        if not isinstance(source, str) or source not in nodes:
            raise WorkflowDefinitionError(f"exit {exit_name!r}: 'from' must name a node of {name!r}")
        exit_nodes[exit_name] = source
    workflow = Workflow(
        name, start_at, dict(nodes), tuple(edges), includes, exit_nodes, max_steps, title, description, agent_model
    )
    workflow.compile()  # flattening checks every edge, mount and exit
    return workflow


def case_key(value: Any) -> str:
    """How a switch case and an output value are compared: a string as it is,
    anything else as its canonical JSON text (True -> "true", None -> "null")."""
    return value if isinstance(value, str) else canonical.dumps(value)


def _check_effect_node(node_name: str, node: Node) -> None:
    """What an effect node declares: its effect, and an http request known now (a dict)."""
    if not isinstance(node, ActionNode):
        return
    effect = node.effect
    if not isinstance(effect, EffectDecl) or not isinstance(effect.effect_type, str) or not effect.effect_type:
        raise WorkflowDefinitionError(
            f"node {node_name!r}: effect= takes idempotent_effect(type) or manual_effect(type)"
        )
    if (
        not isinstance(effect.max_attempts, int)
        or isinstance(effect.max_attempts, bool)
        or not (1 <= effect.max_attempts <= 1000)
    ):
        raise WorkflowDefinitionError(f"node {node_name!r}: max_attempts must be an integer from 1 to 1000")
    if isinstance(node, HttpNode):
        if not isinstance(node.timeout_ms, int) or isinstance(node.timeout_ms, bool) or node.timeout_ms < 1:
            raise WorkflowDefinitionError(f"node {node_name!r}: timeout_ms must be a positive integer")
        if isinstance(node.request, Mapping):
            try:
                http_performer.check_static_request(dict(node.request))
            except ValueError as exc:
                raise WorkflowDefinitionError(f"node {node_name!r}: {exc}") from None
        elif not callable(node.request):
            raise WorkflowDefinitionError(f"node {node_name!r}: request= takes a function of ctx or a dict")


def _is_agent_model(model: Any) -> bool:
    return isinstance(model, str) and len(model) <= MAX_AGENT_MODEL and AGENT_MODEL.match(model) is not None


def _is_names(value: Any) -> bool:
    """A list (or tuple) of names ([A-Za-z_][A-Za-z0-9_-]*), each once."""
    return (
        isinstance(value, (list, tuple))
        and all(isinstance(item, str) and NAME.match(item) for item in value)
        and len(set(value)) == len(value)
    )


def _check_agent_node(node_name: str, node: Node) -> None:
    """What an agent or decision step declares (docs/authoring.md, Agent steps)."""
    if not isinstance(node, AgentNode):
        return

    def refuse(text: str) -> WorkflowDefinitionError:
        return WorkflowDefinitionError(f"node {node_name!r}: {text}")

    if not (isinstance(node.prompt, str) and node.prompt.strip()) and not callable(node.prompt):
        raise refuse(f"{'question' if node.choices is not None else 'prompt'}= takes text or a function of ctx")
    if node.choices is not None:
        choices = node.choices
        if not isinstance(choices, (list, tuple)) or not choices:
            raise refuse("choices= takes a non-empty list of strings")
        if not all(isinstance(choice, str) and choice for choice in choices) or len(set(choices)) != len(choices):
            raise refuse(f"choices {list(choices)!r} must be non-empty strings, each once")
    else:
        _check_expected_output(node, refuse)
    if node.validate is not None and not callable(node.validate):
        raise refuse("validate= takes a function of the output")
    if node.validate is not None and isinstance(node.expected_output, AssistantMessage):
        raise refuse("an assistant_message() output takes no validate= (the reply is the output as it is)")
    timeout = node.timeout_ms
    if (
        timeout is not DEFAULT
        and timeout is not None
        and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1)
    ):
        raise refuse("timeout_ms must be a positive integer, None (no limit) or DEFAULT (the server's)")
    if node.allowed_tools is not None and not _is_names(node.allowed_tools):
        raise refuse(f"allowed_tools={node.allowed_tools!r} must be a list of tool names, each once")
    if node.model is not None and not _is_agent_model(node.model):
        raise refuse(f"model={node.model!r} must be 'provider/id' or 'provider/id:thinking'")
    if node.session not in AGENT_SESSIONS:
        raise refuse(f"session={node.session!r} must be 'run' (the run's Pi session) or 'fresh'")
    executor = node.executor
    if not isinstance(executor, ExecutorDecl) or executor.kind not in ("pi", "command"):
        raise refuse("executor= takes pi() or command([...])")
    if executor.kind == "command" and not (
        isinstance(executor.argv, (list, tuple))
        and executor.argv
        and all(isinstance(arg, str) for arg in executor.argv)
        and executor.argv[0]
    ):
        raise refuse("command() takes a non-empty list of strings (the program, then its arguments)")


def _check_expected_output(node: AgentNode, refuse: Callable[[str], WorkflowDefinitionError]) -> None:
    """A description, a JSON Schema, a pydantic model class, or assistant_message(max_chars)."""
    expected = node.expected_output
    if isinstance(expected, AssistantMessage):
        limit = expected.max_chars
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise refuse("assistant_message(max_chars=) takes a positive integer or None")
        return
    if isinstance(expected, str):
        if not expected.strip():
            raise refuse("expected_output= is empty: describe the output")
        return
    if is_pydantic_model(expected):
        try:
            schema = expected.model_json_schema()
        except Exception as exc:
            raise refuse(f"the JSON Schema of {expected.__name__} could not be made: {exc}") from None
    elif isinstance(expected, Mapping):
        schema = dict(expected)
    else:
        raise refuse(
            "expected_output= takes a description, a JSON Schema (a dict), a pydantic model class "
            "or assistant_message()"
        )
    try:
        canonical.dumps(schema)
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise refuse(f"expected_output is not a valid JSON Schema: {exc.message}") from None
    except (TypeError, ValueError) as exc:
        raise refuse(f"expected_output is not JSON: {exc}") from None


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not NAME.match(name):
        raise WorkflowDefinitionError(f"{what} name {name!r} must match [A-Za-z_][A-Za-z0-9_-]*")


def _flatten(
    workflow: Workflow, prefix: str, nodes: dict[str, Node], routes: dict[str, Edge], mounts: dict[str, IncludeNode]
) -> str:
    """Add the workflow's nodes and edges under ``prefix``; return its entry path."""
    if workflow.start_at not in workflow.nodes and workflow.start_at not in workflow.includes:
        raise WorkflowDefinitionError(f"workflow {workflow.name!r}: start_at {workflow.start_at!r} is not a node")
    entries: dict[str, str] = {}
    exits: dict[str, str] = {}
    for node_name, node in workflow.nodes.items():
        nodes[prefix + node_name] = node
        entries[node_name] = prefix + node_name
    for mount, include in workflow.includes.items():
        child: Workflow = include.child
        mount_prefix = f"{prefix}{mount}/"
        mounts[prefix + mount] = include
        entries[mount] = _flatten(child, mount_prefix, nodes, routes, mounts)
        for exit_name, source in child.exits.items():
            exits[f"{mount}.{exit_name}"] = mount_prefix + source

    def source_path(ref: str, edge_text: str) -> str:
        if ref in workflow.nodes:
            return prefix + ref
        if ref in exits:
            return exits[ref]
        raise WorkflowDefinitionError(
            f"edge {edge_text} in {workflow.name!r}: {ref!r} is not a node or a mount exit (mount.exit)"
        )

    def target_path(ref: str, edge_text: str) -> str:
        if ref in entries:
            return entries[ref]
        raise WorkflowDefinitionError(f"edge {edge_text} in {workflow.name!r}: {ref!r} is not a node or a mount")

    for declared in workflow.edges:
        text = _edge_text(declared)
        if not isinstance(declared, Edge):
            raise WorkflowDefinitionError(f"workflow {workflow.name!r}: {declared!r} is not an edge or switch")
        source = source_path(declared.source, text)
        if source in routes:
            raise WorkflowDefinitionError(
                f"edge {text} in {workflow.name!r}: {declared.source!r} already has an outgoing edge (one per node)"
            )
        if declared.target is None:
            if not isinstance(declared.on, str) or not SWITCH_PATH.match(declared.on):
                raise WorkflowDefinitionError(
                    f"switch from {declared.source!r} in {workflow.name!r}: on={declared.on!r} must be "
                    "$.field, $output.field or $result.outcome"
                )
            if not declared.cases:
                raise WorkflowDefinitionError(f"switch from {declared.source!r} in {workflow.name!r} has no cases")
            cases = {case_key(value): target_path(ref, text) for value, ref in declared.cases.items()}
            _check_decision_switch(nodes[source], declared, set(cases), workflow.name)
            routes[source] = Edge(source, on=declared.on, cases=cases)
        else:
            routes[source] = Edge(source, target_path(declared.target, text))
    return entries[workflow.start_at]


def _check_notify(node_name: str, node: Node) -> None:
    """A notify node's audience, if it names one."""
    if isinstance(node, NotifyNode) and node.audience is not None:
        if not isinstance(node.audience, str) or not 1 <= len(node.audience) <= MAX_AUDIENCE:
            raise WorkflowDefinitionError(
                f"node {node_name!r}: audience must be a name of 1-{MAX_AUDIENCE} characters "
                "(channels.json's audiences)"
            )


def _check_human_decision(node_name: str, node: Node) -> None:
    """A human decision's audience, choices and timeout policy, checked before any state is written."""
    if not isinstance(node, HumanDecisionNode):
        return

    def refuse(text: str) -> WorkflowDefinitionError:
        return WorkflowDefinitionError(f"node {node_name!r}: {text}")

    if not isinstance(node.audience, str) or not 1 <= len(node.audience) <= MAX_AUDIENCE:
        raise refuse(f"audience must be a name of 1-{MAX_AUDIENCE} characters (channels.json's audiences)")
    if not isinstance(node.choices, Mapping) or not node.choices:
        raise refuse("choices= needs at least one choice: {'key': choice('Label')}")
    for key, declared in node.choices.items():
        if not isinstance(key, str) or not NAME.match(key):
            raise refuse(f"choice key {key!r} must match [A-Za-z_][A-Za-z0-9_-]*")
        if not isinstance(declared, Choice):
            raise refuse(f"choice {key!r}: use choice(label, input=text_input(name, prompt))")
        if not isinstance(declared.label, str) or not 1 <= len(declared.label) <= MAX_CHOICE_LABEL:
            raise refuse(f"choice {key!r}: its label must be text of 1-{MAX_CHOICE_LABEL} characters")
        if declared.input is not None:
            asked = declared.input
            if not isinstance(asked, TextInput) or not isinstance(asked.name, str) or not NAME.match(asked.name):
                raise refuse(f"choice {key!r}: input= takes text_input(name, prompt), name [A-Za-z_][A-Za-z0-9_-]*")
            if not isinstance(asked.prompt, str) or not 1 <= len(asked.prompt) <= MAX_DECISION_TEXT:
                raise refuse(f"choice {key!r}: its input prompt must be text of 1-{MAX_DECISION_TEXT} characters")
    if node.request is not None and not callable(node.request) and not isinstance(node.request, Mapping):
        raise refuse("request= takes a function of ctx or a dict ({title, summary, ...})")
    if node.on_timeout is None:
        return
    timeout = node.on_timeout
    if not isinstance(timeout, Mapping) or set(timeout) - {"after_ms", "response"}:
        raise refuse("on_timeout= takes {'after_ms': n, 'response': {'choice': key}} (no response: it expires)")
    after = timeout.get("after_ms")
    if not isinstance(after, int) or isinstance(after, bool) or after <= 0:
        raise refuse("on_timeout's after_ms must be a positive integer (milliseconds)")
    if "response" in timeout:
        problem = response_problem(node, timeout["response"])
        if problem is not None:
            raise refuse(f"on_timeout's response: {problem}")


def response_problem(node: HumanDecisionNode, response: Any) -> str | None:
    """Why ``response`` ({choice, input?}) is not an answer the decision takes, or None."""
    if not isinstance(response, Mapping) or set(response) - {"choice", "input"}:
        return "it must be {'choice': key} or {'choice': key, 'input': text}"
    key = response.get("choice")
    if not isinstance(key, str) or key not in node.choices:
        return f"{key!r} is not one of its choices ({', '.join(node.choices)})"
    text = response.get("input")
    if node.choices[key].input is None:
        return None if text is None else f"choice {key!r} takes no input"
    if not isinstance(text, str) or not 1 <= len(text) <= MAX_DECISION_TEXT:
        return f"choice {key!r} needs its input: text of 1-{MAX_DECISION_TEXT} characters"
    return None


def _check_decision_switch(node: Node, declared: Edge, cases: set[str], workflow_name: str) -> None:
    """A switch over a decision reads its route (over a human decision: its choice), or its
    outcome, and has a case for each choice."""
    if declared.on == "$result.outcome":
        return
    where = f"switch from {declared.source!r} in {workflow_name!r}"
    if isinstance(node, HumanDecisionNode):
        if declared.on not in HUMAN_CHOICE_PATHS:
            raise WorkflowDefinitionError(f"{where}: a human decision's output is {{choice, ...}}: switch on $.choice")
        choices: Mapping[str, Any] = node.choices
    elif isinstance(node, AgentNode) and node.choices is not None:
        if declared.on not in DECISION_ROUTE_PATHS:
            raise WorkflowDefinitionError(f"{where}: a decision's output is {{route}}: switch on $.route")
        choices = {choice: None for choice in node.choices}
    else:
        return
    missing = [choice for choice in choices if choice not in cases]
    if missing:
        raise WorkflowDefinitionError(f"{where}: no case for the decision's choice(s) {', '.join(missing)}")
    unknown = sorted(cases - set(choices))
    if unknown:
        raise WorkflowDefinitionError(f"{where}: case(s) {', '.join(unknown)} are not choices of the decision")


def _edge_text(declared: Any) -> str:
    if isinstance(declared, Edge):
        return f"{declared.source} -> {declared.target}" if declared.target else f"switch({declared.source})"
    return repr(declared)

"""``define_workflow`` and the compiler: validation, flattening, snapshot, digest.

::

    define_workflow(name, start_at, nodes, edges, includes, exits, max_steps, title, description)
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

from piworkflows import canonical
from piworkflows.performers import http as http_performer
from piworkflows.workflows.nodes import ActionNode, Edge, EffectDecl, HttpNode, IncludeNode, Node

SNAPSHOT_SCHEMA = "pi-workflows.definition-snapshot.v1"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
RESERVED_WORKFLOW_NAMES = frozenset({"answer", "cancel", "list", "pause", "resume", "status"})
SWITCH_PATH = re.compile(r"\$(?:output)?(?:\.[A-Za-z_][A-Za-z0-9_-]*)+\Z|\$result\.outcome\Z")
DEFAULT_MAX_STEPS = 100
MAX_DESCRIPTION = 1000


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
) -> Workflow:
    """Declare a workflow; every compile-time rule is checked now. ``description``: what it does
    and the input it expects, in a sentence or two (listed by ``pi-workflows workflows``)."""
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
    includes = dict(includes or {})
    for node_name, node in nodes.items():
        _check_name(node_name, "node")
        if not isinstance(node, Node) or isinstance(node, IncludeNode):
            raise WorkflowDefinitionError(
                f"node {node_name!r}: not a node (use compute, notify, action, shell, http or checkpoint; "
                "include_workflow goes under includes=)"
            )
        _check_effect_node(node_name, node)
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
    workflow = Workflow(name, start_at, dict(nodes), tuple(edges), includes, exit_nodes, max_steps, title, description)
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
            routes[source] = Edge(source, on=declared.on, cases=cases)
        else:
            routes[source] = Edge(source, target_path(declared.target, text))
    return entries[workflow.start_at]


def _edge_text(declared: Any) -> str:
    if isinstance(declared, Edge):
        return f"{declared.source} -> {declared.target}" if declared.target else f"switch({declared.source})"
    return repr(declared)

"""The workflow authoring API, compiler, routing and discovery (spec: WORKFLOWS.md).

Nothing here starts a run: every compile-time rule must fail in
``define_workflow`` itself, routing is a pure function of the compiled graph,
and discovery reads files under ``tmp_path`` only (HOME is private, see
conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from piworkflows import canonical
from piworkflows.workflows import (
    CompiledWorkflow,
    Workflow,
    WorkflowDefinitionError,
    action,
    checkpoint,
    compute,
    define_workflow,
    discovery,
    edge,
    idempotent_effect,
    include_workflow,
    manual_effect,
    notify,
    shell,
    switch,
)
from piworkflows.workflows.compiler import SNAPSHOT_SCHEMA
from piworkflows.workflows.discovery import SourceIdentity, WorkflowNotFound
from piworkflows.workflows.routing import Route, route

pytestmark = pytest.mark.timeout(60)

RESERVED = ["answer", "cancel", "list", "pause", "resume", "status"]


@pytest.fixture(autouse=True)
def _no_user_dir_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default user dir is ~/.pi/agent/workflows unless a test sets the variable."""
    monkeypatch.delenv("PI_WORKFLOWS_USER_DIR", raising=False)


def _noop(ctx: Any) -> None:
    return None


# ---------------------------------------------------------------- builders


def _inner() -> Workflow:
    return define_workflow(
        name="inner",
        start_at="g",
        nodes={"g": compute(run=lambda ctx: {"g": 1})},
        exits={"out": {"from": "g"}},
    )


def _middle() -> Workflow:
    """Starts at its own mount ``b`` (so its entry is ``b/g``), exits from ``m``."""
    return define_workflow(
        name="middle",
        start_at="b",
        nodes={"m": compute(run=lambda ctx: {"m": 1})},
        includes={"b": include_workflow(_inner(), input=lambda ctx: {})},
        edges=[edge("b.out", "m")],
        exits={"done": {"from": "m"}},
    )


def _child(c1_run=None) -> Workflow:
    return define_workflow(
        name="child",
        start_at="c1",
        nodes={
            "c1": compute(run=c1_run or (lambda ctx: {"n": 1})),
            "c2": notify(kind="progress", message="child says hi"),
        },
        edges=[edge("c1", "c2")],
        exits={"done": {"from": "c2"}},
    )


def build_main(
    *,
    prep_run=None,
    act_target: str = "sh",
    max_steps: int = 30,
    allow_non_zero_exit: bool = True,
    act_effect=None,
    say_kind: str = "progress",
    say_name: str = "say",
    max_output_chars: int = 100_000,
    parse=None,
    reverse: bool = False,
) -> Workflow:
    """A workflow with every authoring feature; the keywords vary one static field each."""
    nodes = {
        "prep": compute(run=prep_run or (lambda ctx: {"route": "go"})),
        say_name: notify(kind=say_kind, message=lambda ctx: "working"),
        "act": action(effect=act_effect or manual_effect("ticket.create"), run=lambda ctx: {"id": 1}),
        "sh": shell(
            effect=idempotent_effect("tests.run"),
            exec=lambda ctx: {"command": "true", "args": []},
            parse=parse,
            allow_non_zero_exit=allow_non_zero_exit,
            max_output_chars=max_output_chars,
        ),
        "ask": checkpoint(summary="continue?"),
        "done": notify(kind="final", message="done"),
        "stop": notify(kind="final", message=lambda ctx: "stopped"),
    }
    edges = [
        switch("prep", on="$.route", cases={"go": say_name, "skip": "done"}),
        edge(say_name, "act"),
        edge("act", act_target),
        switch("sh", on="$result.outcome", cases={"ok": "sub", "failed": "stop"}),
        edge("sub.done", "deep"),
        edge("deep.done", "ask"),
        switch("ask", on="$output.continue", cases={"true": "done", "false": "stop"}),
    ]
    includes = {
        "sub": include_workflow(_child(), input=lambda ctx: {"x": 1}),
        "deep": include_workflow(_middle()),
    }
    if reverse:
        nodes = dict(reversed(list(nodes.items())))
        edges = list(reversed(edges))
        includes = dict(reversed(list(includes.items())))
    return define_workflow(
        name="main",
        title=lambda ctx: "main run",
        start_at="prep",
        max_steps=max_steps,
        nodes=nodes,
        edges=edges,
        includes=includes,
    )


def _assert_plain_json(value: Any, where: str = "snapshot") -> None:
    """Only JSON values: no callables, no node objects, no tuples."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), f"{where}: key {key!r}"
            _assert_plain_json(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _assert_plain_json(item, f"{where}[{index}]")
    else:
        assert value is None or isinstance(value, (str, int, float, bool)), f"{where}: {value!r}"
        assert not callable(value), where


# ---------------------------------------------------------------- 1. compile


EXPECTED_NODES = {
    "prep": {"kind": "compute"},
    "say": {"kind": "notify", "notifyKind": "progress"},
    "act": {"kind": "action", "effectType": "ticket.create", "recovery": "manual"},
    "sh": {
        "kind": "shell",
        "effectType": "tests.run",
        "recovery": "idempotent",
        "allowNonZeroExit": True,
        "maxOutputChars": 100_000,
        "parses": False,
    },
    "ask": {"kind": "checkpoint"},
    "done": {"kind": "notify", "notifyKind": "final"},
    "stop": {"kind": "notify", "notifyKind": "final"},
    "sub/c1": {"kind": "compute"},
    "sub/c2": {"kind": "notify", "notifyKind": "progress"},
    "deep/m": {"kind": "compute"},
    "deep/b/g": {"kind": "compute"},
}

EXPECTED_EDGES = [
    {"from": "act", "to": "sh"},
    {"from": "ask", "on": "$output.continue", "cases": {"true": "done", "false": "stop"}},
    {"from": "deep/b/g", "to": "deep/m"},
    {"from": "deep/m", "to": "ask"},
    {"from": "prep", "on": "$.route", "cases": {"go": "say", "skip": "done"}},
    {"from": "say", "to": "act"},
    {"from": "sh", "on": "$result.outcome", "cases": {"ok": "sub/c1", "failed": "stop"}},
    {"from": "sub/c1", "to": "sub/c2"},
    {"from": "sub/c2", "to": "deep/b/g"},
]


def test_define_workflow_returns_a_workflow_with_the_declared_parts() -> None:
    wf = build_main()
    assert isinstance(wf, Workflow)
    assert wf.name == "main"
    assert wf.start_at == "prep"
    assert wf.max_steps == 30
    assert set(wf.nodes) == {"prep", "say", "act", "sh", "ask", "done", "stop"}
    assert set(wf.includes) == {"sub", "deep"}
    assert wf.title is not None and wf.title(None) == "main run"
    assert _child().exits == {"done": "c2"}


def test_compile_flattens_nodes_to_full_paths_including_nested_mounts() -> None:
    wf = build_main()
    compiled = wf.compile()
    assert isinstance(compiled, CompiledWorkflow)
    assert compiled.workflow is wf
    assert set(compiled.nodes) == set(EXPECTED_NODES)
    # The node objects are the declared ones, under their full path.
    assert compiled.nodes["prep"] is wf.nodes["prep"]
    sub_child = wf.includes["sub"].child
    assert compiled.nodes["sub/c1"] is sub_child.nodes["c1"]
    middle = wf.includes["deep"].child
    assert compiled.nodes["deep/m"] is middle.nodes["m"]
    assert compiled.nodes["deep/b/g"] is middle.includes["b"].child.nodes["g"]
    assert set(compiled.mounts) == {"sub", "deep", "deep/b"}
    assert compiled.mounts["sub"] is wf.includes["sub"]
    assert compiled.mounts["deep/b"] is middle.includes["b"]
    assert compiled.start_at == "prep"


def test_compile_routes_are_keyed_by_full_path_and_point_at_full_paths() -> None:
    compiled = build_main().compile()
    assert set(compiled.routes) == {e["from"] for e in EXPECTED_EDGES}
    assert set(compiled.routes) <= set(compiled.nodes)
    assert compiled.routes["act"].target == "sh"
    # A parent edge into a mount lands on the mount's entry (nested: deep -> deep/b/g).
    assert compiled.routes["sub/c2"].target == "deep/b/g"
    # A parent edge from mount.exit leaves from the child's exit node.
    assert compiled.routes["deep/m"].target == "ask"
    assert compiled.routes["sub/c1"].target == "sub/c2"
    sh = compiled.routes["sh"]
    assert sh.target is None and sh.on == "$result.outcome"
    assert dict(sh.cases) == {"ok": "sub/c1", "failed": "stop"}
    for path, compiled_edge in compiled.routes.items():
        assert compiled_edge.source == path
        for target in compiled_edge.targets():
            assert target in compiled.nodes


def test_start_at_a_mount_resolves_into_the_mount_entry_nested() -> None:
    wf = define_workflow(
        name="starts-in-mount",
        start_at="deep",
        nodes={"after": compute(run=_noop)},
        includes={"deep": include_workflow(_middle())},
        edges=[edge("deep.done", "after")],
    )
    compiled = wf.compile()
    assert compiled.start_at == "deep/b/g"
    assert compiled.snapshot["startAt"] == "deep/b/g"
    assert compiled.routes["deep/m"].target == "after"

    flat = define_workflow(
        name="starts-in-sub",
        start_at="sub",
        nodes={"x": compute(run=_noop)},
        includes={"sub": include_workflow(_child())},
    )
    assert flat.compile().start_at == "sub/c1"


def test_snapshot_has_schema_name_start_steps_static_nodes_sorted_edges_and_mounts() -> None:
    compiled = build_main().compile()
    snapshot = compiled.snapshot
    assert snapshot == {
        "schema": SNAPSHOT_SCHEMA,
        "name": "main",
        "startAt": "prep",
        "maxSteps": 30,
        "nodes": EXPECTED_NODES,
        "edges": EXPECTED_EDGES,
        "mounts": {"deep": {"workflow": "middle"}, "deep/b": {"workflow": "inner"}, "sub": {"workflow": "child"}},
    }
    assert SNAPSHOT_SCHEMA == "pi-workflows.definition-snapshot.v1"
    assert [e["from"] for e in snapshot["edges"]] == sorted(e["from"] for e in snapshot["edges"])


def test_snapshot_holds_no_callables_and_is_canonical_json() -> None:
    compiled = build_main(parse=lambda out: out).compile()
    _assert_plain_json(compiled.snapshot)
    text = canonical.dumps(compiled.snapshot)
    assert json.loads(text) == compiled.snapshot
    assert canonical.dumps_bytes(json.loads(text)) == compiled.snapshot_bytes
    assert compiled.snapshot_bytes == canonical.dumps_bytes(compiled.snapshot)
    assert compiled.snapshot["nodes"]["sh"]["parses"] is True
    assert "lambda" not in text and "function" not in text


def test_digest_is_sha256_of_the_canonical_snapshot_bytes() -> None:
    compiled = build_main().compile()
    expected = "sha256:" + hashlib.sha256(canonical.dumps_bytes(compiled.snapshot)).hexdigest()
    assert compiled.digest == expected
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", compiled.digest)
    # Compiling again is deterministic.
    assert compiled.workflow.compile().digest == compiled.digest


# ---------------------------------------------------------------- 2. digest stability


def test_same_definition_written_twice_with_different_lambdas_has_same_digest() -> None:
    first, second = build_main().compile(), build_main().compile()
    assert first.workflow.nodes["prep"] is not second.workflow.nodes["prep"]
    assert first.workflow.nodes["prep"].run is not second.workflow.nodes["prep"].run
    assert first.snapshot == second.snapshot
    assert first.digest == second.digest


def test_declaration_order_of_nodes_edges_and_includes_does_not_change_digest() -> None:
    assert build_main(reverse=True).compile().digest == build_main().compile().digest


def test_lambda_body_change_keeps_digest_code_changes_are_caught_by_source_identity_not_digest() -> None:
    original = build_main(prep_run=lambda ctx: {"route": "go"}).compile()
    edited = build_main(prep_run=lambda ctx: {"route": "skip", "extra": [1, 2, 3]}).compile()
    assert edited.digest == original.digest
    child_edited = define_workflow(
        name="x",
        start_at="sub",
        nodes={"n": compute(run=_noop)},
        includes={"sub": include_workflow(_child(c1_run=lambda ctx: {"n": 2}))},
    )
    child_original = define_workflow(
        name="x", start_at="sub", nodes={"n": compute(run=_noop)}, includes={"sub": include_workflow(_child())}
    )
    assert child_edited.compile().digest == child_original.compile().digest


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"act_target": "ask"}, id="edge-target"),
        pytest.param({"max_steps": 31}, id="max-steps"),
        pytest.param({"allow_non_zero_exit": False}, id="allow-non-zero-exit"),
        pytest.param({"act_effect": manual_effect("ticket.open")}, id="effect-type"),
        pytest.param({"act_effect": idempotent_effect("ticket.create")}, id="recovery-policy"),
        pytest.param({"say_kind": "final"}, id="notify-kind"),
        pytest.param({"say_name": "announce"}, id="node-name"),
        pytest.param({"max_output_chars": 10}, id="max-output-chars"),
        pytest.param({"parse": _noop}, id="parse-present"),
    ],
)
def test_changing_a_static_field_changes_the_digest(change: dict[str, Any]) -> None:
    base = build_main().compile()
    changed = build_main(**change).compile()
    assert changed.snapshot != base.snapshot
    assert changed.digest != base.digest


def test_changing_an_included_childs_name_or_entry_changes_the_digest() -> None:
    def parent(child: Workflow) -> str:
        return (
            define_workflow(
                name="p", start_at="sub", nodes={"n": compute(run=_noop)}, includes={"sub": include_workflow(child)}
            )
            .compile()
            .digest
        )

    nodes = {"c1": compute(run=_noop), "c2": compute(run=_noop)}
    base = parent(define_workflow(name="kid", start_at="c1", nodes=nodes))
    assert parent(define_workflow(name="kid", start_at="c1", nodes=dict(nodes))) == base
    assert parent(define_workflow(name="kid2", start_at="c1", nodes=dict(nodes))) != base
    assert parent(define_workflow(name="kid", start_at="c2", nodes=dict(nodes))) != base


# ---------------------------------------------------------------- 3. compile-time rules


def _base(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "name": "wf",
        "start_at": "a",
        "nodes": {"a": compute(run=_noop), "b": compute(run=_noop), "c": compute(run=_noop)},
        "edges": [edge("a", "b")],
    }
    kwargs.update(overrides)
    return kwargs


def _rejects(*names: str, **overrides: Any) -> str:
    """define_workflow fails with WorkflowDefinitionError naming every one of ``names``."""
    with pytest.raises(WorkflowDefinitionError) as info:
        define_workflow(**_base(**overrides))
    message = str(info.value)
    for name in names:
        assert name in message, f"{name!r} not named in {message!r}"
    return message


def test_the_base_definition_is_valid() -> None:
    compiled = define_workflow(**_base()).compile()
    assert set(compiled.nodes) == {"a", "b", "c"}


BAD_NAMES = [
    pytest.param("has space", id="space"),
    pytest.param("1abc", id="leading-digit"),
    pytest.param("", id="empty"),
    pytest.param("a.b", id="dot"),
    pytest.param("a/b", id="slash"),
    pytest.param("ok\n", id="trailing-newline"),
    pytest.param(5, id="int"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_workflow_name_is_rejected_and_named(bad: Any) -> None:
    message = _rejects(repr(bad), name=bad)
    assert "workflow" in message


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_node_name_is_rejected_and_named(bad: Any) -> None:
    message = _rejects(repr(bad), nodes={"a": compute(run=_noop), bad: compute(run=_noop)}, edges=[])
    assert "node" in message


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_mount_name_is_rejected_and_named(bad: Any) -> None:
    message = _rejects(repr(bad), includes={bad: include_workflow(_child())})
    assert "mount" in message


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_exit_name_is_rejected_and_named(bad: Any) -> None:
    message = _rejects(repr(bad), exits={bad: {"from": "b"}})
    assert "exit" in message


@pytest.mark.parametrize("reserved", RESERVED)
def test_each_reserved_workflow_name_is_rejected(reserved: str) -> None:
    message = _rejects(repr(reserved), name=reserved)
    assert "reserved" in message


@pytest.mark.parametrize("similar", ["Cancel", "status2", "list_runs", "pause-me"])
def test_names_resembling_reserved_ones_are_allowed(similar: str) -> None:
    assert define_workflow(**_base(name=similar)).name == similar


def test_start_at_missing_is_rejected_and_named() -> None:
    message = _rejects("'nowhere'", "'wf'", start_at="nowhere")
    assert "start_at" in message


def test_start_at_an_exit_reference_is_rejected() -> None:
    _rejects("'sub.done'", start_at="sub.done", includes={"sub": include_workflow(_child())})


def test_edge_to_a_missing_node_is_rejected_and_named() -> None:
    _rejects("'nope'", edges=[edge("a", "nope")])


def test_edge_from_a_missing_node_is_rejected_and_named() -> None:
    _rejects("'nope'", edges=[edge("nope", "b")])


def test_edge_from_a_mount_name_instead_of_an_exit_is_rejected() -> None:
    _rejects("'sub'", includes={"sub": include_workflow(_child())}, edges=[edge("sub", "b")])


def test_edge_to_a_mount_exit_is_rejected() -> None:
    _rejects("'sub.done'", includes={"sub": include_workflow(_child())}, edges=[edge("a", "sub.done")])


def test_second_plain_edge_from_one_node_is_rejected_and_named() -> None:
    message = _rejects("'a'", edges=[edge("a", "b"), edge("a", "c")])
    assert "a -> c" in message


def test_edge_plus_switch_from_one_node_is_rejected_and_named() -> None:
    _rejects("'a'", edges=[edge("a", "b"), switch("a", on="$.x", cases={"1": "c"})])
    _rejects("'a'", edges=[switch("a", on="$.x", cases={"1": "c"}), edge("a", "b")])


@pytest.mark.parametrize("on", ["route", "$", "$.", "$result.other", "$input.x", "$result", "$output", "$..x", None])
def test_switch_with_a_bad_on_path_is_rejected_and_named(on: Any) -> None:
    message = _rejects("'a'", edges=[switch("a", on=on, cases={"x": "b"})])
    assert repr(on) in message


@pytest.mark.parametrize("on", ["$.x", "$.a.b", "$output.x", "$output.a-b.c_d", "$result.outcome"])
def test_switch_with_a_good_on_path_compiles(on: str) -> None:
    compiled = define_workflow(**_base(edges=[switch("a", on=on, cases={"x": "b"})])).compile()
    assert compiled.routes["a"].on == on


def test_switch_with_no_cases_is_rejected_and_named() -> None:
    message = _rejects("'a'", edges=[switch("a", on="$.x", cases={})])
    assert "no cases" in message


def test_switch_case_to_a_missing_node_is_rejected_and_named() -> None:
    _rejects("'nope'", edges=[switch("a", on="$.x", cases={"1": "b", "2": "nope"})])


def test_a_non_edge_in_edges_is_rejected() -> None:
    _rejects("'wf'", edges=[("a", "b")])


def test_a_non_node_value_in_nodes_is_rejected_and_named() -> None:
    message = _rejects("'f'", nodes={"a": compute(run=_noop), "f": lambda ctx: 1}, edges=[])
    assert "not a node" in message
    _rejects("'s'", nodes={"a": compute(run=_noop), "s": "compute"}, edges=[])


def test_include_workflow_in_nodes_instead_of_includes_is_rejected_and_named() -> None:
    message = _rejects("'sub'", nodes={"a": compute(run=_noop), "sub": include_workflow(_child())}, edges=[])
    assert "includes" in message


def test_a_mount_named_like_a_node_is_rejected_and_named() -> None:
    message = _rejects("'b'", includes={"b": include_workflow(_child())})
    assert "mount" in message


@pytest.mark.parametrize(
    "include",
    [
        pytest.param(include_workflow("child"), id="include-of-a-string"),
        pytest.param(include_workflow(None), id="include-of-none"),
        pytest.param(include_workflow(lambda: None), id="include-of-a-callable"),
        pytest.param(compute(run=_noop), id="a-node-not-an-include"),
        pytest.param(_child(), id="a-bare-workflow"),
    ],
)
def test_include_of_something_that_is_not_a_workflow_is_rejected_and_named(include: Any) -> None:
    _rejects("'m'", includes={"m": include})


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"from": "nope"}, id="missing-node"),
        pytest.param({"from": "sub"}, id="a-mount-not-a-node"),
        pytest.param({"to": "a"}, id="no-from"),
        pytest.param("a", id="not-a-mapping"),
    ],
)
def test_an_exit_whose_from_is_not_a_node_of_the_child_is_rejected_and_named(spec: Any) -> None:
    _rejects("'out'", exits={"out": spec}, includes={"sub": include_workflow(_child())})


def test_a_parent_edge_from_an_unknown_mount_exit_is_rejected_and_named() -> None:
    _rejects("'sub.nosuchexit'", includes={"sub": include_workflow(_child())}, edges=[edge("sub.nosuchexit", "b")])
    _rejects("'nosuchmount.done'", includes={"sub": include_workflow(_child())}, edges=[edge("nosuchmount.done", "b")])


def test_an_exit_node_with_a_child_edge_and_a_parent_edge_breaks_the_one_edge_rule() -> None:
    child = define_workflow(
        name="kid",
        start_at="c1",
        nodes={"c1": compute(run=_noop), "c2": compute(run=_noop)},
        edges=[edge("c1", "c2")],
        exits={"early": {"from": "c1"}},  # valid on its own: nobody routes from it yet
    )
    message = _rejects("'sub.early'", includes={"sub": include_workflow(child)}, edges=[edge("sub.early", "b")])
    assert "one per node" in message


def test_two_exits_of_one_node_cannot_both_be_routed_by_the_parent() -> None:
    child = define_workflow(
        name="kid",
        start_at="c1",
        nodes={"c1": compute(run=_noop)},
        exits={"x": {"from": "c1"}, "y": {"from": "c1"}},
    )
    includes = {"sub": include_workflow(child)}
    ok = define_workflow(**_base(includes=includes, edges=[edge("sub.x", "b")])).compile()
    assert ok.routes["sub/c1"].target == "b"
    _rejects("'sub.y'", includes=includes, edges=[edge("sub.x", "b"), edge("sub.y", "c")])


@pytest.mark.parametrize("bad", [0, -1, True, False, "5", 2.0, None])
def test_max_steps_must_be_a_positive_int(bad: Any) -> None:
    message = _rejects("'wf'", max_steps=bad)
    assert "max_steps" in message


def test_max_steps_default_and_one_are_valid() -> None:
    assert define_workflow(**_base()).compile().snapshot["maxSteps"] == 100
    assert define_workflow(**_base(max_steps=1)).compile().snapshot["maxSteps"] == 1


# ---------------------------------------------------------------- 4. routing


def _router() -> CompiledWorkflow:
    child = define_workflow(
        name="kid",
        start_at="c1",
        nodes={"c1": compute(run=_noop), "c2": compute(run=_noop)},
        edges=[switch("c1", on="$.k", cases={"go": "c2"})],
        exits={"done": {"from": "c2"}},
    )
    return define_workflow(
        name="router",
        start_at="plain",
        nodes={
            name: compute(run=_noop)
            for name in ["plain", "sw", "deep_sw", "out_sw", "outcome_sw", "last", "ok_next", "fail_next", "into"]
        },
        includes={"sub": include_workflow(child)},
        edges=[
            edge("plain", "last"),
            switch(
                "sw",
                on="$.x",
                cases={
                    "yes": "last",
                    "true": "ok_next",
                    "3": "fail_next",
                    "null": "plain",
                    "1.5": "into",
                    "false": "outcome_sw",
                },
            ),
            switch("deep_sw", on="$.a.b", cases={"v": "last", "7": "ok_next"}),
            switch("out_sw", on="$output.a.b", cases={"v": "ok_next"}),
            switch("outcome_sw", on="$result.outcome", cases={"ok": "ok_next", "failed": "fail_next"}),
            edge("into", "sub"),
            edge("sub.done", "last"),
        ],
    ).compile()


def test_plain_edge_is_followed_after_ok() -> None:
    assert route(_router(), "plain", "ok", {"anything": 1}) == Route(next_node="last")


@pytest.mark.parametrize("outcome", ["failed", "timed_out", "cancelled"])
@pytest.mark.parametrize("node", ["plain", "sw", "deep_sw", "out_sw", "last", "into", "sub/c2"])
def test_failure_outcomes_end_the_run_with_that_status(node: str, outcome: str) -> None:
    """A plain edge, a $.x switch or no edge: a failure ends the run, whatever the output says."""
    assert route(_router(), node, outcome, {"x": "yes", "a": {"b": "v"}}) == Route(end_status=outcome)


def test_no_edge_after_ok_completes_the_run() -> None:
    compiled = _router()
    for node in ["last", "ok_next", "fail_next"]:
        assert route(compiled, node, "ok", {"x": 1}) == Route(end_status="completed")


def test_result_outcome_switch_routes_failures_too() -> None:
    compiled = _router()
    assert route(compiled, "outcome_sw", "ok", {"whatever": 1}) == Route(next_node="ok_next")
    assert route(compiled, "outcome_sw", "failed") == Route(next_node="fail_next")


@pytest.mark.parametrize("outcome", ["timed_out", "cancelled"])
def test_result_outcome_switch_without_a_case_for_the_outcome_is_a_routing_error(outcome: str) -> None:
    result = route(_router(), "outcome_sw", outcome)
    assert result.next_node is None and result.end_status is None
    assert result.routing_error is not None
    assert "outcome_sw" in result.routing_error and outcome in result.routing_error


def test_dollar_and_output_switches_read_nested_fields() -> None:
    compiled = _router()
    assert route(compiled, "sw", "ok", {"x": "yes"}) == Route(next_node="last")
    assert route(compiled, "deep_sw", "ok", {"a": {"b": "v", "c": 0}}) == Route(next_node="last")
    assert route(compiled, "deep_sw", "ok", {"a": {"b": 7}}) == Route(next_node="ok_next")
    assert route(compiled, "out_sw", "ok", {"a": {"b": "v"}}) == Route(next_node="ok_next")


@pytest.mark.parametrize(
    ("value", "target"),
    [
        pytest.param(True, "ok_next", id="true"),
        pytest.param(False, "outcome_sw", id="false"),
        pytest.param(3, "fail_next", id="int-3"),
        pytest.param(3.0, "fail_next", id="float-3.0-is-3"),
        pytest.param(None, "plain", id="null"),
        pytest.param(1.5, "into", id="float-1.5"),
        pytest.param("true", "ok_next", id="string-true"),
    ],
)
def test_non_string_values_match_their_canonical_text(value: Any, target: str) -> None:
    assert route(_router(), "sw", "ok", {"x": value}) == Route(next_node=target)


@pytest.mark.parametrize(
    ("node", "output"),
    [
        pytest.param("sw", {}, id="missing-field"),
        pytest.param("sw", {"y": "yes"}, id="other-field"),
        pytest.param("sw", None, id="no-output"),
        pytest.param("sw", ["yes"], id="list-output"),
        pytest.param("deep_sw", {"a": "v"}, id="intermediate-not-an-object"),
        pytest.param("deep_sw", {"a": {}}, id="missing-nested-field"),
        pytest.param("out_sw", {"b": "v"}, id="output-path-missing"),
        pytest.param("sw", {"x": "no"}, id="no-case-for-string"),
        pytest.param("sw", {"x": 4}, id="no-case-for-number"),
        pytest.param("sw", {"x": {"nested": 1}}, id="no-case-for-object"),
        pytest.param("sw", {"x": "Yes"}, id="case-sensitive"),
    ],
)
def test_missing_field_or_value_without_case_is_a_routing_error_naming_the_node(node: str, output: Any) -> None:
    result = route(_router(), node, "ok", output)
    assert result.next_node is None and result.end_status is None
    assert result.routing_error is not None and node in result.routing_error


def test_a_routing_error_names_the_node_the_value_and_the_cases() -> None:
    compiled = _router()
    assert route(compiled, "deep_sw", "ok", {"a": {"b": "w"}}).routing_error == (
        "node 'deep_sw': no case for $.a.b = w (cases: 7, v)"
    )
    assert route(compiled, "deep_sw", "ok", {"a": {}}).routing_error == "node 'deep_sw': the output has no $.a.b"
    many = define_workflow(
        "many",
        "s",
        {"s": compute(run=lambda ctx: {}), "t": compute(run=lambda ctx: {})},
        [switch("s", on="$.n", cases={str(i): "t" for i in range(12)})],
    ).compile()
    error = route(many, "s", "ok", {"n": 99}).routing_error
    assert error == "node 's': no case for $.n = 99 (cases: 0, 1, 10, 11, 2, 3, 4, 5, 6, 7, ...)"


def test_a_string_and_a_number_with_the_same_text_share_a_case() -> None:
    compiled = _router()
    assert route(compiled, "deep_sw", "ok", {"a": {"b": "7"}}) == Route(next_node="ok_next")
    assert route(compiled, "deep_sw", "ok", {"a": {"b": 7}}) == Route(next_node="ok_next")


def test_routing_error_inside_a_mount_names_the_full_node_path() -> None:
    compiled = _router()
    assert route(compiled, "sub/c1", "ok", {"k": "go"}) == Route(next_node="sub/c2")
    result = route(compiled, "sub/c1", "ok", {"k": "stop"})
    assert result.routing_error is not None and "sub/c1" in result.routing_error
    assert route(compiled, "sub/c1", "ok", {}).routing_error.startswith("node 'sub/c1': ")


def test_routes_into_a_mount_go_to_its_entry_and_mount_exits_route_out() -> None:
    compiled = _router()
    assert route(compiled, "into", "ok") == Route(next_node="sub/c1")
    assert route(compiled, "sub/c2", "ok") == Route(next_node="last")
    nested = build_main().compile()
    assert route(nested, "sub/c2", "ok") == Route(next_node="deep/b/g")
    assert route(nested, "deep/b/g", "ok") == Route(next_node="deep/m")
    assert route(nested, "deep/m", "ok") == Route(next_node="ask")
    assert route(nested, "sh", "failed") == Route(next_node="stop")
    assert route(nested, "ask", "ok", {"continue": False}) == Route(next_node="stop")


def test_non_string_case_keys_are_rejected_or_match_canonical_text() -> None:
    try:
        compiled = define_workflow(**_base(edges=[switch("a", on="$.ok", cases={True: "b", None: "c"})])).compile()
    except WorkflowDefinitionError:
        return  # rejecting non-string case keys at compile time is a fine answer too
    assert route(compiled, "a", "ok", {"ok": True}) == Route(next_node="b")
    assert route(compiled, "a", "ok", {"ok": None}) == Route(next_node="c")


# ---------------------------------------------------------------- 5. discovery.resolve


def _source(name: str, node: str = "a") -> str:
    return (
        "from piworkflows.workflows import compute, define_workflow\n"
        f"workflow = define_workflow(name={name!r}, start_at={node!r}, "
        f"nodes={{{node!r}: compute(run=lambda ctx: None)}})\n"
    )


def _write(directory: Path, stem: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}.workflow.py"
    path.write_text(text)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
def user(tmp_path: Path) -> Path:
    path = tmp_path / "user-workflows"
    path.mkdir()
    return path


def _file_identity(path: Path) -> SourceIdentity:
    data = path.read_bytes()
    return SourceIdentity("file", str(path.resolve()), hashlib.sha256(data).digest())


def _revision(stem: str) -> str:
    text = (discovery.BUILTIN_DIR / f"{stem}.workflow.py").read_text()
    match = re.search(r'^REVISION = "([^"]+)"$', text, re.M)
    assert match is not None
    return match.group(1)


def test_project_wins_over_user_which_wins_over_builtin(project: Path, user: Path) -> None:
    in_project = _write(project / ".pi" / "workflows", "demo", _source("demo", "from_project"))
    in_user = _write(user, "demo", _source("demo", "from_user"))

    first = discovery.resolve("demo", project, user_workflows=user)
    assert first.identity == _file_identity(in_project)
    assert first.path == in_project.resolve()
    assert first.data == in_project.read_bytes()
    assert set(discovery.load(first).nodes) == {"from_project"}

    in_project.unlink()
    second = discovery.resolve("demo", project, user_workflows=user)
    assert second.identity == _file_identity(in_user)
    assert set(discovery.load(second).nodes) == {"from_user"}

    in_user.unlink()
    third = discovery.resolve("demo", project, user_workflows=user)
    assert third.identity == SourceIdentity("builtin", builtin_id="builtin:demo", builtin_revision=_revision("demo"))
    assert discovery.load(third).name == "demo"


def test_user_dir_env_variable_is_honoured(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir = tmp_path / "env-user"
    in_env = _write(env_dir, "mine", _source("mine", "from_env"))
    monkeypatch.setenv("PI_WORKFLOWS_USER_DIR", str(env_dir))
    assert discovery.user_dir() == env_dir
    resolved = discovery.resolve("mine", project)
    assert resolved.identity == _file_identity(in_env)
    assert set(discovery.load(resolved).nodes) == {"from_env"}
    # The env user dir still ranks below the project and above the built-ins.
    _write(env_dir, "demo", _source("demo", "env_demo"))
    assert discovery.resolve("demo", project).identity.source_kind == "file"
    in_project = _write(project / ".pi" / "workflows", "mine", _source("mine", "from_project"))
    assert discovery.resolve("mine", project).identity == _file_identity(in_project)


def test_explicit_user_workflows_wins_over_the_env_variable(
    project: Path, user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_dir = tmp_path / "env-user"
    _write(env_dir, "mine", _source("mine", "from_env"))
    in_user = _write(user, "mine", _source("mine", "from_user"))
    monkeypatch.setenv("PI_WORKFLOWS_USER_DIR", str(env_dir))
    assert discovery.resolve("mine", project, user_workflows=user).identity == _file_identity(in_user)


def test_default_user_dir_is_under_home(project: Path, private_home: Path) -> None:
    default = private_home / ".pi" / "agent" / "workflows"
    assert discovery.user_dir() == default
    in_home = _write(default, "homey", _source("homey"))
    assert discovery.resolve("homey", project).identity == _file_identity(in_home)


def test_builtin_prefix_skips_project_and_user_dirs(project: Path, user: Path) -> None:
    _write(project / ".pi" / "workflows", "demo", _source("demo", "from_project"))
    _write(user, "demo", _source("demo", "from_user"))
    resolved = discovery.resolve("builtin:demo", project, user_workflows=user)
    assert resolved.identity.source_kind == "builtin"
    assert resolved.identity.builtin_id == "builtin:demo"
    assert resolved.path == discovery.BUILTIN_DIR / "demo.workflow.py"


def test_unknown_name_raises_workflow_not_found_naming_where_it_looked(project: Path, user: Path) -> None:
    with pytest.raises(WorkflowNotFound) as info:
        discovery.resolve("nosuchflow", project, user_workflows=user)
    message = str(info.value)
    assert "'nosuchflow'" in message
    assert str(project / ".pi" / "workflows") in message
    assert str(user) in message
    assert "built-ins" in message


def test_unknown_builtin_looks_only_in_builtins(project: Path, user: Path) -> None:
    _write(project / ".pi" / "workflows", "mine", _source("mine"))
    with pytest.raises(WorkflowNotFound) as info:
        discovery.resolve("builtin:mine", project, user_workflows=user)
    message = str(info.value)
    assert "'builtin:mine'" in message and "built-ins" in message
    assert str(project) not in message and str(user) not in message


@pytest.mark.parametrize("bad", ["../x", "x/../x", "sub/x", "", "x y", "1x", "x.y", "builtin:../x", "builtin:", "x\n"])
def test_a_name_that_is_not_a_valid_name_raises_workflow_not_found(project: Path, user: Path, bad: str) -> None:
    # Files the traversal would reach if the name were not checked first.
    _write(project / ".pi", "x", _source("x"))
    _write(project / ".pi" / "workflows" / "sub", "x", _source("x"))
    with pytest.raises(WorkflowNotFound) as info:
        discovery.resolve(bad, project, user_workflows=user)
    assert "not a workflow name" in str(info.value)


def test_file_identity_is_absolute_resolved_path_and_sha256_of_the_bytes(project: Path, user: Path) -> None:
    path = _write(project / ".pi" / "workflows", "mine", _source("mine") + "# trailing comment\n")
    resolved = discovery.resolve("mine", project, user_workflows=user)
    data = path.read_bytes()
    assert resolved.identity.source_kind == "file"
    assert resolved.identity.source_path == str(path.resolve())
    assert Path(resolved.identity.source_path).is_absolute()
    assert resolved.identity.source_sha256 == hashlib.sha256(data).digest()
    assert resolved.identity.builtin_id is None and resolved.identity.builtin_revision is None
    assert resolved.identity.to_json() == {
        "kind": "file",
        "path": str(path.resolve()),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    # One byte more is another identity.
    path.write_bytes(data + b"\n")
    changed = discovery.resolve("mine", project, user_workflows=user)
    assert changed.identity.source_path == resolved.identity.source_path
    assert changed.identity.source_sha256 != resolved.identity.source_sha256


def test_file_identity_is_absolute_when_project_path_is_relative(
    tmp_path: Path, user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "rel" / ".pi" / "workflows", "mine", _source("mine"))
    monkeypatch.chdir(tmp_path)
    resolved = discovery.resolve("mine", Path("rel"), user_workflows=user)
    assert resolved.identity.source_path == str(path.resolve())
    assert Path(resolved.identity.source_path).is_absolute()
    assert resolved.path.is_absolute()
    assert discovery.load(resolved).name == "mine"


def test_file_identity_resolves_a_symlinked_project_dir(tmp_path: Path, project: Path, user: Path) -> None:
    path = _write(project / ".pi" / "workflows", "mine", _source("mine"))
    link = tmp_path / "project-link"
    link.symlink_to(project, target_is_directory=True)
    resolved = discovery.resolve("mine", link, user_workflows=user)
    assert resolved.identity.source_path == str(path.resolve())
    assert "project-link" not in resolved.identity.source_path
    assert resolved.identity == discovery.resolve("mine", project, user_workflows=user).identity


def test_file_identity_resolves_a_symlinked_file(tmp_path: Path, project: Path, user: Path) -> None:
    real = _write(tmp_path / "store", "mine", _source("mine"))
    workflows = project / ".pi" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "mine.workflow.py").symlink_to(real)
    resolved = discovery.resolve("mine", project, user_workflows=user)
    assert resolved.identity == _file_identity(real)
    assert resolved.identity.source_path == str(real.resolve())
    assert discovery.load(resolved).name == "mine"


def test_symlinked_file_with_another_target_name_loads_under_the_command_name(
    tmp_path: Path, project: Path, user: Path
) -> None:
    real = _write(tmp_path / "store", "bar", _source("foo"))
    workflows = project / ".pi" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "foo.workflow.py").symlink_to(real)
    resolved = discovery.resolve("foo", project, user_workflows=user)
    assert resolved.identity.source_path == str(real.resolve())  # identity: the resolved file (holds today)
    assert discovery.load(resolved).name == "foo"


@pytest.mark.parametrize("stem", ["demo", "shell-check"])
def test_builtin_identity_is_id_and_revision(project: Path, user: Path, stem: str) -> None:
    for name in (stem, f"builtin:{stem}"):
        resolved = discovery.resolve(name, project, user_workflows=user)
        expected = SourceIdentity("builtin", builtin_id=f"builtin:{stem}", builtin_revision=_revision(stem))
        assert resolved.identity == expected
        assert resolved.identity.source_path is None and resolved.identity.source_sha256 is None
        assert resolved.identity.to_json() == {"kind": "builtin", "id": f"builtin:{stem}", "revision": _revision(stem)}
        assert resolved.path == discovery.BUILTIN_DIR / f"{stem}.workflow.py"
        assert resolved.data == resolved.path.read_bytes()


# ---------------------------------------------------------------- 6. discovery.load


def test_load_returns_the_workflow(project: Path, user: Path) -> None:
    _write(project / ".pi" / "workflows", "mine", _source("mine", "only"))
    wf = discovery.load(discovery.resolve("mine", project, user_workflows=user))
    assert isinstance(wf, Workflow)
    assert wf.name == "mine" and set(wf.nodes) == {"only"}
    assert wf.compile().start_at == "only"


def test_load_executes_exactly_the_bytes_that_were_read(project: Path, user: Path) -> None:
    path = _write(project / ".pi" / "workflows", "mine", _source("mine", "version_one"))
    resolved = discovery.resolve("mine", project, user_workflows=user)
    path.write_text(_source("mine", "version_two"))
    assert set(discovery.load(resolved).nodes) == {"version_one"}
    assert resolved.identity.source_sha256 == hashlib.sha256(_source("mine", "version_one").encode()).digest()
    # Even a file that no longer exists loads from the bytes held.
    path.unlink()
    assert set(discovery.load(resolved).nodes) == {"version_one"}
    # A new resolve sees the new bytes.
    path.write_text(_source("mine", "version_two"))
    assert set(discovery.load(discovery.resolve("mine", project, user_workflows=user)).nodes) == {"version_two"}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("x = 1\n", id="no-workflow"),
        pytest.param("workflow = 5\n", id="workflow-not-a-workflow"),
        pytest.param("workflow = None\n", id="workflow-none"),
        pytest.param("", id="empty-module"),
    ],
)
def test_a_module_without_a_workflow_raises_naming_the_file(project: Path, user: Path, text: str) -> None:
    _write(project / ".pi" / "workflows", "mine", text)
    resolved = discovery.resolve("mine", project, user_workflows=user)
    with pytest.raises(WorkflowDefinitionError) as info:
        discovery.load(resolved)
    assert "mine.workflow.py" in str(info.value)


def test_a_workflow_named_unlike_the_file_stem_raises_naming_the_file(project: Path, user: Path) -> None:
    _write(project / ".pi" / "workflows", "mine", _source("theirs"))
    with pytest.raises(WorkflowDefinitionError) as info:
        discovery.load(discovery.resolve("mine", project, user_workflows=user))
    message = str(info.value)
    assert "mine.workflow.py" in message and "'theirs'" in message and "'mine'" in message


def test_a_syntax_error_surfaces(project: Path, user: Path) -> None:
    _write(project / ".pi" / "workflows", "mine", "workflow = define_workflow(\n")
    resolved = discovery.resolve("mine", project, user_workflows=user)
    with pytest.raises(SyntaxError):
        discovery.load(resolved)


def test_an_invalid_definition_in_the_module_surfaces(project: Path, user: Path) -> None:
    text = _source("mine").replace("start_at='a'", "start_at='ghost'")
    assert "ghost" in text
    _write(project / ".pi" / "workflows", "mine", text)
    with pytest.raises(WorkflowDefinitionError, match="ghost"):
        discovery.load(discovery.resolve("mine", project, user_workflows=user))


# ---------------------------------------------------------------- 7. built-ins


def _kinds(compiled: CompiledWorkflow) -> dict[str, str]:
    return {path: node["kind"] for path, node in compiled.snapshot["nodes"].items()}


def test_builtin_shell_check_resolves_loads_and_compiles(project: Path, user: Path) -> None:
    wf = discovery.load(discovery.resolve("shell-check", project, user_workflows=user))
    compiled = wf.compile()
    assert wf.name == "shell-check"
    assert _kinds(compiled) == {"check": "shell", "report": "compute", "done": "notify"}
    check = compiled.snapshot["nodes"]["check"]
    assert check["effectType"] == "shell-check.run" and check["recovery"] == "idempotent"
    assert check["allowNonZeroExit"] is False  # a failing command fails the check (and its run)
    assert compiled.snapshot["nodes"]["done"]["notifyKind"] == "final"
    assert compiled.snapshot["startAt"] == "check"
    assert compiled.snapshot["maxSteps"] == 10
    assert compiled.snapshot["edges"] == [{"from": "check", "to": "report"}, {"from": "report", "to": "done"}]
    assert compiled.snapshot["mounts"] == {}
    assert compiled.digest == "sha256:" + hashlib.sha256(canonical.dumps_bytes(compiled.snapshot)).hexdigest()
    _assert_plain_json(compiled.snapshot)
    assert route(compiled, "check", "ok") == Route(next_node="report")
    assert route(compiled, "check", "failed") == Route(end_status="failed")
    assert route(compiled, "done", "ok") == Route(end_status="completed")


def test_builtin_demo_resolves_loads_and_covers_every_kind(project: Path, user: Path) -> None:
    wf = discovery.load(discovery.resolve("builtin:demo", project, user_workflows=user))
    compiled = wf.compile()
    assert wf.name == "demo"
    kinds = _kinds(compiled)
    assert kinds == {
        "greet": "compute",
        "progress": "notify",
        "echo": "shell",
        "note": "action",
        "hook": "compute",
        "post": "http",
        "ask": "checkpoint",
        "finish": "notify",
        "stop": "notify",
        "summary/count": "compute",
        "summary/describe": "compute",
    }
    assert {"compute", "notify", "shell", "action", "http", "checkpoint"} <= set(kinds.values())
    assert compiled.snapshot["mounts"] == {"summary": {"workflow": "demo-summary"}}
    assert set(compiled.mounts) == {"summary"}
    assert compiled.snapshot["startAt"] == "greet"
    assert compiled.snapshot["maxSteps"] == 20
    assert canonical.dumps(compiled.snapshot)
    _assert_plain_json(compiled.snapshot)
    # The include is wired: into the mount's entry and out of its exit.
    assert route(compiled, "progress", "ok") == Route(next_node="echo")
    assert route(compiled, "note", "ok") == Route(next_node="hook")
    assert route(compiled, "hook", "ok", {"post": True}) == Route(next_node="post")
    assert route(compiled, "hook", "ok", {"post": False}) == Route(next_node="summary/count")
    assert route(compiled, "post", "ok") == Route(next_node="summary/count")
    assert route(compiled, "summary/count", "ok") == Route(next_node="summary/describe")
    assert route(compiled, "summary/describe", "ok") == Route(next_node="ask")
    assert route(compiled, "ask", "ok", {"continue": True}) == Route(next_node="finish")
    assert route(compiled, "ask", "ok", {"continue": False}) == Route(next_node="stop")
    assert route(compiled, "ask", "ok", {"continue": "maybe"}).routing_error is not None
    assert route(compiled, "finish", "ok") == Route(end_status="completed")


def test_builtin_digests_are_stable_across_loads(project: Path, user: Path) -> None:
    for name in ("demo", "shell-check"):
        first = discovery.load(discovery.resolve(name, project, user_workflows=user)).compile()
        second = discovery.load(discovery.resolve(f"builtin:{name}", project, user_workflows=user)).compile()
        assert first.digest == second.digest
        assert first.snapshot == second.snapshot


def test_compiled_workflows_are_kept_per_exact_bytes(tmp_path):
    """A child executes a module once per source bytes; changed bytes are executed again."""
    project = tmp_path / "p"
    (project / ".pi" / "workflows").mkdir(parents=True)
    path = project / ".pi" / "workflows" / "kept.workflow.py"
    path.write_text(
        'from piworkflows.workflows import *\nworkflow = define_workflow("kept", "a", {"a": compute(lambda c: 1)})\n'
    )
    first = discovery.compiled(discovery.resolve("kept", project))
    assert discovery.compiled(discovery.resolve("kept", project)) is first
    path.write_text(path.read_text() + "# changed\n")
    assert discovery.compiled(discovery.resolve("kept", project)) is not first
    path.write_text("workflow = 1\n")  # a failure is never kept
    for _ in range(2):
        with pytest.raises(WorkflowDefinitionError):
            discovery.compiled(discovery.resolve("kept", project))


# ---------------------------------------------------------------- 8. descriptions and every source


def test_a_description_is_kept_beside_the_snapshot_and_changes_no_digest() -> None:
    described = define_workflow(**_base(description="Does a, then b. Input: {}."))
    assert described.description == "Does a, then b. Input: {}."
    plain = define_workflow(**_base())
    assert plain.description is None
    assert described.compile().digest == plain.compile().digest and "description" not in described.compile().snapshot


@pytest.mark.parametrize("bad", [5, b"bytes", "x" * 1001])
def test_a_description_is_text_of_bounded_length(bad: Any) -> None:
    _rejects("'wf'", "description", description=bad)


def test_every_builtin_describes_itself(project: Path, user: Path) -> None:
    for stem in ("demo", "shell-check"):
        assert "Input:" in (
            discovery.compiled(discovery.resolve(f"builtin:{stem}", project)).workflow.description or ""
        )


def test_every_source_lists_each_file_in_resolve_order(project: Path, user: Path) -> None:
    in_project = _write(project / ".pi" / "workflows", "demo", _source("demo"))
    in_user = _write(user, "demo", _source("demo"))
    other = _write(user, "another", _source("another"))
    (user / "notes.txt").write_text("not a workflow")
    (user / "dir.workflow.py").mkdir()
    found = discovery.every_source(project, user_workflows=user)
    builtins = sorted(discovery.BUILTIN_DIR.glob("*" + discovery.SUFFIX))
    assert found == [("project", "demo", in_project), ("user", "another", other), ("user", "demo", in_user)] + [
        ("builtin", path.name.removesuffix(discovery.SUFFIX), path) for path in builtins
    ]
    assert discovery.every_source(project / "missing", user_workflows=user / "missing") == found[3:]
    assert discovery.read("user", "demo", in_user).origin == "user"
    assert discovery.resolve("demo", project, user_workflows=user).origin == "project"

"""Our run views against upstream Pi Workflows' run-view controls fixture (its
``protocol/fixtures/run-view-controls-v1.json``): the five displays it names match ours field by
field, and every key of its agent snapshot is in ours with a value of the same JSON type (a null
there admits any type here). The fixture's facts are restated below, not copied as a file."""

from __future__ import annotations

from typing import Any

import pytest

from piworkflows.writer.views.display import RunFacts, display
from tests.support import run_group, submitted
from tests.support_agents import AgentStep

pytestmark = pytest.mark.timeout(60)

# name -> (our facts of such a run, upstream's display)
FIXTURE_DISPLAYS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "agent": (
        {"waiting_for": "agent"},
        {
            "status": "waiting",
            "activity": None,
            "controls": ["pause", "cancel", "update", "submit"],
            "reason": "The workflow needs its assigned agent result.",
        },
    ),
    "decision": (
        {"waiting_for": "human_decision"},
        {
            "status": "waiting",
            "activity": None,
            "controls": ["pause", "cancel", "human-answer"],
            "reason": "The workflow needs a protected human decision.",
        },
    ),
    "checkpoint": (
        {"waiting_for": "checkpoint"},
        {
            "status": "waiting",
            "activity": None,
            "controls": ["pause", "cancel", "answer"],
            "reason": "The workflow needs a checkpoint answer.",
        },
    ),
    "paused": (
        {"paused": True, "waiting_for": "checkpoint"},
        {
            "status": "paused",
            "activity": None,
            "controls": ["resume", "cancel"],
            "reason": "The workflow is durably paused.",
        },
    ),
    "ambiguous": (
        {"ambiguous_effects": 1},
        {
            "status": "ambiguous",
            "activity": None,
            "controls": ["review"],
            "reason": "An external effect needs explicit recovery.",
        },
    ),
}

# upstream's agent snapshot as key paths and JSON types ("null": any type here)
AGENT_SNAPSHOT_TYPES = {
    "schema": "string",
    "runId": "string",
    "revision": "number",
    "runRevision": "number",
    "manifest": "object",
    "manifest.schema": "string",
    "manifest.runId": "string",
    "manifest.workflowName": "string",
    "manifest.workflowSource": "object",
    "manifest.startedAt": "string",
    "manifest.finishedAt": "null",
    "manifest.status": "string",
    "manifest.traceSchema": "string",
    "manifest.paths": "object",
    "manifest.paths.workflow": "string",
    "manifest.paths.state": "string",
    "manifest.paths.trace": "string",
    "state": "object",
    "state.schema": "string",
    "state.traceSeq": "number",
    "state.runId": "string",
    "state.workflowName": "string",
    "state.workflowSource": "object",
    "state.startedAt": "string",
    "state.finishedAt": "null",
    "state.updatedAt": "string",
    "state.status": "string",
    "state.input": "object",
    "state.outputs": "object",
    "state.results": "object",
    "state.steps": "array",
    "state.waitingOn": "string",
    "workflow": "object",
    "workflow.schema": "string",
    "workflow.name": "string",
    "workflow.startAt": "string",
    "workflow.nodes": "object",
    "workflow.edges": "array",
    "display": "object",
    "display.status": "string",
    "display.activity": "null",
    "display.controls": "array",
    "display.reason": "string",
    "graphSteps": "array",
    "takenTransitions": "array",
    "graphCursor": "number",
    "stepStart": "number",
    "stepTotal": "number",
    "tracePage": "object",
    "tracePage.start": "number",
    "tracePage.total": "number",
    "tracePage.items": "array",
    "session": "object",
    "session.binding": "null",
    "session.entryPage": "object",
    "session.entryPage.start": "number",
    "session.entryPage.total": "number",
    "session.entryPage.items": "array",
    "session.eventPage": "object",
    "session.eventPage.start": "number",
    "session.eventPage.total": "number",
    "session.eventPage.items": "array",
    "session.capture": "null",
    "session.integrity": "null",
    "settingsScopes": "array",
    "settingsStart": "number",
    "settingsTotal": "number",
    "followUpQueue": "null",
    "followUpStart": "number",
    "followUpTotal": "number",
    "updateStart": "number",
    "updateTotal": "number",
    "live": "boolean",
    "possiblyInterrupted": "boolean",
}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


@pytest.mark.parametrize("name", sorted(FIXTURE_DISPLAYS))
def test_the_fixtures_displays_match_ours_field_by_field(name):
    overrides, expected = FIXTURE_DISPLAYS[name]
    base: dict[str, Any] = {
        "status": "running",
        "paused": False,
        "park_reason": None,
        "ambiguous_effects": 0,
        "waiting_for": None,
        "live_runner": False,
        "open_turn": False,
    }
    assert display(RunFacts(**(base | overrides))) == expected


def test_the_agent_snapshots_keys_and_types_are_in_ours(executor):
    step = AgentStep(executor)
    assert step.start(timeout_ms=1000).outcome == "accepted"
    (reply,) = run_group(executor, submitted("run.get", {"actor": {"actor_class": "client"}, "run_id": "run-1"}))
    view = reply.receipt
    assert view["display"] == FIXTURE_DISPLAYS["agent"][1]
    for path, kind in AGENT_SNAPSHOT_TYPES.items():
        value: Any = view
        for key in path.split("."):
            assert isinstance(value, dict) and key in value, f"{path} is missing"
            value = value[key]
        assert kind == "null" or json_type(value) == kind, f"{path} is {json_type(value)}, upstream's {kind}"

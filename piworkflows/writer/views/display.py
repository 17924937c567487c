"""Display status and allowed controls: the one status reducer every renderer uses.

Precedence (PROTOCOL.md, Views): a durable terminal status; else an
unresolved ambiguous external effect; else the durable pause flag; else a
pending request (waiting); else a live runner or origin-session turn
(running); else queued (parked, or admitted but not started). A parked queue
is not a pause.

Agent steps follow VIEWS.md §5 (the rest of its reducer is the live-views
work's): a run waiting at an agent step shows ``waiting`` with
``[pause, cancel, update, submit]`` and why (its assigned agent result, or
an assistant-message step's visible response); while a model turn is open
the activity is ``origin_turn`` ("working", or a step pending delivery after
this turn). A run parked ``agentNoProgress`` is ``queued`` with
``[resume, cancel]`` and the cause its agent host left (its notification).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from piworkflows.states import AGENT_NODE_KINDS, TERMINAL_RUN_STATUSES

AGENT_RESULT = "The workflow needs its assigned agent result."
VISIBLE_RESPONSE = "The workflow needs its assigned visible response."
AGENT_WORKING = "The agent is working on the workflow step."
STEP_PENDING = "A step is pending delivery. It starts a new model turn after this turn ends."
AGENT_NOT_STARTED = "The agent could not start: "
NO_CAUSE = "no cause was recorded"


@dataclass(frozen=True)
class RunFacts:
    status: str
    paused: bool
    park_reason: str | None
    ambiguous_effects: int
    waiting_for: str | None  # the node kind a pending request waits on (checkpoint, agent, human_decision)
    live_runner: bool
    open_turn: bool
    expected_output: str | None = None  # the open agent request's expected output kind (assistant-message ...)
    pending_step: bool = False  # a step message of the run waits to be delivered (not its open turn's own)
    park_cause: str | None = None  # agentNoProgress: the cause its notification recorded


_WAITING_CONTROLS = {
    "agent": ["pause", "cancel", "update", "submit"],
    "decision": ["pause", "cancel", "update", "submit"],
    "human_decision": ["pause", "cancel", "human-answer"],
    "checkpoint": ["pause", "cancel", "answer"],
}


def display(facts: RunFacts) -> dict[str, Any]:
    if facts.status in TERMINAL_RUN_STATUSES:
        return _view(facts.status, "finished", [], None)
    if facts.ambiguous_effects:
        return _view("ambiguous", "needs review", ["review"], "effectAmbiguous")
    if facts.paused:
        return _view("paused", "paused", ["resume", "cancel"], None)
    if facts.park_reason == "agentNoProgress":  # its request still waits, but no agent works on it
        return _view("queued", None, ["resume", "cancel"], AGENT_NOT_STARTED + (facts.park_cause or NO_CAUSE))
    if facts.waiting_for is not None:
        controls = _WAITING_CONTROLS.get(facts.waiting_for, ["pause", "cancel"])
        if facts.waiting_for in AGENT_NODE_KINDS:
            return _agent_waiting(facts, controls)
        return _view("waiting", f"waiting for {facts.waiting_for}", controls, None)
    if facts.live_runner or facts.open_turn:
        return _view("running", "running", ["pause", "cancel"], None)
    activity = "parked" if facts.park_reason else "queued"
    return _view("queued", activity, ["pause", "cancel"], facts.park_reason)


def _agent_waiting(facts: RunFacts, controls: list[str]) -> dict[str, Any]:
    """VIEWS.md §5 rule 4 for an agent step: an open model turn first, then what the step needs."""
    if facts.open_turn:
        return _view("waiting", "origin_turn", controls, STEP_PENDING if facts.pending_step else AGENT_WORKING)
    reason = VISIBLE_RESPONSE if facts.expected_output == "assistant-message" else AGENT_RESULT
    return _view("waiting", None, controls, reason)


def _view(status: str, activity: str | None, controls: list[str], reason: str | None) -> dict[str, Any]:
    return {"status": status, "activity": activity, "controls": controls, "reason": reason}

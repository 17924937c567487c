"""Display status and allowed controls: the one status reducer every renderer uses.

Precedence (PROTOCOL.md, Views): a durable terminal status; else an
unresolved ambiguous external effect; else the durable pause flag; else a
pending request (waiting); else a live runner or origin-session turn
(running); else queued (parked, or admitted but not started). A parked queue
is not a pause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from piworkflows.states import TERMINAL_RUN_STATUSES


@dataclass(frozen=True)
class RunFacts:
    status: str
    paused: bool
    park_reason: str | None
    ambiguous_effects: int
    waiting_for: str | None  # the node kind a pending request waits on (checkpoint, agent, human_decision)
    live_runner: bool
    open_turn: bool


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
    if facts.waiting_for is not None:
        controls = _WAITING_CONTROLS.get(facts.waiting_for, ["pause", "cancel"])
        return _view("waiting", f"waiting for {facts.waiting_for}", controls, None)
    if facts.live_runner or facts.open_turn:
        return _view("running", "running", ["pause", "cancel"], None)
    activity = "parked" if facts.park_reason else "queued"
    return _view("queued", activity, ["pause", "cancel"], facts.park_reason)


def _view(status: str, activity: str, controls: list[str], reason: str | None) -> dict[str, Any]:
    return {"status": status, "activity": activity, "controls": controls, "reason": reason}

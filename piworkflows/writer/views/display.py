"""Display status, activity, controls and reason: the one reducer every renderer uses (docs/protocol.md, Run views;
upstream's vocabulary and sentences). First match wins:

1. terminal: the error text as the reason (above 16 KiB, a notice); an open turn gives
   ``origin_turn`` and ``[cancel]`` (``[]`` once cancelled)
2. an unresolved ambiguous effect: ``ambiguous``, ``[review]``
3. the durable pause flag: ``paused``, ``[resume, cancel]`` (a parked queue is not a pause)
   (a run parked ``agentNoProgress`` is ``queued``, ``[resume, cancel]``, with the cause its agent
   host left: its request still waits, but no agent works on it)
4. a pending request: ``waiting``, ``[pause, cancel]`` and the kind's controls and sentence; an
   open model turn gives ``origin_turn`` ("working", or a step pending delivery after this turn)
5. a live runner (``supervised_runner``) or an open turn (``origin_turn``): ``running``
6. ``queued``, ``[cancel]``; parked: ``[resume, cancel]`` and the park reason's sentence

Activity is otherwise null. Clients decide by ``status`` (and the run's park reason), never by
the sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from piworkflows.states import AGENT_NODE_KINDS, TERMINAL_RUN_STATUSES

AGENT_RESULT = "The workflow needs its assigned agent result."
VISIBLE_RESPONSE = "The workflow needs its assigned visible response."
AGENT_WORKING = "The agent is working on the workflow step."
STEP_PENDING = "A step is pending delivery. It starts a new model turn after this turn ends."
AGENT_NOT_STARTED = "The agent made no progress: "
NO_CAUSE = "no cause was recorded"
AMBIGUOUS = "An external effect needs explicit recovery."
PAUSED = "The workflow is durably paused."
FAILURE_DETAILS = "Complete workflow failure details are available."
# A terminal run's error text is its reason up to this many bytes; a longer one shows FAILURE_DETAILS.
REASON_BYTES = 16 * 1024
WAITING = {
    "agent": (["update", "submit"], AGENT_RESULT),
    "decision": (["update", "submit"], AGENT_RESULT),
    "checkpoint": (["answer"], "The workflow needs a checkpoint answer."),
    "human_decision": (["human-answer"], "The workflow needs a protected human decision."),
}
PARKED = {
    "runnerNoProgress": "The worker exited before it saved workflow progress.",
    "shutdown": "The server stopped; the workflow resumes when it starts.",
    "workflowSourceChanged": "The workflow source changed since the run started.",
}


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
    error: bytes | None = None  # a terminal run's error text, its first REASON_BYTES + 1 bytes


def display(facts: RunFacts) -> dict[str, Any]:
    if facts.status in TERMINAL_RUN_STATUSES:
        reason = _error_reason(facts.error)
        if facts.open_turn:
            return _view(facts.status, "origin_turn", [] if facts.status == "cancelled" else ["cancel"], reason)
        return _view(facts.status, None, [], reason)
    if facts.ambiguous_effects:
        return _view("ambiguous", None, ["review"], AMBIGUOUS)
    if facts.paused:
        return _view("paused", None, ["resume", "cancel"], PAUSED)
    if facts.park_reason == "agentNoProgress":
        return _view("queued", None, ["resume", "cancel"], AGENT_NOT_STARTED + (facts.park_cause or NO_CAUSE))
    if facts.waiting_for is not None:
        return _waiting(facts)
    if facts.live_runner:
        return _view("running", "supervised_runner", ["pause", "cancel"], None)
    if facts.open_turn:
        return _view("running", "origin_turn", ["pause", "cancel"], None)
    if facts.park_reason is not None:
        return _view("queued", None, ["resume", "cancel"], PARKED.get(facts.park_reason))
    return _view("queued", None, ["cancel"], None)


def _waiting(facts: RunFacts) -> dict[str, Any]:
    extra, reason = WAITING.get(facts.waiting_for or "", ([], None))
    controls = ["pause", "cancel", *extra]
    if facts.waiting_for in AGENT_NODE_KINDS:
        if facts.open_turn:
            return _view("waiting", "origin_turn", controls, STEP_PENDING if facts.pending_step else AGENT_WORKING)
        if facts.expected_output == "assistant-message":
            reason = VISIBLE_RESPONSE
    return _view("waiting", None, controls, reason)


def _error_reason(error: bytes | None) -> str | None:
    if error is None:
        return None
    return error.decode("utf-8", "replace") if len(error) <= REASON_BYTES else FAILURE_DETAILS


def _view(status: str, activity: str | None, controls: list[str], reason: str | None) -> dict[str, Any]:
    return {"status": status, "activity": activity, "controls": controls, "reason": reason}

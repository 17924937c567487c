"""The oracles of the Telegram side (``--telegram``): the users' presses, the messages that reached
the fake Bot API and the offsets it confirmed, compared with the final database.

Pure functions of ``evidence["telegram"]`` (telegram.py: every press with its update id, every
sendMessage the fake received, the offsets getUpdates confirmed) and of ``snapshot.State``;
``judge`` sorts the findings into the report's classes. The harness never retries a channel
message (no ``channels recover``), so any decision sent twice to one chat is a duplicate.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from stress.crash.snapshot import State

TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})
UNSETTLED = frozenset({"pending", "applying"})
_RUN_LINE = re.compile(r"^Run (\S+), node (\S+)$", re.MULTILINE)


def decision_of(text: str) -> tuple[str, str] | None:
    """(run id, node path) a delivery's text names (``Run <run>, node <path>``), else None."""
    found = _RUN_LINE.search(text)
    return (found.group(1), found.group(2)) if found else None


def update_id_of(key: str, channel_id: str) -> int | None:
    """The update id a channel submission's key names (canonical JSON ``[channelId, updateId]``)."""
    try:
        value = json.loads(key)
    except ValueError:
        return None
    if isinstance(value, list) and len(value) == 2 and value[0] == channel_id and isinstance(value[1], int):
        return value[1]
    return None


def press_submissions(found: dict[str, Any], state: State) -> dict[str, list[str]]:
    """Every press is exactly one submission keyed by its update id (none lost, none twice), and
    every channel submission is a press the users made."""
    channel_id = found["channelId"]
    by_update = Counter(
        update_id_of(s["key"], channel_id) for s in state.decision_submissions if s["channelId"] == channel_id
    )
    pressed = {press["updateId"] for press in found["presses"]}
    lost, duplicated = [], []
    for press in found["presses"]:
        n = by_update.get(press["updateId"], 0)
        where = f"press {press['updateId']} (chat {press['chat']}, run {press['runId']})"
        if n == 0:
            lost.append(f"{where} has no submission")
        elif n > 1:
            duplicated.append(f"{where} has {n} submissions")
    strangers = sorted(str(update) for update in by_update if update not in pressed)
    violations = [
        f"a submission of channel {channel_id} names update {update}, which no user made" for update in strangers
    ]
    return {"lost": lost, "duplicated": duplicated, "violations": violations}


def resolved_more_than_once(state: State) -> list[str]:
    return [
        f"decision {decision_id} has {d['resolutions']} resolutions"
        for decision_id, d in sorted(state.decisions.items())
        if d["resolutions"] > 1
    ]


def unresolved_of_ended_runs(state: State) -> list[str]:
    """A decision of a run that ended has its one resolution (a press, the operator, a cancel)."""
    found = []
    for decision_id, decision in sorted(state.decisions.items()):
        run = state.runs.get(decision["runId"])
        if run is not None and run["status"] in TERMINAL and decision["resolutions"] == 0:
            found.append(f"decision {decision_id} of run {decision['runId']} ({run['status']}) has no resolution")
    return found


def unended_runs(state: State, workflow: str) -> list[str]:
    """Every decision run ended: the quiet period resumed the paused and parked ones and the
    operator answered the decisions nobody could press any more."""
    return [
        f"decision run {run_id} did not end: {run['status']} (paused {run['paused']}, park {run['parkReason']})"
        for run_id, run in sorted(state.runs.items())
        if run["workflow"] == workflow and run["status"] not in TERMINAL
    ]


def sent_twice(found: dict[str, Any]) -> list[str]:
    """No decision reached a chat more than once: its text names its run and node."""
    sends: Counter[tuple[str, str, str]] = Counter()
    for send in found["sends"]:
        shown = decision_of(str(send["text"] or ""))
        if shown:
            sends[(str(send["chat"]), *shown)] += 1
    return [
        f"the decision of run {run_id}, node {node} was sent to chat {chat} {n} times"
        for (chat, run_id, node), n in sorted(sends.items())
        if n > 1
    ]


def cursor_findings(found: dict[str, Any], state: State) -> list[str]:
    """No offset was confirmed at Telegram beyond what the database committed, and every update
    the users made was consumed: the final cursor is the last update id + 1."""
    cursor = state.cursors.get(found["channelId"])
    if cursor is None:
        return [f"channel {found['channelId']} has no cursor"] if found["presses"] else []
    ahead = sorted({offset for offset in found["confirmed"] if offset > cursor})
    problems = [f"getUpdates confirmed offset {offset}, past the committed cursor {cursor}" for offset in ahead]
    last = found["lastUpdate"]
    if last is not None and cursor != last + 1:
        problems.append(f"the final cursor is {cursor}, not {last + 1} (the last update {last} + 1)")
    return problems


def unsettled_messages(state: State) -> list[str]:
    return [
        f"channel message {effect_id} ({effect['type']}) is still {effect['status']}"
        for effect_id, effect in sorted(state.channel_effects.items())
        if effect["status"] in UNSETTLED
    ]


def judge(found: dict[str, Any], state: State, workflow: str) -> dict[str, list[str]]:
    """The findings by class (the same four classes as oracles.judge)."""
    presses = press_submissions(found, state)
    return {
        "lost": presses["lost"],
        "duplicated": presses["duplicated"] + resolved_more_than_once(state) + sent_twice(found),
        "violations": presses["violations"] + unresolved_of_ended_runs(state) + cursor_findings(found, state),
        "stuck": unended_runs(state, workflow) + unsettled_messages(state),
    }

"""The target of every run-view member: a revision's ops are stored as one patch per target it
changed (``viewer_deltas``), in the order of states.VIEW_TARGETS (docs/storage.md, Viewer deltas).

::

    summary        what the run is and how it stands: /display, /manifest, /queue, /live,
                   /possiblyInterrupted, /piworkflows, /state (its status, times, error, final
                   output, current node ...; the whole /state when it is replaced), settings
    graph          /workflow, /graphSteps, /takenTransitions, /graphCursor and their windows
    inspector      /state/steps, /state/outputs, /state/results, /stepStart, /stepTotal
    timeline       /tracePage, /updates (and its mirror /state/updates)
    replay         /session: the session pages and the replay checkpoint
    conversation   /workflowMessages, /followUpQueue and their windows

``/revision`` and ``/runRevision`` belong to no target: the first delta of a revision begins with
them (PREFIX).
"""

from __future__ import annotations

from piworkflows.states import VIEW_TARGETS

MEMBERS: dict[str, str] = {
    "display": "summary",
    "manifest": "summary",
    "queue": "summary",
    "live": "summary",
    "possiblyInterrupted": "summary",
    "piworkflows": "summary",
    "state": "summary",
    "settingsScopes": "summary",
    "settingsStart": "summary",
    "settingsTotal": "summary",
    "workflow": "graph",
    "graphSteps": "graph",
    "graphHistory": "graph",
    "takenTransitions": "graph",
    "takenTransitionStart": "graph",
    "takenTransitionTotal": "graph",
    "graphCursor": "graph",
    "stepStart": "inspector",
    "stepTotal": "inspector",
    "tracePage": "timeline",
    "updates": "timeline",
    "updateStart": "timeline",
    "updateTotal": "timeline",
    "session": "replay",
    "workflowMessages": "conversation",
    "workflowMessageStart": "conversation",
    "workflowMessageTotal": "conversation",
    "followUpQueue": "conversation",
    "followUpStart": "conversation",
    "followUpTotal": "conversation",
}
STATE_MEMBERS: dict[str, str] = {  # /state/<member>; any other member of /state is summary's
    "steps": "inspector",
    "outputs": "inspector",
    "results": "inspector",
    "updates": "timeline",
}
PREFIX = ("revision", "runRevision")  # the first delta of each revision begins with these
ORDER = {target: index for index, target in enumerate(VIEW_TARGETS)}
assert set(MEMBERS.values()) | set(STATE_MEMBERS.values()) == set(VIEW_TARGETS)


def target_of(path: str) -> str:
    """The target of an op's path (a JSON Pointer into the run view, not /revision or /runRevision)."""
    _, member, *rest = path.split("/", 3)
    if member == "state" and rest:
        return STATE_MEMBERS.get(rest[0], "summary")
    return MEMBERS[member]

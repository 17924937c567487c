"""Named fault points for crash tests and the stress harness.

A point does nothing unless ``PIW_FAULTS`` names it::

    PIW_FAULTS="writer.after_commit=crash@3,writer.before_commit=sleep:50"

Actions: ``crash`` (SIGKILL to this process: no cleanup, like ``kill -9``),
``raise`` (``FaultInjected``), ``sleep:MS``, ``enospc`` and ``eio`` (the
``OSError`` a full or failing disk gives at that write). ``@N`` fires on the
Nth hit only, ``@N-M`` on hits N to M (default: every hit). Each point is
named once, here; call sites use the constants. An outbox worker the pool restarts runs without ``PIW_FAULTS``, so a
worker fault fires in the first worker of each slot only; likewise a resolver child started after
one broke, and an agent host (with its Pi) started after one ended unclosed.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass

ENV = "PIW_FAULTS"

WRITER_BEFORE_COMMIT = "writer.before_commit"
WRITER_AFTER_COMMIT = "writer.after_commit"
WRITER_AFTER_REPLY = "writer.after_reply"
# In an outbox worker: the attempt is recorded and the effect handed over, nothing acted yet;
# and (http) the request was sent, its answer not read yet.
# Between two steps of a backup's copy (tests slow it down to watch it).
WRITER_BACKUP_STEP = "writer.backup_step"
OUTBOX_AFTER_ATTEMPT_RECORDED = "outbox.after_attempt_recorded"
OUTBOX_AFTER_REQUEST_SENT = "outbox.after_request_sent"
# The supervisor's own writes: host.json (before its temp file is renamed into place) and a
# line of server.log.
SUPERVISOR_REGISTRY_SAVE = "supervisor.registry_save"
SUPERVISOR_LOG_WRITE = "supervisor.log_write"
# In the supervisor's shutdown, once the client socket closed (tests hang a stop there: its children live on).
SUPERVISOR_SOCKET_CLOSED = "supervisor.socket_closed"
# In an agent host (piworkflows/agents/host.py; agents/command.py for a command step): its launch
# read (the segment is open), around the RPC prompt of a step (the command's start), after each
# report of C6, C7 and C8, before C9 and C12.
AGENT_AFTER_OPEN = "agent.after_open"
AGENT_BEFORE_PROMPT = "agent.before_prompt"
AGENT_AFTER_PROMPT = "agent.after_prompt"
AGENT_AFTER_MESSAGE_SENT = "agent.after_message_sent"
AGENT_AFTER_TURN_STARTED = "agent.after_turn_started"
AGENT_BEFORE_TURN_END = "agent.before_turn_end"
AGENT_AFTER_RECORD = "agent.after_record"
AGENT_BEFORE_CLOSE = "agent.before_close"
# In Pi, the workflow tool (piworkflows/agents/pi/workflow.ts reads PIW_FAULTS itself; only
# ``crash`` there, which kills Pi): a submission written to the socket, its verdict not read.
TOOL_AFTER_SUBMIT_SENT = "tool.after_submit_sent"
# In the supervisor, a submission recorded validating (C10) and not yet judged; in the validator
# (a resolver child), the verdict reached and not yet answered.
SUPERVISOR_AFTER_SUBMISSION_RECORDED = "supervisor.after_submission_recorded"
VALIDATOR_BEFORE_VERDICT = "validator.before_verdict"
# In a Telegram adapter child (piworkflows/channels/adapter.py): a getUpdates batch received and
# not yet handed to the manager; its commit confirmed (the ack) and the offset not yet advanced;
# an effect's attempt handed over (recorded) and nothing sent yet; its request sent, the answer
# not read yet.
CHANNEL_AFTER_UPDATES_RECEIVED = "channel.after_updates_received"
CHANNEL_AFTER_UPDATES_COMMITTED = "channel.after_updates_committed"
CHANNEL_AFTER_ATTEMPT_RECORDED = "channel.after_attempt_recorded"
CHANNEL_AFTER_REQUEST_SENT = "channel.after_request_sent"

POINTS = frozenset(
    {
        WRITER_BEFORE_COMMIT,
        WRITER_AFTER_COMMIT,
        WRITER_AFTER_REPLY,
        WRITER_BACKUP_STEP,
        OUTBOX_AFTER_ATTEMPT_RECORDED,
        OUTBOX_AFTER_REQUEST_SENT,
        SUPERVISOR_REGISTRY_SAVE,
        SUPERVISOR_LOG_WRITE,
        SUPERVISOR_SOCKET_CLOSED,
        AGENT_AFTER_OPEN,
        AGENT_BEFORE_PROMPT,
        AGENT_AFTER_PROMPT,
        AGENT_AFTER_MESSAGE_SENT,
        AGENT_AFTER_TURN_STARTED,
        AGENT_BEFORE_TURN_END,
        AGENT_AFTER_RECORD,
        AGENT_BEFORE_CLOSE,
        TOOL_AFTER_SUBMIT_SENT,
        SUPERVISOR_AFTER_SUBMISSION_RECORDED,
        VALIDATOR_BEFORE_VERDICT,
        CHANNEL_AFTER_UPDATES_RECEIVED,
        CHANNEL_AFTER_UPDATES_COMMITTED,
        CHANNEL_AFTER_ATTEMPT_RECORDED,
        CHANNEL_AFTER_REQUEST_SENT,
    }
)
ACTIONS = ("crash", "raise", "sleep", "enospc", "eio")
_DISK_ERRORS = {"enospc": errno.ENOSPC, "eio": errno.EIO}


class FaultInjected(RuntimeError):
    pass


@dataclass
class _Rule:
    action: str
    arg: int
    first: int | None  # fires on hits first..last (None: every hit)
    last: int | None
    hits: int = 0


def parse(spec: str) -> dict[str, _Rule]:
    rules: dict[str, _Rule] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r}; known: {', '.join(sorted(POINTS))}")
        action, _, hits = action.partition("@")
        action, _, arg = action.partition(":")
        if action not in ACTIONS or (action == "sleep") != bool(arg):
            raise ValueError(f"bad fault action in {item!r}: use crash, raise, sleep:MS, enospc or eio")
        first, _, last = hits.partition("-")
        window = (int(first), int(last or first)) if first else (None, None)
        rules[name] = _Rule(action, int(arg or 0), *window)
    return rules


_rules = parse(os.environ.get(ENV, ""))


def hit(point: str) -> None:
    """Mark that execution reached ``point``; act if PIW_FAULTS asks."""
    rule = _rules.get(point)
    if rule is None:
        return
    rule.hits += 1
    if rule.first is not None and rule.last is not None and not rule.first <= rule.hits <= rule.last:
        return
    if rule.action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif rule.action == "raise":
        raise FaultInjected(point)
    elif rule.action in _DISK_ERRORS:
        code = _DISK_ERRORS[rule.action]
        raise OSError(code, os.strerror(code), point)
    else:
        time.sleep(rule.arg / 1000)


def configure(spec: str) -> None:
    """Replace the active rules (in-process tests)."""
    global _rules
    _rules = parse(spec)

"""Closed value sets: the one Python owner of every status and kind name.

A leaf module (stdlib only). ``writer/schema.sql`` repeats each set in a CHECK
constraint because SQLite needs it there; ``tests/unit/test_states.py`` keeps
the two equal. Transition tables live beside the sets they constrain.
"""

from __future__ import annotations

ACTOR_CLASSES = frozenset(
    {"server", "client", "runner", "outbox", "channel", "operator", "human", "model", "maintenance"}
)

RESOURCE_KINDS = frozenset(
    {
        "server",
        "run",
        "settings_scope",
        "follow_up",
        "decision",
        "managed_resource",
        "effect",
        "channel",
        "workflow_message",
        "session_segment",
    }
)

# Outcomes a durable command receipt can store (``unavailable`` is never stored).
STORED_OUTCOMES = frozenset({"accepted", "rejected", "conflict", "notFound", "claimLost"})

MEDIA_JSON = "application/json"
MEDIA_TEXT = "text/plain;charset=utf-8"
MEDIA_TYPES = frozenset({MEDIA_JSON, MEDIA_TEXT})

# Runs (docs/workflows.md, Run lifecycle).
RUN_STATUSES = frozenset({"queued", "running", "waiting", "completed", "failed", "timed_out", "cancelled"})
RUN_STATUS_VALUES = tuple(sorted(RUN_STATUSES))  # the protocol's order (run.list's status filter)
TERMINAL_RUN_STATUSES = frozenset({"completed", "failed", "timed_out", "cancelled"})
# The run's histories a view.page reads (writer/views/pages.py), in the order of the run view.
PAGE_KINDS = (
    "steps",
    "trace",
    "updates",
    "session_entries",
    "session_events",
    "settings",
    "follow_ups",
    "workflow_messages",
)
QUEUE_STATUSES = frozenset({"queued", "starting", "running", "parked", "done", "failed", "cancelled"})
PARK_REASONS = frozenset(
    {"shutdown", "paused", "runnerNoProgress", "workflowSourceChanged", "effectAmbiguous", "agentNoProgress"}
)
# What a runner itself may ask its run to park for when it exits (runner.exited park_reason).
RUNNER_PARK_REASONS = frozenset({"workflowSourceChanged", "effectAmbiguous"})
# Parks whose runner exit recorded why (the run view's parkDetail): what a runner that made no
# progress left, or what changed in the run's source.
DETAILED_PARKS = frozenset({"runnerNoProgress", "workflowSourceChanged"})
EXECUTION_MODES = frozenset({"headless", "interactive"})
RUN_LINEAGES = frozenset({"root", "restart", "recovery", "child"})
RUNNER_OUTCOMES = frozenset({"exited", "cancelled", "timedOut", "crashed", "claimLost", "orphaned"})
RUNNER_COMMANDS = frozenset({"start", "resume", "continue", "restart"})
# How a runner may end its run where no node is active (run.finish): an answered checkpoint's
# route completes it or fails it, workflow code that fails outside a node fails it, and an agent
# step the writer settled as failed or timed out (no route for it) ends it so.
RUN_FINISH_STATUSES = frozenset({"completed", "failed", "timed_out"})

NODE_KINDS = frozenset(
    {"agent", "decision", "compute", "notify", "action", "shell", "http", "checkpoint", "human_decision", "workflow"}
)
# The node kinds whose step an agent performs (an interactive request; docs/agents.md).
AGENT_NODE_KINDS = frozenset({"agent", "decision"})
ATTEMPT_STATUSES = frozenset({"running", "waiting", "completed", "failed", "timed_out", "cancelled", "interrupted"})
NODE_OUTCOMES = frozenset({"ok", "failed", "timed_out", "cancelled"})
ACTIVE_ATTEMPT_STATUSES = frozenset({"running", "waiting"})  # an attempt that has not finished

# Effects (docs/workflows.md, Effects: the status table is the contract).
EFFECT_STATUSES = frozenset({"pending", "applying", "applied", "rejected", "ambiguous", "cancelled"})
EFFECT_CLASSES = frozenset({"local", "external"})
# Who applies an effect: the writer (local effects), the runner (an action node's own code),
# or an outbox worker through the performer of that name (POOL_PERFORMERS).
POOL_PERFORMERS = frozenset({"shell.exec", "http.request"})
# A channel's adapter child performs the channel's effects (scope 'channel'), claimed by the
# supervisor's channel manager of that channel.
CHANNEL_PERFORMER = "telegram.api"
EFFECT_PERFORMERS = frozenset({"writer", "runner", CHANNEL_PERFORMER}) | POOL_PERFORMERS
# Who may perform a node's effect (node.reserve_effect): its action body in the runner, or the pool.
NODE_EFFECT_PERFORMERS = frozenset({"runner"}) | POOL_PERFORMERS
# How a performer reports an attempt ended (effect.settle): applied, rejected or ambiguous as the
# effect table says; retry: it definitely did not act, and the next attempt is due later.
EFFECT_SETTLEMENTS = frozenset({"applied", "rejected", "ambiguous", "retry"})
RECOVERY_POLICIES = frozenset({"idempotent", "manual"})
EFFECT_OWNER_SCOPES = frozenset({"server", "run", "resource_manager", "channel"})
EFFECT_ATTEMPT_STATUSES = frozenset({"applying", "applied", "rejected", "failed", "ambiguous"})
UNSETTLED_EFFECT_STATUSES = frozenset({"pending", "applying", "ambiguous"})
# Still the performer's work (an ambiguous one is an operator's): what a waiting runner waits for.
EFFECT_WORK_STATUSES = frozenset({"pending", "applying"})
TERMINAL_EFFECT_STATUSES = frozenset({"applied", "rejected", "cancelled"})

# Allowed effect status transitions. ``applying -> pending`` schedules the next
# attempt of an idempotent effect; ``ambiguous -> pending`` is an operator retry
# (its claim records the new numbered attempt); ``ambiguous -> applied`` an
# operator confirmation; ``ambiguous -> cancelled`` never: the run's cancel
# leaves an ambiguous effect for the operator.
EFFECT_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"applying", "cancelled"}),
    "applying": frozenset({"applied", "rejected", "pending", "ambiguous"}),
    "ambiguous": frozenset({"applied", "pending"}),
    "applied": frozenset(),
    "rejected": frozenset(),
    "cancelled": frozenset(),
}

# How an applying attempt ends for each effect status it settles into.
ATTEMPT_END_FOR_EFFECT_STATUS = {
    "applied": "applied",
    "rejected": "rejected",
    "pending": "failed",
    "ambiguous": "ambiguous",
}

INTERACTIVE_REQUEST_STATUSES = frozenset({"pending", "validating", "accepted", "cancelled", "failed"})
SUBMISSION_OUTCOMES = frozenset({"accepted", "adopted", "rejected"})
MESSAGE_KINDS = frozenset({"step", "decision", "notification", "terminal", "follow_up"})
MESSAGE_STATES = frozenset({"pending", "sent", "cancelled"})
RECOVERY_STOPS = frozenset({"cancellation", "interruption", "timeout"})
TURN_STATES = frozenset({"open", "ended", "lost"})
DECISION_RESOLUTION_KINDS = frozenset({"human", "timeoutPolicy", "cancellation", "expiry"})
DECISION_SUBMISSION_OUTCOMES = frozenset({"accepted", "rejected", "superseded"})
FOLLOW_UP_STATUSES = frozenset({"queued", "delivered", "removed", "cancelled"})
SEGMENT_STATUSES = frozenset({"recording", "closed"})
INTERVAL_END_CAUSES = frozenset({"pause", "disconnect", "settlement", "recovery", "turn_end"})
UPDATE_KINDS = frozenset({"progress", "notification"})
# Agent steps (docs/agents.md): what a step must produce, who performs it, which Pi session it
# continues, a turn report's phase, and a validator's verdict on a submission (and why it refused).
EXPECTED_OUTPUT_KINDS = frozenset({"description", "schema", "assistant-message"})
AGENT_EXECUTORS = frozenset({"pi", "command"})
AGENT_SESSIONS = frozenset({"run", "fresh"})
TURN_PHASES = frozenset({"started", "ended"})
SUBMISSION_VERDICTS = frozenset({"accepted", "rejected"})
SUBMISSION_REJECTIONS = frozenset({"validationFailed", "validatorFailed"})
# Why the run of a command step (``executor=command(argv)``) fails its attempt (its error_code): the
# command did not give an output (could not start, exited non-zero, printed no usable stdout), or
# the output was rejected (the code of the validator's verdict).
COMMAND_STEP_FAILURES = frozenset({"commandFailed", *SUBMISSION_REJECTIONS})
BINDING_KINDS = frozenset({"settings", "session", "managed_resource"})
SOURCE_KINDS = frozenset({"file", "builtin"})
# Where a workflow is found, in resolve order (the first hit of a name wins).
WORKFLOW_ORIGINS = ("project", "user", "builtin")
CONTROLLER_LIFECYCLES = frozenset({"active", "deleting"})
CONTROLLER_QUEUE_STATUSES = frozenset({"queued", "claimed", "idle"})
CHANNEL_KINDS = frozenset({"telegram"})
CHANNEL_RECORD_KINDS = frozenset({"delivery", "settlement"})
# The targets of a run view's patches, in the fixed order of a revision's deltas
# (writer/views/targets.py maps every member of the view to one).
VIEW_TARGETS = ("summary", "graph", "replay", "timeline", "conversation", "inspector")

# The server (server.status): its state, and why it cannot commit when it cannot. The writer says
# what it can do (its HEALTH frames) or why it could not start (its FATAL frame).
SERVER_STATES = ("running", "unavailable", "refusing", "stopping")  # refusing: every write refused
WRITER_HEALTH_CODES = ("diskFull", "ioError", "databaseCorrupt")
WRITER_START_FAILURES = (*WRITER_HEALTH_CODES, "stateIncompatible", "statePathRefused", "cannotOpen")
UNAVAILABLE_REASONS = (*WRITER_START_FAILURES, "writerRestarting")

# The Telegram channel's effects (docs/decisions.md, Effects): effect type -> recovery policy. A send is
# manual (an uncertain send is never repeated without an operator: channel.recover); an answer to a
# button press and an edit are idempotent (repeating one is harmless).
TELEGRAM_EFFECT_POLICIES: dict[str, str] = {
    "telegram.deliver": "manual",
    "telegram.prompt": "manual",
    "telegram.reply": "manual",
    "telegram.notify": "manual",
    "telegram.answerCallback": "idempotent",
    "telegram.settle": "idempotent",
}
TELEGRAM_MAX_ATTEMPTS = 6
CHANNEL_KINDS = frozenset({"telegram"})
CHANNEL_RECORD_KINDS = frozenset({"delivery", "settlement"})
# A channel's adapter child, as the manager reports it (supervisord's states).
CHANNEL_STATES = frozenset({"starting", "running", "backoff", "stopped", "fatal"})
# What an adapter hands its manager: an update's kind, the Bot API methods it calls for effects,
# how a call ended, and a polling fault.
TELEGRAM_UPDATE_KINDS = frozenset({"callback", "message"})
TELEGRAM_METHODS = frozenset({"sendMessage", "editMessageText", "editMessageReplyMarkup", "answerCallbackQuery"})
TELEGRAM_CALL_OUTCOMES = frozenset({"applied", "rejected", "failed", "uncertain"})
CHANNEL_FAULTS = frozenset({"unauthorized", "pollConflict", "floodWait", "network"})
# An operator's evidence about an ambiguous channel message (channel.recover).
CHANNEL_RECOVER_ACTIONS = frozenset({"confirm", "retry"})

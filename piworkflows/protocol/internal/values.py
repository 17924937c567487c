"""The field types of the closed value sets: each a ``Literal`` of its set in ``states.py`` (or
``errors.OUTCOMES``), so a set is written once.

A model field names one of these, never a ``Literal`` of its own values;
``tests/unit/test_protocol_values.py`` checks that every ``Literal`` field of
the internal protocol accepts exactly its set. (mypy sees each alias as
``Any``: a ``Literal`` of a computed tuple is not a static type.)
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal, TypeAlias

from piworkflows import errors, states


def _values(values: Collection[str]) -> tuple[str, ...]:
    """A set's values in a stable order (a tuple keeps its own: resolve order, report order)."""
    return tuple(values) if isinstance(values, tuple) else tuple(sorted(values))


ActorClass: TypeAlias = Literal[_values(states.ACTOR_CLASSES)]  # type: ignore[valid-type]
MediaType: TypeAlias = Literal[_values(states.MEDIA_TYPES)]  # type: ignore[valid-type]
Outcome: TypeAlias = Literal[_values(errors.OUTCOMES)]  # type: ignore[valid-type]

# runs and runners
SourceKind: TypeAlias = Literal[_values(states.SOURCE_KINDS)]  # type: ignore[valid-type]
ExecutionMode: TypeAlias = Literal[_values(states.EXECUTION_MODES)]  # type: ignore[valid-type]
RunStatus: TypeAlias = Literal[_values(states.RUN_STATUSES)]  # type: ignore[valid-type]
TerminalRunStatus: TypeAlias = Literal[_values(states.TERMINAL_RUN_STATUSES)]  # type: ignore[valid-type]
RunFinishStatus: TypeAlias = Literal[_values(states.RUN_FINISH_STATUSES)]  # type: ignore[valid-type]
LaunchCommand: TypeAlias = Literal[_values(states.RUNNER_COMMANDS)]  # type: ignore[valid-type]
RunnerOutcome: TypeAlias = Literal[_values(states.RUNNER_OUTCOMES)]  # type: ignore[valid-type]
RunnerParkReason: TypeAlias = Literal[_values(states.RUNNER_PARK_REASONS)]  # type: ignore[valid-type]
NodeKind: TypeAlias = Literal[_values(states.NODE_KINDS)]  # type: ignore[valid-type]
NodeOutcome: TypeAlias = Literal[_values(states.NODE_OUTCOMES)]  # type: ignore[valid-type]

# effects
EffectClass: TypeAlias = Literal[_values(states.EFFECT_CLASSES)]  # type: ignore[valid-type]
EffectStatus: TypeAlias = Literal[_values(states.EFFECT_STATUSES)]  # type: ignore[valid-type]
Performer: TypeAlias = Literal[_values(states.EFFECT_PERFORMERS)]  # type: ignore[valid-type]
PoolPerformer: TypeAlias = Literal[_values(states.POOL_PERFORMERS)]  # type: ignore[valid-type]
NodeEffectPerformer: TypeAlias = Literal[_values(states.NODE_EFFECT_PERFORMERS)]  # type: ignore[valid-type]
RecoveryPolicy: TypeAlias = Literal[_values(states.RECOVERY_POLICIES)]  # type: ignore[valid-type]
EffectOwnerScope: TypeAlias = Literal[_values(states.EFFECT_OWNER_SCOPES)]  # type: ignore[valid-type]
Settlement: TypeAlias = Literal[_values(states.EFFECT_SETTLEMENTS)]  # type: ignore[valid-type]

# channels
TelegramUpdateKind: TypeAlias = Literal[_values(states.TELEGRAM_UPDATE_KINDS)]  # type: ignore[valid-type]
TelegramMethod: TypeAlias = Literal[_values(states.TELEGRAM_METHODS)]  # type: ignore[valid-type]
TelegramCallOutcome: TypeAlias = Literal[_values(states.TELEGRAM_CALL_OUTCOMES)]  # type: ignore[valid-type]
ChannelFault: TypeAlias = Literal[_values(states.CHANNEL_FAULTS)]  # type: ignore[valid-type]
ChannelRecoverAction: TypeAlias = Literal[_values(states.CHANNEL_RECOVER_ACTIONS)]  # type: ignore[valid-type]

# workflows and the writer
WorkflowOrigin: TypeAlias = Literal[_values(states.WORKFLOW_ORIGINS)]  # type: ignore[valid-type]
WriterStartFailure: TypeAlias = Literal[_values(states.WRITER_START_FAILURES)]  # type: ignore[valid-type]
WriterHealthCode: TypeAlias = Literal[_values(states.WRITER_HEALTH_CODES)]  # type: ignore[valid-type]

# agent steps
ExpectedOutputKind: TypeAlias = Literal[_values(states.EXPECTED_OUTPUT_KINDS)]  # type: ignore[valid-type]
AgentExecutor: TypeAlias = Literal[_values(states.AGENT_EXECUTORS)]  # type: ignore[valid-type]
AgentSession: TypeAlias = Literal[_values(states.AGENT_SESSIONS)]  # type: ignore[valid-type]
TurnPhase: TypeAlias = Literal[_values(states.TURN_PHASES)]  # type: ignore[valid-type]
SubmissionVerdict: TypeAlias = Literal[_values(states.SUBMISSION_VERDICTS)]  # type: ignore[valid-type]
SubmissionRejection: TypeAlias = Literal[_values(states.SUBMISSION_REJECTIONS)]  # type: ignore[valid-type]
CommandStepFailure: TypeAlias = Literal[_values(states.COMMAND_STEP_FAILURES)]  # type: ignore[valid-type]

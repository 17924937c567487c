"""Internal message shapes: the one place that defines what crosses a pipe between our processes.

::

    supervisor ──{"k": kind, "id": n, "b": command}──> writer
    supervisor <──{"k": "reply", "id": n, "b": Reply}── writer

One module per domain, mirroring ``writer/commands/``: ``base`` (models,
actors, claims, values, receipt keys), ``content``, ``server``, ``runs``,
``control``, ``runners``, ``nodes``, ``decisions``, ``channels``, ``effects``, ``state``, ``logs``, ``agents``; and one
per child's frames: ``runner``, ``outbox``, ``resolver``, ``writer`` (the
writer link's handshake, replies, log records and health).

Every writer command kind has exactly one model in ``COMMAND_MODELS`` and one
handler in ``piworkflows.writer.commands.REGISTRY`` (``tests/unit/test_registry.py``
keeps the two equal).
"""

from __future__ import annotations

from piworkflows.protocol.internal.agents import (
    AgentBindSession,
    AgentBranch,
    AgentClaimable,
    AgentClose,
    AgentExited,
    AgentMessageSent,
    AgentOpen,
    AgentRecord,
    AgentTurn,
    InteractionSettle,
    InteractionSubmit,
    InteractionsValidating,
    InteractionUpdate,
    NodeRequestAgent,
)
from piworkflows.protocol.internal.base import Command, ReadCommand
from piworkflows.protocol.internal.channels import (
    ChannelClaim,
    ChannelDeliver,
    ChannelRecover,
    ChannelRegister,
    ChannelStatus,
    ChannelUpdates,
)
from piworkflows.protocol.internal.content import BlobPut, BlobPutPart, BlobRead, ProjectEnsure, ReceiptFind
from piworkflows.protocol.internal.control import RunCancel, RunPause, RunRestart, RunResume
from piworkflows.protocol.internal.decisions import DecisionAnswer, DecisionExpire, DecisionNext
from piworkflows.protocol.internal.effects import (
    EffectAbandon,
    EffectClaim,
    EffectConfirm,
    EffectDue,
    EffectList,
    EffectRecover,
    EffectReserve,
    EffectRetry,
    EffectSettle,
)
from piworkflows.protocol.internal.logs import RunContentRead, RunLogs, RunTranscript, ViewContent
from piworkflows.protocol.internal.nodes import (
    CheckpointAnswer,
    NodeEffectReserve,
    NodeFinish,
    NodeStart,
    NodeWait,
    RunFinish,
)
from piworkflows.protocol.internal.runners import (
    ClaimableRuns,
    ClaimRenew,
    OrphanedRunners,
    ResumeState,
    RunClaim,
    RunnerExited,
    RunnerSpawned,
)
from piworkflows.protocol.internal.runs import RunCreate, RunGet, RunList, ViewPage, ViewPatches, ViewSession
from piworkflows.protocol.internal.server import (
    ServerCounts,
    ServerRecordStop,
    ServerReleaseEpoch,
    ServerRenewEpoch,
    ServerTakeEpoch,
)
from piworkflows.protocol.internal.state import (
    RunDelete,
    StateBackup,
    StateCompact,
    StatePrune,
    StateRetain,
    StateStatus,
    StateVerify,
)

COMMAND_MODELS: dict[str, type[Command] | type[ReadCommand]] = {
    model.kind: model
    for model in (
        # content
        ProjectEnsure,
        BlobPut,
        BlobPutPart,
        BlobRead,
        ReceiptFind,
        # server
        ServerTakeEpoch,
        ServerRenewEpoch,
        ServerReleaseEpoch,
        ServerRecordStop,
        ServerCounts,
        # runs
        RunCreate,
        RunList,
        RunGet,
        ViewPage,
        ViewPatches,
        ViewSession,
        # control
        RunCancel,
        RunPause,
        RunResume,
        RunRestart,
        # runners
        RunClaim,
        RunnerSpawned,
        RunnerExited,
        ClaimRenew,
        ResumeState,
        ClaimableRuns,
        OrphanedRunners,
        # nodes
        NodeStart,
        NodeFinish,
        RunFinish,
        NodeWait,
        NodeEffectReserve,
        # channels
        ChannelRegister,
        ChannelClaim,
        ChannelUpdates,
        ChannelDeliver,
        ChannelStatus,
        ChannelRecover,
        CheckpointAnswer,
        # decisions
        DecisionAnswer,
        DecisionExpire,
        DecisionNext,
        # effects
        EffectReserve,
        EffectClaim,
        EffectDue,
        EffectSettle,
        EffectAbandon,
        EffectRecover,
        EffectConfirm,
        EffectRetry,
        EffectList,
        # state
        StateStatus,
        StateVerify,
        StateBackup,
        StatePrune,
        StateRetain,
        StateCompact,
        RunDelete,
        # logs
        RunLogs,
        RunTranscript,
        RunContentRead,
        ViewContent,
        # agents
        NodeRequestAgent,
        AgentClaimable,
        AgentOpen,
        AgentBindSession,
        AgentBranch,
        AgentMessageSent,
        AgentTurn,
        AgentRecord,
        AgentClose,
        AgentExited,
        InteractionSubmit,
        InteractionSettle,
        InteractionsValidating,
        InteractionUpdate,
    )
}

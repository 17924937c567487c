"""Agent steps on Pi: the request a runner makes, the agent host's reports, submissions.

::

    runner ── node.request_agent (C2: request, step message; the run waits) ──> writer
    supervisor ── agent.claimable / agent.open (C3: a recording segment, its claim) ──> writer
    supervisor ── launch AgentLaunch ──> agent host (piworkflows/agents/host.py)
    agent host ── agent.bind_session (C4) | agent.branch (C5) | agent.message_sent (C6)
                  | agent.turn (C7, C9) | agent.record (C8) | agent.close (C12) ──> supervisor
                  (which adds the segment and its claim and forwards the writer command)
    workflow tool ── client.v1 interaction.submit ──> supervisor ── interaction.submit (C10)
                  ── a resolver child validates ── interaction.settle (C11) ──> writer
    supervisor ── agent.exited (the host is gone) ──> writer

Ids are deterministic, so a runner can render the step contract of a request
before the writer has seen it, and every repeat names the same rows.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

from pydantic import Field, model_validator

from piworkflows.protocol.internal.base import BlobValue, Claim, Command, Frame, Id, Model, ReadCommand
from piworkflows.protocol.internal.nodes import UnderRunClaim
from piworkflows.protocol.internal.values import (
    AgentExecutor,
    AgentSession,
    CommandStepFailure,
    ExpectedOutputKind,
    SubmissionRejection,
    SubmissionVerdict,
    TurnPhase,
)
from piworkflows.states import MEDIA_JSON, MEDIA_TEXT

PI_ENTRY_ID = r"^[0-9a-f]{8}$"  # a Pi session entry id (session-format.md)
MAX_EVENTS_PER_RECORD = 64
MAX_ENTRIES_PER_RECORD = 16
MAX_UPDATE_CHARS = 2000
MAX_FAILURE_CHARS = 4000  # an agent host's failure, as a park's detail
CHECKPOINT_EVERY = 256  # a viewer_session_checkpoints row at each multiple of this run_seq

# How an agent host ends (its exit status). Done: the segment was closed (agent.close). Failed: a
# report was refused (claimLost ...) or the host broke; Pi was killed. Pi unavailable: Pi could not
# start here (missing, exited at once, no answer within agent_start_timeout_ms); the host's last
# failure names the fix, and starting another host cannot help. Pi exited: Pi ended mid-segment.
# Pi refused: Pi answered the step's prompt with an error (no API key, an unknown model); as with
# Pi unavailable, another host cannot help until someone changes Pi's configuration.
HOST_EXIT_DONE = 0
HOST_EXIT_FAILED = 1
HOST_EXIT_PI_UNAVAILABLE = 3
HOST_EXIT_PI_EXITED = 4
HOST_EXIT_PI_REFUSED = 5
HOST_EXIT_LASTING = frozenset({HOST_EXIT_PI_UNAVAILABLE, HOST_EXIT_PI_REFUSED})


def _hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def request_id_of(attempt_id: str) -> str:
    """The interactive request of an agent attempt (one per attempt)."""
    return "request-" + _hash(attempt_id)


def message_id_of(idempotency_key: str) -> str:
    """A workflow message, by its idempotency key (``step:<request>:initial`` ...)."""
    return "wm-" + _hash(idempotency_key)


def session_id_of(scope_id: str) -> str:
    """A headless Pi session: ``pis-`` + hash of the run (shared) or of the attempt (fresh)."""
    return "pis-" + _hash(scope_id)


def initial_step_key(request_id: str) -> str:
    return f"step:{request_id}:initial"


def resumed_step_key(request_id: str, segment_id: str) -> str:
    return f"step:{request_id}:resumed:{segment_id}"


def reminder_step_key(request_id: str, turn_id: str) -> str:
    return f"step:{request_id}:reminder:{turn_id}"


def submission_id_of(request_id: str, idempotency_key: str) -> str:
    return "submission-" + _hash(request_id, idempotency_key)


class ExpectedOutput(Model):
    """What the step must produce: a described JSON output (``description``), one checked against
    a JSON Schema (``schema``, which a pydantic model compiles to as well), or the model's visible
    reply (``assistant-message``, at most ``max_chars`` characters when set)."""

    kind: ExpectedOutputKind
    description: str | None = None
    json_schema: dict[str, Any] | None = None
    max_chars: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _shape(self) -> ExpectedOutput:
        if (self.kind == "schema") != (self.json_schema is not None):
            raise ValueError("a schema output carries its JSON Schema, and only it does")
        if self.max_chars is not None and self.kind != "assistant-message":
            raise ValueError("max_chars limits an assistant-message output")
        return self


class Executor(Model):
    """Who performs the step: Pi (RPC mode), or another command-line agent (prompt on stdin)."""

    kind: AgentExecutor = "pi"
    argv: list[str] | None = None


class AgentContract(Model):
    """The durable request contract (``interactive_requests.contract_digest``, canonical JSON).

    ``validates``: the workflow code checks the output too (a pydantic model or a ``validate``
    function), so a resolver child loads the run's workflow to judge a submission.
    """

    workflow_name: str
    node_path: str
    attempt_id: Id
    request_id: Id
    visit_number: int = Field(ge=1)
    attempt_number: int = Field(ge=1)
    prompt: str
    expected_output: ExpectedOutput
    validates: bool = False
    choices: list[str] | None = None  # a decision node: the output is {"route": one of these}
    model: str | None = None  # "provider/id[:thinking]"; None: Pi's own default
    allowed_tools: list[str] | None = None
    session: AgentSession = "run"
    executor: Executor = Field(default_factory=Executor)


class NodeRequestAgentFrame(Frame):
    """C2: a runner asks for an agent step. The request, its contract and its initial step
    message (rendered by protocol/step_contract.py) are committed; the run waits, no runner.

    ``timeout_ms`` is the active-time budget the node declared: 0 unlimited, None the server's
    default. The runner knows no server settings, so the scheduler fills a None in with
    ``PI_WORKFLOWS_AGENT_TIMEOUT_MS`` before it forwards the frame: the writer always gets a
    number (``NodeRequestAgent``)."""

    kind: ClassVar[str] = "node.request_agent"
    attempt_id: Id
    contract: BlobValue  # JSON: AgentContract
    step: BlobValue  # text: the initial step message
    timeout_ms: int | None = Field(default=None, ge=0)  # the active-time budget; 0: unlimited; None: the server's

    @model_validator(mode="after")
    def _shape(self) -> NodeRequestAgentFrame:
        if self.contract.media_type != MEDIA_JSON or self.step.media_type != MEDIA_TEXT:
            raise ValueError("the contract is JSON and the step message text")
        return self


class NodeRequestAgent(UnderRunClaim, NodeRequestAgentFrame):
    """node.request_agent as the writer gets it: the runner's frame under the run's claim, its
    budget resolved (the server's default filled in)."""

    timeout_ms: int = Field(ge=0)  # the active-time budget; 0: unlimited


class AgentClaimable(ReadCommand):
    """C3's question: which pending agent requests may get a host now (oldest first)."""

    kind: ClassVar[str] = "agent.claimable"
    limit: int = Field(ge=1, le=256)
    exclude_request_ids: list[Id] = Field(default_factory=list, max_length=256)  # already being opened


class AgentOpen(Command):
    """C3: a recording segment for the request, leased to the supervisor (the token stays there).
    Dead segments of the run close first; a spent budget times the attempt out instead."""

    kind: ClassVar[str] = "agent.open"
    request_id: Id
    segment_id: Id
    server_epoch: int = Field(ge=1)
    owner_id: Id
    claim_token_hash: bytes = Field(min_length=32, max_length=32)
    ttl_ms: int = Field(ge=1)


class UnderSegmentClaim(Command):
    """What the supervisor attaches to an agent host's frame: the segment and its claim."""

    segment_id: Id
    claim: Claim


class AgentBindSessionFrame(Frame):
    """C4: the Pi session file and id of the segment (the first file of the session, or the same)."""

    kind: ClassVar[str] = "agent.bind_session"
    pi_session_file: str = Field(min_length=1, max_length=4096)
    pi_session_id: str = Field(min_length=1, max_length=256)


class AgentBindSession(UnderSegmentClaim, AgentBindSessionFrame):
    pass


class BranchStep(Model):
    """A step message found on the session's active branch, with its Pi entry."""

    workflow_message_id: Id
    pi_entry_id: str = Field(pattern=PI_ENTRY_ID)


class SettledReply(Model):
    """An assistant-message step's final reply found on the branch (adopted after a crash)."""

    workflow_message_id: Id
    pi_entry_id: str = Field(pattern=PI_ENTRY_ID)
    text: BlobValue


class AgentBranchFrame(Frame):
    """C5, before any prompt: the request's step messages found on the active branch become
    ``sent``; a settled assistant-message reply is adopted. With no pending step left, the
    request gets one ``resumed`` step (the receipt lists what to send)."""

    kind: ClassVar[str] = "agent.branch"
    found: list[BranchStep] = Field(default_factory=list, max_length=256)
    settled_reply: SettledReply | None = None


class AgentBranch(UnderSegmentClaim, AgentBranchFrame):
    pass


class AgentMessageSentFrame(Frame):
    """C6: a pending step message appeared on the branch as this entry."""

    kind: ClassVar[str] = "agent.message_sent"
    workflow_message_id: Id
    pi_entry_id: str = Field(pattern=PI_ENTRY_ID)


class AgentMessageSent(UnderSegmentClaim, AgentMessageSentFrame):
    pass


class AgentTurnFrame(Frame):
    """C7 (``started``: an open turn and an active interval) and C9 (``ended``).

    At the end: ``stop_reason`` is Pi's (``stop``, ``toolUse``, ``length``, ``error``,
    ``aborted``), ``aborted_by_server`` when the host aborted it (timeout, pause, cancel),
    ``reply`` the final visible text (an assistant-message step is accepted with it),
    ``elapsed_ms`` the interval's measured active time at the end. A command step's run (one
    turn) that gave no accepted output ends with ``error_code`` and ``error``: its attempt fails
    so (a command is not reminded). A turn Pi ended ``error`` (after its own retries) carries
    Pi's message as ``provider_error``: the attempt fails ``providerError`` with it.
    """

    kind: ClassVar[str] = "agent.turn"
    phase: TurnPhase
    workflow_turn_id: Id
    workflow_message_id: Id
    stop_reason: str | None = Field(default=None, max_length=64)
    response_entry_id: str | None = Field(default=None, pattern=PI_ENTRY_ID)
    reply: BlobValue | None = None
    aborted_by_server: bool = False
    elapsed_ms: int = Field(default=0, ge=0)
    error_code: CommandStepFailure | None = None
    error: BlobValue | None = None  # text: why the command's run failed
    provider_error: BlobValue | None = None  # text: Pi's message of a turn that ended ``error``

    @model_validator(mode="after")
    def _shape(self) -> AgentTurnFrame:
        if (self.error_code is None) != (self.error is None):
            raise ValueError("a failed run carries its error code and its error, and only it does")
        for error in (self.error, self.provider_error):
            if error is not None and (self.phase != "ended" or error.media_type != MEDIA_TEXT):
                raise ValueError("a turn's error is text, at its end")
        if self.provider_error is not None and self.stop_reason != "error":
            raise ValueError("only a turn that ended with an error carries the provider's error")
        return self


class AgentTurn(UnderSegmentClaim, AgentTurnFrame):
    pass


class SessionEvent(Model):
    """A compact Pi event: type, ids, role, status and times; never text, deltas or tool data."""

    event_type: str = Field(min_length=1, max_length=64)
    pi_event_id: str | None = Field(default=None, max_length=256)
    event_role: str | None = Field(default=None, max_length=64)
    event_status: str | None = Field(default=None, max_length=64)
    started_at: int | None = None
    ended_at: int | None = None


class SessionEntry(Model):
    """A settled Pi session entry (its JSON line as Pi wrote it)."""

    pi_entry_id: str = Field(pattern=PI_ENTRY_ID)
    entry_role: str = Field(min_length=1, max_length=64)
    content: BlobValue


class ActiveSample(Model):
    """The open interval's measured active time (monotonic; it only rises)."""

    elapsed_ms: int = Field(ge=0)


class AttemptLinks(Model):
    """Which captured entries are the attempt's prompt and response (by Pi entry id)."""

    prompt_entry_id: str | None = Field(default=None, pattern=PI_ENTRY_ID)
    response_entry_id: str | None = Field(default=None, pattern=PI_ENTRY_ID)


class AgentRecordFrame(Frame):
    """C8: a capture batch (one transaction, no ``events`` row): compact events numbered from the
    segment's ``event_count``, settled entries, a sample of the open interval."""

    kind: ClassVar[str] = "agent.record"
    first_event_index: int = Field(ge=0)
    events: list[SessionEvent] = Field(default_factory=list, max_length=MAX_EVENTS_PER_RECORD)
    entries: list[SessionEntry] = Field(default_factory=list, max_length=MAX_ENTRIES_PER_RECORD)
    sample: ActiveSample | None = None
    links: AttemptLinks | None = None
    checkpoint: BlobValue | None = None  # JSON: open turn, active message, open tools (at a 256 boundary)


class AgentRecord(UnderSegmentClaim, AgentRecordFrame):
    pass


class AgentCloseFrame(Frame):
    """C12: the host is done (the request settled, or it stops): the segment closes."""

    kind: ClassVar[str] = "agent.close"
    elapsed_ms: int | None = Field(default=None, ge=0)  # the open interval's last measurement


class AgentClose(UnderSegmentClaim, AgentCloseFrame):
    pass


class AgentExited(Command):
    """The supervisor saw the host of a recording segment end: the segment closes (open turn
    ``lost``, open interval at its last observation). A host that committed nothing after C3, or
    one the supervisor gives up on (``no_progress``: Pi missing or refusing the step, or
    agent_host_failure_limit hosts in a row that finished no turn), and that was not stopped,
    parks the run ``agentNoProgress`` with ``detail`` as a notification."""

    kind: ClassVar[str] = "agent.exited"
    segment_id: Id
    stopped_by_server: bool = False
    no_progress: bool = False
    detail: BlobValue | None = None  # text: why (the host's failure in Pi's words, else its stderr)


class HostFailure(Frame):
    """An agent host's last frame when it ends early: why, in Pi's own words where Pi gave them
    (the supervisor keeps it as the park's detail; it is not a writer command)."""

    kind: ClassVar[str] = "agent.failure"
    why: str = Field(max_length=MAX_FAILURE_CHARS)


class AgentLaunch(Frame):
    """The first frame to an agent host: everything it needs to drive Pi for one segment."""

    kind: ClassVar[str] = "launch"
    segment_id: Id
    run_id: Id
    attempt_id: Id
    request_id: Id
    session_id: str
    pi_session_file: str | None = None
    project_path: str
    contract: AgentContract
    pending: list[PendingStep] = Field(default_factory=list)
    steps: list[Id] = Field(default_factory=list)  # every step message of the request (the branch walk looks for them)
    pi_command: list[str]  # the executable and its fixed arguments
    pi_args: list[str] = Field(default_factory=list)  # PI_WORKFLOWS_PI_ARGS
    socket_path: str
    coordinator_epoch: int = Field(ge=1)  # the segment's lease generation
    timeout_ms: int = Field(ge=0)
    elapsed_ms: int = Field(ge=0)  # active time already spent by earlier intervals
    sample_ms: int = Field(ge=1)
    flush_ms: int = Field(ge=1)
    start_timeout_ms: int = Field(ge=1)
    abort_grace_ms: int = Field(ge=1)
    retry_settle_ms: int = Field(ge=0)


class PendingStep(Model):
    """A committed ``pending`` step message the host sends (RPC ``prompt``)."""

    workflow_message_id: Id
    text: str


class InteractionSubmit(Command):
    """C10: a submission for the request (idempotency key adopts); the request is ``validating``.
    The model's (the workflow tool's) carries the coordinator epoch of the live recording segment;
    an operator's (actor ``operator``) carries none and needs no live segment."""

    kind: ClassVar[str] = "interaction.submit"
    request_id: Id
    target_session_id: Id
    coordinator_epoch: int | None = Field(default=None, ge=1)
    idempotency_key: Id
    output: BlobValue  # JSON: the submitted output


class InteractionsValidating(ReadCommand):
    """Submissions recorded ``validating`` with no verdict (oldest first): at the server's start none
    is being judged, so each is validated again (its tool's connection died with the server)."""

    kind: ClassVar[str] = "interaction.validating"
    limit: int = Field(default=256, ge=1, le=256)


class InteractionSettle(Command):
    """C11: the validator's verdict on a submission: accepted (the attempt completes with
    ``output``) or rejected with the error the model can act on (at ``max_rejections`` the
    attempt fails instead)."""

    kind: ClassVar[str] = "interaction.settle"
    submission_id: Id
    verdict: SubmissionVerdict
    output: BlobValue | None = None  # JSON: the accepted output (as validated)
    error: BlobValue | None = None  # text: why it was rejected
    error_code: SubmissionRejection | None = None
    # the rejection that reaches this many judged rejections of the request fails its attempt
    # tooManyRejections, naming this one (the supervisor's agent_max_rejections)
    max_rejections: int = Field(default=20, ge=1)

    @model_validator(mode="after")
    def _shape(self) -> InteractionSettle:
        if (self.verdict == "accepted") != (self.output is not None and self.error is None):
            raise ValueError("an accepted submission has its output; a rejected one its error")
        return self


class InteractionUpdate(Command):
    """A progress update from the step's agent (``workflow_updates``, kind ``progress``)."""

    kind: ClassVar[str] = "interaction.update"
    request_id: Id
    target_session_id: Id
    coordinator_epoch: int = Field(ge=1)
    message: str = Field(min_length=1, max_length=MAX_UPDATE_CHARS)
    progress: float | None = Field(default=None, ge=0, le=1)


AgentLaunch.model_rebuild()

# What an agent host sends (each forwarded under the segment's claim as the command of its kind).
HOST_FRAMES: tuple[type[Frame], ...] = (
    AgentBindSessionFrame,
    AgentBranchFrame,
    AgentMessageSentFrame,
    AgentTurnFrame,
    AgentRecordFrame,
    AgentCloseFrame,
)

"""The client wire protocol ``pi-workflows.client.v1``: the one owner of its shapes.

::

    client ── one canonical JSON object + "\\n" (<= 1 MiB) ──> server
           <── hello (first), response, event ─────────────────

``parse_request`` accepts a received line only if it nests at most
``MAX_NESTING`` levels (checked by a linear scan before any JSON reader sees
it), is canonical (envelope keys sorted; ``payload`` in the sender's key order
with index keys first), names a known operation and fits the envelope model;
anything else raises ``MalformedFrame`` and the connection is closed.
``encode`` emits fully canonical text. ``fingerprint`` is the durable identity
of a request. A connection the server cannot serve gets one ``Refused`` line
instead of the hello, then closes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

from piworkflows import canonical
from piworkflows.errors import OUTCOMES, describe_invalid_fields
from piworkflows.isotime import prune_before_ms as prune_before_ms  # StatePrunePayload.before
from piworkflows.protocol import domain
from piworkflows.protocol.envelope import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES  # owned there, as below
from piworkflows.protocol.envelope import OPERATIONS as OPERATIONS
from piworkflows.protocol.envelope import SCHEMA as SCHEMA
from piworkflows.protocol.envelope import UPSTREAM_UNSERVED as UPSTREAM_UNSERVED
from piworkflows.protocol.envelope import check_id
from piworkflows.protocol.internal.agents import MAX_UPDATE_CHARS
from piworkflows.states import PAGE_KINDS, RUN_STATUS_VALUES, SERVER_STATES, UNAVAILABLE_REASONS, WORKFLOW_ORIGINS

# The deepest ``[``/``{`` nesting of a received line, the envelope object being level 1. JavaScript's
# parser accepts far deeper text; Python's readers recurse once per level, so the limit is ours
# (owned by the value domain, protocol/domain.py, as is the scan that measures it).
MAX_NESTING = domain.MAX_NESTING
nesting_depth = domain.nesting_depth

assert not set(UPSTREAM_UNSERVED) & set(OPERATIONS)

# Reads are never stored in host_commands.
READ_ONLY_OPERATIONS = frozenset(
    op for op in OPERATIONS if op.endswith((".status", ".list", ".get")) or op.startswith("view.")
) | {"protocol.schema", "state.verify", "workflow.show", "run.logs", "run.transcript"}

# Their fingerprint leaves out payload.coordinatorEpoch.
SESSION_ANSWER_OPERATIONS = frozenset(
    {
        "interaction.submit",
        "interaction.assistant",
        "interaction.update",
        "checkpoint.answer",
        "decision.answer",
        "run.restart",
    }
)


EVENTS = ("runs", "run_snapshot", "run_patch", "run_page", "session_snapshot", "unavailable")


class MalformedFrame(Exception):
    """The line is not a valid protocol message: close this one connection."""


Id = Annotated[str, AfterValidator(check_id)]
Outcome = Literal["accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"]
assert set(Outcome.__args__) == set(OUTCOMES)  # type: ignore[attr-defined]


class Envelope(BaseModel):
    # strict: "5" or true is not an integer, 1 is not a string.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)

    schema_: Literal["pi-workflows.client.v1"] = Field(default=SCHEMA, alias="schema")


class Hello(Envelope):
    type: Literal["hello"] = "hello"
    connectionId: Id
    packageVersion: str


class Request(Envelope):
    type: Literal["request"] = "request"
    requestId: Id
    clientId: Id
    operation: Literal[OPERATIONS + UPSTREAM_UNSERVED]  # type: ignore[valid-type]
    idempotencyKey: Id
    payload: Any
    runId: Id | None = None
    expectedRevision: int | None = Field(default=None, ge=0)


class Response(Envelope):
    type: Literal["response"] = "response"
    requestId: Id
    outcome: Outcome
    revision: int | None = Field(default=None, ge=0)
    receipt: Any = None
    error: str | None = Field(default=None, min_length=1)


class Refused(Envelope):
    """The one line a connection the server cannot serve gets instead of the hello; then it closes.
    Not an outcome: ``code`` names why (not one of errors.CODES), ``error`` is a safe sentence."""

    type: Literal["refused"] = "refused"
    code: Literal["tooManyConnections"]
    error: str = Field(min_length=1)


class Event(Envelope):
    type: Literal["event"] = "event"
    subscriptionId: Id
    event: Literal[EVENTS]  # type: ignore[valid-type]
    payload: Any
    revision: int | None = Field(default=None, ge=0)
    runId: Id | None = None


_KEEP_ORDER = frozenset({"payload", "receipt"})


def _read_canonical(text: bytes) -> dict[str, Any] | None:
    """The common case fast: the stdlib (C) reader, then the canonical text compared byte for byte.

    Equal text proves what the exact reader checks: UTF-8, no duplicate key
    (one would be missing from the printed text), and numbers as JavaScript
    reads them (an integer that is not exactly a double, ``-0``, ``1.0`` or
    ``NaN`` does not print back the same). Anything else returns None.
    """
    try:
        value = json.loads(text.decode("utf-8"))
        if isinstance(value, dict) and canonical.dumps_envelope(value, _KEEP_ORDER).encode("utf-8") == text:
            return value
    except (ValueError, TypeError):  # UnicodeDecodeError is a ValueError
        pass
    return None


def parse_request(line: bytes) -> Request:
    """Validate one received line (with its trailing newline) as a request."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise MalformedFrame("message exceeds 1 MiB")
    if not line.endswith(b"\n"):
        raise MalformedFrame("message is not terminated by a newline")
    text = line[:-1]
    # Before any reader (both recurse once per level); few brackets at all is the common case.
    if text.count(b"[") + text.count(b"{") > MAX_NESTING and nesting_depth(text) > MAX_NESTING:
        raise MalformedFrame(f"message nests deeper than {MAX_NESTING} levels")
    value = _read_canonical(text)
    if value is None:  # the exact path, for the precise reason
        try:
            value = canonical.loads(text)
        except ValueError:
            raise MalformedFrame("not valid JSON (UTF-8, no duplicate keys, finite numbers)") from None
        if not isinstance(value, dict):
            raise MalformedFrame("a message is a JSON object")
        try:
            canonical_text = canonical.dumps_envelope(value, _KEEP_ORDER).encode("utf-8")
        except (TypeError, ValueError):
            raise MalformedFrame("message is not in canonical form") from None
        if canonical_text != text:
            raise MalformedFrame("message is not in canonical form")
    if value.get("schema") != SCHEMA:
        raise MalformedFrame("schema is missing or not pi-workflows.client.v1")
    if value.get("type") != "request":
        raise MalformedFrame("a client sends only requests")
    try:
        return Request.model_validate(value)
    except ValidationError as exc:
        raise MalformedFrame("envelope has " + describe_invalid_fields(exc.errors())) from None


# A payload puts a value that a run keeps at most this many levels below itself (payload.value.output).
_PAYLOAD_VALUE_LEVELS = 2


def outside_domain(line: bytes, request: Request) -> domain.OutsideDomain | None:
    """Where a parsed request leaves the protocol's value domain (a lone surrogate in an id or a
    string, a payload nesting deeper than a value a run keeps), or None. The line is canonical, so
    a lone surrogate shows as an escape: the exact walk runs only when a byte filter trips."""
    if b"\\ud" not in line and line.count(b"[") + line.count(b"{") <= domain.MAX_VALUE_NESTING:
        return None
    fields = {name: value for name, value in wire(request).items() if name not in ("schema", "type", "operation")}
    found = domain.problem(fields, max_depth=domain.MAX_VALUE_NESTING + _PAYLOAD_VALUE_LEVELS + 1)
    if found is not None and found.too_deep:
        why = f"a value in it nests deeper than a run keeps ({domain.MAX_VALUE_NESTING} levels)"
        return domain.OutsideDomain("$.payload", why, too_deep=True)
    return found


_OPTIONAL = frozenset({"runId", "expectedRevision", "revision", "receipt", "error"})


def wire(envelope: Envelope) -> dict[str, Any]:
    """The envelope as a JSON object: optional members are absent, never null."""
    data = envelope.model_dump(by_alias=True)
    return {k: v for k, v in data.items() if not (k in _OPTIONAL and v is None)}


def encode(envelope: Envelope) -> bytes:
    """Fully canonical text of an envelope, newline-terminated."""
    data = wire(envelope)
    line = canonical.dumps_bytes(data) + b"\n"
    if len(line) > MAX_MESSAGE_BYTES:
        raise ValueError("an outgoing message exceeds 1 MiB")
    return line


def fingerprint(request: Request) -> bytes:
    """SHA-256 of the fully canonical request without requestId (and, for
    session-answer operations, without payload.coordinatorEpoch)."""
    data = wire(request)
    del data["requestId"]
    if request.operation in SESSION_ANSWER_OPERATIONS and isinstance(data.get("payload"), dict):
        data["payload"] = {k: v for k, v in data["payload"].items() if k != "coordinatorEpoch"}
    return hashlib.sha256(canonical.dumps_bytes(data)).digest()


# --- payloads and receipts (docs/protocol.md documents each) ------------------


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EmptyPayload(Payload):
    """server.status, server.stop and protocol.schema take an empty object."""


class ErrorReceipt(BaseModel):
    """Every outcome other than accepted/adopted carries a code (errors.CODES) and safe details."""

    model_config = ConfigDict(extra="allow", frozen=True)
    code: str


class UnavailableReason(BaseModel):
    """Why the server cannot commit now: a full disk (with the free bytes it saw), an I/O error, a
    damaged database (every write refused), a writer that cannot start or is restarting."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    code: Literal[UNAVAILABLE_REASONS]  # type: ignore[valid-type]
    message: str
    freeBytes: int | None = None


class ServerStatusReceipt(BaseModel):
    """``state``: running; unavailable (nothing can be committed now, ``reason`` says why; it
    serves again by itself when the cause passes); refusing (the database is damaged: every write
    is refused, reads that still work are answered); stopping. The counts are null when the
    writer cannot read them. ``connections`` open now (this one included); at most
    ``maxConnections`` at once, the smaller of the setting and what the process's file descriptor
    limit ``fdLimit`` leaves (null: no limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    state: Literal[SERVER_STATES]  # type: ignore[valid-type]
    reason: UnavailableReason | None = None
    socketAvailable: bool
    epoch: int
    activeRunners: int
    queuedRuns: int | None = None
    runningRuns: int | None = None
    parkedRuns: int | None = None
    waitingRuns: int | None = None
    expiredClaims: int | None = None
    pendingInteractions: int | None = None
    ambiguousEffects: int | None = None
    ambiguousEffectsOfEndedRuns: int | None = None  # of those, the ones whose run ended (confirm only)
    connections: int
    maxConnections: int
    fdLimit: int | None


class ServerStopReceipt(BaseModel):
    """``recorded`` false: the stop could not be confirmed as recorded (a full disk, a damaged
    database, no writer); it is carried out all the same."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stopping: bool
    serverEpoch: int
    recorded: bool = True


class UpstreamSourceRoot(BaseModel):
    """The root of upstream's source set: ``{kind: "file", path, hash}`` (hash: the SHA-256 of the
    file, hex, optionally ``sha256:``-prefixed; path: absolute or relative to the project) or
    ``{kind: "builtin", id, revision}``. Other members are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    kind: Literal["file", "builtin"]
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    hash: str | None = Field(default=None, pattern=r"^(sha256:)?[0-9a-f]{64}$")
    id: str | None = Field(default=None, min_length=1, max_length=256)
    revision: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> UpstreamSourceRoot:
        if self.kind == "file" and (self.path is None or self.hash is None):
            raise ValueError("a file root names its path and hash")
        if self.kind == "builtin" and (self.id is None or self.revision is None):
            raise ValueError("a builtin root names its id and revision")
        return self


class UpstreamSourceSet(BaseModel):
    """upstream's ``workflowSource`` object form; this server resolves no mounted sources."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    root: UpstreamSourceRoot
    mounted: list[Any] = Field(default_factory=list, max_length=0)


class RunStartPayload(Payload):
    """run.start. Our CLI sends projectPath, workflowName, input, launchOptions and
    executionMode; the server resolves and compiles the source itself. The
    upstream fields, when sent, must match what the server resolved."""

    projectPath: str = Field(min_length=1, max_length=4096, pattern=r"^/")
    workflowName: str = Field(min_length=1, max_length=256)
    input: Any = Field(default_factory=dict)
    launchOptions: dict[str, Any] | None = None
    executionMode: Literal["headless", "interactive"] = "headless"
    originSessionId: str | None = Field(default=None, min_length=1, max_length=256)
    workflowSourceRef: Any = None
    workflowSource: str | UpstreamSourceSet | None = None  # the source text, or upstream's source set
    definitionDigest: str | None = None
    definitionSnapshot: Any = None


class RunStartReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    status: Literal["queued"]
    definitionDigest: str


class RunListPayload(Payload):
    """run.list: newest first; ``cursor`` is the previous page's cursor. The filters combine: runs
    of ``projectPath``, whose durable status (not the display status: a paused or ambiguous run
    is queued, running or waiting underneath) is one of ``status``, of ``workflowName`` (the
    compiled name; ``builtin:demo`` for the runs of that built-in only), created at or after
    ``since`` (epoch ms)."""

    projectPath: str | None = Field(default=None, min_length=1, max_length=4096, pattern=r"^/")
    status: list[Literal[RUN_STATUS_VALUES]] | None = Field(default=None, min_length=1, max_length=7)  # type: ignore[valid-type]
    workflowName: str | None = Field(default=None, min_length=1, max_length=256)
    since: int | None = Field(default=None, ge=0)
    limit: int = Field(default=50, ge=1, le=256)
    cursor: dict[str, Any] | None = None


class ViewRunsPagePayload(RunListPayload):
    """view.runs.page: a run-list page as run.list gives it, at ``cursor``: upstream's offset into
    the list (0, the default: the first page) or run.list's keyset cursor. ``revision`` is the list
    revision the client holds (a ``runs`` event's or a page's): on the first page another one is
    ``conflict`` (``staleRevision``) with the current page in the receipt's ``page``; later pages
    follow their cursor."""

    cursor: Annotated[int, Field(ge=0, strict=True)] | dict[str, Any] = 0  # type: ignore[assignment]
    revision: str = Field(min_length=1, max_length=256)
    limit: int = Field(default=256, ge=1, le=256)


MAX_PINNED_PAGES = 8  # a run watch's pinned pages, at most


class ViewPagePayload(Payload):
    """view.page, the run in the envelope's runId: at most ``limit`` rows of one of its histories
    from position ``cursor`` (a page's ``cursor`` gives the next; a window's ``start`` the rows
    before it). With the envelope's expectedRevision: ``conflict`` when the run's view moved on."""

    kind: Literal[PAGE_KINDS]  # type: ignore[valid-type]
    cursor: int = Field(default=0, ge=0)
    limit: int = Field(default=256, ge=1, le=256)


class ViewRunWatchPayload(Payload):
    """view.run.watch, the run in the envelope's runId: snapshots of its view (``run_snapshot``
    events) now and after each change. ``subscriptionId`` names the watch (default: the requestId;
    a reused one replaces its watch); ``revision``: the client holds this one (no snapshot until the
    run changes). ``patches``: after the first snapshot, ``run_patch`` events with the ops of every
    revision (from ``revision`` on, when it is still retained: no snapshot). ``pages``: pages of the
    run's histories (view.page's kind, cursor and limit) pinned to the watch: each is sent as a
    ``run_page`` event now and again whenever it changes."""

    subscriptionId: Id | None = None
    revision: int | None = Field(default=None, ge=0)
    patches: bool = False
    pages: list[ViewPagePayload] | None = Field(default=None, max_length=MAX_PINNED_PAGES)


class ViewSessionWatchPayload(Payload):
    """view.session.watch: the run a Pi session runs interactively (its unfinished interactive run,
    else the newest run it started) as ``session_snapshot`` events, now and after each change.
    ``coordinator: true`` (a session's coordinating host) is refused ``notAvailable``: interactive
    runs in a person's Pi are not served yet, so a watch can never fence an agent host."""

    subscriptionId: Id | None = None
    sessionId: Id
    coordinator: bool = False


class ViewUnwatchPayload(Payload):
    """view.run.unwatch: ends the connection's watch of any kind with this id."""

    subscriptionId: Id


class ViewContentPayload(Payload):
    """view.content, the run in the envelope's runId: a chunk of the content a run view's reference
    names (its ``$artifact.path``) from ``offset``."""

    path: str = Field(min_length=1, max_length=128)
    offset: int = Field(default=0, ge=0)


class ContentChunkReceipt(BaseModel):
    """pi-workflows.content-chunk.v1: ``data`` is base64 of the bytes [offset, nextOffset) of the
    content, whose whole ``sha256`` the reader verifies once ``complete``."""

    model_config = ConfigDict(frozen=True)
    schema_: Literal["pi-workflows.content-chunk.v1"] = Field(alias="schema")
    runId: str
    path: str
    mediaType: Literal["application/json", "text/plain"]
    bytes: int
    sha256: str
    offset: int
    nextOffset: int
    complete: bool
    data: str


class ViewRunsWatchPayload(RunListPayload):
    """view.runs.watch: the run list's first page (``runs`` events) now and after changes, with
    run.list's filters and limit (no cursor: later pages come from view.runs.page);
    ``subscriptionId`` as view.run.watch's."""

    subscriptionId: Id | None = None
    limit: int = Field(default=256, ge=1, le=256)
    cursor: None = None


class RunLogsContent(Payload):
    """A part of a value linked to the run (a shell step's stream), named as the step names it."""

    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    mediaType: Literal["application/json", "text/plain;charset=utf-8"]
    offset: int = Field(default=0, ge=0)


class RunLogsPayload(Payload):
    """run.logs, the run in the envelope's runId: its steps in order after step ``after`` (the
    previous page's cursor), of one node with ``nodePath``; with ``content``, instead, a part of at
    most 256 KiB of a value linked to the run."""

    nodePath: str | None = Field(default=None, min_length=1, max_length=1024)
    after: int | None = Field(default=None, ge=0)
    limit: int = Field(default=64, ge=1, le=256)
    content: RunLogsContent | None = None


class StreamReference(BaseModel):
    """A shell step's stream as stored: ``digest`` null when nothing was stored (an empty stream,
    or one the writer refused); ``keptBytes`` of the ``seenBytes`` the command wrote were kept (the
    cap), ``byteLength`` is the stored text's (UTF-8; an invalid byte replaced)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    digest: str | None
    mediaType: str
    byteLength: int
    keptBytes: int
    seenBytes: int


class LogStep(BaseModel):
    """One step: ``output`` JSON inline up to 64 KiB (else ``{"omitted": {byteLength, digest}}``),
    ``error`` text up to 64 KiB, ``streams`` (stdout, stderr) for a shell step once it settled."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stepIndex: int
    attemptId: str
    nodePath: str
    nodeKind: str
    visit: int
    attempt: int
    status: str
    outcome: str | None
    startedAt: int
    finishedAt: int | None
    errorCode: str | None
    output: Any
    error: str | None
    streams: dict[str, StreamReference] | None


class RunLogsPage(BaseModel):
    """At most ``limit`` steps (and about 512 KiB); ``cursor``: the next page's ``after``, null at the end."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    steps: list[LogStep]
    cursor: int | None


class ContentPart(BaseModel):
    """``data``: base64 of the bytes from ``offset`` (empty at the end); the reader verifies the
    SHA-256 of the whole against ``digest``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    digest: str
    mediaType: str
    byteLength: int
    offset: int
    data: str


class RunLogsReceipt(RootModel[RunLogsPage | ContentPart]):
    """run.logs: a page of steps, or with ``content`` a part of the value."""


class RunTranscriptPayload(Payload):
    """run.transcript, the run in the envelope's runId: its captured Pi conversation, the settled
    session entries in order after ``after`` (the previous page's cursor, a runSeq), of one node's
    agent attempts with ``nodePath``."""

    nodePath: str | None = Field(default=None, min_length=1, max_length=1024)
    after: int | None = Field(default=None, ge=0)
    limit: int = Field(default=64, ge=1, le=256)


class TranscriptEntry(BaseModel):
    """One settled Pi session entry: ``entry`` is its JSON line as Pi wrote it (text), inline up to
    64 KiB, else ``{"omitted": {byteLength, digest}}`` (read it with run.logs ``content``,
    mediaType text/plain;charset=utf-8); ``attemptId`` and ``nodePath`` name the agent step whose
    captured range holds it (null outside every step's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runSeq: int
    piEntryId: str
    role: str
    settledAt: int
    attemptId: str | None
    nodePath: str | None
    entry: str | dict[str, Any]


class RunTranscriptReceipt(BaseModel):
    """At most ``limit`` entries (and about 512 KiB); ``cursor``: the next page's ``after``, null at the end."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    items: list[TranscriptEntry]
    cursor: int | None


class CheckpointAnswerPayload(Payload):
    """checkpoint.answer, the run in the envelope's runId: the answer becomes the node's output."""

    nodePath: str = Field(min_length=1, max_length=1024)
    answer: Any
    coordinatorEpoch: int | None = None  # sent by session clients; not part of the fingerprint


class CheckpointAnswerReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    attemptId: str
    status: Literal["queued"]


class DecisionAnswerPayload(Payload):
    """decision.answer, the run in the envelope's runId: a human's choice (and its input) for the
    protected decision waiting at ``nodePath``. ``source`` declares who answers: ``operator`` (the
    CLI) or ``human`` (a person's Pi) may; ``model`` (an agent's workflow tool) is refused."""

    nodePath: str = Field(min_length=1, max_length=1024)
    decisionId: str | None = Field(default=None, min_length=1, max_length=128)
    choice: str = Field(min_length=1, max_length=128)
    input: str | None = Field(default=None, min_length=1, max_length=4000)
    source: Literal["operator", "human", "model"] | None = None
    coordinatorEpoch: int | None = None  # sent by session clients; not part of the fingerprint


class DecisionAnswerReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    decisionId: str
    attemptId: str
    resolution: Literal["human"]
    choice: str
    status: Literal["queued"]


class SubmittedValue(Payload):
    """What an agent step submits: its ``output`` (any JSON; the step's contract judges it)."""

    output: Any


class InteractionSubmitPayload(Payload):
    """interaction.submit (the ``workflow`` tool in Pi, for the step it was given): the request
    and the session it targets, the coordinator epoch the tool was started with (the recording
    segment's lease generation; left out of the fingerprint), and ``submissionId``, one per
    submission (the tool's ``submit-<uuid>``; the envelope's idempotencyKey is the same). The
    response stays open until a supervised child validated the value.

    An operator's submission (``pi-workflows submit``) says ``operator: true`` and sends no
    ``coordinatorEpoch``: it is recorded with actor ``operator`` and needs no live host; its
    validation and verdict are the model's."""

    targetSessionId: Id
    coordinatorEpoch: int | None = Field(default=None, ge=1)
    requestId: Id
    submissionId: Id
    value: SubmittedValue
    operator: bool = False

    @model_validator(mode="after")
    def _epoch(self) -> InteractionSubmitPayload:
        if self.operator != (self.coordinatorEpoch is None):
            raise ValueError("a tool's submission carries its coordinatorEpoch; an operator's (operator: true) none")
        return self


class InteractionSubmitReceipt(BaseModel):
    """The submission was accepted: the step's attempt completed with its output. A rejected one is
    ``rejected`` ``validationFailed`` with the validator's error, which the model can act on."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    submissionId: str
    requestId: str
    status: Literal["accepted"]


class ProgressUpdate(Payload):
    """A short progress note of an agent step (``progress`` a fraction from 0 to 1)."""

    message: str = Field(min_length=1, max_length=MAX_UPDATE_CHARS)
    progress: float | None = Field(default=None, ge=0, le=1)


class InteractionUpdatePayload(Payload):
    """interaction.update (the ``workflow`` tool): a progress update on the request's step, recorded
    as a ``progress`` workflow update; the idempotencyKey names it (``update-<uuid>``)."""

    targetSessionId: Id
    coordinatorEpoch: int = Field(ge=1)
    requestId: Id
    update: ProgressUpdate


class InteractionUpdateReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    requestId: str
    status: Literal["recorded"]


class RunCancelReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    status: Literal["cancelled"]


class DeletedCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    trees: int
    runs: int
    blobs: int


class RunDeleteReceipt(BaseModel):
    """run.delete: the root run named in the envelope, and what its tree's deletion removed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    deleted: DeletedCounts


class RunPauseReceipt(BaseModel):
    """run.pause and run.resume: the run's status after the change and its pause flag."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    status: Literal["queued", "running", "waiting"]
    paused: bool


class RunRestartReceipt(BaseModel):
    """run.restart: the child run (lineage restart), committed queued."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runId: str
    parentRunId: str
    rootRunId: str
    restartNumber: int
    status: Literal["queued"]


class RunRestartPayload(Payload):
    coordinatorEpoch: int | None = None  # sent by session clients; not part of the fingerprint


EffectListStatus = Literal["pending", "applying", "applied", "rejected", "ambiguous", "cancelled"]


def _open_effect_statuses() -> list[EffectListStatus]:
    return ["pending", "applying", "ambiguous"]


class EffectListPayload(Payload):
    """effect.list: unsettled and ambiguous effects by default, newest first; optionally of one run
    (the envelope's runId) or one effect. Never payloads, results, error texts or secrets."""

    effectId: str | None = Field(default=None, min_length=1, max_length=256)
    statuses: list[EffectListStatus] = Field(default_factory=_open_effect_statuses, min_length=1, max_length=6)
    limit: int = Field(default=256, ge=1, le=256)


class EffectListItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    effectId: str
    effectType: str
    status: str
    recoveryPolicy: str
    performer: str
    runId: str | None
    nodePath: str | None
    visit: int | None
    attempts: int
    maxAttempts: int
    nextAttemptAt: int | None
    errorCode: str | None
    createdAt: int
    updatedAt: int
    settledAt: int | None
    controls: list[str]  # of an ambiguous effect, what review can do now (confirm, retry); else empty


class EffectListReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    items: list[EffectListItem]
    now: int


class EffectConfirmPayload(Payload):
    """effect.confirm: the operator's evidence that an ambiguous attempt acted (-> applied).
    ``output`` becomes the node's output (default null)."""

    effectId: str = Field(min_length=1, max_length=256)
    note: str = Field(default="", max_length=2000)
    output: Any = None


class EffectRetryPayload(Payload):
    """effect.retry: a new numbered attempt of an ambiguous effect (-> pending, due now)."""

    effectId: str = Field(min_length=1, max_length=256)


class EffectRecoveryReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    effectId: str
    effectStatus: Literal["applied", "pending"]


class ChannelReloadReceipt(BaseModel):
    """channel.reload: the configuration now in force (its digest) and what changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    configDigest: str
    added: list[str]  # channel ids
    removed: list[str]
    restarted: list[str]
    deliveriesReserved: int  # deliveries of decisions that were waiting for a route


class ChannelRecoverPayload(Payload):
    """channel.recover: an operator's evidence about an ambiguous channel message: ``confirm`` (it
    was sent; with its Telegram message id, a decided decision's edit reaches it) or ``retry``."""

    messageId: str = Field(min_length=1, max_length=256)  # the message's effect id (channels status)
    action: Literal["confirm", "retry"]
    telegramMessageId: int | None = Field(default=None, ge=1)


class ChannelRecoverReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    messageId: str
    effectStatus: Literal["applied", "pending"]
    settleReserved: bool


class StateCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    resources: int
    runs: dict[str, int]  # by status
    controllers: int
    decisions: int
    pendingDecisions: int  # not resolved yet
    settingsScopes: int
    pendingInteractions: int
    pendingFollowUps: int
    activeLeases: int
    expiredClaims: int
    unsettledEffects: int
    ambiguousEffects: int
    ambiguousEffectsOfEndedRuns: int  # of those, the ones whose run ended (confirm only)
    channelEffects: dict[str, int]  # the Telegram channel's messages, by status


class StateStatusReceipt(BaseModel):
    """state.status: the database's sizes, safe counts (no actor ids, channel references, payloads
    or credentials), invariant violations by name with the affected run ids, and the progress of
    a running backup or prune (``maintenance``, null when none runs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    fileBytes: int
    walBytes: int
    pageSize: int
    pageCount: int
    freelistCount: int
    counts: StateCounts
    violations: dict[str, list[str]]
    maintenance: dict[str, Any] | None


class StateVerifyReceipt(BaseModel):
    """state.verify: ``integrity`` lists what integrity_check and foreign_key_check found."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ok: bool
    integrity: list[str]
    violations: dict[str, list[str]]


class StateBackupPayload(Payload):
    """state.backup: a new absolute file path in a private directory (created 0700 if missing)."""

    destination: str = Field(min_length=1, max_length=4096, pattern=r"^/")


class StateBackupReceipt(BaseModel):
    """The copy exists (0600), is one self-contained file, and verified before this answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    destination: str
    bytes: int
    pages: int
    verified: Literal[True]


class StatePrunePayload(Payload):
    """state.prune: trees whose runs all finished before ``before`` (ISO 8601 with a zone, e.g.
    ``2026-08-01T00:00:00Z``). ``apply`` needs ``backupPath`` (a new absolute file); a dry run
    (``apply: false``) changes nothing and is not stored."""

    before: str = Field(min_length=1, max_length=64)
    apply: bool = False
    backupPath: str | None = Field(default=None, min_length=1, max_length=4096, pattern=r"^/")


class PruneBlocked(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rootRunId: str
    blocker: str


class StatePruneReceipt(BaseModel):
    """Eligible root run ids and blocked trees; after an apply also what was deleted, the backup,
    and the state after the WAL truncation and VACUUM (answered, not stored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    applied: bool
    eligible: list[str]
    blocked: list[PruneBlocked]
    deleted: dict[str, int] | None = None
    backup: str | None = None
    vacuumed: bool | None = None
    integrity: list[str] | None = None
    pageCount: int | None = None
    freelistCount: int | None = None
    pageSize: int | None = None


WorkflowOrigin = Literal[WORKFLOW_ORIGINS]  # type: ignore[valid-type]


class WorkflowListPayload(Payload):
    """workflow.list: every ``*.workflow.py`` the server would find for ``projectPath``: its
    ``.pi/workflows``, the user workflows dir and the built-ins."""

    projectPath: str = Field(min_length=1, max_length=4096, pattern=r"^/")


class LoadError(BaseModel):
    """A workflow module that fails to load or compile: ``file`` and ``line`` (null when not
    known), ``message`` (one line), ``text`` (the report: the file and line, then the offending
    line and caret, the missing module, or the workflow file's last frames)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str
    line: int | None
    message: str
    text: str


class WorkflowListItem(BaseModel):
    """``source`` as the run view shows it (kind, path and sha256, or id and revision; null when
    the file cannot be read); ``shadowedBy`` the origin whose file of this name run.start finds
    first (``builtin:NAME`` still reaches a shadowed built-in); ``error`` when it does not load."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    origin: WorkflowOrigin
    source: dict[str, str] | None
    description: str | None
    shadowedBy: WorkflowOrigin | None
    error: LoadError | None


class WorkflowListReceipt(BaseModel):
    """By name, then origin in resolve order (project, user, builtin); at most 256 items
    (``truncated`` when there are more). Read, never stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    projectDirectory: str
    userDirectory: str
    items: list[WorkflowListItem]
    truncated: bool


class WorkflowShowPayload(Payload):
    """workflow.show: the workflow run.start would find for ``workflowName`` (or ``builtin:NAME``)."""

    projectPath: str = Field(min_length=1, max_length=4096, pattern=r"^/")
    workflowName: str = Field(min_length=1, max_length=256)


class WorkflowShowReceipt(BaseModel):
    """The compiled workflow: its source (as the run view shows it), description, the definition
    digest and snapshot (pi-workflows.definition-snapshot.v1: startAt, maxSteps, nodes with their
    kinds, edges and switches, mounts). ``define_workflow`` declares no input schema: what input
    a workflow expects is in its description. Read, never stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    workflowName: str
    origin: WorkflowOrigin
    source: dict[str, str]
    description: str | None
    definitionDigest: str
    snapshot: dict[str, Any]


OPERATION_SHAPES: dict[str, tuple[type[BaseModel], type[BaseModel] | None]] = {
    # run control: the run in the envelope's runId (run.restart: with expectedRevision = runRevision)
    "run.pause": (EmptyPayload, RunPauseReceipt),
    "run.resume": (EmptyPayload, RunPauseReceipt),
    "run.restart": (RunRestartPayload, RunRestartReceipt),
    "run.cancel": (EmptyPayload, RunCancelReceipt),
    "run.delete": (EmptyPayload, RunDeleteReceipt),
    "checkpoint.answer": (CheckpointAnswerPayload, CheckpointAnswerReceipt),
    "decision.answer": (DecisionAnswerPayload, DecisionAnswerReceipt),
    "interaction.submit": (InteractionSubmitPayload, InteractionSubmitReceipt),
    "interaction.update": (InteractionUpdatePayload, InteractionUpdateReceipt),
    "run.start": (RunStartPayload, RunStartReceipt),
    "run.status": (EmptyPayload, None),  # the receipt is the pi-workflows.run-view.v1 object (runId in the envelope)
    "run.list": (RunListPayload, None),  # the receipt is a pi-workflows.run-list-page.v1 page
    "view.runs.page": (ViewRunsPagePayload, None),  # a run.list page, revision-checked on the first
    "view.run.get": (EmptyPayload, None),  # run.status under upstream's name
    "view.run.watch": (ViewRunWatchPayload, None),  # {subscribed, subscriptionId, revision}; run_snapshot events
    "view.runs.watch": (ViewRunsWatchPayload, None),  # {subscribed, subscriptionId}; runs events
    "view.run.unwatch": (ViewUnwatchPayload, None),  # {subscribed: false, subscriptionId}
    "view.session.watch": (ViewSessionWatchPayload, None),  # {subscribed, subscriptionId}; session_snapshot events
    "view.page": (ViewPagePayload, None),  # a pi-workflows.run-page.v1 page of one history
    "view.content": (ViewContentPayload, ContentChunkReceipt),  # a chunk of a run view's content reference
    "server.status": (EmptyPayload, ServerStatusReceipt),
    "server.stop": (EmptyPayload, ServerStopReceipt),
    "protocol.schema": (EmptyPayload, None),  # the receipt is this document
    # state maintenance (reads: never stored)
    "state.status": (EmptyPayload, StateStatusReceipt),
    "state.verify": (EmptyPayload, StateVerifyReceipt),
    "state.backup": (StateBackupPayload, StateBackupReceipt),
    "state.prune": (StatePrunePayload, StatePruneReceipt),
    # operator recovery of ambiguous effects (the review control)
    "effect.list": (EffectListPayload, EffectListReceipt),
    "effect.confirm": (EffectConfirmPayload, EffectRecoveryReceipt),
    "effect.retry": (EffectRetryPayload, EffectRecoveryReceipt),
    # the Telegram channel: per channel state, cursor and messages (no chat or user ids, texts
    # or tokens); the configuration read again; an ambiguous message settled by an operator
    "channel.status": (EmptyPayload, None),
    "channel.reload": (EmptyPayload, ChannelReloadReceipt),
    "channel.recover": (ChannelRecoverPayload, ChannelRecoverReceipt),
    # finding workflows (reads, answered by a resolver child)
    "workflow.list": (WorkflowListPayload, WorkflowListReceipt),
    "workflow.show": (WorkflowShowPayload, WorkflowShowReceipt),
    # a run's steps with outputs, errors and complete shell streams (a read: never stored)
    "run.logs": (RunLogsPayload, RunLogsReceipt),
    # a run's captured Pi conversation (a read: never stored)
    "run.transcript": (RunTranscriptPayload, RunTranscriptReceipt),
}


def schema_document() -> dict[str, Any]:
    """The JSON Schema of every message and of each served payload and receipt."""
    return {
        "schema": SCHEMA,
        "messages": {
            model.__name__: model.model_json_schema(by_alias=True)
            for model in (Hello, Request, Response, Event, Refused)
        },
        "errorReceipt": ErrorReceipt.model_json_schema(),
        "operations": {
            op: {
                "payload": OPERATION_SHAPES[op][0].model_json_schema(),
                "receipt": shape.model_json_schema() if (shape := OPERATION_SHAPES[op][1]) else {"type": "object"},
                "stored": op not in READ_ONLY_OPERATIONS,
            }
            for op in OPERATION_SHAPES
        },
        "notYetServed": [op for op in OPERATIONS if op not in OPERATION_SHAPES],
        "upstreamNotServed": list(UPSTREAM_UNSERVED),
    }

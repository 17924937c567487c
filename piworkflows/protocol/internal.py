"""Internal message shapes: the one place that defines what crosses a pipe.

::

    supervisor ──{"k": kind, "id": n, "b": command}──> writer
    supervisor <──{"k": "reply", "id": n, "b": Reply}── writer

Every writer command kind has exactly one model in ``COMMAND_MODELS`` and one
handler in ``piworkflows.writer.commands.REGISTRY`` (a test keeps the two
equal). Blob values carry their digest, computed by the submitter; the model
checks digest, length and media type while it is decoded, before any write
transaction, so no hashing happens inside one.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from piworkflows import canonical
from piworkflows.states import (
    MEDIA_JSON,
    MEDIA_TEXT,
    RUN_STATUSES,
    WORKFLOW_ORIGINS,
    WRITER_HEALTH_CODES,
    WRITER_START_FAILURES,
)

# Frame kinds that are not commands.
READY = "ready"
FATAL = "fatal"
REPLY = "reply"
LOG = "log"  # a child's log record, written to the server log by the supervisor
HEALTH = "health"  # the writer's ability to commit changed (WriterHealth)

MAX_FRAME_BYTES = 1024 * 1024
MAX_PARK_DETAIL_BYTES = 1024  # a dead runner's last stderr line (settings bound it to fewer characters)
MAX_INLINE_BLOB_BYTES = 900 * 1024  # a blob.put must fit one frame with its envelope
MAX_BLOB_READ_BYTES = 256 * 1024

Digest = Annotated[bytes, Field(min_length=32, max_length=32)]
Id = Annotated[str, Field(min_length=1, max_length=256)]
ActorClass = Literal["server", "client", "runner", "outbox", "channel", "operator", "human", "model", "maintenance"]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Actor(Model):
    actor_class: ActorClass
    actor_id: str | None = None


def verify_value(digest: bytes, media_type: str, data: bytes) -> None:
    """Raises ValueError unless ``data`` has this SHA-256 digest and is what the media type says
    (UTF-8; JSON parses). Canonical form is the producer's duty (``BlobValue.of_json``)."""
    if hashlib.sha256(data).digest() != digest:
        raise ValueError("blob digest does not match its bytes")
    text = data.decode("utf-8")
    if media_type == MEDIA_JSON:
        json.loads(text)


class BlobValue(Model):
    """Canonical JSON or UTF-8 text, with the digest its submitter computed.

    Decoding verifies the digest, the byte length and that the bytes are what
    the media type says (UTF-8; JSON parses). Producers build values with
    ``of_json``/``of_text``, which write canonical JSON.
    """

    digest: Digest
    media_type: Literal["application/json", "text/plain;charset=utf-8"]
    data: bytes = Field(max_length=MAX_INLINE_BLOB_BYTES)

    @model_validator(mode="after")
    def _verify(self) -> BlobValue:
        verify_value(self.digest, self.media_type, self.data)
        return self

    @classmethod
    def of_json(cls, value: Any) -> BlobValue:
        """Canonical JSON of ``value`` (raises TypeError/ValueError if it is not JSON). Built here, so
        not checked again; the receiver checks whatever it decodes."""
        return cls.of_bytes(canonical.dumps_bytes(value), MEDIA_JSON)

    @classmethod
    def of_text(cls, text: str) -> BlobValue:
        return cls.of_bytes(text.encode("utf-8"), MEDIA_TEXT)

    @classmethod
    def of_bytes(cls, data: bytes, media_type: str) -> BlobValue:
        """Bytes its producer vouches for (canonical JSON or UTF-8 text): digest computed, not re-checked."""
        if len(data) > MAX_INLINE_BLOB_BYTES:
            raise ValueError(f"the value is {len(data)} bytes; at most {MAX_INLINE_BLOB_BYTES} fit inline")
        return cls.model_construct(digest=hashlib.sha256(data).digest(), media_type=media_type, data=data)


class BlobPart(Model):
    """One part of a value larger than one frame: ``data`` at ``offset`` of the whole value's
    ``byte_length`` bytes, with the whole value's digest (computed once by the uploader). Nothing
    of the whole is checked here; the writer verifies it when its last byte arrives
    (``writer/uploads.py``). An outbox worker sends its parts in ``upload`` frames."""

    digest: Digest
    media_type: Literal["application/json", "text/plain;charset=utf-8"]
    byte_length: int = Field(ge=1)
    offset: int = Field(ge=0)
    data: bytes = Field(min_length=1, max_length=MAX_INLINE_BLOB_BYTES)

    @model_validator(mode="after")
    def _within(self) -> BlobPart:
        if self.offset + len(self.data) > self.byte_length:
            raise ValueError("a part ends beyond its value")
        return self

    @classmethod
    def parts_of(cls, data: bytes, media_type: str) -> Iterator[BlobPart]:
        """A value its producer vouches for (canonical JSON or UTF-8 text), in parts that fit a frame
        (made one at a time: a large value is not copied whole)."""
        digest = hashlib.sha256(data).digest()
        for offset in range(0, len(data), MAX_INLINE_BLOB_BYTES):
            yield cls.model_construct(
                digest=digest,
                media_type=media_type,
                byte_length=len(data),
                offset=offset,
                data=data[offset : offset + MAX_INLINE_BLOB_BYTES],
            )

    def whole(self) -> BlobValue | None:
        """The value itself when this part is all of it (it is stored with a plain blob.put)."""
        if self.offset or len(self.data) != self.byte_length:
            return None
        return BlobValue.model_construct(digest=self.digest, media_type=self.media_type, data=self.data)


class ClientReceiptKey(Model):
    """Names a client request's durable intent (``host_commands``)."""

    client_id: Id
    idempotency_key: Id
    fingerprint: Digest
    operation: str
    run_id: Id | None = None


class WorkerMessageKey(Model):
    """Names a state-changing child message (``worker_messages``)."""

    sender_scope: Id
    message_id: Id
    fingerprint: Digest
    message_kind: str
    run_id: Id | None = None


class Claim(Model):
    """A claim the supervisor attaches: the token's hash, never the token.

    ``server_epoch`` names the epoch of the server that took the claim; a
    claim of an older epoch is dead as soon as a newer epoch was taken.
    """

    server_epoch: int = Field(ge=1)
    owner_id: Id
    claim_token_hash: Digest
    lease_generation: int = Field(ge=1)
    ttl_ms: int = Field(ge=1)


def server_owner_id(server_epoch: int) -> str:
    """The owner id of every claim a server epoch takes (runs, and the effects it performs)."""
    return f"server-{server_epoch}"


def new_claim(server_epoch: int, ttl_ms: int) -> dict[str, Any]:
    """A claim the supervisor is about to take: a fresh random token, of which only the hash
    leaves this process (``lease_generation`` is added from the writer's receipt)."""
    token_hash = hashlib.sha256(secrets.token_bytes(32)).digest()
    return {
        "server_epoch": server_epoch,
        "owner_id": server_owner_id(server_epoch),
        "claim_token_hash": token_hash,
        "ttl_ms": ttl_ms,
    }


class Command(Model):
    kind: ClassVar[str]
    actor: Actor
    client_receipt: ClientReceiptKey | None = None
    worker_message: WorkerMessageKey | None = None

    @model_validator(mode="after")
    def _one_dedup_key(self) -> Command:
        if self.client_receipt is not None and self.worker_message is not None:
            raise ValueError("a command has at most one receipt key")
        return self


class ReadCommand(Model):
    kind: ClassVar[str]
    actor: Actor


# --- projects and blobs -------------------------------------------------------


class ProjectEnsure(Command):
    kind: ClassVar[str] = "project.ensure"
    canonical_path: str = Field(min_length=1, max_length=4096, pattern=r"^/")


class BlobPut(Command):
    kind: ClassVar[str] = "blob.put"
    blob: BlobValue


class BlobPutPart(Command):
    """One part of an upload. The writer holds the parts in memory and, when the last byte arrives,
    verifies the whole (digest, length, media type) while it decodes the command, outside the
    transaction, then stores it as blob.put does (``writer/uploads.py``)."""

    kind: ClassVar[str] = "blob.put_part"
    part: BlobPart
    # What the writer's decoding made of the part (writer/uploads.Received); never on the wire.
    _received: Any = PrivateAttr(default=None)


class BlobRead(ReadCommand):
    kind: ClassVar[str] = "blob.read"
    digest: Digest
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=MAX_BLOB_READ_BYTES, ge=1, le=MAX_BLOB_READ_BYTES)


# --- server epoch -------------------------------------------------------------


class ServerTakeEpoch(Command):
    kind: ClassVar[str] = "server.take_epoch"
    host_id: Id
    claim_token_hash: Digest
    pid: int = Field(ge=1)
    process_started_at: int = Field(ge=0)
    ttl_ms: int = Field(ge=1)


class ServerRenewEpoch(Command):
    kind: ClassVar[str] = "server.renew_epoch"
    server_epoch: int = Field(ge=1)
    claim_token_hash: Digest
    ttl_ms: int = Field(ge=1)


class ServerReleaseEpoch(Command):
    kind: ClassVar[str] = "server.release_epoch"
    server_epoch: int = Field(ge=1)
    claim_token_hash: Digest


class ServerRecordStop(Command):
    """A client asked the server to stop: recorded on the server resource, with a receipt."""

    kind: ClassVar[str] = "server.record_stop"
    server_epoch: int = Field(ge=1)


class ServerCounts(ReadCommand):
    """Privacy-safe counts for server.status: no ids, paths or payloads."""

    kind: ClassVar[str] = "server.counts"


class StateStatus(ReadCommand):
    """state.status: sizes, safe counts and invariant violations (no ids but run ids, no payloads)."""

    kind: ClassVar[str] = "state.status"


class StateVerify(ReadCommand):
    """state.verify: SQLite integrity and foreign keys, then the spec's invariants; repairs nothing."""

    kind: ClassVar[str] = "state.verify"


class BackupDone(Model):
    """What the writer loop made before the receipt commits (writer/backup.py)."""

    destination: str
    bytes: int = Field(ge=0)
    pages: int = Field(ge=0)


class StateBackup(Command):
    """state.backup: the online backup API on the writer's connection, verified, then the receipt.
    ``performed`` is set by the writer loop itself once the copy exists and verified."""

    kind: ClassVar[str] = "state.backup"
    destination: str = Field(min_length=1, max_length=4096)
    performed: BackupDone | None = None


class StatePrune(Command):
    """state.prune: complete terminal root-run trees that finished before ``before_ms``. A dry run
    only selects; ``apply`` needs a new ``backup_path``, which the writer loop makes and verifies
    first (``performed_backup``), then the same selection is rechecked and deleted in one
    transaction."""

    kind: ClassVar[str] = "state.prune"
    before_ms: int = Field(ge=0)
    apply: bool = False
    backup_path: str | None = Field(default=None, min_length=1, max_length=4096)
    performed_backup: BackupDone | None = None


class RunDelete(Command):
    """run.delete: one terminal root-run tree, by its root, with prune's blockers and deletion."""

    kind: ClassVar[str] = "run.delete"
    run_id: Id


class StateRetain(Command):
    """Automatic retention, one step: recheck the selection and delete one eligible tree (and the
    blobs no longer referenced) in one transaction. No backup."""

    kind: ClassVar[str] = "state.retain"
    cutoff_ms: int = Field(ge=0)
    after: tuple[int, str] | None = None  # the sweep's cursor: (finished_at, root run id) last taken


class StateCompact(Command):
    """After a retention sweep, while idle: truncate the WAL, measure, and VACUUM only when at
    least 64 MiB and 20 percent of the pages are free (the writer loop does it, outside groups)."""

    kind: ClassVar[str] = "state.compact"


# --- runs ---------------------------------------------------------------------


class RunSource(Model):
    """Source identity without source text: a file path + SHA-256, or a built-in id + revision."""

    source_kind: Literal["file", "builtin"]
    source_path: str | None = None
    source_sha256: Digest | None = None
    builtin_id: str | None = None
    builtin_revision: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> RunSource:
        file_fields = self.source_path is not None and self.source_sha256 is not None
        builtin_fields = self.builtin_id is not None and self.builtin_revision is not None
        if (self.source_kind == "file") != file_fields or (self.source_kind == "builtin") != builtin_fields:
            raise ValueError("a file source has path and sha256; a built-in has id and revision")
        return self


class RunCreate(Command):
    """A new run, committed as queued with its final id (run.start)."""

    kind: ClassVar[str] = "run.create"
    run_id: Id
    project_path: str = Field(min_length=1, max_length=4096, pattern=r"^/")
    workflow_name: str = Field(min_length=1, max_length=256)
    definition: BlobValue  # the canonical snapshot; its digest is the definition digest
    source: RunSource
    input: BlobValue
    launch_options: BlobValue | None = None
    title: str | None = Field(default=None, max_length=1000)
    max_steps: int = Field(ge=1)
    execution_mode: Literal["headless", "interactive"] = "headless"
    origin_session_id: Id | None = None

    @model_validator(mode="after")
    def _shape(self) -> RunCreate:
        for value in (self.definition, self.input, self.launch_options):
            if value is not None and value.media_type != MEDIA_JSON:
                raise ValueError("definition, input and launch options are JSON")
        if self.execution_mode == "interactive" and self.origin_session_id is None:
            raise ValueError("an interactive run names its origin session")
        return self


# --- effects ------------------------------------------------------------------


Performer = Literal["writer", "runner", "shell.exec", "http.request"]  # states.EFFECT_PERFORMERS
PoolPerformer = Literal["shell.exec", "http.request"]  # states.POOL_PERFORMERS


class EffectRequest(Model):
    """One deterministic effect a transaction records before it commits."""

    effect_type: str = Field(min_length=1, max_length=128)
    idempotency_key: str = Field(min_length=1, max_length=1024)
    payload: BlobValue
    effect_class: Literal["local", "external"]
    performer: Performer
    recovery_policy: Literal["idempotent", "manual"]
    owner_scope: Literal["server", "run", "resource_manager", "channel"]
    run_id: Id | None = None
    max_attempts: int = Field(default=5, ge=1, le=1000)

    @model_validator(mode="after")
    def _json_payload(self) -> EffectRequest:
        if self.payload.media_type != MEDIA_JSON:
            raise ValueError("an effect payload is canonical JSON")
        if (self.effect_class == "local") != (self.performer == "writer"):
            raise ValueError("the writer performs exactly the local effects")
        return self

    def effect_id(self, source_resource_id: str) -> str:
        """Deterministic: derived from source resource, effect type and key."""
        ident = canonical.dumps_bytes([source_resource_id, self.effect_type, self.idempotency_key])
        return "effect-" + hashlib.sha256(ident).hexdigest()[:32]

    def fingerprint(self, source_resource_id: str) -> bytes:
        """What makes a repeated request 'the same' (the source revision is not part of it)."""
        fields = self.model_dump(exclude={"payload"})
        fields["payload"] = self.payload.digest.hex()
        fields["source"] = source_resource_id
        return hashlib.sha256(canonical.dumps_bytes(fields)).digest()


class EffectReserve(Command):
    """Record effects for a source resource at its exact expected revision."""

    kind: ClassVar[str] = "effect.reserve"
    source_resource_id: Id
    expected_revision: int = Field(ge=1)
    claim: Claim | None = None
    effects: list[EffectRequest] = Field(min_length=1, max_length=64)


class EffectClaim(Command):
    """Claim one due pending effect: a named one, or the next due one of these performers."""

    kind: ClassVar[str] = "effect.claim"
    effect_id: Id | None = None
    performers: list[PoolPerformer] = Field(default_factory=lambda: ["shell.exec", "http.request"], min_length=1)
    owner_id: Id
    claim_token_hash: Digest
    ttl_ms: int = Field(ge=1)


class EffectSettle(Command):
    """Report how the applying attempt ended, fenced by its claim."""

    kind: ClassVar[str] = "effect.settle"
    effect_id: Id
    expected_revision: int = Field(ge=1)
    claim: Claim
    settlement: Literal["applied", "rejected", "retry", "ambiguous"]
    result: BlobValue | None = None
    error: BlobValue | None = None
    error_code: str | None = Field(default=None, max_length=64)
    external_ref: str | None = Field(default=None, max_length=1024)
    retry_at: int | None = Field(default=None, ge=0)
    # Stored values the result names (a shell command's streams): linked to the effect's run
    # (run_view_content) in the same transaction, so they live as long as the run.
    view_content: list[Digest] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _shape(self) -> EffectSettle:
        if (self.settlement == "retry") != (self.retry_at is not None):
            raise ValueError("retry_at is given exactly when the settlement is retry")
        if self.settlement == "applied" and self.error is not None:
            raise ValueError("an applied settlement carries no error")
        if self.error is not None and self.error.media_type != MEDIA_TEXT:
            raise ValueError("an effect error is text")
        return self


class EffectAbandon(Command):
    """The claimant of an applying effect is gone (its runner or worker died): the attempt is
    uncertain. An idempotent effect's next attempt is due at ``retry_at`` (default: now)."""

    kind: ClassVar[str] = "effect.abandon"
    effect_id: Id
    claim: Claim
    retry_at: int | None = Field(default=None, ge=0)


class EffectRecover(Command):
    """At pool start: end the applying attempts of pool effects whose claims are dead (an
    older server epoch, or expired), as an abandon would."""

    kind: ClassVar[str] = "effect.recover"


class EffectConfirm(Command):
    """An operator confirms an ambiguous effect acted: it becomes ``applied`` with the note
    (and the node output, if given); the run parked for it continues."""

    kind: ClassVar[str] = "effect.confirm"
    effect_id: Id
    note: str = Field(default="", max_length=2000)
    output: BlobValue | None = None


class EffectRetry(Command):
    """An operator asks for a new numbered attempt of an ambiguous effect (it becomes
    ``pending``; the claim records the attempt); the run parked for it continues."""

    kind: ClassVar[str] = "effect.retry"
    effect_id: Id


class EffectList(ReadCommand):
    """Effects for operators, newest first: unsettled and ambiguous by default. No payloads."""

    kind: ClassVar[str] = "effect.list"
    effect_id: Id | None = None
    run_id: Id | None = None
    statuses: list[Literal["pending", "applying", "applied", "rejected", "ambiguous", "cancelled"]] = Field(
        default_factory=lambda: ["pending", "applying", "ambiguous"], min_length=1
    )
    limit: int = Field(default=256, ge=1, le=256)


class NodeEffectReserve(Command):
    """A runner reserves its action or shell node's effect, or adopts it after a crash.

    The key is deterministic: run id, effect type, full compiled node path and
    node visit number; every attempt of one visit shares it.
    """

    kind: ClassVar[str] = "node.reserve_effect"
    run_id: Id
    claim: Claim
    expected_revision: int = Field(ge=1)
    attempt_id: Id
    effect_type: str = Field(min_length=1, max_length=128)
    recovery_policy: Literal["idempotent", "manual"]
    performer: Literal["runner", "shell.exec", "http.request"]
    payload: BlobValue
    max_attempts: int = Field(default=5, ge=1, le=1000)


class RunListCursor(Model):
    created_at: int
    run_id: Id


class RunList(ReadCommand):
    """Run metadata, newest first, optionally only runs of one project, with one of ``statuses``
    (durable run statuses), of one workflow name, created at or after ``since``; never payload bodies."""

    kind: ClassVar[str] = "run.list"
    project_path: str | None = None
    statuses: list[Literal[tuple(sorted(RUN_STATUSES))]] | None = Field(default=None, min_length=1)  # type: ignore[valid-type]
    workflow_name: str | None = None
    since: int | None = Field(default=None, ge=0)
    limit: int = Field(default=50, ge=1, le=256)
    before: RunListCursor | None = None


class RunGet(ReadCommand):
    """One consistent run view (pi-workflows.run-view.v1)."""

    kind: ClassVar[str] = "run.get"
    run_id: Id


class RunLogs(ReadCommand):
    """A run's steps in order (of one node, if named) after step ``after``: outcome, times, the
    output and error (bounded inline) and a shell step's stream references (run.logs)."""

    kind: ClassVar[str] = "run.logs"
    run_id: Id
    node_path: str | None = Field(default=None, min_length=1, max_length=1024)
    after: int | None = Field(default=None, ge=0)
    limit: int = Field(default=64, ge=1, le=256)


class RunContentRead(ReadCommand):
    """A bounded part of a value linked to the run in ``run_view_content``: the run id, the digest
    and the media type must all match the link. The reader verifies the whole digest."""

    kind: ClassVar[str] = "run.content"
    run_id: Id
    digest: Digest
    media_type: Literal["application/json", "text/plain;charset=utf-8"]
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=MAX_BLOB_READ_BYTES, ge=1, le=MAX_BLOB_READ_BYTES)


class RunClaim(Command):
    """Admission: a new claim generation on a claimable run, its runner epoch recorded before spawn."""

    kind: ClassVar[str] = "run.claim"
    run_id: Id
    server_epoch: int = Field(ge=1)
    owner_id: Id
    claim_token_hash: Digest
    ttl_ms: int = Field(ge=1)
    launch_command: Literal["start", "resume", "continue", "restart"]


class RunnerSpawned(Command):
    """The runner process exists: its exact identity, right after the spawn."""

    kind: ClassVar[str] = "runner.spawned"
    run_id: Id
    runner_epoch: int = Field(ge=1)
    claim: Claim
    pid: int = Field(ge=1)
    process_started_at: int = Field(ge=0)


class RunnerExited(Command):
    """A runner ended: its outcome, and where the run goes (the respawn rules)."""

    kind: ClassVar[str] = "runner.exited"
    run_id: Id
    runner_epoch: int = Field(ge=1)
    outcome: Literal["exited", "cancelled", "timedOut", "crashed", "claimLost", "orphaned"]
    stopped_by_server: bool  # pause, cancel, shutdown or a supervisor crash: never "no progress"
    # the runner refused to run changed code, or met an effect only an operator can resolve
    park_reason: Literal["workflowSourceChanged", "effectAmbiguous"] | None = None
    # a runner that died: its last stderr line (the exception class and message), kept with a
    # runnerNoProgress park as the runner.exited event's payload
    park_detail: BlobValue | None = None

    @model_validator(mode="after")
    def _short_text(self) -> RunnerExited:
        if self.park_detail is not None and (
            self.park_detail.media_type != MEDIA_TEXT or len(self.park_detail.data) > MAX_PARK_DETAIL_BYTES
        ):
            raise ValueError(f"a park detail is text of at most {MAX_PARK_DETAIL_BYTES} bytes")
        return self


NodeKind = Literal[
    "agent", "decision", "compute", "notify", "action", "shell", "http", "checkpoint", "human_decision", "workflow"
]


def attempt_id_of(run_id: str, node_path: str, visit_number: int, attempt_number: int) -> str:
    """Deterministic: one id per run, node path, visit and attempt number."""
    ident = canonical.dumps_bytes([run_id, node_path, visit_number, attempt_number])
    return "attempt-" + hashlib.sha256(ident).hexdigest()[:32]


class NextAttempt(Model):
    """The next node's attempt, started in the same transaction that finishes this one."""

    node_kind: NodeKind
    visit_number: int = Field(ge=1)
    attempt_number: int = Field(default=1, ge=1)


class NodeStart(Command):
    """A runner begins a node: a new attempt and step, under the run's claim."""

    kind: ClassVar[str] = "node.start"
    run_id: Id
    claim: Claim
    expected_revision: int = Field(ge=1)
    node_path: str = Field(min_length=1, max_length=1024)
    node_kind: NodeKind
    visit_number: int = Field(ge=1)
    attempt_number: int = Field(default=1, ge=1)

    def attempt_id(self) -> str:
        return attempt_id_of(self.run_id, self.node_path, self.visit_number, self.attempt_number)


class NodeFinish(Command):
    """A runner ends a node: its outcome and output, and where the run goes next.

    ``error`` is the node's error when it failed. ``run_error`` is the run's
    when it fails here: a routing error, max_steps, or the failed node that
    ends it, named (without it a failed node's error is the run's).
    """

    kind: ClassVar[str] = "node.finish"
    run_id: Id
    claim: Claim
    expected_revision: int = Field(ge=1)
    attempt_id: Id
    outcome: Literal["ok", "failed", "timed_out", "cancelled"]
    output: BlobValue | None = None
    error: BlobValue | None = None
    error_code: str | None = Field(default=None, max_length=64)
    next_node: str | None = Field(default=None, min_length=1, max_length=1024)
    end_status: Literal["completed", "failed", "timed_out", "cancelled"] | None = None
    start_next: NextAttempt | None = None  # start next_node's attempt in the same commit (one round trip)
    run_error: BlobValue | None = None

    @model_validator(mode="after")
    def _shape(self) -> NodeFinish:
        if (self.next_node is None) == (self.end_status is None):
            raise ValueError("a finished node names either the next node or how the run ends")
        if self.output is not None and self.output.media_type != MEDIA_JSON:
            raise ValueError("a node output is JSON")
        if any(e is not None and e.media_type != MEDIA_TEXT for e in (self.error, self.run_error)):
            raise ValueError("a node or run error is text")
        if self.outcome == "ok" and self.error is not None:
            raise ValueError("a successful node carries no error (a run that fails on its route has run_error)")
        if self.run_error is not None and self.end_status in (None, "completed"):
            raise ValueError("run_error is the error of a run that ends here without completing")
        if self.start_next is not None and self.next_node is None:
            raise ValueError("start_next starts the next node")
        return self


class RunFinish(Command):
    """A runner ends its run where no node is active: the route after an answered checkpoint
    (completed with the answer, or a routing error), or workflow code outside any node's own
    execution that failed (the module's load): ``failed`` with the code and an error naming
    the node or file."""

    kind: ClassVar[str] = "run.finish"
    run_id: Id
    claim: Claim
    expected_revision: int = Field(ge=1)
    end_status: Literal["completed", "failed"]
    output: BlobValue | None = None
    error: BlobValue | None = None
    error_code: str | None = Field(default=None, min_length=1, max_length=64)

    @model_validator(mode="after")
    def _shape(self) -> RunFinish:
        if self.end_status == "completed":
            if self.output is None or self.output.media_type != MEDIA_JSON or self.error or self.error_code:
                raise ValueError("a completed run has a JSON output and no error")
        elif self.error is None or self.error.media_type != MEDIA_TEXT or self.error_code is None or self.output:
            raise ValueError("a failed run has an error text and an error code, and no output")
        return self


class NodeWait(Command):
    """A checkpoint asks for input: the run waits with no runner and no claim."""

    kind: ClassVar[str] = "node.wait"
    run_id: Id
    claim: Claim
    expected_revision: int = Field(ge=1)
    attempt_id: Id
    request: BlobValue  # what the answerer sees (JSON: summary)


class CheckpointAnswer(Command):
    """The answer to a waiting checkpoint: it becomes the node's output, in the same run."""

    kind: ClassVar[str] = "checkpoint.answer"
    run_id: Id
    expected_revision: int | None = Field(default=None, ge=1)
    node_path: str = Field(min_length=1, max_length=1024)
    answer: BlobValue


class RunControl(Command):
    """A control command on a run, at the client's expected revision if it names one."""

    run_id: Id
    expected_revision: int | None = Field(default=None, ge=1)


class RunCancel(RunControl):
    """Cancel a run: the terminal state and its receipt commit before the runner is stopped."""

    kind: ClassVar[str] = "run.cancel"


class RunPause(RunControl):
    """Pause: park at the last durable boundary, release the claim, stop the runner, with the receipt."""

    kind: ClassVar[str] = "run.pause"


class RunResume(RunControl):
    """Resume a paused run (or one parked for runnerNoProgress/workflowSourceChanged): queued again."""

    kind: ClassVar[str] = "run.resume"


class RunRestart(RunControl):
    """A finished run gets a child run (lineage restart) with the same definition and input."""

    kind: ClassVar[str] = "run.restart"
    expected_revision: int = Field(ge=1)  # required: the parent's runRevision
    child_run_id: Id


class ClaimRenew(Command):
    """The supervisor keeps a runner's claim alive while workflow code blocks."""

    kind: ClassVar[str] = "claim.renew"
    resource_id: Id
    claim: Claim


class ResumeState(ReadCommand):
    """What a runner needs to continue a run from its last durable boundary."""

    kind: ClassVar[str] = "run.resume_state"
    run_id: Id


class ClaimableRuns(ReadCommand):
    """Runs the scheduler may claim, in admission order."""

    kind: ClassVar[str] = "run.claimable"
    limit: int = Field(default=16, ge=1, le=256)


class OrphanedRunners(ReadCommand):
    """Runner records no live runner serves: of older server epochs (startup recovery), or of
    this epoch but not among ``active_runner_epochs`` (a reply lost when the writer crashed)."""

    kind: ClassVar[str] = "runner.orphans"
    server_epoch: int = Field(ge=1)
    active_runner_epochs: list[int] = Field(default_factory=list, max_length=4096)


class ResolveRequest(Model):
    """To a resolver child: find, load and compile a workflow; compute its title."""

    project_path: str
    workflow_name: str
    input: Any = None


class Resolution(Model):
    """From a resolver child: the compiled definition and source identity, or why not (``message``:
    for a module that failed to load, the file, line and what went wrong, workflows/failures.py)."""

    ok: bool
    code: str | None = None  # when not ok: workflowNotFound | invalidDefinition | titleFailed
    message: str | None = None
    workflow_name: str | None = None
    snapshot: bytes | None = None  # canonical JSON of the definition snapshot
    digest: str | None = None  # "sha256:<hex>" of the snapshot
    source: RunSource | None = None
    title: str | None = None
    max_steps: int | None = None


WorkflowOrigin = Literal[WORKFLOW_ORIGINS]  # type: ignore[valid-type]
MAX_LISTED_WORKFLOWS = 256


class WorkflowShowRequest(Model):
    """To a resolver child: find, load and compile a workflow, to describe it (no input, no title)."""

    project_path: str
    workflow_name: str


class WorkflowShown(Model):
    """From a resolver child: the workflow that ``workflow_name`` finds, or why not (as Resolution)."""

    ok: bool
    code: str | None = None  # when not ok: workflowNotFound | invalidDefinition
    message: str | None = None
    workflow_name: str | None = None
    origin: WorkflowOrigin | None = None
    source: dict[str, str] | None = None  # as the run view shows it: kind, path and sha256, or id and revision
    description: str | None = None
    digest: str | None = None  # "sha256:<hex>" of the snapshot
    snapshot: dict[str, Any] | None = None  # the definition snapshot


class WorkflowListRequest(Model):
    """To a resolver child: every workflow source of the project, the user dir and the built-ins."""

    project_path: str


class LoadError(Model):
    """A workflow module that failed to load or compile (workflows/failures.py): ``text`` is the
    report (the file and line, then the offending line and caret, the missing module or the
    workflow file's frames)."""

    file: str
    line: int | None
    message: str
    text: str


class ListedWorkflow(Model):
    """One ``*.workflow.py`` file: ``shadowed_by`` names the origin whose file of the same name a
    run.start would find first; ``error`` says why it does not load (then no description)."""

    name: str
    origin: WorkflowOrigin
    source: dict[str, str] | None  # as WorkflowShown.source; None when the file cannot be read
    description: str | None = None
    shadowed_by: WorkflowOrigin | None = None
    error: LoadError | None = None


class WorkflowListing(Model):
    """From a resolver child: the workflows by name, then origin in resolve order; at most
    ``MAX_LISTED_WORKFLOWS`` (``truncated`` when there are more)."""

    project_directory: str
    user_directory: str
    items: list[ListedWorkflow] = Field(max_length=MAX_LISTED_WORKFLOWS)
    truncated: bool = False


# What a resolver child answers, by frame kind: the request model and its answer's.
RESOLVER_FRAMES: dict[str, tuple[type[Model], type[Model]]] = {
    "resolve": (ResolveRequest, Resolution),
    "show": (WorkflowShowRequest, WorkflowShown),
    "list": (WorkflowListRequest, WorkflowListing),
}


class ReceiptFind(ReadCommand):
    """The stored answer of a client request, if any (so a retry skips re-resolving)."""

    kind: ClassVar[str] = "receipt.find"
    key: ClientReceiptKey


COMMAND_MODELS: dict[str, type[Command] | type[ReadCommand]] = {
    model.kind: model
    for model in (
        ProjectEnsure,
        BlobPut,
        BlobPutPart,
        BlobRead,
        ServerTakeEpoch,
        ServerRenewEpoch,
        ServerReleaseEpoch,
        ServerRecordStop,
        ServerCounts,
        RunCreate,
        RunList,
        RunGet,
        RunLogs,
        RunContentRead,
        RunClaim,
        RunnerSpawned,
        RunnerExited,
        NodeStart,
        NodeFinish,
        RunFinish,
        NodeWait,
        CheckpointAnswer,
        RunCancel,
        RunPause,
        RunResume,
        RunRestart,
        ClaimRenew,
        ResumeState,
        ClaimableRuns,
        OrphanedRunners,
        ReceiptFind,
        EffectReserve,
        EffectClaim,
        EffectSettle,
        EffectAbandon,
        EffectRecover,
        EffectConfirm,
        EffectRetry,
        EffectList,
        NodeEffectReserve,
        StateStatus,
        StateVerify,
        StateBackup,
        StatePrune,
        StateRetain,
        StateCompact,
        RunDelete,
    )
}


class RunnerLaunch(Model):
    """pi-workflows.runner-launch.v1: everything a runner child needs, and nothing secret."""

    run_id: Id
    lease_generation: int
    runner_epoch: int
    project_path: str
    source: RunSource
    definition_digest: str  # "sha256:<hex>"
    input: Any = None
    steps: list[dict[str, Any]] = Field(default_factory=list)  # completed attempts, in order


class Reply(Model):
    """The writer's answer, sent only after the command's transaction committed."""

    outcome: Literal["accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"]
    revision: int | None = None
    receipt: dict[str, Any] | None = None
    error: str | None = None


class Ready(Model):
    pid: int
    schema_name: str
    schema_version: int
    ddl_sha256: bytes


class Fatal(Model):
    """Why a writer cannot open the state database: ``stateIncompatible``, ``databaseCorrupt``,
    ``statePathRefused``, ``diskFull`` (with the free bytes it saw), ``ioError``, ``cannotOpen``."""

    code: Literal[WRITER_START_FAILURES]  # type: ignore[valid-type]
    message: str
    free_bytes: int | None = None


class WriterHealth(Model):
    """What the writer can do now, sent when it changes: commit (``code`` None); ``diskFull`` or
    ``ioError`` (each write group fails until one commits again); ``databaseCorrupt`` (every write
    refused, reads still answered). ``message`` is for server status and the log."""

    code: Literal[WRITER_HEALTH_CODES] | None  # type: ignore[valid-type]
    message: str | None = None
    free_bytes: int | None = None


class LogRecord(Model):
    level: int
    message: str = Field(max_length=4096)

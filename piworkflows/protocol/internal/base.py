"""The shapes every internal message is built from: models, actors, claims, values, receipt keys.

A frame between two processes is ``{"k": kind, "id": n, "b": body}`` (``protocol/frames.py``);
each body is one model of this package. Blob values carry their digest, computed by the
submitter; the model checks digest, length and media type while it is decoded, before any
write transaction, so no hashing happens inside one.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from piworkflows import canonical
from piworkflows.errors import CommandError
from piworkflows.protocol import domain
from piworkflows.protocol.internal.values import ActorClass, MediaType
from piworkflows.states import MEDIA_JSON, MEDIA_TEXT

MAX_FRAME_BYTES = 1024 * 1024
MAX_INLINE_BLOB_BYTES = 900 * 1024  # a blob.put must fit one frame with its envelope
MAX_BLOB_READ_BYTES = 256 * 1024
Digest = Annotated[bytes, Field(min_length=32, max_length=32)]
Id = Annotated[str, Field(min_length=1, max_length=256)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Frame(Model):
    """The body of a frame: its ``kind`` is the frame's ``k``, the one name of the message, used by
    its sender, any relay and its handler."""

    kind: ClassVar[str]


class Actor(Model):
    actor_class: ActorClass
    actor_id: str | None = None


def verify_value(digest: bytes, media_type: str, data: bytes) -> None:
    """Raises ValueError unless ``data`` has this SHA-256 digest and is what the media type says
    (UTF-8; JSON that parses to a value of the protocol's domain, protocol/domain.py). Canonical
    form is the producer's duty (``BlobValue.of_json``)."""
    if hashlib.sha256(data).digest() != digest:
        raise ValueError("blob digest does not match its bytes")
    text = data.decode("utf-8")
    if media_type == MEDIA_JSON:
        json.loads(text)
        domain.check_json_bytes(data)


class BlobValue(Model):
    """Canonical JSON or UTF-8 text, with the digest its submitter computed.

    Decoding verifies the digest, the byte length and that the bytes are what
    the media type says (UTF-8; JSON parses). Producers build values with
    ``of_json``/``of_text``, which write canonical JSON.
    """

    digest: Digest
    media_type: MediaType
    data: bytes = Field(max_length=MAX_INLINE_BLOB_BYTES)

    @model_validator(mode="after")
    def _verify(self) -> BlobValue:
        verify_value(self.digest, self.media_type, self.data)
        return self

    @classmethod
    def of_json(cls, value: Any) -> BlobValue:
        """Canonical JSON of ``value``. Raises ``domain.OutsideDomain`` (a ValueError naming the path)
        when the value is outside the protocol's value domain, TypeError/ValueError when it is not
        JSON at all. Built here, so not checked again; the receiver checks whatever it decodes."""
        try:
            data = canonical.dumps_bytes(value)
        except (TypeError, ValueError):
            domain.check(value)  # the path and the reason, where the domain says why
            raise
        domain.check_json_bytes(data)
        return cls.of_bytes(data, MEDIA_JSON)

    @classmethod
    def of_client_json(cls, field: str, value: Any) -> BlobValue:
        """A client's value (payload member ``field``) as a run keeps it. Outside the protocol's value
        domain: CommandError ``invalidRequest`` naming its path (``answer.items[2]``), nothing kept."""
        try:
            return cls.of_json(value)
        except domain.OutsideDomain as exc:
            raise CommandError("invalidRequest", f"{field}{exc.path[1:]}: {exc.reason}") from None

    @classmethod
    def of_text(cls, text: str) -> BlobValue:
        """Text for people: a lone surrogate (not Unicode text) is stored as U+FFFD."""
        return cls.of_bytes(domain.text(text).encode("utf-8"), MEDIA_TEXT)

    @classmethod
    def of_bytes(cls, data: bytes, media_type: str) -> BlobValue:
        """Bytes its producer vouches for (canonical JSON or UTF-8 text): digest computed, not re-checked."""
        if len(data) > MAX_INLINE_BLOB_BYTES:
            raise ValueError(f"the value is {len(data)} bytes; at most {MAX_INLINE_BLOB_BYTES} fit inline")
        return cls.model_construct(digest=hashlib.sha256(data).digest(), media_type=media_type, data=data)


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


class Command(Frame):
    """A writer command that changes state; ``client_receipt`` or ``worker_message`` makes a repeat
    answer the stored outcome."""

    actor: Actor
    client_receipt: ClientReceiptKey | None = None
    worker_message: WorkerMessageKey | None = None

    @model_validator(mode="after")
    def _one_dedup_key(self) -> Command:
        if self.client_receipt is not None and self.worker_message is not None:
            raise ValueError("a command has at most one receipt key")
        return self


class ReadCommand(Frame):
    """A writer command that only reads."""

    actor: Actor

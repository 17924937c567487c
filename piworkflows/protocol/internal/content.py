"""Projects and content-addressed values (writer/commands/content.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field, PrivateAttr, model_validator

from piworkflows.protocol.internal.base import (
    MAX_BLOB_READ_BYTES,
    MAX_INLINE_BLOB_BYTES,
    BlobValue,
    ClientReceiptKey,
    Command,
    Digest,
    Frame,
    Model,
    ReadCommand,
)
from piworkflows.protocol.internal.values import MediaType


class BlobPart(Model):
    """One part of a value larger than one frame: ``data`` at ``offset`` of the whole value's
    ``byte_length`` bytes, with the whole value's digest (computed once by the uploader). Nothing
    of the whole is checked here; the writer verifies it when its last byte arrives
    (``writer/uploads.py``). An outbox worker sends its parts in ``upload`` frames."""

    digest: Digest
    media_type: MediaType
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


class ProjectEnsure(Command):
    kind: ClassVar[str] = "project.ensure"
    canonical_path: str = Field(min_length=1, max_length=4096, pattern=r"^/")


class BlobPut(Command):
    kind: ClassVar[str] = "blob.put"
    blob: BlobValue


class BlobPutPartFrame(Frame):
    """One part of an upload, as an outbox worker sends it (a command's stream); the supervisor
    forwards it under the worker's actor (a part that is the whole value as a blob.put)."""

    kind: ClassVar[str] = "blob.put_part"
    part: BlobPart


class BlobPutPart(Command, BlobPutPartFrame):
    """One part of an upload. The writer holds the parts in memory and, when the last byte arrives,
    verifies the whole (digest, length, media type) while it decodes the command, outside the
    transaction, then stores it as blob.put does (``writer/uploads.py``)."""

    # What the writer's decoding made of the part (writer/uploads.Received); never on the wire.
    _received: Any = PrivateAttr(default=None)


class BlobRead(ReadCommand):
    kind: ClassVar[str] = "blob.read"
    digest: Digest
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=MAX_BLOB_READ_BYTES, ge=1, le=MAX_BLOB_READ_BYTES)


class ReceiptFind(ReadCommand):
    """The stored answer of a client request, if any (so a retry skips re-resolving)."""

    kind: ClassVar[str] = "receipt.find"
    key: ClientReceiptKey

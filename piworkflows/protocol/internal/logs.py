"""A run's steps, its captured Pi conversation and the values linked to it (writer/commands/logs.py)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import MAX_BLOB_READ_BYTES, Digest, Id, ReadCommand
from piworkflows.protocol.internal.values import MediaType


class RunLogs(ReadCommand):
    """A run's steps in order (of one node, if named) after step ``after``: outcome, times, the
    output and error (bounded inline) and a shell step's stream references (run.logs)."""

    kind: ClassVar[str] = "run.logs"
    run_id: Id
    node_path: str | None = Field(default=None, min_length=1, max_length=1024)
    after: int | None = Field(default=None, ge=0)
    limit: int = Field(default=64, ge=1, le=256)


class RunTranscript(ReadCommand):
    """A run's settled Pi session entries in order (of one node's agent attempts, if named) after
    run_seq ``after``: each entry's line inline up to 64 KiB, else its size and digest (run.transcript)."""

    kind: ClassVar[str] = "run.transcript"
    run_id: Id
    node_path: str | None = Field(default=None, min_length=1, max_length=1024)
    after: int | None = Field(default=None, ge=0)
    limit: int = Field(default=64, ge=1, le=256)


class RunContentRead(ReadCommand):
    """A bounded part of a value linked to the run in ``run_view_content`` (or of a settled Pi entry
    of the run): the run id, the digest and the media type must all match. The reader verifies the
    whole digest."""

    kind: ClassVar[str] = "run.content"
    run_id: Id
    digest: Digest
    media_type: MediaType
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=MAX_BLOB_READ_BYTES, ge=1, le=MAX_BLOB_READ_BYTES)


class ViewContent(ReadCommand):
    """``view.content``: a verified chunk of the content a run view's reference names by its path
    (writer/views/content.py)."""

    kind: ClassVar[str] = "view.content"
    run_id: Id
    path: str = Field(min_length=1, max_length=128)
    offset: int = Field(default=0, ge=0)

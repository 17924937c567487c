"""Uploads in progress: values larger than one frame, arriving in parts (``blob.put_part``).

::

    uploader ── blob.put_part {digest, media type, byte length, offset, data} ──> writer
    decode, outside the transaction (GroupExecutor): the part joins its upload in memory; the
        part that completes it has the whole verified here (SHA-256, length, UTF-8, JSON)
    the command, in the transaction: the digest stored already -> adopted, complete;
        the whole verified -> stored as blob.put stores it, complete; else {complete: false}
    unavailable (uploadsFull, a group that did not commit, a writer restart) -> the uploader
        sends every part again (a repeated part changes nothing)

Nothing durable is half-written: the parts live only in this memory, at most
``blob_upload_max_bytes`` together; an upload no part reached for
``blob_upload_idle_ms`` is forgotten. A completed upload stays until its
command stored it, so a part decoded again (a group cut by its time bound, a
group that did not commit) finds the verified value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import BlobValue, verify_value
from piworkflows.protocol.internal.content import BlobPart

Key = tuple[bytes, str, int]  # digest, media type, byte length: one upload


@dataclass(frozen=True)
class Received:
    """What one part did: the whole value, verified (the upload is complete), or the bytes received
    so far, or why the part was refused. ``forget`` drops the upload once the value is stored."""

    forget: Callable[[], None]
    value: BlobValue | None = None
    received_bytes: int = 0
    refusal: CommandError | None = None


@dataclass
class _Upload:
    byte_length: int
    touched_ms: int
    data: bytearray
    spans: list[tuple[int, int]] = field(default_factory=list)  # received [start, end), merged, in order
    value: BlobValue | None = None

    def add(self, offset: int, data: bytes) -> int:
        """Copy the part in; the bytes received so far."""
        end = offset + len(data)
        self.data[offset:end] = data
        merged: list[tuple[int, int]] = []
        for start, stop in sorted([*self.spans, (offset, end)]):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        self.spans = merged
        return sum(stop - start for start, stop in merged)


class Uploads:
    """The writer's uploads in progress, bounded in total bytes."""

    def __init__(self, max_bytes: int, idle_ms: int) -> None:
        self.max_bytes = max_bytes
        self.idle_ms = idle_ms
        self._uploads: dict[Key, _Upload] = {}

    @property
    def held_bytes(self) -> int:
        return sum(upload.byte_length for upload in self._uploads.values())

    def receive(self, part: BlobPart, now_ms: int) -> Received:
        key: Key = (part.digest, part.media_type, part.byte_length)
        self._forget_idle(now_ms)

        def forget() -> None:
            self._uploads.pop(key, None)

        upload = self._uploads.get(key)
        if upload is None:
            if part.byte_length > self.max_bytes:
                refusal = CommandError(
                    "uploadTooLarge",
                    f"the value is {part.byte_length} bytes; the writer holds "
                    f"at most {self.max_bytes} bytes of uploads",
                )
                return Received(forget, refusal=refusal)
            if self.held_bytes + part.byte_length > self.max_bytes:
                refusal = CommandError("uploadsFull", "other uploads fill the writer's memory; try again later")
                return Received(forget, refusal=refusal)
            upload = self._uploads[key] = _Upload(part.byte_length, now_ms, bytearray(part.byte_length))
        upload.touched_ms = now_ms
        if upload.value is not None:
            return Received(forget, value=upload.value, received_bytes=part.byte_length)
        received = upload.add(part.offset, part.data)
        if received < part.byte_length:
            return Received(forget, received_bytes=received)
        data = bytes(upload.data)
        upload.data = bytearray()
        try:
            verify_value(part.digest, part.media_type, data)
        except ValueError:
            forget()
            refusal = CommandError(
                "blobMismatch", "the uploaded bytes do not match their digest or media type", digest=part.digest.hex()
            )
            return Received(forget, refusal=refusal)
        upload.value = BlobValue.model_construct(digest=part.digest, media_type=part.media_type, data=data)
        return Received(forget, value=upload.value, received_bytes=received)

    def _forget_idle(self, now_ms: int) -> None:
        for key in [key for key, upload in self._uploads.items() if now_ms - upload.touched_ms >= self.idle_ms]:
            del self._uploads[key]

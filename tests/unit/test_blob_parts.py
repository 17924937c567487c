"""``blob.put_part``: values larger than one frame, uploaded in parts and stored whole, verified.

Everything runs through a real ``GroupExecutor`` on a FakeClock against a real SQLite file: parts
out of order and repeated, a wrong digest or media type refused when the last byte arrives, the
writer's memory bound (``unavailable``, the uploader tries again), a value stored already adopted at
once, an upload the writer forgot (a restart, an idle upload) started again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from piworkflows.clock import FakeClock
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import MAX_INLINE_BLOB_BYTES
from piworkflows.protocol.internal.content import BlobPart
from piworkflows.settings import Settings
from piworkflows.states import MEDIA_JSON, MEDIA_TEXT
from piworkflows.writer.db import GroupExecutor, open_database
from tests.support import OUTBOX, run_group, submitted

pytestmark = pytest.mark.timeout(60)

TEXT = ("line \u00e9 \u2713 \U0001f600 " * 70_000).encode()  # about 1.2 MB: two parts
BIG = ("x" * 100 + "\n").encode() * 25_000  # about 2.5 MB: three parts


def parts_of(data: bytes, media_type: str) -> list[BlobPart]:
    return list(BlobPart.parts_of(data, media_type))


def put(part: BlobPart) -> Any:
    return submitted("blob.put_part", {"actor": OUTBOX, "part": part.model_dump()})


def upload(executor: GroupExecutor, parts: list[BlobPart]) -> list[Any]:
    """Each part in a group of its own, as an uploader sends them; the replies."""
    return [run_group(executor, put(part))[0] for part in parts]


def stored(executor: GroupExecutor, digest: bytes) -> tuple[str, bytes] | None:
    row = executor.conn.execute("SELECT media_type, bytes FROM blobs WHERE digest = ?", (digest,)).fetchone()
    return None if row is None else (row[0], bytes(row[1]))


@pytest.fixture
def small_executor(paths: StatePaths, clock: FakeClock) -> Iterator[GroupExecutor]:
    """A writer that holds at most 3 MB of uploads and forgets one after 1 s without a part."""
    settings = Settings(blob_upload_max_bytes=3_000_000, blob_upload_idle_ms=1000)
    conn = open_database(paths, settings, clock)
    yield GroupExecutor(conn, settings, clock)
    conn.close()


def test_parts_out_of_order_and_repeated_store_the_value_once_complete(executor):
    parts = parts_of(BIG, MEDIA_TEXT)
    assert len(parts) == 3 and all(len(part.data) <= MAX_INLINE_BLOB_BYTES for part in parts)
    last, first, middle = parts[2], parts[0], parts[1]
    replies = upload(executor, [last, first, first, middle])
    assert [r.outcome for r in replies] == ["accepted"] * 4
    assert [r.receipt["complete"] for r in replies] == [False, False, False, True]
    received = len(last.data) + len(first.data)
    assert [r.receipt.get("receivedBytes") for r in replies[:3]] == [len(last.data), received, received]
    assert replies[3].receipt == {
        "digest": hashlib.sha256(BIG).hexdigest(),
        "byteLength": len(BIG),
        "complete": True,
        "created": True,
    }
    assert stored(executor, first.digest) == (MEDIA_TEXT, BIG)
    # a part repeated after the value is stored is adopted, nothing stored twice
    (again,) = upload(executor, [middle])
    assert again.outcome == "accepted" and again.receipt["complete"] and not again.receipt["created"]
    assert executor.uploads.held_bytes == 0


def test_parts_in_one_group_complete_the_value(executor):
    parts = parts_of(TEXT, MEDIA_TEXT)
    replies = run_group(executor, *[put(part) for part in reversed(parts)])
    assert [(r.outcome, r.receipt["complete"]) for r in replies] == [("accepted", False), ("accepted", True)]
    assert replies[1].receipt["created"]
    assert stored(executor, parts[0].digest) == (MEDIA_TEXT, TEXT)


def test_a_value_stored_already_is_adopted_at_its_first_part(executor):
    parts = parts_of(BIG, MEDIA_TEXT)
    upload(executor, parts)
    (adopted,) = upload(executor, [parts[1]])  # another uploader of the same stream
    assert adopted.receipt == {
        "digest": parts[1].digest.hex(),
        "byteLength": len(BIG),
        "complete": True,
        "created": False,
    }
    assert executor.uploads.held_bytes == 0  # nothing held for it


@pytest.mark.parametrize(
    ("case", "media_type", "data", "claimed"),
    [
        ("wrong digest", MEDIA_TEXT, BIG, hashlib.sha256(b"something else").digest()),
        ("not UTF-8", MEDIA_TEXT, b"\xff" * 1_000_000, None),
        ("not JSON", MEDIA_JSON, b"{" * 1_000_000, None),
    ],
)
def test_a_whole_that_does_not_verify_is_refused_at_its_last_part_and_nothing_is_stored(
    executor, case: str, media_type: str, data: bytes, claimed: bytes | None
):
    parts = parts_of(data, media_type)
    if claimed is not None:
        parts = [part.model_copy(update={"digest": claimed}) for part in parts]
    *first, last = upload(executor, parts)
    assert all(r.outcome == "accepted" and not r.receipt["complete"] for r in first), case
    assert (last.outcome, last.receipt["code"]) == ("rejected", "blobMismatch"), case
    assert stored(executor, parts[0].digest) is None
    assert executor.uploads.held_bytes == 0  # the upload is dropped, its memory free


def test_a_stored_value_of_another_media_type_is_a_mismatch(executor):
    value = json.dumps(["x" * 1_000_000]).encode()
    upload(executor, parts_of(value, MEDIA_JSON))
    (refused,) = upload(executor, parts_of(value, MEDIA_TEXT)[:1])
    assert (refused.outcome, refused.receipt["code"]) == ("rejected", "blobMismatch")


def test_the_memory_bound_answers_unavailable_and_the_upload_goes_through_later(small_executor):
    held, waiting = parts_of(BIG, MEDIA_TEXT), parts_of(TEXT, MEDIA_TEXT)
    upload(small_executor, held[:1])  # 2.5 MB of the 3 MB bound held
    (full,) = upload(small_executor, waiting[:1])
    assert (full.outcome, full.receipt["code"]) == ("unavailable", "uploadsFull")
    assert upload(small_executor, held[1:])[-1].receipt["complete"]  # stored: its memory is free again
    assert upload(small_executor, waiting)[-1].receipt["complete"]  # tried again from the start
    assert stored(small_executor, waiting[0].digest) == (MEDIA_TEXT, TEXT)


def test_a_value_larger_than_the_bound_is_refused_for_good(small_executor):
    huge = b"y" * 3_000_001
    (refused,) = upload(small_executor, parts_of(huge, MEDIA_TEXT)[:1])
    assert (refused.outcome, refused.receipt["code"]) == ("rejected", "uploadTooLarge")


def test_an_upload_the_writer_forgot_is_started_again(paths, small_executor, clock):
    parts = parts_of(BIG, MEDIA_TEXT)
    upload(small_executor, parts[:2])
    restarted = GroupExecutor(small_executor.conn, small_executor.settings, clock)  # a new writer: memory lost
    (last,) = upload(restarted, parts[2:])
    assert (last.receipt["complete"], last.receipt["receivedBytes"]) == (False, len(parts[2].data))
    assert upload(restarted, parts)[-1].receipt["complete"]  # the uploader sends every part again
    assert stored(restarted, parts[0].digest) == (MEDIA_TEXT, BIG)

    other = parts_of(TEXT, MEDIA_TEXT)
    upload(restarted, other[:1])
    clock.advance(1000)  # no part for blob_upload_idle_ms: forgotten
    (late,) = upload(restarted, other[1:])
    assert not late.receipt["complete"] and restarted.uploads.held_bytes == len(TEXT)


def test_a_part_must_lie_within_its_value():
    with pytest.raises(ValueError, match="beyond its value"):
        BlobPart(digest=b"\0" * 32, media_type=MEDIA_TEXT, byte_length=3, offset=2, data=b"ab")


def test_a_part_that_is_the_whole_value_converts_to_a_plain_value():
    (only,) = parts_of(b"small", MEDIA_TEXT)
    whole = only.whole()
    assert whole is not None and (whole.data, whole.digest) == (b"small", hashlib.sha256(b"small").digest())
    assert parts_of(BIG, MEDIA_TEXT)[0].whole() is None

"""Content references: how a run view carries a stored value too big to inline, and
``view.content``, which reads it back in verified chunks.

::

    a value of at most ``limit`` bytes     the value itself (a JSON object shaped like a reference,
                                           {"$artifact": …} or {"$escaped": …}, wrapped in {"$escaped": …})
    a bigger one                           {"$artifact": {path: "artifacts/sha256/<hex>.json|txt",
                                           mediaType: "application/json" | "text/plain", bytes,
                                           sha256, opaque: true, runId}}  (no byte of it read)
    view.content {runId, path, offset}     pi-workflows.content-chunk.v1 {schema, runId, path,
                                           mediaType, bytes, sha256, offset, nextOffset, complete,
                                           data: base64 of at most CHUNK_BYTES}

A read needs all three identities: the run, the digest and the media type. The run owns the
content when one of its own rows names that digest (its input, output, error or definition; a node
attempt's output, error or receipt; one of its events, updates, settings, follow-ups, settled Pi
entries or replay checkpoints) or when ``run_view_content`` links it (values the server generated
for the run, effect results), and the blob has that media type; else ``contentNotFound``. Every
one of those rows is written before the view that names its digest can be read, and a read never
writes. A pruned run owns nothing.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from piworkflows import canonical
from piworkflows.errors import CommandError
from piworkflows.states import MEDIA_JSON, MEDIA_TEXT

REFERENCE_BYTES = 256  # a history item's field above this is a reference: an item stays under 1 KiB
STATE_VALUE_BYTES = 16 * 1024  # the run's input, final output, error, a node's output: inline up to this
CHUNK_BYTES = 192 * 1024
CONTENT_CHUNK_SCHEMA = "pi-workflows.content-chunk.v1"

WIRE_MEDIA = {MEDIA_JSON: "application/json", MEDIA_TEXT: "text/plain"}
_SUFFIX = {MEDIA_JSON: "json", MEDIA_TEXT: "txt"}
_PATH = re.compile(r"artifacts/sha256/([0-9a-f]{64})\.(json|txt)")

# (table, digest column, run column): every row that makes a digest the run's own, each digest
# column indexed (schema.sql, the blob references' indexes).
_OWNERS = (
    ("node_attempts", "output_digest", "run_id"),
    ("node_attempts", "error_digest", "run_id"),
    ("node_attempts", "receipt_digest", "run_id"),
    ("events", "payload_digest", "resource_id"),
    ("workflow_updates", "body_digest", "run_id"),
    ("workflow_settings", "value_digest", "run_id"),
    ("workflow_follow_ups", "prompt_digest", "run_id"),
    ("session_entries", "content_digest", "run_id"),
    ("workflow_messages", "content_digest", "run_id"),
    ("interactive_requests", "contract_digest", "run_id"),
    ("viewer_session_checkpoints", "state_digest", "run_id"),
)
_OWNED = " OR ".join(
    [
        "EXISTS (SELECT 1 FROM runs r WHERE r.run_id = :run AND :digest IN "
        "(r.input_digest, r.output_digest, r.error_digest, r.definition_digest))",
        "EXISTS (SELECT 1 FROM run_view_content l WHERE l.run_id = :run AND l.digest = :digest "
        "AND l.media_type = :media)",
        *(
            f"EXISTS (SELECT 1 FROM {table} WHERE {column} = :digest AND {run} = :run)"
            for table, column, run in _OWNERS
        ),
    ]
)


def path(digest: bytes, media_type: str) -> str:
    return f"artifacts/sha256/{digest.hex()}.{_SUFFIX[media_type]}"


def reference(run_id: str, digest: bytes, media_type: str, length: int) -> dict[str, Any]:
    return {
        "$artifact": {
            "path": path(digest, media_type),
            "mediaType": WIRE_MEDIA[media_type],
            "bytes": length,
            "sha256": digest.hex(),
            "opaque": True,
            "runId": run_id,
        }
    }


def escape(value: Any) -> Any:
    """A user value as a view carries it: every object shaped like a reference (its one key
    ``$artifact`` or ``$escaped``) wrapped in ``{"$escaped": …}``, so no value reads as one."""
    if isinstance(value, list):
        return [escape(item) for item in value]
    if not isinstance(value, dict):
        return value
    escaped = {key: escape(item) for key, item in value.items()}
    return {"$escaped": escaped} if len(value) == 1 and next(iter(value)) in ("$artifact", "$escaped") else escaped


class RunValues:
    """Reads one run's stored values for a view: each inline up to its bound, else a reference."""

    def __init__(self, conn: sqlite3.Connection, run_id: str) -> None:
        self.conn, self.run_id = conn, run_id
        self.read: dict[tuple[bytes, int], Any] = {}  # a value named twice in a view is read once

    def value(self, digest: bytes | None, limit: int) -> Any:
        """The value of ``digest`` through its declared media type (JSON or text), or its reference
        when it has more than ``limit`` bytes; None for no value."""
        if digest is None:
            return None
        if (digest, limit) not in self.read:
            self.read[digest, limit] = self._value(digest, limit)
        return self.read[digest, limit]

    def _value(self, digest: bytes, limit: int) -> Any:
        row = self.conn.execute(
            "SELECT media_type, byte_length, CASE WHEN byte_length <= ? THEN bytes END FROM blobs WHERE digest = ?",
            (limit, digest),
        ).fetchone()
        if row is None or row[0] not in _SUFFIX:
            raise CommandError("presentationFailed", "a stored value is missing or has an unknown media type")
        media_type, length, data = row
        if data is None:
            return reference(self.run_id, digest, media_type, length)
        return escape(canonical.loads(data)) if media_type == MEDIA_JSON else bytes(data).decode("utf-8")


def parse_path(run_id: str, content_path: str) -> tuple[bytes, str]:
    """The digest and stored media type a reference's path names."""
    found = _PATH.fullmatch(content_path)
    if found is None:
        raise CommandError(
            "contentNotFound",
            "a content path is artifacts/sha256/<64 hex digits>.json or .txt, as a reference gives it",
            runId=run_id,
            path=content_path,
        )
    return bytes.fromhex(found.group(1)), MEDIA_JSON if found.group(2) == "json" else MEDIA_TEXT


def owned_blob(conn: sqlite3.Connection, run_id: str, digest: bytes, media_type: str) -> tuple[int, int] | None:
    """The rowid and length of the blob ``digest`` with ``media_type`` when the run owns it, else None."""
    row = conn.execute(
        f"SELECT b.rowid, b.byte_length FROM blobs b WHERE b.digest = :digest AND b.media_type = :media AND ({_OWNED})",
        {"run": run_id, "digest": digest, "media": media_type},
    ).fetchone()
    return None if row is None else (row[0], row[1])


def read(conn: sqlite3.Connection, rowid: int, offset: int, size: int) -> bytes:
    """``size`` bytes of a blob from ``offset``, through SQLite's incremental blob I/O."""
    if size <= 0:
        return b""
    with conn.blobopen("blobs", "bytes", rowid, readonly=True) as blob:
        blob.seek(offset)
        return blob.read(size)


def chunk(conn: sqlite3.Connection, run_id: str, content_path: str, offset: int) -> dict[str, Any]:
    """``view.content``: at most CHUNK_BYTES of the run's content at ``content_path`` from
    ``offset`` (0 up to its length)."""
    digest, media_type = parse_path(run_id, content_path)
    row = owned_blob(conn, run_id, digest, media_type)
    if row is None:
        raise CommandError("contentNotFound", "the run has no content at this path", runId=run_id, path=content_path)
    rowid, length = row
    if offset > length:
        raise CommandError(
            "validationFailed", f"offset {offset} is past the content's {length} bytes", path=content_path
        )
    end = min(length, offset + CHUNK_BYTES)
    return {
        "schema": CONTENT_CHUNK_SCHEMA,
        "runId": run_id,
        "path": content_path,
        "mediaType": WIRE_MEDIA[media_type],
        "bytes": length,
        "sha256": digest.hex(),
        "offset": offset,
        "nextOffset": end,
        "complete": end == length,
        "data": read(conn, rowid, offset, end - offset),
    }

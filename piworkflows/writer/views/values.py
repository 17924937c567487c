"""How a view shows a stored value: read through its declared media type, inline up to a bound,
else only its size and digest (``{"omitted": {byteLength, digest}}``)."""

from __future__ import annotations

import sqlite3
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.states import MEDIA_JSON, MEDIA_TEXT
from piworkflows.writer import records

INLINE_VALUE_BYTES = 64 * 1024


def omitted(length: int, digest: bytes) -> dict[str, Any]:
    return {"omitted": {"byteLength": length, "digest": "sha256:" + digest.hex()}}


def read_json(conn: sqlite3.Connection, digest: bytes, limit: int | None) -> Any:
    """A JSON value through its declared media type; above ``limit`` only its size."""
    row = conn.execute("SELECT media_type, byte_length FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None or row[0] != MEDIA_JSON:
        raise CommandError("presentationFailed", "a stored JSON value is missing or has another media type")
    length = row[1]
    if limit is not None and length > limit:
        return omitted(length, digest)
    return records.read_json(conn, digest)


def read_text(conn: sqlite3.Connection, digest: bytes, limit: int) -> str:
    """A stored text value through its declared media type, cut at ``limit`` bytes."""
    row = conn.execute("SELECT media_type, substr(bytes, 1, ?) FROM blobs WHERE digest = ?", (limit, digest)).fetchone()
    if row is None or row[0] != MEDIA_TEXT:
        raise CommandError("presentationFailed", "a stored text value is missing or has another media type")
    return bytes(row[1]).decode("utf-8", "replace")

"""A run's captured Pi conversation: its settled session entries, page by page, each with the agent
step (attempt and node) whose range holds it.

::

    run.transcript {run, node?, after?, limit}
      session_entries in run_seq order; with a node, only those in the ranges attempt_entries
      gives that node's attempts (first_seq..last_seq, one index range each)
      per entry: runSeq, piEntryId, role, settledAt, attemptId and nodePath (null outside every
      attempt's range), and ``entry``: its JSON line as Pi wrote it, inline up to 64 KiB, else
      {"omitted": {byteLength, digest}} (read in parts with run.logs content: a settled entry
      of the run is readable there)
      a page: at most ``limit`` entries and about PAGE_BYTES; ``cursor`` is the next ``after``

The run view's pending agent step shows the tail of its attempt's range with the same items
(writer/views/pending.py).
"""

from __future__ import annotations

import bisect
import sqlite3
from dataclasses import dataclass
from typing import Any

from piworkflows import canonical
from piworkflows.writer.views.values import INLINE_VALUE_BYTES, omitted, read_text

# A page stays well inside one message: entries are added while the page is smaller than this
# (the first always; one entry is at most its inline line, escaped).
PAGE_BYTES = 512 * 1024
_LAST_SEQ = 2**62

_ENTRIES = """
    SELECT e.run_seq, e.pi_entry_id, e.entry_role, e.settled_at, e.content_digest, b.byte_length
    FROM session_entries e JOIN blobs b ON b.digest = e.content_digest
    WHERE e.run_id = ? AND e.run_seq BETWEEN ? AND ? ORDER BY e.run_seq LIMIT ?"""

EntryRow = tuple[int, str, str, int, bytes, int]


@dataclass(frozen=True)
class AttemptRange:
    """The run_seq range of the entries an agent attempt's segments captured."""

    attempt_id: str
    node_path: str
    first: int
    last: int


def attempt_ranges(conn: sqlite3.Connection, run_id: str, node_path: str | None = None) -> list[AttemptRange]:
    """The ranges of the run's attempts (of one node's, if named) that captured entries, in order."""
    rows = conn.execute(
        "SELECT e.attempt_id, a.node_path, e.first_seq, e.last_seq FROM attempt_entries e "
        "JOIN node_attempts a ON a.attempt_id = e.attempt_id WHERE e.run_id = :run AND e.first_seq IS NOT NULL "
        "AND (:node IS NULL OR a.node_path = :node) ORDER BY e.first_seq",
        {"run": run_id, "node": node_path},
    ).fetchall()
    return [AttemptRange(*row) for row in rows]


def entry_rows(conn: sqlite3.Connection, run_id: str, first: int, last: int, limit: int) -> list[EntryRow]:
    """At most ``limit`` entries with run_seq in [first, last], in order (one primary-key range)."""
    return conn.execute(_ENTRIES, (run_id, first, last, limit)).fetchall()


def owner_of(ranges: list[AttemptRange], run_seq: int) -> AttemptRange | None:
    """The attempt whose range holds the entry (ranges in order, never overlapping)."""
    index = bisect.bisect_right([r.first for r in ranges], run_seq) - 1
    return ranges[index] if index >= 0 and ranges[index].last >= run_seq else None


def entry_item(
    conn: sqlite3.Connection, row: EntryRow, owner: AttemptRange | None, inline: bool = True
) -> dict[str, Any]:
    """One settled entry; its line inline when ``inline`` and at most INLINE_VALUE_BYTES, else only
    its size and digest."""
    run_seq, entry_id, role, settled_at, digest, length = row
    shown = inline and length <= INLINE_VALUE_BYTES
    return {
        "runSeq": run_seq,
        "piEntryId": entry_id,
        "role": role,
        "settledAt": settled_at,
        "attemptId": owner.attempt_id if owner else None,
        "nodePath": owner.node_path if owner else None,
        "entry": read_text(conn, digest, length) if shown else omitted(length, digest),
    }


def run_transcript(
    conn: sqlite3.Connection, run_id: str, node_path: str | None, after: int | None, limit: int
) -> dict[str, Any] | None:
    """One page of the run's settled entries (of NODE's attempts), or None when there is no such run."""
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        return None
    start = (after or 0) + 1
    ranges = attempt_ranges(conn, run_id, node_path)
    if node_path is None:
        rows = entry_rows(conn, run_id, start, _LAST_SEQ, limit + 1)
    else:
        rows = []
        for span in ranges:
            if span.last >= start and len(rows) <= limit:
                rows += entry_rows(conn, run_id, max(span.first, start), span.last, limit + 1 - len(rows))
    items: list[dict[str, Any]] = []
    size = 0
    for row in rows[:limit]:
        item = entry_item(conn, row, owner_of(ranges, row[0]))
        item_bytes = len(canonical.dumps_bytes(item))
        if items and size + item_bytes > PAGE_BYTES:
            break
        items.append(item)
        size += item_bytes
    more = len(items) < len(rows)
    return {"runId": run_id, "items": items, "cursor": items[-1]["runSeq"] if more else None}

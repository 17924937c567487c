"""Session capture: one agent.record batch (C8) written into the session tables.

::

    agent host ── AgentRecord {first_event_index, events, entries, links, sample, checkpoint}
        ──> session_events   run_seq continues the run's own sequence (contiguous)
            session_entries  one row per settled Pi entry new to the run (content: a blob)
            attempt_entries  the attempt's prompt, response, first and last entry
            session_segments.event_count += len(events)   (the batch's fence)
            viewer_session_checkpoints   one row at each multiple of 256 the batch crosses
            attempt_active_intervals     the sample (elapsed_ms only rises)

The batch is its own journal: no ``events`` row and no resource revision
(docs/storage.md, Write contract). The handler checks the claim and the
counter; everything here writes inside its savepoint.
"""

from __future__ import annotations

import sqlite3

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.agents import CHECKPOINT_EVERY, AgentRecord, AttemptLinks
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import records
from piworkflows.writer.agent_steps import Segment


def _next_seq(conn: sqlite3.Connection, table: str, run_id: str) -> int:
    (seq,) = conn.execute(f"SELECT coalesce(max(run_seq), 0) + 1 FROM {table} WHERE run_id = ?", (run_id,)).fetchone()
    return int(seq)


def write_events(conn: sqlite3.Connection, segment: Segment, cmd: AgentRecord, now: int) -> tuple[int, int]:
    """The batch's compact events, numbered on from the run's last; returns (first, last) run_seq
    (last < first when the batch has none)."""
    first = _next_seq(conn, "session_events", segment.run_id)
    conn.executemany(
        "INSERT INTO session_events (run_id, run_seq, segment_id, event_type, pi_event_id, event_role, event_status, "
        "started_at, ended_at, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                segment.run_id,
                first + index,
                segment.segment_id,
                event.event_type,
                event.pi_event_id,
                event.event_role,
                event.event_status,
                event.started_at,
                event.ended_at,
                now,
            )
            for index, event in enumerate(cmd.events)
        ],
    )
    conn.execute(
        "UPDATE session_segments SET event_count = event_count + ? WHERE segment_id = ?",
        (len(cmd.events), segment.segment_id),
    )
    return first, first + len(cmd.events) - 1


def write_entries(conn: sqlite3.Connection, segment: Segment, cmd: AgentRecord, now: int) -> list[int]:
    """Settled entries new to the run (an entry already stored, by its Pi id, is skipped); returns
    the run_seq of each written."""
    written = []
    seq = _next_seq(conn, "session_entries", segment.run_id)
    for entry in cmd.entries:
        known = conn.execute(
            "SELECT 1 FROM session_entries WHERE run_id = ? AND pi_entry_id = ?", (segment.run_id, entry.pi_entry_id)
        ).fetchone()
        if known is not None:
            continue
        records.put_blob(conn, entry.content, now)
        conn.execute(
            "INSERT INTO session_entries (run_id, run_seq, segment_id, pi_entry_id, entry_role, content_digest, "
            "settled_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (segment.run_id, seq, segment.segment_id, entry.pi_entry_id, entry.entry_role, entry.content.digest, now),
        )
        written.append(seq)
        seq += 1
    return written


def _entry_seq(conn: sqlite3.Connection, run_id: str, pi_entry_id: str | None) -> int | None:
    if pi_entry_id is None:
        return None
    row = conn.execute(
        "SELECT run_seq FROM session_entries WHERE run_id = ? AND pi_entry_id = ?", (run_id, pi_entry_id)
    ).fetchone()
    if row is None:
        raise CommandError("validationFailed", "a link names an entry not captured for the run", piEntryId=pi_entry_id)
    return int(row[0])


def link_entries(conn: sqlite3.Connection, segment: Segment, links: AttemptLinks | None, written: list[int]) -> None:
    """The attempt's prompt and response entries, and the first and last entry captured for it."""
    prompt = _entry_seq(conn, segment.run_id, links.prompt_entry_id) if links else None
    response = _entry_seq(conn, segment.run_id, links.response_entry_id) if links else None
    if prompt is None and response is None and not written:
        return
    first, last = (min(written), max(written)) if written else (None, None)
    conn.execute(
        "INSERT INTO attempt_entries (attempt_id, run_id, prompt_seq, response_seq, first_seq, last_seq) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (attempt_id) DO UPDATE SET "
        "prompt_seq = coalesce(excluded.prompt_seq, prompt_seq), "
        "response_seq = coalesce(excluded.response_seq, response_seq), "
        "first_seq = coalesce(first_seq, excluded.first_seq), last_seq = coalesce(excluded.last_seq, last_seq)",
        (segment.attempt_id, segment.run_id, prompt, response, first, last),
    )


def write_checkpoints(
    conn: sqlite3.Connection, segment: Segment, cmd: AgentRecord, first: int, last: int, now: int
) -> None:
    """A viewer checkpoint at each multiple of CHECKPOINT_EVERY in [first, last]: the host's state
    (open turn, active message, open tools), else the open turn the database knows."""
    crossed = range(-(-first // CHECKPOINT_EVERY) * CHECKPOINT_EVERY, last + 1, CHECKPOINT_EVERY)
    if not crossed:
        return
    state = cmd.checkpoint
    if state is None:
        turn = conn.execute(
            "SELECT workflow_turn_id, workflow_message_id FROM workflow_turns WHERE run_id = ? AND turn_state = 'open'",
            (segment.run_id,),
        ).fetchone()
        state = BlobValue.of_json(
            {"openTurn": turn[0] if turn else None, "activeMessage": turn[1] if turn else None, "openTools": []}
        )
    records.put_blob(conn, state, now)
    conn.executemany(
        "INSERT INTO viewer_session_checkpoints (run_id, run_seq, state_digest, created_at) VALUES (?, ?, ?, ?)",
        [(segment.run_id, seq, state.digest, now) for seq in crossed],
    )

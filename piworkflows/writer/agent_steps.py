"""The rows of an agent step (docs/agents.md), changed from the transactions of several commands.

::

    node.request_agent (C2) ──> interactive_requests pending, its initial step message
    agent.* (C3..C12)       ──> session_segments, workflow_turns, attempt intervals (active_time),
                                step messages sent or cancelled, reminder and resumed steps
    interaction.* (C10, C11)──> interactive_submissions, the request's outcome
    run.pause, run.cancel, a run's end (control.py, nodes.end_run) ──> stop_for_pause, stop_for_end

Each function is one domain change inside the caller's savepoint; the checks
that refuse a command stay in its handler (writer/commands/agents/); active time is
writer/active_time.py, a capture batch writer/session_capture.py. A step
message and a segment are resources of their own: a change to one from another
resource's command advances its revision and writes its event here, as
``records.abandon_effect`` does for an effect. The request's ``revision``
column is its compare-and-set: each outcome (acceptance, timeout, cancellation,
missingSubmission) needs the request open at the revision its command read,
so exactly one wins and the others meet ``winnerDecided``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.agents import AgentContract, message_id_of
from piworkflows.protocol.internal.base import Actor, BlobValue, server_owner_id
from piworkflows.writer import active_time, records
from piworkflows.writer.views import touched

OPEN_REQUEST = ("pending", "validating")
REQUEST_COLUMNS = "request_id, run_id, attempt_id, target_session_id, contract_digest, request_status, revision"
SEGMENT_COLUMNS = (
    "segment_id, run_id, attempt_id, session_id, segment_status, event_count, pi_session_file, pi_session_id"
)


@dataclass(frozen=True)
class Request:
    request_id: str
    run_id: str
    attempt_id: str
    target_session_id: str
    contract_digest: bytes
    status: str
    revision: int

    @property
    def open(self) -> bool:
        return self.status in OPEN_REQUEST


@dataclass(frozen=True)
class Segment:
    segment_id: str
    run_id: str
    attempt_id: str
    session_id: str
    status: str
    event_count: int
    pi_session_file: str | None
    pi_session_id: str | None


def get_request(conn: sqlite3.Connection, request_id: str) -> Request | None:
    row = conn.execute(f"SELECT {REQUEST_COLUMNS} FROM interactive_requests WHERE request_id = ?", (request_id,))
    found = row.fetchone()
    return Request(*found) if found else None


def contract_of(conn: sqlite3.Connection, request: Request) -> AgentContract:
    return AgentContract.model_validate(records.read_json(conn, request.contract_digest))


def get_segment(conn: sqlite3.Connection, segment_id: str) -> Segment | None:
    row = conn.execute(f"SELECT {SEGMENT_COLUMNS} FROM session_segments WHERE segment_id = ?", (segment_id,))
    found = row.fetchone()
    return Segment(*found) if found else None


def advance(
    conn: sqlite3.Connection,
    resource_id: str,
    event_type: str,
    actor: Actor,
    now: int,
    payload: bytes | None = None,
    attempt_id: str | None = None,
) -> int:
    """Another resource changed in this command's transaction: its revision and its event (about
    ``attempt_id``, if a node attempt)."""
    resource = records.get_resource(conn, resource_id)
    assert resource is not None, resource_id
    revision = records.increment_revision(conn, resource_id, resource.revision, now)
    records.write_event(conn, resource_id, revision, event_type, actor, now, None, payload, attempt_id)
    return revision


def set_request(
    conn: sqlite3.Connection, request: Request, status: str, now: int, accepted_submission_id: str | None = None
) -> None:
    """The request's next status, at the revision the command read (else another outcome won)."""
    updated = conn.execute(
        "UPDATE interactive_requests SET request_status = ?, accepted_submission_id = ?, revision = revision + 1, "
        "updated_at = ? WHERE request_id = ? AND revision = ?",
        (status, accepted_submission_id, now, request.request_id, request.revision),
    ).rowcount
    if updated != 1:
        raise CommandError("winnerDecided", "the request changed since it was read", requestId=request.request_id)


# --- step messages --------------------------------------------------------------


def add_step(
    conn: sqlite3.Connection,
    run_id: str,
    request_id: str,
    session_id: str,
    key: str,
    content: BlobValue,
    source: tuple[str, str],
    actor: Actor,
    now: int,
) -> str:
    """A pending ``step`` message (its own resource), next in its session's order. ``source``:
    (source_kind, source_id). The content blob is the caller's to put."""
    message_id = message_id_of(key)
    (order,) = conn.execute(
        "SELECT coalesce(max(session_order), 0) + 1 FROM workflow_messages WHERE target_session_id = ?", (session_id,)
    ).fetchone()
    records.create_resource(conn, message_id, "workflow_message", now)
    records.write_event(conn, message_id, 1, "workflow_message.pending", actor, now, payload_digest=content.digest)
    conn.execute(
        "INSERT INTO workflow_messages (workflow_message_id, run_id, request_id, target_session_id, message_kind, "
        "source_kind, source_id, idempotency_key, content_digest, session_order, message_state, created_at, "
        "updated_at) VALUES (?, ?, ?, ?, 'step', ?, ?, ?, ?, ?, 'pending', ?, ?)",
        (message_id, run_id, request_id, session_id, *source, key, content.digest, order, now, now),
    )
    return message_id


def step_message(conn: sqlite3.Connection, message_id: str) -> tuple[str | None, str, str, str | None] | None:
    """(request_id, target_session_id, message_state, pi_entry_id) of a step message."""
    row = conn.execute(
        "SELECT request_id, target_session_id, message_state, pi_entry_id FROM workflow_messages "
        "WHERE workflow_message_id = ? AND message_kind = 'step'",
        (message_id,),
    ).fetchone()
    return (row[0], row[1], row[2], row[3]) if row else None


def mark_sent(conn: sqlite3.Connection, message_id: str, pi_entry_id: str, actor: Actor, now: int) -> None:
    """Active-branch evidence: a pending or cancelled step is ``sent`` as this entry (its
    recovery_stop, if any, stays)."""
    conn.execute(
        "UPDATE workflow_messages SET message_state = 'sent', pi_entry_id = ?, updated_at = ? "
        "WHERE workflow_message_id = ? AND message_state IN ('pending', 'cancelled')",
        (pi_entry_id, now, message_id),
    )
    advance(conn, message_id, "workflow_message.sent", actor, now)


def cancel_steps(
    conn: sqlite3.Connection, actor: Actor, now: int, recovery_stop: str | None, column: str, value: str
) -> None:
    """Every pending step message of a request or a run (``column``: request_id or run_id) is cancelled."""
    assert column in ("request_id", "run_id")
    rows = conn.execute(
        f"SELECT workflow_message_id FROM workflow_messages WHERE {column} = ? AND message_kind = 'step' "
        "AND message_state = 'pending'",
        (value,),
    ).fetchall()
    for (message_id,) in rows:
        conn.execute(
            "UPDATE workflow_messages SET message_state = 'cancelled', recovery_stop = ?, updated_at = ? "
            "WHERE workflow_message_id = ?",
            (recovery_stop, now, message_id),
        )
        advance(conn, message_id, "workflow_message.cancelled", actor, now)


def pending_steps(conn: sqlite3.Connection, request_id: str) -> list[dict[str, str]]:
    """The committed pending step messages of a request, in session order: what a host sends now."""
    rows = conn.execute(
        "SELECT workflow_message_id, content_digest FROM workflow_messages WHERE request_id = ? "
        "AND message_kind = 'step' AND message_state = 'pending' ORDER BY session_order",
        (request_id,),
    ).fetchall()
    return [{"workflowMessageId": message_id, "text": records.read_text(conn, digest)} for message_id, digest in rows]


def step_ids(conn: sqlite3.Connection, request_id: str) -> list[str]:
    rows = conn.execute(
        "SELECT workflow_message_id FROM workflow_messages WHERE request_id = ? AND message_kind = 'step' "
        "ORDER BY session_order",
        (request_id,),
    )
    return [row[0] for row in rows]


def reminders(conn: sqlite3.Connection, request_id: str) -> int:
    (count,) = conn.execute(
        "SELECT count(*) FROM workflow_messages WHERE request_id = ? AND message_kind = 'step' "
        "AND source_kind = 'workflow_turn'",
        (request_id,),
    ).fetchone()
    return int(count)


def last_rejection(conn: sqlite3.Connection, request_id: str) -> str | None:
    """The error of the request's last submission a validator rejected (a timeout or cancel leaves none)."""
    row = conn.execute(
        "SELECT receipt_digest FROM interactive_submissions WHERE request_id = ? AND outcome = 'rejected' "
        "AND receipt_digest IS NOT NULL ORDER BY settled_at DESC, rowid DESC LIMIT 1",
        (request_id,),
    ).fetchone()
    if row is None:
        return None
    error = records.read_json(conn, row[0]).get("error")
    return error if isinstance(error, str) else None


# --- turns ------------------------------------------------------------------------


def lose_open_turns(conn: sqlite3.Connection, run_id: str, now: int) -> None:
    conn.execute(
        "UPDATE workflow_turns SET turn_state = 'lost', ended_at = ? WHERE run_id = ? AND turn_state = 'open'",
        (now, run_id),
    )


# --- segments -----------------------------------------------------------------------


def segment_owner(conn: sqlite3.Connection) -> str:
    """The owner id a live segment claim has: the current server epoch's."""
    row = conn.execute("SELECT server_epoch FROM workflow_host_state").fetchone()
    return server_owner_id(row[0] if row else 0)


# A recording segment whose claim is live: held by the current epoch's server and not expired.
LIVE_SEGMENT = (
    "EXISTS (SELECT 1 FROM leases l WHERE l.resource_id = s.segment_id AND l.owner_id = :owner AND l.expires_at > :now)"
)


def recording_segments(conn: sqlite3.Connection, run_id: str, now: int, live: bool | None = None) -> list[Segment]:
    """The run's recording segments: all, or only the live (True) or dead (False) ones."""
    condition = "" if live is None else (" AND " if live else " AND NOT ") + LIVE_SEGMENT
    columns = ", ".join("s." + column.strip() for column in SEGMENT_COLUMNS.split(","))
    rows = conn.execute(
        f"SELECT {columns} FROM session_segments s WHERE s.run_id = :run AND s.segment_status = 'recording'"
        + condition,
        {"run": run_id, "owner": segment_owner(conn), "now": now},
    ).fetchall()
    return [Segment(*row) for row in rows]


def close_segment(
    conn: sqlite3.Connection, segment: Segment, cause: str, now: int, at: int | None, elapsed_ms: int | None = None
) -> None:
    """Domain rows only: the run's open turns are ``lost``, the attempt's open interval ends (at
    ``at``, None: its last observation), the segment is ``closed``."""
    lose_open_turns(conn, segment.run_id, now)
    active_time.close_intervals(conn, "attempt_id", segment.attempt_id, cause, at, elapsed_ms)
    conn.execute(
        "UPDATE session_segments SET segment_status = 'closed', ended_at = ? WHERE segment_id = ?",
        (now, segment.segment_id),
    )


def close_segment_from(
    conn: sqlite3.Connection, segment: Segment, cause: str, actor: Actor, now: int, at: int | None
) -> None:
    """close_segment from another resource's command: the segment's lease released, its revision
    advanced and its event written."""
    close_segment(conn, segment, cause, now, at)
    lease = records.get_lease(conn, segment.segment_id)
    if lease is not None and lease.owner_id is not None:
        records.release_lease(conn, segment.segment_id, lease.lease_generation)
    advance(conn, segment.segment_id, "agent.closed", actor, now)


# --- outcomes ---------------------------------------------------------------------


def requeue_run(conn: sqlite3.Connection, run_id: str, now: int) -> None:
    """The request settled: run and queue ``queued``, a runner continues from the attempt's result."""
    conn.execute(
        "UPDATE runs SET status = 'queued', park_reason = NULL, updated_at = ? WHERE run_id = ?", (now, run_id)
    )
    conn.execute("UPDATE run_queue SET queue_status = 'queued', updated_at = ? WHERE run_id = ?", (now, run_id))
    touched.touch(conn, run_id)


def accept(
    conn: sqlite3.Connection,
    request: Request,
    submission_id: str,
    output: bytes,
    receipt: bytes,
    actor: Actor,
    now: int,
) -> None:
    """One accepted submission: the request and attempt complete with its output and receipt; the
    interval ends (settlement); pending steps are moot; the run continues."""
    conn.execute(
        "UPDATE interactive_submissions SET outcome = 'accepted', receipt_digest = ?, settled_at = ? "
        "WHERE submission_id = ?",
        (receipt, now, submission_id),
    )
    set_request(conn, request, "accepted", now, submission_id)
    conn.execute(
        "UPDATE node_attempts SET attempt_status = 'completed', outcome = 'ok', output_digest = ?, "
        "receipt_digest = ?, finished_at = ? WHERE attempt_id = ?",
        (output, receipt, now, request.attempt_id),
    )
    active_time.close_intervals(conn, "attempt_id", request.attempt_id, "settlement", now)
    cancel_steps(conn, actor, now, None, "request_id", request.request_id)
    requeue_run(conn, request.run_id, now)


def rejections(conn: sqlite3.Connection, request_id: str) -> int:
    """The request's judged rejections (not those that lost to another outcome unjudged)."""
    (count,) = conn.execute(
        "SELECT count(*) FROM interactive_submissions WHERE request_id = ? AND outcome = 'rejected' "
        "AND receipt_digest IS NOT NULL",
        (request_id,),
    ).fetchone()
    return int(count)


def reject_validating(conn: sqlite3.Connection, request_id: str, now: int) -> None:
    """A submission still being validated loses to the request's other outcome (no verdict receipt)."""
    conn.execute(
        "UPDATE interactive_submissions SET outcome = 'rejected', settled_at = ? "
        "WHERE request_id = ? AND outcome IS NULL",
        (now, request_id),
    )


def fail(
    conn: sqlite3.Connection,
    request: Request,
    status: str,
    error_code: str,
    error: BlobValue,
    recovery_stop: str | None,
    actor: Actor,
    now: int,
) -> None:
    """The attempt ends ``status`` (timed_out, failed) with its error: the request fails, a
    validating submission is rejected, pending steps cancelled, the run continues (the runner
    routes the outcome)."""
    records.put_blob(conn, error, now)
    set_request(conn, request, "failed", now)
    reject_validating(conn, request.request_id, now)
    conn.execute(
        "UPDATE node_attempts SET attempt_status = ?, outcome = ?, error_digest = ?, error_code = ?, "
        "finished_at = ? WHERE attempt_id = ?",
        (status, status, error.digest, error_code, now, request.attempt_id),
    )
    active_time.close_intervals(conn, "attempt_id", request.attempt_id, "settlement", now)
    cancel_steps(conn, actor, now, recovery_stop, "request_id", request.request_id)
    requeue_run(conn, request.run_id, now)


def time_out(conn: sqlite3.Connection, request: Request, timeout_ms: int, actor: Actor, now: int) -> None:
    """The attempt spent its active-time budget (C3 or a sample)."""
    error = BlobValue.of_text(f"the agent step used its active-time budget of {timeout_ms} ms")
    fail(conn, request, "timed_out", "agentTimeout", error, "timeout", actor, now)


# --- run control and run ends ----------------------------------------------------------


def open_requests(conn: sqlite3.Connection, run_id: str) -> list[Request]:
    rows = conn.execute(
        f"SELECT {REQUEST_COLUMNS} FROM interactive_requests WHERE run_id = ? "
        "AND request_status IN ('pending', 'validating')",
        (run_id,),
    ).fetchall()
    return [Request(*row) for row in rows]


def stop_for_pause(conn: sqlite3.Connection, run_id: str, actor: Actor, now: int) -> None:
    """A pause: the open interval ends (``pause``), pending steps are cancelled (``interruption``);
    the request keeps waiting, and a resumed step follows the next host's branch report."""
    active_time.close_intervals(conn, "run_id", run_id, "pause", now)
    cancel_steps(conn, actor, now, "interruption", "run_id", run_id)


def stop_for_end(conn: sqlite3.Connection, run_id: str, actor: Actor, now: int) -> None:
    """The run ends (cancelled, or its last node): open turns ``lost``, pending steps cancelled
    (``cancellation``), open requests ``cancelled``, open intervals ended, recording segments
    closed with their claims released."""
    for segment in recording_segments(conn, run_id, now):
        close_segment_from(conn, segment, "settlement", actor, now, now)
    lose_open_turns(conn, run_id, now)
    active_time.close_intervals(conn, "run_id", run_id, "settlement", now)
    cancel_steps(conn, actor, now, "cancellation", "run_id", run_id)
    for request in open_requests(conn, run_id):
        reject_validating(conn, request.request_id, now)
        set_request(conn, request, "cancelled", now)


def launch_receipt(conn: sqlite3.Connection, segment_id: str, request: Request) -> dict[str, Any]:
    """What agent.open answers (the supervisor builds the host's launch from it)."""
    segment = get_segment(conn, segment_id)
    lease = records.get_lease(conn, segment_id)
    assert segment is not None and lease is not None
    (project_path,) = conn.execute(
        "SELECT p.canonical_path FROM runs r JOIN projects p ON p.project_id = r.project_id WHERE r.run_id = ?",
        (request.run_id,),
    ).fetchone()
    return {
        "segmentId": segment_id,
        "leaseGeneration": lease.lease_generation,
        "runId": request.run_id,
        "attemptId": request.attempt_id,
        "requestId": request.request_id,
        "sessionId": segment.session_id,
        "piSessionFile": segment.pi_session_file,
        "contract": records.read_json(conn, request.contract_digest),
        "pending": pending_steps(conn, request.request_id),
        "steps": step_ids(conn, request.request_id),
        "timeoutMs": active_time.timeout_ms_of(conn, request.attempt_id),
        "elapsedMs": active_time.spent_ms(conn, request.attempt_id),
        "projectPath": project_path,
    }

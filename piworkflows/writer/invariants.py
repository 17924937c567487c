"""The spec's state invariants: one module owns the queries (spec, State verification).

Each check returns the run ids (or other ids) that violate it; an empty
report means the state is consistent. Verification never repairs anything.
The explicit non-contradictions of the spec are honoured: queued, starting,
running and parked queue phases beside live execution states during
admission; a terminal run whose queue settlement effect is still pending;
expired claims (recovery facts, not proof of completed work).

Used by ``state.status``/``state.verify`` (``writer/commands/state.py``) and
the tests; backup verification and the stress harness will use the same
functions.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from piworkflows.protocol import domain
from piworkflows.states import MEDIA_JSON
from piworkflows.writer.local_effects import SETTLE_QUEUE

# name -> a query returning one id per violation
CHECKS: dict[str, str] = {
    # A terminal run's queue is settled (done/failed/cancelled), unless its settlement effect is pending.
    "terminalQueueMismatch": f"""
        SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id
        WHERE r.finished_at IS NOT NULL
          AND q.queue_status NOT IN ('done', 'failed', 'cancelled')
          AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.run_id = r.run_id AND e.effect_type = '{SETTLE_QUEUE}'
                          AND e.effect_status IN ('pending', 'applying'))""",
    # A settled queue belongs to a terminal run.
    "settledQueueOfLiveRun": """
        SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id
        WHERE r.finished_at IS NULL AND q.queue_status IN ('done', 'failed', 'cancelled')""",
    # A waiting run waits on something: a waiting attempt or a pending request.
    "waitingRunWithoutResponse": """
        SELECT r.run_id FROM runs r WHERE r.status = 'waiting'
          AND NOT EXISTS (SELECT 1 FROM node_attempts a WHERE a.run_id = r.run_id AND a.attempt_status = 'waiting')
          AND NOT EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = r.run_id
                          AND i.request_status IN ('pending', 'validating'))""",
    # A pending request belongs to an attempt that is still active.
    "pendingRequestOnInactiveAttempt": """
        SELECT i.run_id FROM interactive_requests i JOIN node_attempts a ON a.attempt_id = i.attempt_id
        WHERE i.request_status IN ('pending', 'validating') AND a.attempt_status NOT IN ('running', 'waiting')""",
    # An accepted request names a submission that exists and was accepted.
    "missingAcceptedSubmission": """
        SELECT i.run_id FROM interactive_requests i
        WHERE i.request_status = 'accepted' AND NOT EXISTS (
            SELECT 1 FROM interactive_submissions s WHERE s.submission_id = i.accepted_submission_id
              AND s.request_id = i.request_id AND s.outcome IN ('accepted', 'adopted'))""",
    # An open active-time interval belongs to an active attempt, and ends after it starts.
    "invalidActiveClock": """
        SELECT a.run_id FROM attempt_active_intervals t JOIN node_attempts a ON a.attempt_id = t.attempt_id
        WHERE (t.ended_at IS NULL AND a.attempt_status NOT IN ('running', 'waiting'))
           OR t.last_observed_at < t.started_at OR (t.ended_at IS NOT NULL AND t.ended_at < t.started_at)""",
    # An open Pi turn belongs to a nonterminal run.
    "conflictingPiTurn": """
        SELECT t.run_id FROM workflow_turns t JOIN runs r ON r.run_id = t.run_id
        WHERE t.turn_state = 'open' AND r.finished_at IS NOT NULL""",
    # A session segment records only for an unfinished run (a run's end closes them).
    "recordingSegmentOfFinishedRun": """
        SELECT s.run_id FROM session_segments s JOIN runs r ON r.run_id = s.run_id
        WHERE s.segment_status = 'recording' AND r.finished_at IS NOT NULL""",
    # A pending step message belongs to an open request (every outcome of a request cancels them).
    "pendingStepOfSettledRequest": """
        SELECT m.run_id FROM workflow_messages m JOIN interactive_requests i ON i.request_id = m.request_id
        WHERE m.message_kind = 'step' AND m.message_state = 'pending'
          AND i.request_status NOT IN ('pending', 'validating')""",
    # An accepted decision submission is its decision's one winner (a human resolution naming it).
    "acceptedSubmissionWithoutResolution": """
        SELECT d.run_id FROM human_decision_submissions s JOIN human_decisions d ON d.decision_id = s.decision_id
        WHERE s.submission_outcome = 'accepted' AND NOT EXISTS (
            SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = s.decision_id
              AND r.resolution_kind = 'human' AND r.submission_id = s.submission_id)""",
    # A decision's attempt waits exactly while it has no resolution (one winner ends the wait).
    "decisionWaitMismatch": """
        SELECT d.run_id FROM human_decisions d JOIN node_attempts a ON a.attempt_id = d.attempt_id
        WHERE (a.attempt_status = 'waiting') = EXISTS (
            SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)""",
    # A claim or a live runner never stands beside a terminal, waiting or queued-and-idle run.
    "claimOrRunnerOfIdleRun": """
        SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id
        WHERE (r.finished_at IS NOT NULL OR r.status = 'waiting' OR q.queue_status IN ('queued', 'parked'))
          AND (EXISTS (SELECT 1 FROM leases l WHERE l.resource_id = r.run_id AND l.owner_id IS NOT NULL
                       AND l.expires_at > :now)
               OR EXISTS (SELECT 1 FROM run_workers w WHERE w.run_id = r.run_id AND w.ended_at IS NULL))""",
    # A running queue phase of an unfinished run has its runner record (a finished one: see above).
    "runningQueueWithoutRunner": """
        SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id
        WHERE q.queue_status IN ('starting', 'running') AND r.finished_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM run_workers w WHERE w.run_id = r.run_id AND w.ended_at IS NULL)""",
    # Fencing: a resource is never written under an older lease generation than one it was already
    # written under (a stale owner's write would be). The id is the resource's.
    "staleGenerationWrite": """
        SELECT resource_id FROM (
            SELECT resource_id, lease_generation, max(lease_generation) OVER (
                PARTITION BY resource_id ORDER BY resource_revision
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
            FROM events WHERE lease_generation IS NOT NULL)
        WHERE lease_generation < before""",
    # An event about a node attempt names an attempt of its own run (the id is the event's resource).
    "eventOfAnotherAttempt": """
        SELECT e.resource_id FROM events e WHERE e.attempt_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM node_attempts a WHERE a.attempt_id = e.attempt_id AND a.run_id = e.resource_id)""",
}


def values_outside_domain(conn: sqlite3.Connection) -> list[str]:
    """The JSON blobs (by digest) whose value is outside the protocol's value domain: a lone
    surrogate an older build let in (protocol/domain.py). A byte filter first: canonical JSON
    writes a lone surrogate as an escape ``\\udxxx``; the exact check decides."""
    found = []
    rows = conn.execute(
        "SELECT digest, bytes FROM blobs WHERE media_type = ? AND instr(bytes, X'5C7564') > 0", (MEDIA_JSON,)
    )
    for digest, data in rows:
        try:
            domain.check_json_bytes(bytes(data))
        except ValueError:
            found.append("sha256:" + bytes(digest).hex())
    return found


def violations(conn: sqlite3.Connection, now: int) -> dict[str, list[str]]:
    """Every violated invariant with the ids involved (empty: consistent)."""
    found = {}
    for name, query in CHECKS.items():
        params = {"now": now} if ":now" in query else {}
        ids = sorted({row[0] for row in conn.execute(query, params)})
        if ids:
            found[name] = ids
    return found


def damage(conn: sqlite3.Connection, check: str = "integrity_check") -> list[str]:
    """What SQLite's ``integrity_check`` (or the cheaper ``quick_check``) finds damaged in the file;
    a file too damaged for the check to finish is reported as the check's own finding."""
    try:
        return [row[0] for row in conn.execute(f"PRAGMA {check}") if row[0] != "ok"]
    except sqlite3.DatabaseError as exc:
        return [f"{check}: {exc}"]


def integrity(conn: sqlite3.Connection) -> list[str]:
    """SQLite's own checks: 'ok' from integrity_check and no foreign key violation, else the problems."""
    return sum(_sqlite_checks(conn), [])


def _sqlite_checks(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
    """(damage to the file, foreign key violations)."""
    damaged = damage(conn)
    try:
        keys = [f"foreign key: {row[0]} row {row[1]} -> {row[2]}" for row in conn.execute("PRAGMA foreign_key_check")]
    except sqlite3.DatabaseError as exc:
        keys = [f"foreign_key_check: {exc}"]
    return damaged, keys


def verify(conn: sqlite3.Connection, now: int) -> tuple[dict[str, Any], list[str]]:
    """``state.verify`` and the inactive verification: SQLite's checks, then (on a sound file) the
    invariants. Returns the report and the damage it found to the file itself. Reports; never
    raises for what it finds, never repairs."""
    damaged, keys = _sqlite_checks(conn)
    problems = damaged + keys
    found: dict[str, list[str]] = {}
    if not problems:
        try:
            found = violations(conn, now)
            outside = values_outside_domain(conn)  # a scan of every value: verify only, never status
            if outside:
                found["valueOutsideDomain"] = outside
        except sqlite3.DatabaseError as exc:
            damaged = [f"invariants: {exc}"]
            problems += damaged
    return {"ok": not problems and not found, "integrity": problems, "violations": found}, damaged

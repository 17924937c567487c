"""Protected human decisions: one immutable winner per decision (spec: Competing outcomes).

::

    node.wait of a human_decision   open(): a decision resource (revision 1) and its human_decisions
                                    row (deadline = commit time + after_ms, the default response)
    decision.answer                 a verified human's submission (accepted), resolution 'human'
    decision.expire, any answer     a due deadline first: resolution 'timeoutPolicy' (the default
      or cancel                     response) or 'expiry' (none); the node completes, or ends
                                    timed_out (decisionExpired)
    run.cancel                      resolution 'cancellation' of a decision still open

``human_decision_resolutions`` admits one row per decision (its primary key; rows are immutable),
so whichever commits first wins and every later command names it. The node's output is
``{choice, input?, resolution}``; a resolved decision requeues its run (a paused run keeps its
flag). Outcomes follow commit time, never the timer's latency: every command on a decision applies
its due deadline first, and a human answer counts only while ``now < deadline_at``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import Actor, BlobValue
from piworkflows.writer import channel_effects, records
from piworkflows.writer.views import touched

EXPIRED = "decisionExpired"  # the error code of a node whose decision expired without a default


@dataclass(frozen=True)
class Decision:
    decision_id: str
    run_id: str
    attempt_id: str
    node_path: str
    audience: str
    request: dict[str, Any]  # {request, choices} as node.wait stored it
    default_digest: bytes | None
    deadline_at: int | None


def decision_id_of(attempt_id: str) -> str:
    """One decision per waiting attempt: its id follows from the attempt's."""
    return "decision-" + attempt_id.removeprefix("attempt-")


def open_decision(
    conn: sqlite3.Connection,
    run_id: str,
    attempt_id: str,
    audience: str,
    request: BlobValue,
    after_ms: int | None,
    default_response: BlobValue | None,
    now: int,
) -> str:
    """The decision of a human_decision node that starts waiting (its blobs stored by the caller)."""
    decision_id = decision_id_of(attempt_id)
    records.create_resource(conn, decision_id, "decision", now)
    conn.execute(
        "INSERT INTO human_decisions (decision_id, run_id, attempt_id, audience, request_digest, "
        "default_response_digest, deadline_at, continuation_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            decision_id,
            run_id,
            attempt_id,
            audience,
            request.digest,
            default_response.digest if default_response is not None else None,
            now + after_ms if after_ms is not None else None,
            "continuation-" + attempt_id.removeprefix("attempt-"),
            now,
        ),
    )
    return decision_id


def waiting(conn: sqlite3.Connection, run_id: str, node_path: str | None = None) -> Decision | None:
    """The run's decision that waits (at ``node_path``): unresolved, its attempt waiting."""
    row = conn.execute(
        "SELECT d.decision_id, d.attempt_id, a.node_path, d.audience, d.request_digest, d.default_response_digest, "
        "d.deadline_at FROM human_decisions d JOIN node_attempts a ON a.attempt_id = d.attempt_id "
        "WHERE d.run_id = ? AND a.attempt_status = 'waiting' AND (? IS NULL OR a.node_path = ?) "
        "AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)",
        (run_id, node_path, node_path),
    ).fetchone()
    if row is None:
        return None
    decision_id, attempt_id, path, audience, request, default, deadline = row
    request_value = records.read_json(conn, request)
    return Decision(decision_id, run_id, attempt_id, path, audience, request_value, default, deadline)


def winner(conn: sqlite3.Connection, run_id: str, node_path: str) -> dict[str, Any] | None:
    """The newest resolved decision of the node: how it was resolved, and its choice if any."""
    row = conn.execute(
        "SELECT d.decision_id, r.resolution_kind, r.response_digest FROM human_decisions d "
        "JOIN node_attempts a ON a.attempt_id = d.attempt_id "
        "JOIN human_decision_resolutions r ON r.decision_id = d.decision_id "
        "WHERE d.run_id = ? AND a.node_path = ? ORDER BY r.resolved_at DESC LIMIT 1",
        (run_id, node_path),
    ).fetchone()
    if row is None:
        return None
    decision_id, kind, response = row
    named: dict[str, Any] = {"decisionId": decision_id, "resolution": kind}
    if response is not None:
        named["choice"] = records.read_json(conn, response)["choice"]
    return named


def answered_so(
    conn: sqlite3.Connection, run_id: str, node_path: str, choice: str, text: str | None
) -> dict[str, Any] | None:
    """When the node's newest resolved decision was won by a human with exactly this response: the
    receipt its answer had (the run's status now); else None."""
    row = conn.execute(
        "SELECT d.decision_id, d.attempt_id, r.resolution_kind, r.response_digest, runs.status "
        "FROM human_decisions d JOIN node_attempts a ON a.attempt_id = d.attempt_id "
        "JOIN human_decision_resolutions r ON r.decision_id = d.decision_id JOIN runs ON runs.run_id = d.run_id "
        "WHERE d.run_id = ? AND a.node_path = ? ORDER BY r.resolved_at DESC LIMIT 1",
        (run_id, node_path),
    ).fetchone()
    if row is None or row[2] != "human" or row[3] is None:
        return None
    response = {"choice": choice} if text is None else {"choice": choice, "input": text}
    if records.read_json(conn, row[3]) != response:
        return None
    return {"attemptId": row[1], "status": row[4], "decisionId": row[0], "resolution": "human", "choice": choice}


def check_response(decision: Decision, choice: str, text: str | None) -> dict[str, Any]:
    """The response ``{choice, input?}`` when it is one the decision takes; else validationFailed."""
    choices = decision.request["choices"]
    if choice not in choices:
        raise CommandError("validationFailed", f"{choice!r} is not a choice of this decision", choices=sorted(choices))
    asked = choices[choice]["input"]
    if asked is None and text is not None:
        raise CommandError("validationFailed", f"choice {choice!r} takes no input")
    if asked is not None and text is None:
        raise CommandError("validationFailed", f"choice {choice!r} needs its input ({asked['name']})", choice=choice)
    return {"choice": choice} if text is None else {"choice": choice, "input": text}


def resolve(
    conn: sqlite3.Connection,
    decision: Decision,
    kind: str,
    actor: Actor,
    now: int,
    response: dict[str, Any] | None = None,
    submission_id: str | None = None,
) -> None:
    """The decision's one winner, and what it does to its node and run (the run's revision and
    event are the caller's). ``cancellation`` leaves the node and run to run.cancel."""
    digest = None
    if response is not None:
        value = BlobValue.of_json(response)
        records.put_blob(conn, value, now)
        digest = value.digest
    conn.execute(
        "INSERT INTO human_decision_resolutions (decision_id, resolution_kind, submission_id, response_digest, "
        "resolved_at) VALUES (?, ?, ?, ?, ?)",
        (decision.decision_id, kind, submission_id, digest, now),
    )
    revision = records.get_resource(conn, decision.decision_id)
    assert revision is not None
    new_revision = records.increment_revision(conn, decision.decision_id, revision.revision, now)
    records.write_event(conn, decision.decision_id, new_revision, f"decision.{kind}", actor, now)
    channel_effects.resolved(conn, decision.decision_id, actor, now)
    if kind == "cancellation":
        return
    if kind == "expiry":
        error = BlobValue.of_text("the human decision expired: its deadline passed with no answer")
        records.put_blob(conn, error, now)
        conn.execute(
            "UPDATE node_attempts SET attempt_status = 'timed_out', outcome = 'timed_out', error_code = ?, "
            "error_digest = ?, finished_at = ? WHERE attempt_id = ?",
            (EXPIRED, error.digest, now, decision.attempt_id),
        )
    else:
        assert response is not None
        output = BlobValue.of_json({**response, "resolution": kind})
        records.put_blob(conn, output, now)
        conn.execute(
            "UPDATE node_attempts SET attempt_status = 'completed', outcome = 'ok', output_digest = ?, "
            "finished_at = ? WHERE attempt_id = ?",
            (output.digest, now, decision.attempt_id),
        )
    conn.execute("UPDATE runs SET status = 'queued', updated_at = ? WHERE run_id = ?", (now, decision.run_id))
    conn.execute(
        "UPDATE run_queue SET queue_status = 'queued', updated_at = ? WHERE run_id = ?", (now, decision.run_id)
    )
    touched.touch(conn, decision.run_id)


def due(decision: Decision, now: int) -> bool:
    """Its deadline has passed: a human answer no longer competes (at the same millisecond the
    deadline wins)."""
    return decision.deadline_at is not None and now >= decision.deadline_at


def deadline_winner(conn: sqlite3.Connection, decision: Decision) -> dict[str, Any]:
    """What a due deadline resolves the decision to (as ``winner`` names it)."""
    named: dict[str, Any] = {"decisionId": decision.decision_id}
    if decision.default_digest is None:
        return named | {"resolution": "expiry"}
    return named | {"resolution": "timeoutPolicy", "choice": records.read_json(conn, decision.default_digest)["choice"]}


def apply_deadline(conn: sqlite3.Connection, decision: Decision, actor: Actor, now: int) -> bool:
    """A due deadline resolves the decision now (timeout policy, or expiry): True if it did."""
    if not due(decision, now):
        return False
    if decision.default_digest is not None:
        resolve(conn, decision, "timeoutPolicy", actor, now, records.read_json(conn, decision.default_digest))
    else:
        resolve(conn, decision, "expiry", actor, now)
    return True


def due_runs(conn: sqlite3.Connection, now: int) -> list[str]:
    """The runs with an open decision whose deadline passed."""
    return [
        row[0]
        for row in conn.execute(
            "SELECT DISTINCT d.run_id FROM human_decisions d JOIN node_attempts a ON a.attempt_id = d.attempt_id "
            "WHERE d.deadline_at IS NOT NULL AND d.deadline_at <= ? AND a.attempt_status = 'waiting' "
            "AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id) "
            "ORDER BY d.deadline_at",
            (now,),
        )
    ]


def next_deadline(conn: sqlite3.Connection) -> int | None:
    """The earliest deadline of a decision still open (the server's timer sleeps until it)."""
    row = conn.execute(
        "SELECT min(d.deadline_at) FROM human_decisions d JOIN node_attempts a ON a.attempt_id = d.attempt_id "
        "WHERE d.deadline_at IS NOT NULL AND a.attempt_status = 'waiting' "
        "AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)"
    ).fetchone()
    return row[0] if row else None

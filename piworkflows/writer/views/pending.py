"""The run view's pending agent step (``piworkflows.pending``): what the step asks, what was
submitted and judged, the active time it used, and the tail of its conversation, all bounded.

::

    the run's open interactive request (pending or validating) + its attempt ──>
      {kind (agent | decision), nodePath, request: {requestId, attemptId, targetSessionId, status,
       prompt (the contract's, cut at PROMPT_BYTES; promptBytes: its whole length), expectedOutput,
       submissions {items, start, total}: the last SUBMISSION_ROWS, each {submissionId, status
         (validating | accepted | rejected), errorCode, error, submittedAt, settledAt, output},
       activeTime {usedMs: the intervals' elapsed_ms, timeoutMs, leftMs (null: unlimited)},
       transcript {items, start, total}: the last TRANSCRIPT_ROWS entries of the attempt's range,
         items as run.transcript's}}
    or the run's open human decision ──>
      {kind: human_decision, nodePath, decision: {decisionId, attemptId, audience, request (the
       node's request: title, summary, ...; above PROMPT_BYTES a notice of its size), choices
       {key: {label, input: {name, prompt} | null}}, deadline (ISO, null: none), onDeadline
       (timeoutPolicy: the default response's choice | expiry | null), deliveries (its Telegram
       messages: {sent, pending, failed, ambiguous})}}
    null when the run has no open agent request or decision

Values share PENDING_VALUES_BYTES, the prompt first, then the conversation newest first, then
the submitted outputs newest first; one that does not fit (or exceeds its own bound) is only
``{"omitted": {byteLength, digest}}``. A run that waits has no output or error yet, so this
takes their share of the view's frame (writer/views/runs.py).
"""

from __future__ import annotations

import hashlib
import sqlite3
from typing import Any

from piworkflows import canonical
from piworkflows.isotime import iso_or_none
from piworkflows.protocol.internal.agents import AgentContract
from piworkflows.writer import active_time, channel_effects, decisions, records
from piworkflows.writer.views.transcript import AttemptRange, entry_item, entry_rows
from piworkflows.writer.views.values import omitted, read_json

PENDING_VALUES_BYTES = 128 * 1024
PROMPT_BYTES = 16 * 1024
DESCRIPTION_BYTES = 4 * 1024
SCHEMA_BYTES = 16 * 1024
ENTRY_BYTES = 16 * 1024  # one entry shown inline in the view (run.transcript shows up to 64 KiB)
OUTPUT_BYTES = 4 * 1024  # one submitted output shown inline
ERROR_CHARS = 2048  # a rejection's error, cut here
SUBMISSION_ROWS = 16
TRANSCRIPT_ROWS = 32


class _Budget:
    def __init__(self, total: int) -> None:
        self.left = total

    def afford(self, cost: int, bound: int) -> bool:
        if cost > bound or cost > self.left:
            return False
        self.left -= cost
        return True


def pending_view(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT i.request_id, i.attempt_id, i.target_session_id, i.request_status, i.contract_digest, "
        "a.node_path, a.node_kind FROM interactive_requests i JOIN node_attempts a ON a.attempt_id = i.attempt_id "
        "WHERE i.run_id = ? AND i.request_status IN ('pending', 'validating')",
        (run_id,),
    ).fetchone()
    if row is None:
        return _decision(conn, run_id)
    request_id, attempt_id, session_id, status, contract_digest, node_path, node_kind = row
    contract = AgentContract.model_validate(records.read_json(conn, contract_digest))
    budget = _Budget(PENDING_VALUES_BYTES)
    prompt = contract.prompt.encode("utf-8")
    shown_prompt = prompt[:PROMPT_BYTES].decode("utf-8", "ignore")
    budget.afford(len(shown_prompt.encode("utf-8")), PROMPT_BYTES)
    transcript = _transcript(conn, run_id, attempt_id, node_path, budget)
    request = {
        "requestId": request_id,
        "attemptId": attempt_id,
        "targetSessionId": session_id,
        "status": status,
        "prompt": shown_prompt,
        "promptBytes": len(prompt),
        "expectedOutput": _expected_output(contract, budget),
        "submissions": _submissions(conn, request_id, budget),
        "activeTime": _active_time(conn, attempt_id),
        "transcript": transcript,
    }
    return {"kind": node_kind, "nodePath": node_path, "request": request}


def _decision(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The run's open human decision, as the human who answers it sees it."""
    open_decision = decisions.waiting(conn, run_id)
    if open_decision is None:
        return None
    asked = open_decision.request
    request = asked["request"]
    data = canonical.dumps_bytes(request)
    if len(data) > PROMPT_BYTES:
        request = omitted(len(data), hashlib.sha256(data).digest())
    on_deadline = None
    if open_decision.deadline_at is not None:
        on_deadline = decisions.deadline_winner(conn, open_decision).get("choice", "expiry")
    shown = {
        "decisionId": open_decision.decision_id,
        "attemptId": open_decision.attempt_id,
        "audience": open_decision.audience,
        "request": request,
        "choices": asked["choices"],
        "deadline": iso_or_none(open_decision.deadline_at),
        "onDeadline": on_deadline,
        "deliveries": channel_effects.delivery_counts(conn, open_decision.decision_id),
    }
    return {"kind": "human_decision", "nodePath": open_decision.node_path, "decision": shown}


def _expected_output(contract: AgentContract, budget: _Budget) -> dict[str, Any]:
    expected = contract.expected_output
    schema: Any = None
    if expected.json_schema is not None:
        data = canonical.dumps_bytes(expected.json_schema)
        affordable = budget.afford(len(data), SCHEMA_BYTES)
        schema = expected.json_schema if affordable else omitted(len(data), hashlib.sha256(data).digest())
    description = expected.description
    if description is not None:
        description = description.encode("utf-8")[:DESCRIPTION_BYTES].decode("utf-8", "ignore")
    return {
        "kind": expected.kind,
        "description": description,
        "schema": schema,
        "maxChars": expected.max_chars,
        "choices": contract.choices,
    }


def _active_time(conn: sqlite3.Connection, attempt_id: str) -> dict[str, Any]:
    """Used: the attempt's intervals' measured time; a budget of 0 (or none) is unlimited: null."""
    used = active_time.spent_ms(conn, attempt_id)
    timeout = active_time.timeout_ms_of(conn, attempt_id) or None
    return {"usedMs": used, "timeoutMs": timeout, "leftMs": max(0, timeout - used) if timeout else None}


def _submissions(conn: sqlite3.Connection, request_id: str, budget: _Budget) -> dict[str, Any]:
    (total,) = conn.execute(
        "SELECT count(*) FROM interactive_submissions WHERE request_id = ?", (request_id,)
    ).fetchone()
    rows = conn.execute(
        "SELECT s.submission_id, s.outcome, s.receipt_digest, s.created_at, s.settled_at, s.payload_digest, "
        "b.byte_length FROM interactive_submissions s JOIN blobs b ON b.digest = s.payload_digest "
        "WHERE s.request_id = ? ORDER BY s.created_at DESC, s.rowid DESC LIMIT ?",
        (request_id, SUBMISSION_ROWS),
    ).fetchall()
    items = []
    for submission_id, outcome, receipt, created, settled, payload, length in rows:  # newest first
        verdict = records.read_json(conn, receipt) if outcome == "rejected" and receipt is not None else {}
        error = verdict.get("error")
        affordable = budget.afford(length, OUTPUT_BYTES)
        items.append(
            {
                "submissionId": submission_id,
                "status": outcome or "validating",
                "errorCode": verdict.get("errorCode"),
                "error": error[:ERROR_CHARS] if isinstance(error, str) else None,
                "submittedAt": created,
                "settledAt": settled,
                "output": read_json(conn, payload, limit=None) if affordable else omitted(length, payload),
            }
        )
    items.reverse()
    return {"items": items, "start": total - len(items), "total": total}


def _transcript(
    conn: sqlite3.Connection, run_id: str, attempt_id: str, node_path: str, budget: _Budget
) -> dict[str, Any]:
    """The tail of the entries the attempt's segments captured (a range of the run's dense run_seq)."""
    row = conn.execute(
        "SELECT first_seq, last_seq FROM attempt_entries WHERE attempt_id = ? AND first_seq IS NOT NULL",
        (attempt_id,),
    ).fetchone()
    if row is None:
        return {"items": [], "start": 0, "total": 0}
    first, last = row
    span = AttemptRange(attempt_id, node_path, first, last)
    rows = entry_rows(conn, run_id, max(first, last - TRANSCRIPT_ROWS + 1), last, TRANSCRIPT_ROWS)
    items = [entry_item(conn, r, span, inline=budget.afford(r[5], ENTRY_BYTES)) for r in reversed(rows)]
    items.reverse()
    total = last - first + 1
    return {"items": items, "start": total - len(items), "total": total}

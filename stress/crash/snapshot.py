"""What the database holds at the end, read once the server has stopped (read-only, query_only).

Only the facts the oracles compare: the stored receipts, the runs (with the harness tag of
their input), the effects by idempotency key, the agent steps' requests, submissions and step
messages (with the count of their ``workflow_message.sent`` events) and Pi session files, the
human decisions with their submissions and resolutions, the channel messages and cursors, and
the spec's invariants with the integrity and foreign-key checks (``writer/invariants.py``).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from piworkflows.writer import invariants


@dataclass
class State:
    receipts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (clientId, key) -> answer
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # runId -> status, parkReason, paused, tag, root
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)  # idempotency key -> status, policy
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # requestId -> runId, status, accepted
    submissions: list[dict[str, Any]] = field(default_factory=list)  # requestId, submissionId, outcome
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)  # step message id -> state, entry, sentEvents
    session_files: dict[str, set[str]] = field(default_factory=dict)  # runId -> its segments' Pi session files
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)  # decisionId -> runId, resolutions, kind
    decision_submissions: list[dict[str, Any]] = field(default_factory=list)  # decisionId, key, outcome, actor
    channel_effects: dict[str, dict[str, Any]] = field(default_factory=dict)  # effectId -> type, status, channel
    cursors: dict[str, int] = field(default_factory=dict)  # channelId -> its durable cursor
    violations: dict[str, list[str]] = field(default_factory=dict)
    integrity: list[str] = field(default_factory=list)


def read(database: Path, now_ms: int) -> State:
    uri = "file:" + quote(str(database.absolute())) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        conn.execute("PRAGMA query_only = ON")
        state = State()
        for client, key, outcome, receipt in conn.execute(
            "SELECT client_id, idempotency_key, outcome, receipt FROM host_commands"
        ):
            state.receipts[(client, key)] = {"outcome": outcome, "receipt": json.loads(receipt) if receipt else None}
        for run_id, root, status, park, paused, queue, workflow, data in conn.execute(
            "SELECT r.run_id, r.root_run_id, r.status, r.park_reason, r.paused, q.queue_status, r.workflow_name, "
            "b.bytes FROM runs r JOIN blobs b ON b.digest = r.input_digest LEFT JOIN run_queue q ON q.run_id = r.run_id"
        ):
            value = json.loads(data)
            tag = value.get("tag") if isinstance(value, dict) else None
            state.runs[run_id] = {
                "status": status,
                "parkReason": park,
                "paused": bool(paused),
                "queue": queue,
                "tag": tag,
                "root": run_id == root,
                "workflow": workflow,
            }
        for key, status, policy in conn.execute("SELECT idempotency_key, effect_status, recovery_policy FROM effects"):
            state.effects[key] = {"status": status, "policy": policy}
        _agent_rows(conn, state)
        _decision_rows(conn, state)
        state.violations = invariants.violations(conn, now_ms)
        state.integrity = invariants.integrity(conn)
    finally:
        conn.close()
    return state


def _agent_rows(conn: sqlite3.Connection, state: State) -> None:
    for request_id, run_id, status, accepted in conn.execute(
        "SELECT request_id, run_id, request_status, accepted_submission_id FROM interactive_requests"
    ):
        state.requests[request_id] = {"runId": run_id, "status": status, "accepted": accepted}
    for request_id, submission_id, outcome in conn.execute(
        "SELECT request_id, submission_id, outcome FROM interactive_submissions"
    ):
        state.submissions.append({"requestId": request_id, "submissionId": submission_id, "outcome": outcome})
    for message_id, run_id, request_id, message_state, entry, sent in conn.execute(
        "SELECT m.workflow_message_id, m.run_id, m.request_id, m.message_state, m.pi_entry_id, "
        "(SELECT count(*) FROM events e WHERE e.resource_id = m.workflow_message_id "
        "AND e.event_type = 'workflow_message.sent') FROM workflow_messages m WHERE m.message_kind = 'step'"
    ):
        state.messages[message_id] = {
            "runId": run_id,
            "requestId": request_id,
            "state": message_state,
            "entry": entry,
            "sentEvents": sent,
        }
    for run_id, path in conn.execute(
        "SELECT DISTINCT run_id, pi_session_file FROM session_segments WHERE pi_session_file IS NOT NULL"
    ):
        state.session_files.setdefault(run_id, set()).add(path)


def _decision_rows(conn: sqlite3.Connection, state: State) -> None:
    for decision_id, run_id, resolutions, kind in conn.execute(
        "SELECT d.decision_id, d.run_id, (SELECT count(*) FROM human_decision_resolutions r "
        "WHERE r.decision_id = d.decision_id), (SELECT r.resolution_kind FROM human_decision_resolutions r "
        "WHERE r.decision_id = d.decision_id LIMIT 1) FROM human_decisions d"
    ):
        state.decisions[decision_id] = {"runId": run_id, "resolutions": resolutions, "resolution": kind}
    for decision_id, key, outcome, actor_class, channel_id in conn.execute(
        "SELECT decision_id, idempotency_key, submission_outcome, actor_class, channel_id "
        "FROM human_decision_submissions"
    ):
        state.decision_submissions.append(
            {
                "decisionId": decision_id,
                "key": key,
                "outcome": outcome,
                "actorClass": actor_class,
                "channelId": channel_id,
            }
        )
    for effect_id, effect_type, status, channel_id, attempts in conn.execute(
        "SELECT effect_id, effect_type, effect_status, channel_id, attempt_count FROM effects "
        "WHERE channel_id IS NOT NULL"
    ):
        state.channel_effects[effect_id] = {
            "type": effect_type,
            "status": status,
            "channelId": channel_id,
            "attempts": attempts,
        }
    for channel_id, cursor in conn.execute("SELECT channel_id, cursor_position FROM channel_cursors"):
        state.cursors[channel_id] = cursor

"""What the database holds at the end, read once the server has stopped (read-only, query_only).

Only the facts the oracles compare: the stored receipts, the runs (with the harness tag of
their input), the effects by idempotency key, and the spec's invariants with the integrity and
foreign-key checks (``writer/invariants.py``).
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
        for run_id, root, status, park, paused, queue, data in conn.execute(
            "SELECT r.run_id, r.root_run_id, r.status, r.park_reason, r.paused, q.queue_status, b.bytes FROM runs r "
            "JOIN blobs b ON b.digest = r.input_digest LEFT JOIN run_queue q ON q.run_id = r.run_id"
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
            }
        for key, status, policy in conn.execute("SELECT idempotency_key, effect_status, recovery_policy FROM effects"):
            state.effects[key] = {"status": status, "policy": policy}
        state.violations = invariants.violations(conn, now_ms)
        state.integrity = invariants.integrity(conn)
    finally:
        conn.close()
    return state

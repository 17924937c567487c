"""Every retention blocker keeps a finished tree by itself (writer/prune.py BLOCKERS).

Each case plants the rows its blocker looks for into an otherwise eligible tree and expects that
blocker, by name, to keep it: dropping or narrowing any blocker's query fails its case. The rows
are planted with foreign keys off: only the columns a blocker reads matter here.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from piworkflows.writer import prune
from tests.support import run_create, run_group, take_epoch

pytestmark = pytest.mark.timeout(30)

CUTOFF, NOW = 5_000, 10_000
DIGEST = b"\x01" * 32
SESSION = {"target_session_id": "session-1", "created_at": 1}

Row = tuple[str, dict[str, Any]]  # a table and its row; a "runs" row copies run-old's with these columns


def effect(effect_id: str, status: str, run_id: str | None, source: str) -> Row:
    settled = status in ("applied", "rejected", "cancelled")
    return (
        "effects",
        {
            "effect_id": effect_id,
            "source_resource_id": source,
            "source_revision": 1,
            "effect_type": "test.effect",
            "idempotency_key": effect_id,
            "request_fingerprint": DIGEST,
            "payload_digest": DIGEST,
            "effect_class": "external",
            "performer": "shell.exec",
            "recovery_policy": "manual",
            "owner_scope": "run" if run_id else "server",
            "run_id": run_id,
            "effect_status": status,
            "available_at": 0,
            "max_attempts": 1,
            "settled_at": 1 if settled else None,
            "created_at": 1,
            "updated_at": 1,
        },
    )


def outside_run(**lineage: Any) -> Row:
    """An unfinished root run of another tree that refers to run-old's tree."""
    return (
        "runs",
        {"run_id": "run-other", "root_run_id": "run-other", "status": "running", "finished_at": None, **lineage},
    )


def lease(resource_id: str) -> Row:
    """A claim still live at NOW."""
    return (
        "leases",
        {
            "resource_id": resource_id,
            "lease_generation": 1,
            "owner_id": "server-1",
            "claim_token_hash": DIGEST,
            "acquired_at": 1,
            "renewed_at": 1,
            "expires_at": NOW + 1,
        },
    )


def segment(status: str) -> Row:
    return (
        "session_segments",
        {
            "segment_id": "segment-1",
            "run_id": "run-old",
            "session_id": "session-1",
            "segment_status": status,
            "started_at": 1,
            "ended_at": 2 if status == "closed" else None,
        },
    )


ATTEMPT: Row = (
    "node_attempts",
    {
        "attempt_id": "attempt-1",
        "run_id": "run-old",
        "node_path": "greet",
        "node_kind": "compute",
        "visit_number": 1,
        "attempt_number": 1,
        "attempt_status": "completed",
        "outcome": "ok",
        "lease_generation": 1,
        "started_at": 1,
        "finished_at": 2,
    },
)
CHILD = {"run_id": "run-child", "lineage": "restart", "parent_run_id": "run-old"}

# case id -> (the blocker that must keep the tree, the rows that make it hold)
CASES: dict[str, tuple[str, list[Row]]] = {
    "unfinishedRun": ("unfinishedRun", [("runs", {**CHILD, "status": "running", "finished_at": None})]),
    "recentRun": ("recentRun", [("runs", {**CHILD, "finished_at": CUTOFF})]),  # not before the cutoff
    "liveQueue": ("liveQueue", [("run_queue", {"queue_status": "parked"})]),
    "activeRunner": (
        "activeRunner",
        [
            (
                "run_workers",
                {
                    "runner_epoch": 1,
                    "run_id": "run-old",
                    "server_epoch": 1,
                    "lease_generation": 1,
                    "launch_command": "start",
                    "start_revision": 1,
                    "created_at": 1,
                },
            )
        ],
    ),
    "pendingWorkflowMessage": (
        "pendingWorkflowMessage",
        [
            (
                "workflow_messages",
                {
                    **SESSION,
                    "workflow_message_id": "message-1",
                    "run_id": "run-old",
                    "message_kind": "notification",
                    "source_kind": "node",
                    "source_id": "greet",
                    "idempotency_key": "message-1",
                    "content_digest": DIGEST,
                    "session_order": 1,
                    "message_state": "pending",
                    "updated_at": 1,
                },
            )
        ],
    ),
    "openTurn": (
        "openTurn",
        [
            (
                "workflow_turns",
                {
                    "target_session_id": "session-1",
                    "workflow_turn_id": "turn-1",
                    "workflow_message_id": "message-1",
                    "run_id": "run-old",
                    "turn_state": "open",
                    "started_at": 1,
                },
            )
        ],
    ),
    "pendingInteraction": (
        "pendingInteraction",
        [
            (
                "interactive_requests",
                {
                    **SESSION,
                    "request_id": "request-1",
                    "run_id": "run-old",
                    "attempt_id": "attempt-1",
                    "contract_digest": DIGEST,
                    "request_status": "validating",
                    "revision": 1,
                    "updated_at": 1,
                },
            )
        ],
    ),
    "pendingDecision": (
        "pendingDecision",
        [
            (
                "human_decisions",
                {
                    "decision_id": "decision-1",
                    "run_id": "run-old",
                    "attempt_id": "attempt-1",
                    "audience": "operator",
                    "request_digest": DIGEST,
                    "continuation_id": "continuation-1",
                    "created_at": 1,
                },
            )
        ],
    ),
    "recordingSegment": ("recordingSegment", [segment("recording")]),
    "queuedFollowUp": (
        "queuedFollowUp",
        [
            (
                "workflow_follow_ups",
                {
                    "follow_up_id": "follow-up-1",
                    "run_id": "run-old",
                    "source_order": 1,
                    "source_session_id": "session-1",
                    "prompt_digest": DIGEST,
                    "follow_up_status": "queued",
                    "created_at": 1,
                    "updated_at": 1,
                },
            )
        ],
    ),
    **{
        f"activeLease-{on}": ("activeLease", [*rows, lease(resource_id)])
        for on, resource_id, rows in (
            ("run", "run-old", []),
            ("effect", "effect-1", [effect("effect-1", "applied", "run-old", "server")]),
            ("segment", "segment-1", [segment("closed")]),
        )
    },
    "controllerOwnership": (
        "controllerOwnership",
        [
            (
                "controller_workflows",
                {"managed_resource_id": "managed-1", "run_id": "run-old", "purpose": "reconcile", "created_at": 1},
            )
        ],
    ),
    **{
        f"unsettledEffect-{status}": ("unsettledEffect", [effect("effect-1", status, "run-old", "server")])
        for status in ("pending", "applying", "ambiguous")
    },
    "outsideReference-parent_run_id": (
        "outsideReference",
        [outside_run(lineage="child", parent_run_id="run-old")],
    ),
    "outsideReference-recovery_root_run_id": (
        "outsideReference",
        [outside_run(recovery_root_run_id="run-old", recovery_source_message_id="message-1")],
    ),
    "outsideReference-parent_attempt_id": ("outsideReference", [ATTEMPT, outside_run(parent_attempt_id="attempt-1")]),
    "outsideEffectSource": ("outsideEffectSource", [effect("effect-outside", "applied", None, "run-old")]),
}


def plant(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    if table == "run_queue":
        sets = ", ".join(f"{column} = ?" for column in row)
        conn.execute(f"UPDATE run_queue SET {sets} WHERE run_id = 'run-old'", list(row.values()))
    elif table == "runs":
        names = [info[1] for info in conn.execute("PRAGMA table_info(runs)")]
        select = ", ".join("?" if name in row else name for name in names)
        values = [row[name] for name in names if name in row]
        conn.execute(f"INSERT INTO runs SELECT {select} FROM runs WHERE run_id = 'run-old'", values)
    else:
        marks = ", ".join("?" for _ in row)
        conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks})", list(row.values()))


@pytest.fixture
def conn(executor):
    """run-old: a finished root tree with a settled queue and nothing else, eligible before CUTOFF."""
    run_group(executor, take_epoch(), run_create("run-old"))
    conn = executor.conn
    conn.execute("UPDATE runs SET status = 'completed', finished_at = 1000 WHERE run_id = 'run-old'")
    conn.execute("UPDATE run_queue SET queue_status = 'done' WHERE run_id = 'run-old'")
    conn.execute("PRAGMA foreign_keys = OFF")
    return conn


def test_the_tree_alone_is_eligible(conn):
    assert prune.select(conn, CUTOFF, NOW) == {"eligible": ["run-old"], "blocked": []}


def test_every_blocker_has_a_case():
    assert {blocker for blocker, _ in CASES.values()} == set(prune.BLOCKERS)


@pytest.mark.parametrize("case", list(CASES))
def test_each_blocker_keeps_the_tree_by_itself(conn, case):
    blocker, rows = CASES[case]
    for table, row in rows:
        plant(conn, table, row)
    assert prune.select(conn, CUTOFF, NOW) == {
        "eligible": [],
        "blocked": [{"rootRunId": "run-old", "blocker": blocker}],
    }
    assert prune.next_eligible(conn, CUTOFF, NOW, None) == (None, None)

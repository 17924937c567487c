"""Builders for internal writer commands, shared by unit and integration tests."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
from typing import Any

from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.writer.db import GroupExecutor, Submitted

_ids = itertools.count(1)

SERVER = {"actor_class": "server"}
OUTBOX = {"actor_class": "outbox", "actor_id": "worker-1"}


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def submitted(kind: str, body: dict[str, Any]) -> Submitted:
    return Submitted(next(_ids), kind, body)


def take_epoch(token: str = "epoch-token", ttl_ms: int = 30_000) -> Submitted:
    return submitted(
        "server.take_epoch",
        {
            "actor": SERVER,
            "host_id": "host-1",
            "claim_token_hash": token_hash(token),
            "pid": 1,
            "process_started_at": 1,
            "ttl_ms": ttl_ms,
        },
    )


def effect_request(
    key: str,
    payload: Any = None,
    policy: str = "idempotent",
    max_attempts: int = 5,
    effect_type: str = "test.effect",
    performer: str = "http.request",
) -> dict[str, Any]:
    return EffectRequest(
        effect_type=effect_type,
        idempotency_key=key,
        payload=BlobValue.of_json({"key": key} if payload is None else payload),
        effect_class="external",
        performer=performer,
        recovery_policy=policy,
        owner_scope="server",
        max_attempts=max_attempts,
    ).model_dump()


def reserve(
    expected_revision: int, *effects: dict[str, Any], source: str = "server", receipt: dict[str, Any] | None = None
) -> Submitted:
    body = {
        "actor": SERVER,
        "source_resource_id": source,
        "expected_revision": expected_revision,
        "effects": list(effects),
    }
    if receipt is not None:
        body["client_receipt"] = receipt
    return submitted("effect.reserve", body)


def claim_effect(token: str, effect_id: str | None = None, ttl_ms: int = 10_000, owner: str = "worker-1") -> Submitted:
    body = {"actor": OUTBOX, "owner_id": owner, "claim_token_hash": token_hash(token), "ttl_ms": ttl_ms}
    if effect_id is not None:
        body["effect_id"] = effect_id
    return submitted("effect.claim", body)


def settle(
    effect_id: str,
    expected_revision: int,
    token: str,
    generation: int,
    settlement: str = "applied",
    owner: str = "worker-1",
    server_epoch: int = 1,
    **extra: Any,
) -> Submitted:
    body = {
        "actor": OUTBOX,
        "effect_id": effect_id,
        "expected_revision": expected_revision,
        "claim": {
            "owner_id": owner,
            "claim_token_hash": token_hash(token),
            "lease_generation": generation,
            "server_epoch": server_epoch,
            "ttl_ms": 10_000,
        },
        "settlement": settlement,
        **extra,
    }
    if settlement == "applied" and "result" not in extra:
        body["result"] = BlobValue.of_json({"ok": True}).model_dump()
    return submitted("effect.settle", body)


def claim_run(token: str = "tok", run_id: str = "run-1", epoch: int = 1, command: str = "start") -> Submitted:
    """A run.claim by the server of ``epoch``: the run's claim and a new runner record."""
    body = {
        "actor": SERVER,
        "run_id": run_id,
        "server_epoch": epoch,
        "owner_id": f"server-{epoch}",
        "claim_token_hash": token_hash(token),
        "ttl_ms": 10_000,
        "launch_command": command,
    }
    return submitted("run.claim", body)


def runner_exited(
    runner_epoch: int,
    outcome: str = "exited",
    by_server: bool = False,
    run_id: str = "run-1",
    crash_backoff_ms: int = 0,
    crash_limit: int = 3,
    park_detail: str | None = None,
) -> Submitted:
    """A runner's end; a death's requeue waits no backoff unless one is given (tests of it do)."""
    body = {
        "actor": SERVER,
        "run_id": run_id,
        "runner_epoch": runner_epoch,
        "outcome": outcome,
        "stopped_by_server": by_server,
        "crash_backoff_ms": crash_backoff_ms,
        "crash_limit": crash_limit,
    }
    if park_detail is not None:
        body["park_detail"] = BlobValue.of_text(park_detail).model_dump()
    return submitted("runner.exited", body)


# WORKFLOWS.md, Run lifecycle: (run status, queue status, claim held, live runner).
LIFECYCLE = {
    ("queued", "queued", False, False),
    ("running", "starting", True, True),
    ("running", "running", True, True),
    ("running", "parked", False, False),
    ("waiting", "parked", False, False),
    ("completed", "done", False, False),
    ("failed", "failed", False, False),
    ("timed_out", "failed", False, False),
    ("cancelled", "cancelled", False, False),
}


def node_start(
    conn: sqlite3.Connection, attempt: int, generation: int, node_path: str = "greet", visit: int = 1
) -> Submitted:
    """A runner's node.start of run-1 under the claim ``claim_run()`` took (its ``generation``)."""
    claim_body = {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": token_hash("tok"),
        "lease_generation": generation,
        "ttl_ms": 10_000,
    }
    (revision,) = conn.execute("SELECT revision FROM resources WHERE resource_id = 'run-1'").fetchone()
    body = {
        "actor": {"actor_class": "runner"},
        "run_id": "run-1",
        "claim": claim_body,
        "expected_revision": revision,
        "node_path": node_path,
        "node_kind": "compute",
        "visit_number": visit,
        "attempt_number": attempt,
    }
    return submitted("node.start", body)


def run_state(executor: GroupExecutor, run_id: str = "run-1") -> tuple[tuple[str, str, bool, bool], str | None]:
    """((run status, queue status, claim held, live runner), park reason), the facts checked against LIFECYCLE."""
    conn = executor.conn
    status, park = conn.execute("SELECT status, park_reason FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    (queue,) = conn.execute("SELECT queue_status FROM run_queue WHERE run_id = ?", (run_id,)).fetchone()
    held = conn.execute("SELECT owner_id IS NOT NULL FROM leases WHERE resource_id = ?", (run_id,)).fetchone()
    live = conn.execute("SELECT count(*) FROM run_workers WHERE run_id = ? AND ended_at IS NULL", (run_id,)).fetchone()
    facts = (status, queue, bool(held and held[0]), bool(live[0]))
    assert facts in LIFECYCLE, facts
    return facts, park


def client_receipt(
    idempotency_key: str, request: Any, client_id: str = "client-1", operation: str = "test.operation"
) -> dict[str, Any]:
    return {
        "client_id": client_id,
        "idempotency_key": idempotency_key,
        "fingerprint": hashlib.sha256(repr(request).encode()).digest(),
        "operation": operation,
    }


def run_group(executor: GroupExecutor, *items: Submitted):
    """Run one group; return the replies in submission order."""
    replies, leftover = executor.run(list(items))
    assert not leftover
    executor.apply_local_effects()  # as the writer loop does right after sending the replies
    by_id = dict(replies)
    return [by_id[item.corr_id] for item in items]


def demo_snapshot() -> dict[str, Any]:
    """The built-in demo's real definition snapshot."""
    from pathlib import Path

    from piworkflows.workflows import discovery

    return discovery.compiled(discovery.resolve("builtin:demo", Path("/"))).snapshot


def run_create(
    run_id: str,
    project: str = "/projects/p1",
    mode: str = "headless",
    session: str | None = None,
    input_value: Any = None,
    receipt: dict[str, Any] | None = None,
    workflow_name: str = "demo",
) -> Submitted:
    """A run.create of the built-in demo workflow (stored under ``workflow_name``)."""
    body: dict[str, Any] = {
        "actor": {"actor_class": "client", "actor_id": "client-1"},
        "run_id": run_id,
        "project_path": project,
        "workflow_name": workflow_name,
        "definition": BlobValue.of_json(demo_snapshot()).model_dump(),
        "source": {"source_kind": "builtin", "builtin_id": "builtin:demo", "builtin_revision": "2"},
        "input": BlobValue.of_json({"who": "tests"} if input_value is None else input_value).model_dump(),
        "title": "demo for tests",
        "max_steps": 20,
        "execution_mode": mode,
        "origin_session_id": session,
    }
    if receipt is not None:
        body["client_receipt"] = receipt
    return submitted("run.create", body)


def effect_row(conn: sqlite3.Connection, effect_id: str) -> dict[str, Any]:
    """An effect's status, schedule, attempt count and settlement columns."""
    cur = conn.execute(
        "SELECT effect_status, available_at, attempt_count, max_attempts, error_code, settled_at, result_digest "
        "FROM effects WHERE effect_id = ?",
        (effect_id,),
    )
    names = [d[0] for d in cur.description]
    return dict(zip(names, cur.fetchone(), strict=True))

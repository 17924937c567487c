"""External effects through the outbox pool: 2 workers perform local HTTP requests.

``--runs`` runs (default 200) of a workflow of ``--nodes`` sequential ``http``
nodes (default 10: 2,000 effects) against a local ledger server that answers
200 at once. Runners execute the runs (``--runners``, default 8, so several
effects wait for the 2 workers at a time); each node reserves its effect, a
worker claims it (numbered attempt), sends the request, and settles it.

``effects_per_s``: effects applied per second, from the first run start to the
last completion. ``commit_to_attempt_p50_ms`` / ``_p99_ms``: from the commit
that reserved an effect (``effects.created_at``) to the commit that recorded
its first attempt (``effect_attempts.started_at``), read from the database
after the server stopped (millisecond timestamps).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import time
from typing import Any

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup, filesystem_of
from stress.bench.runs import wait_idle
from stress.ledger import LedgerServer

WORKFLOW = """
from piworkflows.workflows import define_workflow, edge, http, idempotent_effect
def post(i):
    return lambda ctx: {{"method": "POST", "url": ctx.input["url"], "body": {{"node": i}}}}
workflow = define_workflow("posts", "h0", {{f"h{{i}}": http(effect=idempotent_effect("bench.post"), request=post(i))
                                            for i in range({nodes})}},
                           [edge(f"h{{i}}", f"h{{i + 1}}") for i in range({nodes} - 1)])
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=10, help="http nodes per run")
    parser.add_argument("--runners", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="outbox workers")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def _latencies(paths: StatePaths) -> list[int]:
    conn = sqlite3.connect(f"file:{paths.database}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT a.started_at - e.created_at FROM effects e JOIN effect_attempts a USING (effect_id) "
            "WHERE e.performer = 'http.request' AND a.attempt_number = 1"
        ).fetchall()
        statuses = dict(
            conn.execute(
                "SELECT effect_status, count(*) FROM effects WHERE performer = 'http.request' GROUP BY effect_status"
            ).fetchall()
        )
    finally:
        conn.close()
    if set(statuses) != {"applied"}:
        raise SystemExit(f"not every effect was applied: {statuses}")
    return [row[0] for row in rows]


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        paths = StatePaths.resolve(base / "s")
        project = base / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "posts.workflow.py").write_text(WORKFLOW.format(nodes=args.nodes))
        settings = {"PI_WORKFLOWS_MAX_RUNNERS": str(args.runners), "PI_WORKFLOWS_OUTBOX_WORKERS": str(args.workers)}
        os.environ.update(settings)
        try:
            start_server(paths)
        finally:
            for name in settings:
                del os.environ[name]
        with LedgerServer() as ledger, WorkflowClient(paths.state_dir) as client:
            payload = {"projectPath": str(project), "workflowName": "posts", "input": {"url": ledger.url + "/post"}}
            if client.request("run.start", payload).outcome != "accepted":  # warm-up: runner and resolver start
                raise SystemExit("the warm-up run failed")
            wait_idle(client)
            began = time.perf_counter()
            for _ in range(args.runs):
                if client.request("run.start", payload).outcome != "accepted":
                    raise SystemExit("run.start failed")
            wait_idle(client)
            elapsed = time.perf_counter() - began
            requests = len(ledger.requests)
        stop_server(paths)
        latencies = sorted(_latencies(paths))
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    effects = args.runs * args.nodes
    if requests != effects + args.nodes or len(latencies) != effects + args.nodes:
        raise SystemExit(f"{requests} requests and {len(latencies)} attempts for {effects + args.nodes} effects")
    return {
        "benchmark": "effects",
        "effects": effects,
        "workers": args.workers,
        "runners": args.runners,
        "effects_per_s": round(effects / elapsed, 1),
        "commit_to_attempt_p50_ms": statistics.median(latencies),
        "commit_to_attempt_p99_ms": latencies[int(len(latencies) * 0.99) - 1],
        "filesystem": fstype,
    }

"""Durable run.start acknowledgements through the socket against the same SQL replayed raw.

``run_start_per_s``: 8 client processes each send ``run.start`` of
``builtin:shell-check`` one after another through the real server (socket,
canonical JSON, resolver child, writer, group commit, synchronous=FULL).

``raw_same_statements_per_s``: the exact SQL statements the writer executed
for those run starts (captured with the connection's trace callback, one
command = the statements between its SAVEPOINT and RELEASE), replayed
in-process on a plain sqlite3 connection with the same pragmas on the same
filesystem, one ``BEGIN IMMEDIATE ... COMMIT`` per command.

``ratio_run_start`` = the first over the second (target >= 1.0: group commit
must pay for all of the server's overhead).

``workflows_per_s`` / ``nodes_per_s``: ``--workflows`` runs (default 200) of a
10-node compute workflow started back to back by one client and executed by
4 runners, measured from the first start to the last completion (the client
polls the cheap ``server.status`` counts every 20 ms; every run is checked
``completed`` after the clock stopped). ``dbos_workflows_per_s``: the same
10-step workflow on DBOS Transact (``stress/bench/dbos_side.py``, its own
process, the optional ``bench`` extra), measured in the same invocation;
``ratio_vs_dbos`` = ours / theirs (target >= 2). Without ``dbos`` installed
both print ``null``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.clock import SystemClock
from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.writer import db, schema, viewer_notify
from piworkflows.writer.views import projection
from stress.bench.fs import bench_dir, cleanup, filesystem_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--starts", type=int, default=100, help="run.start requests per client")
    parser.add_argument("--workflows", type=int, default=200, help="10-node workflow runs")
    parser.add_argument("--dir", help="where to create the temporary state dirs (a disk, not tmpfs)")


def _client(state_dir: str, project: str, starts: int, go: Any, out: Any) -> None:
    with WorkflowClient(state_dir) as client:
        client.connect()
        out.put(0)  # ready: started, imported and connected before the clock
        go.wait()
        for n in range(starts):
            payload = {
                "projectPath": project,
                "workflowName": "builtin:shell-check",
                "input": {"command": "true", "n": n},
            }
            response = client.request("run.start", payload)
            if response.outcome != "accepted":
                raise SystemExit(f"run.start answered {response.outcome}: {response.error}")
    out.put(starts)


def _warm_up(paths: StatePaths, project: str) -> None:
    """Before the clock: the resolver children start (a Python start each) on the first requests."""

    def one() -> None:
        with WorkflowClient(paths.state_dir) as client:
            payload = {"projectPath": project, "workflowName": "builtin:shell-check", "input": {"command": "true"}}
            if client.request("run.start", payload).outcome != "accepted":
                raise SystemExit("the warm-up run.start failed")

    threads = [threading.Thread(target=one) for _ in range(Settings().resolvers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure_server(paths: StatePaths, clients: int, starts: int, trace: Path) -> float:
    # Runs are only started here (no runners: execution is measured separately).
    os.environ.update(PI_WORKFLOWS_SQL_TRACE_PATH=str(trace), PI_WORKFLOWS_MAX_RUNNERS="0")
    try:
        start_server(paths)
    finally:
        del os.environ["PI_WORKFLOWS_SQL_TRACE_PATH"], os.environ["PI_WORKFLOWS_MAX_RUNNERS"]
    project = str(paths.state_dir.parent)
    _warm_up(paths, project)
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(str(paths.state_dir), project, starts, go, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        out.get(timeout=120)
    began = time.perf_counter()
    go.set()
    total = sum(out.get(timeout=600) for _ in procs)
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join()
    stop_server(paths)
    return total / elapsed


TEN_NODES = """
from piworkflows.workflows import compute, define_workflow, edge
def step(i):
    return lambda ctx: {"sum": (ctx.outputs.get(f"n{i - 1}") or {"sum": 0})["sum"] + i}
workflow = define_workflow("ten-nodes", "n0", {f"n{i}": compute(step(i)) for i in range(10)},
                           [edge(f"n{i}", f"n{i + 1}") for i in range(9)])
"""


def measure_workflows(paths: StatePaths, count: int) -> tuple[float, float]:
    project = paths.state_dir.parent / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "ten-nodes.workflow.py").write_text(TEN_NODES)
    start_server(paths)
    with WorkflowClient(paths.state_dir) as client:
        payload = {"projectPath": str(project), "workflowName": "ten-nodes"}
        warm_up = [client.request("run.start", payload) for _ in range(4)]  # runner and resolver children start
        wait_idle(client)
        if any(r.outcome != "accepted" for r in warm_up):
            raise SystemExit("the warm-up runs failed")
        began = time.perf_counter()
        for _ in range(count):
            if client.request("run.start", payload).outcome != "accepted":
                raise SystemExit("run.start failed")
        wait_idle(client)
        elapsed = time.perf_counter() - began
        page = client.request("run.list", {"limit": 256}).receipt
        if sum(1 for i in page["items"] if i["display"]["status"] == "completed") != count + len(warm_up):
            raise SystemExit("a benchmark run did not complete")
    stop_server(paths)
    return count / elapsed, count * 10 / elapsed


def measure_dbos(base: Path, count: int) -> dict[str, Any] | None:
    """The DBOS Transact side in its own process, or None without the ``bench`` extra."""
    if importlib.util.find_spec("dbos") is None:
        return None
    directory = base / "dbos"
    directory.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "stress.bench.dbos_side", str(directory), str(count)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def wait_idle(client: WorkflowClient) -> None:
    """Until no run is queued, running, parked or waiting (polling the cheap counts every 20 ms)."""
    while True:
        counts = client.request("server.status").receipt
        if counts["queuedRuns"] + counts["runningRuns"] + counts["parkedRuns"] + counts["waitingRuns"] == 0:
            return
        time.sleep(0.02)


def run_create_commands(trace: Path) -> list[list[str]]:
    """The statements of each command that inserted a run, in commit order."""
    commands, current = [], None
    for line in trace.read_text(encoding="utf-8").splitlines():
        statement = json.loads(line)
        if statement == "SAVEPOINT command":
            current = []
        elif statement == "RELEASE command":
            if current is not None and any(s.startswith("INSERT INTO runs ") for s in current):
                commands.append(current)
            current = None
        elif current is not None and (not current or current[-1] != statement):
            current.append(statement)  # a statement is traced again for each trigger it fires: once here
    return commands


def measure_raw(paths: StatePaths, commands: list[list[str]]) -> float:
    schema.ensure_database(paths, SystemClock().now_ms())
    conn = db.connect(paths, Settings())
    projection.install(conn)  # the writer's temporary triggers, which the statements fire there too
    viewer_notify.install(conn)
    began = time.perf_counter()
    for statements in commands:
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - began
    count = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    conn.close()
    if count != len(commands):
        raise SystemExit(f"the replay made {count} runs of {len(commands)}")
    return len(commands) / elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        trace = base / "writer-sql.trace"
        server_rate = measure_server(StatePaths.resolve(base / "s"), args.clients, args.starts, trace)
        commands = run_create_commands(trace)
        raw_rate = measure_raw(StatePaths.resolve(base / "raw"), commands)
        workflows, nodes = measure_workflows(StatePaths.resolve(base / "w" / "s"), min(args.workflows, 252))
        dbos = measure_dbos(base, min(args.workflows, 252))
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    return {
        "benchmark": "runs",
        "clients": args.clients,
        "run_starts": len(commands),
        "run_start_per_s": round(server_rate, 1),
        "raw_same_statements_per_s": round(raw_rate, 1),
        "ratio_run_start": round(server_rate / raw_rate, 2),
        "statements_per_run_start": round(sum(map(len, commands)) / len(commands), 1),
        "workflows": min(args.workflows, 252),
        "runners": 4,
        "workflows_per_s": round(workflows, 1),
        "nodes_per_s": round(nodes, 1),
        "dbos_workflows_per_s": dbos["workflows_per_s"] if dbos else None,
        "ratio_vs_dbos": round(workflows / dbos["workflows_per_s"], 2) if dbos else None,
        "dbos": dbos["dbos"] if dbos else None,
        "filesystem": fstype,
        "sqlite": sqlite3.sqlite_version,
    }

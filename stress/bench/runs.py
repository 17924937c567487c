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
must pay for all of the server's overhead). The engine issue's second part,
``workflows_per_s``/``nodes_per_s`` against DBOS Transact, needs runners and
is not measured yet.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from piworkflows.client import WorkflowClient, start_server
from piworkflows.clock import SystemClock
from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.writer import db, schema
from stress.bench.fs import bench_dir, cleanup, filesystem_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--starts", type=int, default=100, help="run.start requests per client")
    parser.add_argument("--dir", help="where to create the temporary state dirs (a disk, not tmpfs)")


def _client(state_dir: str, project: str, starts: int, go: Any, out: Any) -> None:
    with WorkflowClient(state_dir) as client:
        client.connect()
        go.wait()
        for n in range(starts):
            payload = {"projectPath": project, "workflowName": "builtin:shell-check", "input": {"command": "true",
                                                                                                  "n": n}}  # fmt: skip
            response = client.request("run.start", payload)
            if response.outcome != "accepted":
                raise SystemExit(f"run.start answered {response.outcome}: {response.error}")
    out.put(starts)


def measure_server(paths: StatePaths, clients: int, starts: int, trace: Path) -> float:
    os.environ["PI_WORKFLOWS_SQL_TRACE_PATH"] = str(trace)
    try:
        start_server(paths)
    finally:
        del os.environ["PI_WORKFLOWS_SQL_TRACE_PATH"]
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    project = str(paths.state_dir.parent)
    procs = [ctx.Process(target=_client, args=(str(paths.state_dir), project, starts, go, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    began = time.perf_counter()
    go.set()
    total = sum(out.get(timeout=600) for _ in procs)
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join()
    with WorkflowClient(paths.state_dir) as client:
        client.request("server.stop")
    while WorkflowClient(paths.state_dir, retry_for=0).running():
        time.sleep(0.05)
    return total / elapsed


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
        elif current is not None:
            current.append(statement)
    return commands


def measure_raw(paths: StatePaths, commands: list[list[str]]) -> float:
    schema.ensure_database(paths, SystemClock().now_ms())
    conn = db.connect(paths, Settings())
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
        "filesystem": fstype,
        "sqlite": sqlite3.sqlite_version,
    }

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
``ratio_vs_dbos`` = ours / theirs (target >= 2.5). Without ``dbos`` installed
both print ``null``.

``cpu_ms_per_start``: the CPU (user + system) each process role spent per acknowledged start
while the clients ran: the supervisor, the writer, the resolver children (psutil, roles from
host.json) and the client processes (their own ``os.times``). ``cpu_ms_per_node``: the same per
executed node of the workflow part, runners included (runs they finished while measured; a
runner that exited in between is not counted).

Everything is measured ``--repeat`` times (default 3) in this one invocation; each figure is the
median of its rounds, each ratio the median of its rounds' ratios (``*_rounds`` lists them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.clock import SystemClock
from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.supervisor import registry
from piworkflows.writer import db, schema, viewer_notify
from piworkflows.writer.views import projection
from stress.bench.fs import bench_dir, cleanup, filesystem_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--starts", type=int, default=100, help="run.start requests per client")
    parser.add_argument("--workflows", type=int, default=200, help="10-node workflow runs")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each figure is their median")
    parser.add_argument("--dir", help="where to create the temporary state dirs (a disk, not tmpfs)")


def _client(state_dir: str, project: str, starts: int, go: Any, out: Any) -> None:
    with WorkflowClient(state_dir) as client:
        client.connect()
        out.put(0)  # ready: started, imported and connected before the clock
        go.wait()
        began = os.times()
        for n in range(starts):
            payload = {
                "projectPath": project,
                "workflowName": "builtin:shell-check",
                "input": {"command": "true", "n": n},
            }
            response = client.request("run.start", payload)
            if response.outcome != "accepted":
                raise SystemExit(f"run.start answered {response.outcome}: {response.error}")
        ended = os.times()
    out.put((starts, (ended.user - began.user) + (ended.system - began.system)))


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


def server_processes(paths: StatePaths) -> list[tuple[psutil.Process, str]]:
    """The server's processes with their roles: the supervisor and every descendant (roles from
    host.json; a descendant it does not record: its parent's; one that ended meanwhile: left out)."""
    roles = {identity.pid: identity.role for identity in registry.live(paths.registry)}
    supervisor = psutil.Process(next(pid for pid, role in roles.items() if role == "supervisor"))
    found = []
    for proc in [supervisor, *supervisor.children(recursive=True)]:
        try:
            found.append((proc, roles.get(proc.pid) or roles.get(proc.ppid(), "other")))
        except psutil.NoSuchProcess:
            continue
    return found


def server_cpu(paths: StatePaths) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of the server's processes: pid -> (role, user + system)."""
    found: dict[int, tuple[str, float]] = {}
    for proc, role in server_processes(paths):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        found[proc.pid] = (role, times.user + times.system)
    return found


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each role spent between two ``server_cpu`` readings (a process that ended in
    between is not counted: runners are off and resolvers are recycled only after 1,000 requests)."""
    spent: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        spent[role] = spent.get(role, 0.0) + seconds - before.get(pid, (role, 0.0))[1]
    return spent


def measure_server(paths: StatePaths, clients: int, starts: int, trace: Path) -> tuple[float, dict[str, float]]:
    """Run starts per second, and the CPU milliseconds per start of each process role."""
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
    cpu_before = server_cpu(paths)
    began = time.perf_counter()
    go.set()
    answers = [out.get(timeout=600) for _ in procs]
    elapsed = time.perf_counter() - began
    spent = cpu_by_role(cpu_before, server_cpu(paths))
    spent["client"] = sum(cpu for _, cpu in answers)
    total = sum(count for count, _ in answers)
    for p in procs:
        p.join()
    stop_server(paths)
    return total / elapsed, {role: round(seconds * 1000 / total, 3) for role, seconds in sorted(spent.items())}


TEN_NODES = """
from piworkflows.workflows import compute, define_workflow, edge
def step(i):
    return lambda ctx: {"sum": (ctx.outputs.get(f"n{i - 1}") or {"sum": 0})["sum"] + i}
workflow = define_workflow("ten-nodes", "n0", {f"n{i}": compute(step(i)) for i in range(10)},
                           [edge(f"n{i}", f"n{i + 1}") for i in range(9)])
"""


def measure_workflows(
    paths: StatePaths, count: int, before_stop: Callable[[StatePaths], None] | None = None
) -> tuple[float, float, dict[str, float]]:
    """Workflows and nodes per second, and the CPU milliseconds per node of each process role
    (``before_stop``: called on the idle server before it stops)."""
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
        cpu_before = server_cpu(paths)
        began = time.perf_counter()
        for _ in range(count):
            if client.request("run.start", payload).outcome != "accepted":
                raise SystemExit("run.start failed")
        wait_idle(client)
        elapsed = time.perf_counter() - began
        spent = cpu_by_role(cpu_before, server_cpu(paths))
        page = client.request("run.list", {"limit": 256}).receipt
        if sum(1 for i in page["items"] if i["display"]["status"] == "completed") != count + len(warm_up):
            raise SystemExit("a benchmark run did not complete")
    if before_stop is not None:
        before_stop(paths)
    stop_server(paths)
    per_node = {role: round(seconds * 1000 / (count * 10), 3) for role, seconds in sorted(spent.items())}
    return count / elapsed, count * 10 / elapsed, per_node


def measure_dbos(base: Path, count: int) -> dict[str, Any] | None:
    """The DBOS Transact side in its own process, or None without the ``bench`` extra."""
    if importlib.util.find_spec("dbos") is None:
        return None
    directory = base / "dbos"
    directory.mkdir(parents=True)
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
    """Each figure is the median of ``--repeat`` measurements in this one invocation, each ratio
    the median of the ratios of its rounds (a server round, then its raw replay; our workflows,
    then DBOS's)."""
    base = bench_dir(args.dir)
    count = min(args.workflows, 252)
    rounds: list[dict[str, Any]] = []
    try:
        for n in range(args.repeat):
            trace = base / f"writer-sql-{n}.trace"
            server_rate, cpu = measure_server(StatePaths.resolve(base / f"s{n}"), args.clients, args.starts, trace)
            commands = run_create_commands(trace)
            raw_rate = measure_raw(StatePaths.resolve(base / f"raw{n}"), commands)
            workflows, nodes, node_cpu = measure_workflows(StatePaths.resolve(base / f"w{n}" / "s"), count)
            dbos = measure_dbos(base / f"d{n}", count)
            rounds.append(
                {
                    "run_start_per_s": server_rate,
                    "raw_same_statements_per_s": raw_rate,
                    "ratio_run_start": server_rate / raw_rate,
                    "cpu_ms_per_start": cpu,
                    "statements": sum(map(len, commands)) / len(commands),
                    "run_starts": len(commands),
                    "workflows_per_s": workflows,
                    "nodes_per_s": nodes,
                    "cpu_ms_per_node": node_cpu,
                    "dbos_workflows_per_s": dbos["workflows_per_s"] if dbos else None,
                    "ratio_vs_dbos": workflows / dbos["workflows_per_s"] if dbos else None,
                    "dbos": dbos["dbos"] if dbos else None,
                }
            )
        fstype = filesystem_of(base)
    finally:
        cleanup(base)

    def median(name: str, digits: int = 1) -> float | None:
        values = [r[name] for r in rounds if r[name] is not None]
        return round(statistics.median(values), digits) if values else None

    roles = sorted({role for r in rounds for role in r["cpu_ms_per_start"]})
    cpu = {role: round(statistics.median(r["cpu_ms_per_start"].get(role, 0.0) for r in rounds), 3) for role in roles}
    node_roles = sorted({role for r in rounds for role in r["cpu_ms_per_node"]})
    node_cpu = {
        role: round(statistics.median(r["cpu_ms_per_node"].get(role, 0.0) for r in rounds), 3) for role in node_roles
    }
    return {
        "benchmark": "runs",
        "repeat": args.repeat,
        "clients": args.clients,
        "run_starts": rounds[0]["run_starts"],
        "run_start_per_s": median("run_start_per_s"),
        "raw_same_statements_per_s": median("raw_same_statements_per_s"),
        "ratio_run_start": median("ratio_run_start", 2),
        "ratio_run_start_rounds": [round(r["ratio_run_start"], 2) for r in rounds],
        "cpu_ms_per_start": cpu | {"total": round(sum(cpu.values()), 3)},
        "statements_per_run_start": median("statements"),
        "workflows": count,
        "runners": 4,
        "workflows_per_s": median("workflows_per_s"),
        "nodes_per_s": median("nodes_per_s"),
        "cpu_ms_per_node": node_cpu | {"total": round(sum(node_cpu.values()), 3)},
        "dbos_workflows_per_s": median("dbos_workflows_per_s"),
        "ratio_vs_dbos": median("ratio_vs_dbos", 2),
        "ratio_vs_dbos_rounds": [round(r["ratio_vs_dbos"], 2) for r in rounds if r["ratio_vs_dbos"] is not None],
        "dbos": rounds[0]["dbos"],
        "filesystem": fstype,
        "sqlite": sqlite3.sqlite_version,
    }

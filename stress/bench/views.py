"""Live views: what watchers of a busy run cost the writer.

One server runs a checkpoint and then a chain of ``--nodes`` compute nodes (each node start and
finish is a commit that changes the run's view), timed from the checkpoint's answer, ``--rounds``
times with no watcher and with ``--watchers`` watchers of the run, alternately (none, watched,
none, watched, ...), so a drift of the machine's load shows in both. Every watcher is a
connection of its own, subscribed (its first snapshot received) before the timing starts; one
thread of the benchmark reads every event of all of them (counted, not parsed).

- ``steps_per_s``: the run's node steps per second, the median of each mode's rounds;
- ``ratio``: watched over unwatched (1.0: the watchers cost the writer nothing);
- ``events``: events the watchers received in all: with ``--watch patches`` (the default) a
  snapshot each, then ``run_patch`` events (the ops of every revision since the last); with
  ``--watch snapshots`` a whole snapshot per change burst.
- ``cpu_s``: CPU seconds (user + system) of each process in each mode, summed over its rounds
  (each timed as the steps are):
  the writer, the supervisor, its other children (runners, resolvers; those that exited counted
  when reaped) and this benchmark (its watcher threads).
"""

from __future__ import annotations

import argparse
import datetime
import os
import selectors
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from piworkflows.protocol import client_v1
from stress.bench.fs import bench_dir, cleanup, filesystem_of

# A checkpoint first (the watchers subscribe while it waits), then the chain.
WORKFLOW = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge
N = {nodes}
nodes = {{f"n{{i}}": compute(lambda ctx, i=i: {{"i": i}}) for i in range(N)}}
nodes["go"] = checkpoint(summary="go?")
edges = [edge("go", "n0")] + [edge(f"n{{i}}", f"n{{i + 1}}") for i in range(N - 1)]
workflow = define_workflow("busy", "go", nodes, edges, max_steps=N + 1)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=200, help="compute nodes in the busy run's chain")
    parser.add_argument("--watchers", type=int, default=100, help="watchers of the run in the watched rounds")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode")
    parser.add_argument(
        "--watch", choices=("patches", "snapshots"), default="patches", help="what the watchers ask for"
    )
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


class _Watchers:
    """``count`` watches of a run, each on its own connection, all read by one thread (a selector)
    until stopped. They count event lines without parsing them: the figure is the server's cost,
    not the benchmark's JSON parsing or thread switching on the same cores."""

    def __init__(self, paths: StatePaths, run_id: str, count: int, patches: bool) -> None:
        self.lines: dict[socket.socket, int] = {}
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        for n in range(count):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(paths.socket))
            request = client_v1.Request(
                requestId=f"req-{n}",
                clientId="bench-watcher",
                operation="view.run.watch",
                idempotencyKey=f"key-{n}",
                payload={"subscriptionId": f"watch-{n}", "patches": patches},
                runId=run_id,
            )
            sock.sendall(client_v1.encode(request))
            sock.setblocking(False)
            self.lines[sock] = 0
            self.selector.register(sock, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stopping:
            for key, _ in self.selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    raise SystemExit("the server closed a watcher's connection")
                self.lines[sock] += data.count(b"\n")

    def wait_subscribed(self, timeout: float = 60.0) -> None:
        """Until every watcher got its hello, its response and its first snapshot."""
        deadline = time.monotonic() + timeout
        while min(self.lines.values()) < 3:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise SystemExit("the watchers were not all subscribed in time")
            time.sleep(0.01)

    @property
    def received(self) -> int:
        """Events received (the hello and the response are not events)."""
        return sum(max(0, lines - 2) for lines in self.lines.values())

    def close(self) -> None:
        self.stopping = True
        self.thread.join(timeout=10)
        self.selector.close()
        for sock in self.lines:
            sock.close()


def _server(paths: StatePaths) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "piworkflows.supervisor" in cmdline and str(paths.state_dir) in cmdline:
            return proc
    raise SystemExit("the benchmark's server is not running")


def _cpu(server: psutil.Process) -> dict[str, float]:
    """CPU seconds so far of the writer, the supervisor, its other children and this process."""
    times = server.cpu_times()
    spent = {
        "writer": 0.0,
        "supervisor": times.user + times.system,
        "children": times.children_user + times.children_system,
    }
    for child in server.children(recursive=True):
        try:
            child_times = child.cpu_times()
            role = "writer" if "piworkflows.writer" in child.cmdline() else "children"
        except psutil.NoSuchProcess:  # exited: counted once its parent reaps it
            continue
        spent[role] += child_times.user + child_times.system
    own = os.times()
    spent["benchmark"] = own.user + own.system
    return spent


def _round(
    paths: StatePaths,
    client: WorkflowClient,
    project: Path,
    nodes: int,
    watchers: int,
    patches: bool,
    server: psutil.Process,
) -> tuple[float, int, dict[str, float]]:
    """One run of the chain, timed from the checkpoint's answer (its watchers are subscribed
    while it waits): its node steps per second, the events its watchers got, and the CPU each
    process spent from the answer to the end."""
    response = client.request("run.start", {"projectPath": str(project), "workflowName": "busy", "input": {}})
    if response.outcome != "accepted":
        raise SystemExit(f"run.start: {response.outcome} {response.error}")
    run_id = response.receipt["runId"]
    while client.request("run.status", {}, run_id=run_id).receipt["display"]["status"] != "waiting":
        time.sleep(0.02)
    watching = _Watchers(paths, run_id, watchers, patches) if watchers else None
    if watching is not None:
        watching.wait_subscribed()
    before = _cpu(server)
    began = time.time()  # wall clock, as the run's finishedAt
    answer = {"nodePath": "go", "answer": {}}
    if client.request("checkpoint.answer", answer, run_id=run_id).outcome != "accepted":
        raise SystemExit("checkpoint.answer was not accepted")
    try:
        while True:
            view = client.request("run.status", {}, run_id=run_id).receipt
            if view["queue"]["finishedAt"] is not None:
                break
            time.sleep(0.2)  # a view read costs the server too: rarely, the same in both modes
        # to the run's own end (the poll's 200 ms would round the time up)
        elapsed = datetime.datetime.fromisoformat(view["queue"]["finishedAt"]).timestamp() - began
        spent = {role: seconds - before[role] for role, seconds in _cpu(server).items()}
        if view["piworkflows"]["status"] != "completed":
            raise SystemExit(f"{run_id} ended {view['piworkflows']['status']}")
    finally:
        if watching is not None:
            watching.close()
    return nodes / elapsed, watching.received if watching else 0, spent


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        load = os.getloadavg()[0]
        paths = StatePaths.resolve(base / "state")
        project = base / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "busy.workflow.py").write_text(WORKFLOW.format(nodes=args.nodes))
        start_server(paths)
        rates: dict[str, list[float]] = {"none": [], "watched": []}
        cpu: dict[str, dict[str, float]] = {"none": {}, "watched": {}}
        events = 0
        patches = args.watch == "patches"
        try:
            server = _server(paths)
            with WorkflowClient(paths.state_dir) as client:
                _round(paths, client, project, args.nodes, 0, patches, server)  # warm-up: imports, the page cache
                for _ in range(args.rounds):
                    for mode, watchers in (("none", 0), ("watched", args.watchers)):
                        rate, got, spent = _round(paths, client, project, args.nodes, watchers, patches, server)
                        for role, seconds in spent.items():
                            cpu[mode][role] = cpu[mode].get(role, 0.0) + seconds
                        rates[mode].append(rate)
                        events += got
        finally:
            stop_server(paths)
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    medians = {mode: round(statistics.median(values), 1) for mode, values in rates.items()}
    return {
        "benchmark": "views",
        "cpus": os.cpu_count(),
        "filesystem": fstype,
        "loadavg_1m_at_start": round(load, 2),
        "nodes": args.nodes,
        "watchers": args.watchers,
        "watch": args.watch,
        "rounds": args.rounds,
        "steps_per_s": medians,
        "ratio": round(medians["watched"] / medians["none"], 3),
        "events": events,
        "cpu_s": {mode: {role: round(seconds, 2) for role, seconds in spent.items()} for mode, spent in cpu.items()},
    }

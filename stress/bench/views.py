"""Live views: what watchers of a busy run cost the writer.

One server runs a checkpoint and then a chain of ``--nodes`` compute nodes (each node start and
finish is a commit that changes the run's view), timed from the checkpoint's answer, ``--rounds``
times with no watcher and with ``--watchers`` watchers of the run, alternately (none, watched,
none, watched, ...), so a drift of the machine's load shows in both. Every watcher is a
connection of its own whose thread reads every event (counted, not parsed).

- ``steps_per_s``: the run's node steps per second, the median of each mode's rounds;
- ``ratio``: watched over unwatched (1.0: the watchers cost the writer nothing);
- ``events``: events the watchers received in all: with ``--watch patches`` (the default) a
  snapshot each, then ``run_patch`` events (the ops of every revision since the last); with
  ``--watch snapshots`` a whole snapshot per change burst.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

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
    """``count`` watches of a run, each on its own connection read by its own thread until
    stopped. They count event lines without parsing them: the figure is the server's cost, not
    the benchmark's JSON parsing on the same cores."""

    def __init__(self, paths: StatePaths, run_id: str, count: int, patches: bool) -> None:
        self.received = 0
        self.lock = threading.Lock()
        self.socks = []
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
            self.socks.append(sock)
        self.threads = [threading.Thread(target=self._read, args=(s,), daemon=True) for s in self.socks]
        for thread in self.threads:
            thread.start()

    def _read(self, sock: socket.socket) -> None:
        lines = 0
        try:
            while data := sock.recv(1 << 20):
                lines += data.count(b"\n")
        except OSError:
            pass
        with self.lock:
            self.received += max(0, lines - 2)  # the hello and the response are not events

    def close(self) -> None:
        for sock in self.socks:
            sock.shutdown(socket.SHUT_RDWR)
        for thread in self.threads:
            thread.join(timeout=10)
        for sock in self.socks:
            sock.close()


def _round(
    paths: StatePaths, client: WorkflowClient, project: Path, nodes: int, watchers: int, patches: bool
) -> tuple[float, int]:
    """One run of the chain, timed from the checkpoint's answer (its watchers are subscribed
    while it waits): its node steps per second, and the events its watchers got."""
    response = client.request("run.start", {"projectPath": str(project), "workflowName": "busy", "input": {}})
    if response.outcome != "accepted":
        raise SystemExit(f"run.start: {response.outcome} {response.error}")
    run_id = response.receipt["runId"]
    while client.request("run.status", {}, run_id=run_id).receipt["display"]["status"] != "waiting":
        time.sleep(0.02)
    watching = _Watchers(paths, run_id, watchers, patches) if watchers else None
    began = time.perf_counter()
    answer = {"nodePath": "go", "answer": {}}
    if client.request("checkpoint.answer", answer, run_id=run_id).outcome != "accepted":
        raise SystemExit("checkpoint.answer was not accepted")
    try:
        while True:
            view = client.request("run.status", {}, run_id=run_id).receipt
            if view["queue"]["finishedAt"] is not None:
                break
            time.sleep(0.2)  # a view read costs the server too: rarely, the same in both modes
        elapsed = time.perf_counter() - began
        if view["piworkflows"]["status"] != "completed":
            raise SystemExit(f"{run_id} ended {view['piworkflows']['status']}")
    finally:
        if watching is not None:
            watching.close()
    return nodes / elapsed, watching.received if watching else 0


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
        events = 0
        patches = args.watch == "patches"
        try:
            with WorkflowClient(paths.state_dir) as client:
                _round(paths, client, project, args.nodes, 0, patches)  # warm-up: the runner's imports, the page cache
                for _ in range(args.rounds):
                    for mode, watchers in (("none", 0), ("watched", args.watchers)):
                        rate, got = _round(paths, client, project, args.nodes, watchers, patches)
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
    }

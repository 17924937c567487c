"""Automatic retention: trees deleted per second, and run.start latency during a sweep.

``trees_per_s``: ``--trees`` (default 10,000) old terminal root-run trees are planted
(``stress/bench/trees.py``: through the writer's own ``run.create``, then made terminal long
ago); a server starts on that state dir and its automatic retention sweeps them, one tree per
transaction with an idle check between trees. Measured from the first tree gone to the last,
as seen by polling ``state.status`` every 50 ms on the socket.

``run_start_p99_ms_during_sweep``: the same planted state again; while the sweep runs, one
client starts a one-node compute workflow every ``--start-every-ms`` (open loop, ``--starts``
of them) and times each ``run.start`` acknowledgement. Every run makes the server busy, so the
sweep stops between trees until the run has finished and continues at the next idle trigger:
what a start waits for is at most the one tree in the writer. ``trees_left_after_load`` shows the
sweep was still going when the last start was answered.
``run_start_p99_ms_baseline``: the same load on a server with nothing to sweep, in the same
invocation; ``ratio_p99`` = during / baseline (only ratios from one run compare).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup, filesystem_of
from stress.bench.runs import wait_idle
from stress.bench.trees import plant

ONE_NODE = """
from piworkflows.workflows import compute, define_workflow
workflow = define_workflow("one-node", "n", {"n": compute(lambda ctx: {"ok": True})}, [])
"""
POLL_S = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trees", type=int, default=10_000)
    parser.add_argument("--starts", type=int, default=200, help="run.start requests during the sweep")
    parser.add_argument("--start-every-ms", type=int, default=50)
    parser.add_argument("--dir", help="where to create the temporary state dirs (a disk, not tmpfs)")


def _runs(client: WorkflowClient) -> int:
    receipt = client.request("state.status").receipt
    return sum(receipt["counts"]["runs"].values())


def measure_sweep(paths: StatePaths, trees: int) -> tuple[float, float]:
    """(trees per second, seconds from the first tree gone to the last)."""
    plant(paths, trees)
    start_server(paths)
    try:
        with WorkflowClient(paths.state_dir) as client:
            first = None
            while (left := _runs(client)) > 0:
                if first is None and left < trees:
                    first, first_left = time.perf_counter(), left
                time.sleep(POLL_S)
            done = time.perf_counter()
    finally:
        stop_server(paths)
    if first is None:  # swept between two polls
        raise SystemExit("the sweep ended before the first poll saw it; plant more trees")
    return first_left / (done - first), done - first


def measure_starts(paths: StatePaths, project: Path, trees: int, starts: int, every_ms: int) -> tuple[list[float], int]:
    """run.start latencies (ms) of an open-loop load, and the planted trees left after it."""
    if trees:
        plant(paths, trees)
    start_server(paths)
    latencies = []
    try:
        with WorkflowClient(paths.state_dir) as client:
            payload = {"projectPath": str(project), "workflowName": "one-node"}
            warm_up = [client.request("run.start", payload) for _ in range(4)]  # resolver and runner children
            if any(response.outcome != "accepted" for response in warm_up):
                raise SystemExit("the warm-up runs failed")
            wait_idle(client)
            if trees:
                while _runs(client) >= trees + len(warm_up):  # the sweep goes on (or has begun)
                    time.sleep(0.005)
            began = time.perf_counter()
            for n in range(starts):
                due = began + n * every_ms / 1000
                time.sleep(max(0.0, due - time.perf_counter()))
                sent = time.perf_counter()
                response = client.request("run.start", payload)
                latencies.append((time.perf_counter() - sent) * 1000)
                if response.outcome != "accepted":
                    raise SystemExit(f"run.start answered {response.outcome}: {response.error}")
            left = _runs(client) - starts - len(warm_up) if trees else 0
    finally:
        stop_server(paths)
    return latencies, left


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        project = base / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "one-node.workflow.py").write_text(ONE_NODE)
        rate, seconds = measure_sweep(StatePaths.resolve(base / "sweep" / "s"), args.trees)
        during, left = measure_starts(
            StatePaths.resolve(base / "during" / "s"), project, args.trees, args.starts, args.start_every_ms
        )
        baseline, _ = measure_starts(
            StatePaths.resolve(base / "baseline" / "s"), project, 0, args.starts, args.start_every_ms
        )
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    return {
        "benchmark": "retention",
        "trees": args.trees,
        "trees_per_s": round(rate, 1),
        "sweep_s": round(seconds, 1),
        "starts": args.starts,
        "start_every_ms": args.start_every_ms,
        "run_start_p50_ms_during_sweep": round(statistics.median(during), 2),
        "run_start_p99_ms_during_sweep": round(p99(during), 2),
        "run_start_p50_ms_baseline": round(statistics.median(baseline), 2),
        "run_start_p99_ms_baseline": round(p99(baseline), 2),
        "ratio_p99": round(p99(during) / p99(baseline), 2),
        "trees_left_after_load": left,
        "filesystem": fstype,
    }

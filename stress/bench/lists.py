"""Run-list pages: what a ``run.list`` page read costs as runs accumulate and as their values grow.

A server with ``PI_WORKFLOWS_MAX_RUNNERS=0`` (its runs stay queued, nothing else writes) gets
``--runs`` runs of one workflow in batches; after each batch, ``--reads`` reads of the first page
(50 items) are timed, unfiltered and with the ``status`` filter, as the client sees them (socket,
supervisor, writer read). Items read a bounded number of rows; ``total``, ``start`` and ``revision``
count the runs the filters admit, so the page grows with the number of runs. A second pass, on a
new server, starts one batch of runs with a ``--big-kib`` KiB input each instead of a small one: a
page reads no payload, so its cost should not change.

- ``page_ms``: runs in the list -> median page read (unfiltered, ``status`` filtered);
- ``ratio_last_to_first``: the median at the last batch over the first (same invocation);
- ``big_input_ratio``: the median after one batch of big inputs over one batch of small ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup, filesystem_of

WORKFLOW = """
from piworkflows.workflows import compute, define_workflow
workflow = define_workflow("listed", "a", {"a": compute(lambda ctx: {"ok": True})})
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=10_000, help="runs in the list at the end")
    parser.add_argument("--batches", type=int, default=4, help="measure after each of these many batches")
    parser.add_argument("--reads", type=int, default=50, help="page reads timed per measurement")
    parser.add_argument("--big-kib", type=int, default=256, help="the input of each run in the second pass")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def _page_ms(client: WorkflowClient, payload: dict[str, Any], reads: int) -> float:
    times = []
    for _ in range(reads):
        began = time.perf_counter()
        response = client.request("run.list", payload)
        times.append((time.perf_counter() - began) * 1000)
        if response.outcome != "accepted":
            raise SystemExit(f"run.list: {response.outcome} {response.error}")
    return round(statistics.median(times), 2)


def _fill(
    paths: StatePaths, project: Path, args: argparse.Namespace, value: Any, batches: int
) -> dict[int, list[float]]:
    """Start the runs batch by batch; after each, the page read medians."""
    found: dict[int, list[float]] = {}
    start = {"projectPath": str(project), "workflowName": "listed", "input": {"v": value}}
    per_batch = args.runs // args.batches
    with WorkflowClient(paths.state_dir) as client:
        for batch in range(1, batches + 1):
            for _ in range(per_batch):
                if client.request("run.start", start).outcome != "accepted":
                    raise SystemExit("run.start was not accepted")
            found[batch * per_batch] = [
                _page_ms(client, {"limit": 50}, args.reads),
                _page_ms(client, {"limit": 50, "status": ["queued"]}, args.reads),
            ]
    return found


def _pass(base: Path, name: str, args: argparse.Namespace, value: Any, batches: int) -> dict[int, list[float]]:
    paths = StatePaths.resolve(base / name)
    project = base / "project"
    (project / ".pi" / "workflows").mkdir(parents=True, exist_ok=True)
    (project / ".pi" / "workflows" / "listed.workflow.py").write_text(WORKFLOW)
    saved = os.environ.get("PI_WORKFLOWS_MAX_RUNNERS")
    os.environ["PI_WORKFLOWS_MAX_RUNNERS"] = "0"  # the runs stay queued: the list changes only by run.start
    try:
        start_server(paths)
    finally:
        if saved is None:
            del os.environ["PI_WORKFLOWS_MAX_RUNNERS"]
        else:
            os.environ["PI_WORKFLOWS_MAX_RUNNERS"] = saved
    try:
        return _fill(paths, project, args, value, batches)
    finally:
        stop_server(paths)


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        load = os.getloadavg()[0]
        small = _pass(base, "small", args, 1, args.batches)
        big = _pass(base, "big", args, "x" * (args.big_kib * 1024), 1)
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    counts = sorted(small)
    return {
        "benchmark": "lists",
        "cpus": os.cpu_count(),
        "filesystem": fstype,
        "loadavg_1m_at_start": round(load, 2),
        "page_ms": {str(n): small[n] for n in counts},
        "ratio_last_to_first": [round(small[counts[-1]][i] / small[counts[0]][i], 2) for i in range(2)],
        "big_input_ratio": [round(big[counts[0]][i] / small[counts[0]][i], 2) for i in range(2)],
        "big_page_ms": big[counts[0]],
        "runs": args.runs,
        "big_kib": args.big_kib,
    }

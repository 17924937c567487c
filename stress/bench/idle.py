"""What an idle server keeps running: its processes and their memory after work, and once idle.

A server starts on a temporary state dir with ``--idle-exit-ms`` as
``PI_WORKFLOWS_CHILD_IDLE_EXIT_MS`` (the default is a minute). It runs ``builtin:shell-check``
(a resolver child loads it, a runner executes it, an outbox worker runs its command) and then
nothing. The server's processes (the supervisor and every descendant, roles from host.json) are
counted twice:

- ``after_work``: as soon as the run completed;
- ``idle``: once no outbox worker, resolver or runner child is left, or after ten times the idle
  exit (those left are in ``by_role``);

each with ``processes``, ``by_role`` and ``rss_mib`` (resident memory of them all, MiB).
``idle_rss_share`` = idle ``rss_mib`` / after-work ``rss_mib``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import psutil

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup
from stress.bench.runs import server_processes, wait_idle

IDLE_EXIT = "PI_WORKFLOWS_CHILD_IDLE_EXIT_MS"
SHORT_LIVED = ("outbox", "resolver", "runner")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--idle-exit-ms", type=int, default=2000, help="how long idle children live")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def processes(paths: StatePaths) -> dict[str, Any]:
    """The server's processes now: how many, by role, and their resident memory."""
    by_role: dict[str, int] = {}
    rss = 0
    for proc, role in server_processes(paths):
        try:
            rss += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        by_role[role] = by_role.get(role, 0) + 1
    return {"processes": sum(by_role.values()), "by_role": by_role, "rss_mib": round(rss / 2**20, 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    paths = StatePaths.resolve(base / "s")
    os.environ[IDLE_EXIT] = str(args.idle_exit_ms)
    try:
        start_server(paths)
        with WorkflowClient(paths.state_dir) as client:
            payload = {"projectPath": str(base), "workflowName": "builtin:shell-check", "input": {"command": "true"}}
            if client.request("run.start", payload).outcome != "accepted":
                raise SystemExit("run.start failed")
            wait_idle(client)
            after_work = processes(paths)
            deadline = time.monotonic() + 10 * args.idle_exit_ms / 1000
            while any(processes(paths)["by_role"].get(role) for role in SHORT_LIVED) and time.monotonic() < deadline:
                time.sleep(0.1)
            idle = processes(paths)
        stop_server(paths)
    finally:
        del os.environ[IDLE_EXIT]
        cleanup(base)
    return {
        "benchmark": "idle",
        "idle_exit_ms": args.idle_exit_ms,
        "after_work": after_work,
        "idle": idle,
        "idle_rss_share": round(idle["rss_mib"] / after_work["rss_mib"], 2),
    }

"""Round trips of ``server.status`` through the client socket.

A real server (supervisor + writer) on a fresh state dir; client processes
each open one connection and send requests one after another, timing each
round trip. Reported for 8 concurrent clients (``server_requests_per_s``,
``p50_ms``, ``p99_ms``) and for one client (``single_*``). Durable command
throughput through the socket is measured by the ``runs`` benchmark.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup, filesystem_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=500, help="requests per client")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def _client(state_dir: str, requests: int, start: Any, out: Any) -> None:
    latencies = []
    with WorkflowClient(state_dir) as client:
        client.connect()
        start.wait()
        for _ in range(requests):
            began = time.perf_counter()
            response = client.request("server.status")
            latencies.append(time.perf_counter() - began)
            if response.outcome != "accepted":
                raise SystemExit(f"server.status answered {response.outcome}")
    out.put(latencies)


def _measure(state_dir: Path, clients: int, requests: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(str(state_dir), requests, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    began = time.perf_counter()
    start.set()
    latencies = [lat for _ in procs for lat in out.get(timeout=600)]
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join()
    latencies.sort()
    return {
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    paths = StatePaths.resolve(base / "s")
    try:
        start_server(paths)
        try:
            many = _measure(paths.state_dir, args.clients, args.requests)
            single = _measure(paths.state_dir, 1, args.requests)
        finally:
            stop_server(paths)
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    return {
        "benchmark": "server",
        "clients": args.clients,
        "requests_per_client": args.requests,
        "server_requests_per_s": many["requests_per_s"],
        "p50_ms": many["p50_ms"],
        "p99_ms": many["p99_ms"],
        "single_requests_per_s": single["requests_per_s"],
        "single_p50_ms": single["p50_ms"],
        "single_p99_ms": single["p99_ms"],
        "filesystem": fstype,
    }

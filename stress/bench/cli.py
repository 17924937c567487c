"""The CLI's read commands against a bare Python start, measured in the same run.

A server is started on a temporary state dir with ``--runs`` finished runs of ``builtin:shell-check``.
Each command is then run ``--repeat`` times as a new process, alternating with a bare
``python -c pass`` of the same interpreter, and timed from spawn to exit (wall clock):

- ``python_startup_ms``: the bare start, the floor every command pays;
- ``cli_runs_ms``: ``pi-workflows runs`` (one page of the run list);
- ``cli_run_status_ms``: ``pi-workflows run status RUN_ID`` (one run's view);
- ``cli_help_ms``: ``pi-workflows --help`` (no server contacted: imports and click alone).

Each figure is the median of its timings; ``ratio_cli_runs`` = ``cli_runs_ms / python_startup_ms``
(target <= 4). ``--importtime`` also prints the ten slowest imports of ``pi-workflows runs``
(``python -X importtime``, cumulative microseconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup, filesystem_of
from stress.bench.runs import wait_idle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=15, help="timings of each command")
    parser.add_argument("--runs", type=int, default=20, help="finished runs in the listed state")
    parser.add_argument("--importtime", action="store_true", help="also print the slowest imports")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def _timed(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - began) * 1000


def _cli(paths: StatePaths, *args: str) -> list[str]:
    """The installed ``pi-workflows`` script, run by this interpreter (as its shebang does)."""
    script = Path(sys.executable).parent / "pi-workflows"
    return [sys.executable, str(script), "--state-dir", str(paths.state_dir), *args]


def slowest_imports(argv: list[str], env: dict[str, str], count: int = 10) -> list[tuple[str, int]]:
    """The ``count`` imports with the largest cumulative time (microseconds) of one command."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True, check=True)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((name.strip(), int(cumulative)))
    return sorted(rows, key=lambda row: -row[1])[:count]


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    paths = StatePaths.resolve(base / "s")
    env = dict(os.environ)
    try:
        start_server(paths)
        with WorkflowClient(paths.state_dir) as client:
            payload = {"projectPath": str(base), "workflowName": "builtin:shell-check", "input": {"command": "true"}}
            run_ids = [client.request("run.start", payload).receipt["runId"] for _ in range(args.runs)]
            wait_idle(client)
        commands = {
            "cli_runs_ms": _cli(paths, "runs"),
            "cli_run_status_ms": _cli(paths, "run", "status", run_ids[-1]),
            "cli_help_ms": _cli(paths, "--help"),
        }
        bare = [sys.executable, "-c", "pass"]
        timings: dict[str, list[float]] = {name: [] for name in ["python_startup_ms", *commands]}
        for _ in range(args.repeat):  # alternating: the machine's noise reaches every figure alike
            timings["python_startup_ms"].append(_timed(bare, env))
            for name, argv in commands.items():
                timings[name].append(_timed(argv, env))
        imports = slowest_imports(commands["cli_runs_ms"], env) if args.importtime else None
        stop_server(paths)
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    medians = {name: round(statistics.median(values), 1) for name, values in timings.items()}
    result: dict[str, Any] = {
        "benchmark": "cli",
        "repeat": args.repeat,
        **medians,
        "ratio_cli_runs": round(medians["cli_runs_ms"] / medians["python_startup_ms"], 2),
        "ratio_cli_run_status": round(medians["cli_run_status_ms"] / medians["python_startup_ms"], 2),
        "filesystem": fstype,
    }
    if imports is not None:
        result["slowest_imports_us"] = dict(imports)
    return result

"""Shell streams kept whole: what storing and reading back a large stdout costs.

One workflow, one ``shell`` node whose command writes ``--mib`` MiB of text lines to stdout (or
nothing). Runs alternate between the loud command and the quiet one (``--repeat`` each, after a
warm-up of both), one at a time, each timed from ``run.start`` to its completion as seen by
polling ``run.status`` every 5 ms. The loud run's outbox worker stores the stream as a
content-addressed blob in parts (``blob.put_part``) before it settles; the settlement links it to
the run.

- ``quiet_run_s`` / ``loud_run_s``: medians of the run times;
- ``capture_mib_per_s``: ``--mib`` over the difference of the two medians (what the stream costs
  beyond the run itself, the command's own time included);
- ``read_mib_per_s``: the loud stdout read back as ``pi-workflows run logs`` does (``run.logs``
  content parts of 256 KiB, verified against the digest), median over the loud runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from piworkflows.cli.logs import read_content
from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup, filesystem_of

WORKFLOW = """
from piworkflows.workflows import define_workflow, idempotent_effect, shell
LOUD = 'yes "a line of text that the command writes to its stdout, again and again" | head -c "$1"'
workflow = define_workflow("talk", "talk", {
    "talk": shell(effect=idempotent_effect("bench.talk"), max_output_chars=100,
                  exec=lambda ctx: {"command": "sh", "args": ["-c", LOUD, "sh", str(ctx.input["bytes"])]}),
})
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=int, default=16, help="stdout of the loud command")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def _run(client: WorkflowClient, payload: dict[str, Any]) -> tuple[float, str]:
    began = time.perf_counter()
    receipt = client.request("run.start", payload)
    if receipt.outcome != "accepted":
        raise SystemExit(f"run.start: {receipt.outcome}")
    run_id = receipt.receipt["runId"]
    while True:
        status = client.request("run.status", run_id=run_id).receipt["display"]["status"]
        if status == "completed":
            return time.perf_counter() - began, run_id
        if status in ("failed", "cancelled"):
            raise SystemExit(f"run {run_id} {status}")
        time.sleep(0.005)


def _read_stdout(client: WorkflowClient, run_id: str) -> tuple[float, int]:
    """The seconds to read the run's stdout back as ``run logs`` does (verified parts), and its length."""

    def ask(operation: str, payload: dict[str, Any]) -> Any:
        return client.request(operation, payload, run_id=run_id).receipt

    began = time.perf_counter()
    (step,) = ask("run.logs", {})["steps"]
    data = read_content(ask, step["streams"]["stdout"])
    return time.perf_counter() - began, len(data)


def measure(
    paths: StatePaths, project: Path, size: int, repeat: int, quiet: list[float], loud: list[float], reads: list[float]
) -> None:
    """Alternate the quiet and the loud run ``repeat`` times each (after a warm-up of both)."""
    with WorkflowClient(paths.state_dir) as client:
        payloads = {n: {"projectPath": str(project), "workflowName": "talk", "input": {"bytes": n}} for n in (0, size)}
        _run(client, payloads[0])  # warm-up: runner, resolver and outbox worker start
        _run(client, payloads[size])
        for _ in range(repeat):
            quiet.append(_run(client, payloads[0])[0])
            seconds, run_id = _run(client, payloads[size])
            loud.append(seconds)
            read_s, length = _read_stdout(client, run_id)
            if length != size:
                raise SystemExit(f"read back {length} bytes of {size}")
            reads.append(read_s)


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    size = args.mib * 1024 * 1024
    try:
        paths = StatePaths.resolve(base / "s")
        project = base / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "talk.workflow.py").write_text(WORKFLOW)
        start_server(paths)
        quiet, loud, reads = [], [], []
        try:
            measure(paths, project, size, args.repeat, quiet, loud, reads)
        finally:
            stop_server(paths)  # also when a run failed: never a server left behind on a deleted dir
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    quiet_s, loud_s = statistics.median(quiet), statistics.median(loud)
    return {
        "benchmark": "logs",
        "mib": args.mib,
        "runs": args.repeat,
        "quiet_run_s": round(quiet_s, 3),
        "loud_run_s": round(loud_s, 3),
        "capture_mib_per_s": round(args.mib / (loud_s - quiet_s), 1) if loud_s > quiet_s else None,
        "read_mib_per_s": round(args.mib / statistics.median(reads), 1),
        "filesystem": fstype,
    }

"""Agent steps on the real Pi against a scripted model that answers at once: where a step's time goes.

``--runs`` runs (default 5, after ``--warmup`` 1), one after another, of a workflow of ``--nodes``
agent nodes (default 5) then a compute node, with the server's default settings. The model
answers every prompt at once with the workflow tool's submission (validated against the node's
JSON Schema by a resolver child). Each step's points, from durable rows (read after the server
stopped) and the host's timing line in server.log (agents/host.py TIMING, epoch ms):

    started     node_attempts.started_at           C1 node.start
    requested   interactive_requests.created_at    C2 node.request_agent
    opened      session_segments.started_at        C3 agent.open
    launch      host log "launch read"             the host runs and read its launch
    ready       host log "Pi ready"                Pi answered get_state
    prompt      host log "first prompt written"    the step's RPC prompt written
    submitted   interactive_submissions.created_at C10 interaction.submit
    settled     interactive_submissions.settled_at C11 interaction.settle (accepted)
    next        the next attempt's started_at      its node.started

Intervals: request (started -> requested), scheduling (-> opened), spawn (-> launch), pi_ready
(-> ready: Pi's start-up), send (-> prompt), c2_to_prompt (requested -> prompt), model_turn
(prompt -> submitted: Pi and the model), validation (-> settled), c11_to_next (settled ->
next), wall (started -> next). ``server_share_pct``: (wall - pi_ready - model_turn) / wall, the
server's own part of a step. Each figure is the p50 and p95 over a run's steps, then the median
of those over the runs.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sqlite3
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from piworkflows.agents.pi import find_pi
from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.testing.scripted_model import PROVIDER, ScriptedModel
from stress.bench.fs import bench_dir, cleanup, filesystem_of

WORKFLOW = """
from piworkflows.workflows import agent, compute, define_workflow, edge

SCHEMA = {{"type": "object", "required": ["summary"], "properties": {{"summary": {{"type": "string"}}}}}}
nodes = {{f"a{{i}}": agent(prompt=f"Carry out part {{i}}.", expected_output=SCHEMA) for i in range({nodes})}}
nodes["done"] = compute(run=lambda ctx: {{"steps": len(ctx.outputs)}})
workflow = define_workflow(
    name="agent-steps",
    start_at="a0",
    nodes=nodes,
    edges=[edge(f"a{{i}}", f"a{{i + 1}}") for i in range({nodes} - 1)] + [edge("a{last}", "done")],
)
"""
MODEL = "bench"
SUBMIT = {
    "tool_calls": [
        {
            "name": "workflow",
            "arguments": {"action": "submit", "requestId": "${requestId}", "output": {"summary": "done"}},
        }
    ]
}
INTERVALS = {
    "request": ("started", "requested"),
    "scheduling": ("requested", "opened"),
    "spawn": ("opened", "launch"),
    "pi_ready": ("launch", "ready"),
    "send": ("ready", "prompt"),
    "c2_to_prompt": ("requested", "prompt"),
    "model_turn": ("prompt", "submitted"),
    "validation": ("submitted", "settled"),
    "c11_to_next": ("settled", "next"),
    "wall": ("started", "next"),
}
_TIMING = re.compile(r"segment (segment-[0-9a-f]+) closes: .*\(epoch ms: ([^)]*)\)")
HOST_POINTS = {"launch read": "launch", "Pi ready": "ready", "first prompt written": "prompt"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="measured runs (one after another)")
    parser.add_argument("--nodes", type=int, default=5, help="agent nodes per run")
    parser.add_argument("--warmup", type=int, default=1, help="runs first, not measured")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def host_timing(lines: Iterable[str]) -> dict[str, dict[str, int]]:
    """segment id -> the host's start-up points (epoch ms) from its close line (server.log's lines)."""
    found = {}
    for line in lines:
        match = _TIMING.search(line)
        if match:
            points = dict(item.rsplit(" ", 1) for item in match.group(2).split(", ") if item)
            found[match.group(1)] = {HOST_POINTS[k]: int(v) for k, v in points.items() if k in HOST_POINTS}
    return found


def steps_of(database: Path, log: Path) -> dict[str, list[dict[str, int]]]:
    """run id -> its agent steps' points, in step order."""
    timing = host_timing(log.read_text(encoding="utf-8", errors="replace").splitlines())
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT a.run_id, a.attempt_id, a.node_kind, a.started_at, r.created_at, "
            "(SELECT min(g.started_at) FROM session_segments g WHERE g.attempt_id = a.attempt_id), "
            "(SELECT group_concat(g.segment_id) FROM session_segments g WHERE g.attempt_id = a.attempt_id), "
            "s.created_at, s.settled_at "
            "FROM run_steps t JOIN node_attempts a USING (attempt_id) "
            "LEFT JOIN interactive_requests r ON r.attempt_id = a.attempt_id "
            "LEFT JOIN interactive_submissions s ON s.submission_id = r.accepted_submission_id "
            "ORDER BY a.run_id, t.step_index"
        ).fetchall()
    finally:
        conn.close()
    by_run: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_run.setdefault(row[0], []).append(row)
    steps: dict[str, list[dict[str, int]]] = {}
    for run_id, attempts in by_run.items():
        for here, after in zip(attempts, attempts[1:], strict=False):
            _, _, kind, started, requested, opened, segments, submitted, settled = here
            if kind != "agent":
                continue
            if segments is None or "," in segments or segments not in timing or settled is None:
                raise SystemExit(f"{run_id}: an agent step without exactly one segment and an accepted submission")
            points = {"started": started, "requested": requested, "opened": opened, **timing[segments]}
            points.update(submitted=submitted, settled=settled, next=after[3])
            steps.setdefault(run_id, []).append(points)
    return steps


def _percentile(values: list[float], fraction: float) -> float:
    """Nearest rank (the p95 of five values is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * fraction) - 1)]


def figures(runs: list[list[dict[str, int]]]) -> dict[str, dict[str, float]]:
    """Per interval (and the server's share): the median over the runs of each run's p50 and p95."""
    per_run: dict[str, list[tuple[float, float]]] = {}
    for steps in runs:
        values: dict[str, list[float]] = {name: [] for name in [*INTERVALS, "server_share_pct"]}
        for points in steps:
            spans = {name: float(points[end] - points[start]) for name, (start, end) in INTERVALS.items()}
            for name, span in spans.items():
                values[name].append(span)
            server = spans["wall"] - spans["pi_ready"] - spans["model_turn"]
            values["server_share_pct"].append(100 * server / spans["wall"])
        for name, found in values.items():
            per_run.setdefault(name, []).append((_percentile(found, 0.5), _percentile(found, 0.95)))
    return {
        name: {
            "p50": round(statistics.median(p50 for p50, _ in pairs), 1),
            "p95": round(statistics.median(p95 for _, p95 in pairs), 1),
        }
        for name, pairs in per_run.items()
    }


def _finish(client: WorkflowClient, payload: dict[str, Any]) -> str:
    response = client.request("run.start", payload)
    if response.outcome != "accepted":
        raise SystemExit(f"run.start: {response.outcome} {response.error}")
    run_id = str(response.receipt["runId"])
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        view = client.request("run.status", run_id=run_id).receipt
        if view["queue"]["finishedAt"] is not None:
            if view["piworkflows"]["status"] != "completed":
                raise SystemExit(f"{run_id} ended {view['piworkflows']['status']}: {view['state'].get('error')}")
            return run_id
        time.sleep(0.05)
    raise SystemExit(f"{run_id} did not end within 600 s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    pi = find_pi(Settings.from_env())
    if pi is None:
        raise SystemExit("the agents benchmark needs Pi: run 'pi-workflows setup pi' or set PI_WORKFLOWS_PI_COMMAND")
    base = bench_dir(args.dir)
    try:
        paths = StatePaths.resolve(base / "s")
        project = base / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        source = WORKFLOW.format(nodes=args.nodes, last=args.nodes - 1)
        (project / ".pi" / "workflows" / "agent-steps.workflow.py").write_text(source)
        with ScriptedModel({MODEL: [SUBMIT]}, cycle=True) as model:
            settings = {
                "PI_WORKFLOWS_PI_COMMAND": pi,
                "PI_CODING_AGENT_DIR": str(model.write_pi_config(base / "pi-agent")),
                "PI_WORKFLOWS_AGENT_MODEL": f"{PROVIDER}/{MODEL}",
                "PI_WORKFLOWS_CONFIG_DIR": str(base / "config"),
            }
            saved = {name: os.environ.get(name) for name in settings}
            os.environ.update(settings)
            try:
                start_server(paths)
            finally:
                for name, value in saved.items():
                    if value is None:
                        del os.environ[name]
                    else:
                        os.environ[name] = value
            load = os.getloadavg()[0]
            try:
                with WorkflowClient(paths.state_dir) as client:
                    payload = {"projectPath": str(project), "workflowName": "agent-steps", "input": {}}
                    for _ in range(args.warmup):
                        _finish(client, payload)
                    measured = [_finish(client, payload) for _ in range(args.runs)]
            finally:
                stop_server(paths)
            requests = len(model.requests)
        steps = steps_of(paths.database, paths.log)
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    runs = [steps[run_id] for run_id in measured]
    if any(len(found) != args.nodes for found in runs) or requests != args.nodes * (args.runs + args.warmup):
        raise SystemExit(f"expected {args.nodes} steps a run and one model request a step ({requests} requests)")
    found = figures(runs)
    return {
        "benchmark": "agents",
        "runs": args.runs,
        "nodes": args.nodes,
        "server_share_pct": found.pop("server_share_pct"),
        "ms": found,
        "loadavg_1m_at_start": round(load, 2),
        "cpus": os.cpu_count(),
        "filesystem": fstype,
    }

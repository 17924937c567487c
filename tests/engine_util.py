"""Helpers of the engine's integration tests: workflows on disk, runs started and watched through the client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server_util import ServerProcess, wait_until

# Nine computes adding 0..8 and a final notification: "sum=36".
TENSTEP = """
from piworkflows.workflows import compute, define_workflow, edge, notify
def add(i):
    return lambda ctx: {"sum": (ctx.outputs.get(f"n{i - 1}") or {"sum": 0})["sum"] + i}
nodes = {f"n{i}": compute(add(i)) for i in range(9)}
nodes["done"] = notify(kind="final", message=lambda ctx: f"sum={ctx.outputs['n8']['sum']}")
edges = [edge(f"n{i}", f"n{i + 1}") for i in range(8)] + [edge("n8", "done")]
workflow = define_workflow("tenstep", "n0", nodes, edges)
"""

# The second node waits for a flag file (polling with a deadline), so a test can act while it runs.
BLOCKING = """
import os, time
from piworkflows.workflows import compute, define_workflow, edge
def wait_for_flag(ctx):
    deadline = time.monotonic() + 60
    while not os.path.exists(ctx.input["flag"]):
        if time.monotonic() > deadline:
            raise TimeoutError("no flag")
        time.sleep(0.02)
    return {"waited": True}
workflow = define_workflow("blocking", "first", {
    "first": compute(lambda ctx: {"first": True}),
    "wait": compute(wait_for_flag),
    "last": compute(lambda ctx: {"done": ctx.outputs["wait"]["waited"]}),
}, [edge("first", "wait"), edge("wait", "last")])
"""

# A checkpoint between two computes; the answer {"go": true|false} picks the branch.
CHECKPOINT = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge, switch
workflow = define_workflow("ask", "prepare", {
    "prepare": compute(lambda ctx: {"question": "go on?"}),
    "ask": checkpoint(summary=lambda ctx: ctx.outputs["prepare"]["question"]),
    "yes": compute(lambda ctx: {"answered": ctx.outputs["ask"]["go"]}),
    "no": compute(lambda ctx: {"answered": False}),
}, [edge("prepare", "ask"), switch("ask", on="$.go", cases={"true": "yes", "false": "no"})])
"""


def write(project: Path, name: str, source: str) -> None:
    """A project workflow file ``<name>.workflow.py``."""
    (project / ".pi" / "workflows" / f"{name}.workflow.py").write_text(source)


def start(server: ServerProcess, project: Path, name: str, input_value: Any = None) -> str:
    with server.client() as client:
        response = client.request(
            "run.start", {"projectPath": str(project), "workflowName": name, "input": input_value or {}}
        )
    assert response.outcome == "accepted", response
    return str(response.receipt["runId"])


def view(server: ServerProcess, run_id: str) -> dict[str, Any]:
    """The run-view object (run.status)."""
    with server.client() as client:
        response = client.request("run.status", {}, run_id=run_id)
    assert response.outcome == "accepted", response
    return dict(response.receipt)


def wait_status(server: ServerProcess, run_id: str, *statuses: str) -> dict[str, Any]:
    """Poll the run view until its display status is one of ``statuses``."""
    return wait_until(
        lambda: (v := view(server, run_id))["display"]["status"] in statuses and v, what=f"run {statuses}"
    )


def blocked_in_wait(server: ServerProcess, run_id: str) -> bool:
    """The BLOCKING workflow's ``wait`` node is the run's running step."""
    steps = view(server, run_id)["steps"]["items"]
    return bool(steps) and steps[-1]["nodePath"] == "wait" and steps[-1]["status"] == "running"

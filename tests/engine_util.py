"""Helpers of the engine's integration tests: workflows on disk, runs started and watched through the
client, and the rows (read-only) of a run's nodes and effects."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from piworkflows.protocol import client_v1
from tests.server_util import ServerProcess, query, wait_until

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

# One http node (its URL from the run input), then a compute that hands its output on.
HTTP = """
from piworkflows.workflows import compute, define_workflow, edge, http, idempotent_effect, manual_effect
workflow = define_workflow({name!r}, "call", {{
    "call": http(effect={effect}, timeout_ms={timeout_ms},
                 request=lambda ctx: {{"method": "POST", "url": ctx.input["url"], "headers": {headers},
                                       "body": {{"order": ctx.input.get("order", 1)}}}}),
    "after": compute(lambda ctx: {{"call": ctx.outputs["call"]}}),
}}, [edge("call", "after")])
"""

CLIENT_ID = "client-engine-tests"  # one client: an idempotency key is scoped to its client


def write(project: Path, name: str, source: str) -> None:
    """A project workflow file ``<name>.workflow.py``."""
    (project / ".pi" / "workflows" / f"{name}.workflow.py").write_text(source)


def http_workflow(
    project: Path,
    name: str,
    effect: str = 'idempotent_effect("test.http")',
    timeout_ms: int = 5000,
    headers: dict[str, Any] | None = None,
) -> None:
    """The HTTP workflow as ``<name>.workflow.py``."""
    write(project, name, HTTP.format(name=name, effect=effect, timeout_ms=timeout_ms, headers=repr(headers or {})))


def start(server: ServerProcess, project: Path, name: str, input_value: Any = None) -> str:
    with server.client() as client:
        response = client.request(
            "run.start", {"projectPath": str(project), "workflowName": name, "input": input_value or {}}
        )
    assert response.outcome == "accepted", response
    return str(response.receipt["runId"])


def request(server: ServerProcess, operation: str, payload: Any, **kwargs: Any) -> client_v1.Response:
    """One client request; a repeat under the same idempotency key comes from the same client."""
    with server.client(client_id=CLIENT_ID) as client:
        return client.request(operation, payload, **kwargs)


def view(server: ServerProcess, run_id: str) -> dict[str, Any]:
    """The run-view object (run.status)."""
    with server.client() as client:
        response = client.request("run.status", {}, run_id=run_id)
    assert response.outcome == "accepted", response
    return dict(response.receipt)


def wait_status(server: ServerProcess, run_id: str, *statuses: str) -> dict[str, Any]:
    """Poll the run view until its display status is one of ``statuses``."""
    reached: dict[str, Any] = wait_until(
        lambda: (v := view(server, run_id))["display"]["status"] in statuses and v, what=f"run {statuses}"
    )
    return reached


def start_blocked(server: ServerProcess, project: Path, flag: Path) -> str:
    """Start the BLOCKING workflow (as ``blocking``) and wait until its ``wait`` node runs: it goes on
    once ``flag`` exists. Returns the run id."""
    write(project, "blocking", BLOCKING)
    run_id = start(server, project, "blocking", {"flag": str(flag)})
    wait_until(lambda: blocked_in_wait(server, run_id), what="the wait node running")
    return run_id


def start_waiting(server: ServerProcess, project: Path) -> str:
    """Start the CHECKPOINT workflow (as ``ask``) and wait until it waits for an answer at its node ``ask``.
    Returns the run id."""
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    return run_id


def blocked_in_wait(server: ServerProcess, run_id: str) -> bool:
    """The BLOCKING workflow's ``wait`` node is the run's running step."""
    steps = view(server, run_id)["state"]["steps"]
    return bool(steps) and steps[-1]["nodeId"] == "wait" and steps[-1]["status"] == "running"


def parked_ambiguous(server: ServerProcess, run_id: str) -> dict[str, Any]:
    """Poll the run view until the run is parked for an ambiguous effect."""
    parked: dict[str, Any] = wait_until(
        lambda: (v := view(server, run_id))["piworkflows"]["parkReason"] == "effectAmbiguous" and v,
        what="run parked effectAmbiguous",
    )
    return parked


# --- rows of a run, read straight from the state database ------------------------------------


def run_phases(server: ServerProcess, run_id: str) -> tuple[str, str | None, str]:
    """(runs.status, runs.park_reason, run_queue.queue_status)."""
    rows = query(
        server,
        "SELECT r.status, r.park_reason, q.queue_status FROM runs r JOIN run_queue q USING (run_id) WHERE run_id = ?",
        run_id,
    )
    assert len(rows) == 1, rows
    return rows[0]


def node_attempts(server: ServerProcess, run_id: str, node_path: str) -> list[tuple[int, str]]:
    """(attempt_number, attempt_status) of the node's attempts, visit by visit."""
    return query(
        server,
        "SELECT attempt_number, attempt_status FROM node_attempts WHERE run_id = ? "
        "AND node_path = ? ORDER BY visit_number, attempt_number",
        run_id,
        node_path,
    )


def effect_row(server: ServerProcess, run_id: str) -> dict[str, Any]:
    """The run's only outside effect (its node's; local ones such as a queue settlement are the writer's)."""
    rows = query(
        server,
        "SELECT effect_id, effect_type, idempotency_key, effect_status, recovery_policy, "
        "attempt_count, error_code FROM effects WHERE run_id = ? AND effect_class = 'external'",
        run_id,
    )
    assert len(rows) == 1, rows
    keys = ("effectId", "type", "key", "status", "policy", "attempts", "errorCode")
    return dict(zip(keys, rows[0], strict=True))


def effect_attempts(server: ServerProcess, run_id: str) -> list[tuple[int, str]]:
    """(attempt_number, attempt_status) of the run's outside effect's numbered attempts."""
    return query(
        server,
        "SELECT a.attempt_number, a.attempt_status FROM effect_attempts a "
        "JOIN effects e USING (effect_id) WHERE e.run_id = ? AND e.effect_class = 'external' "
        "ORDER BY a.attempt_number",
        run_id,
    )


def effect_content(server: ServerProcess, run_id: str, field: Literal["result", "error"]) -> tuple[str, bytes]:
    """The media type and bytes of the stored result (or error) of the run's outside effect."""
    rows = query(
        server,
        f"SELECT b.media_type, b.bytes FROM effects e JOIN blobs b ON b.digest = e.{field}_digest "
        "WHERE e.run_id = ? AND e.effect_class = 'external'",
        run_id,
    )
    assert len(rows) == 1, rows
    return rows[0][0], bytes(rows[0][1])

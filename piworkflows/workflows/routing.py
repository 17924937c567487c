"""Where a run goes after a node: the compiled edges applied to a node's result.

- No outgoing edge: the run ends, ``completed`` after success, otherwise with
  the node's failure outcome.
- A plain edge is followed after success; a failed node ends the run.
- A switch on ``$result.outcome`` routes every outcome (failures included).
- A switch on ``$.field`` / ``$output.field`` reads the accepted output after
  success; a failed node ends the run. A value without a case is a routing
  error: the run fails, with an error naming the node (and the cases).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from piworkflows.workflows.compiler import CompiledWorkflow, case_key

FAILURE_STATUS = {"failed": "failed", "timed_out": "timed_out", "cancelled": "cancelled"}
MAX_CASES_NAMED = 10  # a routing error lists at most this many cases of the switch


@dataclass(frozen=True)
class Route:
    next_node: str | None = None  # the full path of the next node
    end_status: str | None = None  # completed | failed | timed_out | cancelled
    routing_error: str | None = None  # why the run fails for want of a route


def route(compiled: CompiledWorkflow, node_path: str, outcome: str, output: Any = None) -> Route:
    edge = compiled.routes.get(node_path)
    reads_result = edge is not None and edge.on == "$result.outcome"
    if outcome != "ok" and not reads_result:
        return Route(end_status=FAILURE_STATUS[outcome])
    if edge is None:
        return Route(end_status="completed")
    if edge.target is not None:
        return Route(next_node=edge.target)
    assert edge.on is not None
    if reads_result:
        value: Any = outcome
    else:
        value = output
        for field in edge.on.removeprefix("$output").removeprefix("$").lstrip(".").split("."):
            if not isinstance(value, dict) or field not in value:
                return Route(routing_error=f"node '{node_path}': the output has no {edge.on}")
            value = value[field]
    key = case_key(value)
    if key not in edge.cases:
        cases = ", ".join(case[:40] for case in sorted(edge.cases)[:MAX_CASES_NAMED])
        more = ", ..." if len(edge.cases) > MAX_CASES_NAMED else ""
        return Route(routing_error=f"node '{node_path}': no case for {edge.on} = {key[:80]} (cases: {cases}{more})")
    return Route(next_node=edge.cases[key])

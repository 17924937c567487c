"""Node attempt numbering in the runner: a visit interrupted by a runner's exit continues with
the next attempt number (the writer refuses a number the visit already has)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from piworkflows.protocol.internal.base import Frame
from piworkflows.protocol.internal.runner import RunnerExiting, RunnerLaunch
from piworkflows.protocol.internal.writer import Reply
from piworkflows.runner import run as runner
from piworkflows.workflows import discovery

pytestmark = pytest.mark.timeout(30)


class FencedChannel:
    """Records the runner's requests and answers each ``claimLost``: the runner stops at once."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def request(self, frame: Frame) -> Reply:
        self.requests.append((frame.kind, frame.model_dump()))
        return Reply(outcome="claimLost", error="fenced")


def interrupted(node: str, attempt: int, visit: int = 1) -> dict[str, Any]:
    return {
        "node_path": node,
        "visit_number": visit,
        "attempt_number": attempt,
        "outcome": "cancelled",
        "output": None,
        "interrupted": True,
    }


def first_start(steps: list[dict[str, Any]]) -> dict[str, Any]:
    resolved = discovery.resolve("builtin:demo", Path("/"))
    launch = RunnerLaunch(
        run_id="run-1",
        lease_generation=1,
        runner_epoch=1,
        project_path="/",
        source={
            "source_kind": "builtin",
            "builtin_id": "builtin:demo",
            "builtin_revision": resolved.identity.builtin_revision,
        },
        definition_digest=discovery.compiled(resolved).digest,
        input={"who": "tests"},
        steps=steps,
    )
    channel = FencedChannel()
    assert runner.run(channel, launch) == RunnerExiting()  # type: ignore[arg-type]
    (kind, body), *_ = channel.requests
    assert kind == "node.start"
    return body


def test_a_fresh_visit_starts_attempt_one():
    assert first_start([]) == {"node_path": "greet", "node_kind": "compute", "visit_number": 1, "attempt_number": 1}


@pytest.mark.parametrize("interrupted_attempts", [[1], [1, 2]])
def test_an_interrupted_visit_continues_with_the_next_attempt_number(interrupted_attempts):
    body = first_start([interrupted("greet", n) for n in interrupted_attempts])
    assert (body["node_path"], body["visit_number"]) == ("greet", 1)
    assert body["attempt_number"] == interrupted_attempts[-1] + 1

"""The agents benchmark's figures (stress/bench/agents.py): the median over runs of each run's p50 and
p95 (its reading of the host's timing line is tested with the real host: test_agent_host.py)."""

from __future__ import annotations

import pytest

from stress.bench import agents

pytestmark = pytest.mark.timeout(30)


def step(offset: int, pi_ready: int, model: int) -> dict[str, int]:
    """A step with 9 ms of server time around Pi's start-up and the model's turn."""
    points = {"started": 0, "requested": 1, "opened": 2, "launch": 3, "ready": 3 + pi_ready}
    points["prompt"] = points["ready"] + 1
    points["submitted"] = points["prompt"] + model
    points.update(settled=points["submitted"] + 2, next=points["submitted"] + 5)
    return {name: value + offset for name, value in points.items()}


def test_figures_are_the_median_over_runs_of_each_runs_p50_and_p95():
    runs = [[step(1000 * i, pi_ready, 0) for i, pi_ready in enumerate(ready)] for ready in ([90, 90, 990], [190] * 3)]
    found = agents.figures(runs)
    assert found["pi_ready"] == {"p50": 140.0, "p95": 590.0}  # medians of (90, 190) and (990, 190)
    assert found["wall"] == {"p50": 149.0, "p95": 599.0}
    assert found["c2_to_prompt"]["p50"] == 143.0 and found["scheduling"] == {"p50": 1.0, "p95": 1.0}
    assert found["server_share_pct"]["p50"] == pytest.approx((9 / 99 + 9 / 199) * 50, abs=0.1)

"""Agent steps end to end: a real server runs workflows whose agent nodes run on the real Pi against
the scripted model (no network, no API key), and the state they leave verifies clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piworkflows.testing.scripted_model import ScriptedModel
from tests.engine_util import start, view, wait_status, write
from tests.server_util import SCHEDULER_TICK, ServerProcess, query, serving

pytestmark = pytest.mark.timeout(180)

TWO_STEPS = """
from piworkflows.workflows import agent, compute, define_workflow, edge

workflow = define_workflow(
    name="two-steps",
    start_at="plan",
    nodes={
        "plan": agent(
            prompt="Plan the change.",
            expected_output={"type": "object", "required": ["steps"], "properties": {"steps": {"type": "integer"}}},
        ),
        "fix": agent(prompt=lambda ctx: f"Carry out the {ctx.outputs['plan']['steps']} steps.",
                     expected_output="a summary of what you changed"),
        "done": compute(run=lambda ctx: {"plan": ctx.outputs["plan"], "fix": ctx.outputs["fix"]}),
    },
    edges=[edge("plan", "fix"), edge("fix", "done")],
)
"""


def submit(output: Any) -> dict[str, Any]:
    """A model turn that calls the workflow tool with ``output`` for the request it was given."""
    arguments = {"action": "submit", "requestId": "${requestId}", "output": output}
    return {"tool_calls": [{"name": "workflow", "arguments": arguments}]}


@pytest.fixture
def agent_server(tmp_path: Path, pi_command: list[str], request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A server whose agent steps run the real Pi on the scripted model of the test's ``scripts`` mark."""
    scripts = request.node.get_closest_marker("scripts").args[0]
    with ScriptedModel(scripts) as model:
        env = {
            **SCHEDULER_TICK,
            "HOME": str(tmp_path / "home"),
            "PI_WORKFLOWS_PI_COMMAND": pi_command[0],
            "PI_CODING_AGENT_DIR": str(model.write_pi_config(tmp_path / "pi-agent")),
            "PI_WORKFLOWS_AGENT_MODEL": f"scripted/{next(iter(scripts))}",
            "PI_WORKFLOWS_ACTIVE_SAMPLE_MS": "100",
            "PI_WORKFLOWS_AGENT_FLUSH_MS": "50",
        }
        with serving(tmp_path / "s", env) as proc:
            proc.model = model  # type: ignore[attr-defined]
            yield proc


@pytest.mark.scripts({"two": [submit({"steps": 3}), submit({"summary": "changed three files"})]})
def test_two_agent_steps_share_the_run_session_and_the_run_completes(agent_server, project):
    write(project, "two-steps", TWO_STEPS)
    run_id = start(agent_server, project, "two-steps")
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "completed", done
    assert done["output"] == {"plan": {"steps": 3}, "fix": {"summary": "changed three files"}}
    asked = agent_server.model.requests  # type: ignore[attr-defined]
    assert len(asked) == 2
    first, second = ([m for m in r["messages"] if m["role"] != "system"] for r in asked)
    assert second[: len(first)] == first  # the second prompt's request carries the first turn
    assert "Carry out the 3 steps." in _text(second[-1])
    sessions = query(agent_server, "SELECT DISTINCT session_id FROM session_segments WHERE run_id = ?", run_id)
    assert len(sessions) == 1  # both steps ran in the run's one Pi session
    sent = query(
        agent_server, "SELECT message_state, pi_entry_id FROM workflow_messages WHERE run_id = ? ORDER BY 1", run_id
    )
    assert [state for state, _ in sent] == ["sent", "sent"] and all(entry for _, entry in sent)
    accepted = query(
        agent_server,
        "SELECT count(*) FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
        "WHERE r.run_id = ? AND s.outcome = 'accepted'",
        run_id,
    )
    assert accepted == [(2,)]
    assert view(agent_server, run_id)["display"]["status"] == "completed"


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)

"""What a person sees of agent steps on a real server with the real Pi and the scripted model: the run
view while a step waits and its model turn runs, ``run watch`` that follows a run through its agent
step, ``run transcript`` of the captured conversation, ``submit`` of an operator's output (rejected
with the validator's error, then accepted: the run completes), and a run whose agent could not start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piworkflows.testing.scripted_model import ScriptedModel
from tests.engine_util import start, view, wait_status, write
from tests.pi_util import agent_env
from tests.server_util import SCHEDULER_TICK, ServerProcess, query, serving, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]

ONE_STEP = """
from piworkflows.workflows import agent, compute, define_workflow, edge

workflow = define_workflow(
    name="one-step",
    start_at="fix",
    nodes={
        "fix": agent(
            prompt="Fix the failing test.",
            expected_output={"type": "object", "required": ["summary"],
                             "properties": {"summary": {"type": "string"}}},
        ),
        "done": compute(run=lambda ctx: {"fix": ctx.outputs["fix"]}),
    },
    edges=[edge("fix", "done")],
)
"""

AGENT_CONTROLS = ["pause", "cancel", "update", "submit"]


def submit(output: Any, stall_ms: int = 0) -> dict[str, Any]:
    """A model turn that calls the workflow tool with ``output`` for the request it was given."""
    arguments = {"action": "submit", "requestId": "${requestId}", "output": output}
    return {
        "tool_calls": [{"name": "workflow", "arguments": arguments}],
        **({"stall_ms": stall_ms} if stall_ms else {}),
    }


@pytest.fixture
def agent_server(tmp_path: Path, pi_command: list[str], request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A server whose agent steps run the real Pi on the scripted model of the test's ``scripts`` mark."""
    scripts = request.node.get_closest_marker("scripts").args[0]
    with ScriptedModel(scripts) as model, serving(tmp_path / "s", agent_env(tmp_path, pi_command, model)) as proc:
        proc.model = model  # type: ignore[attr-defined]
        yield proc


def in_turn(server: ServerProcess, run_id: str) -> dict[str, Any] | None:
    """The run view once the step's model turn is open and its active time was sampled."""
    shown = view(server, run_id)
    pending = shown["piworkflows"]["pending"]
    if shown["display"]["activity"] != "origin_turn" or pending["request"]["activeTime"]["usedMs"] == 0:
        return None
    return shown


@pytest.mark.scripts({"slow": [submit({"summary": "fixed it"}, stall_ms=4000)]})
def test_the_view_while_the_agent_works_then_the_transcript_of_the_completed_run(agent_server, project):
    write(project, "one-step", ONE_STEP)
    run_id = start(agent_server, project, "one-step")
    working = wait_until(lambda: in_turn(agent_server, run_id), what="the model turn in the view")
    assert working["display"]["status"] == "waiting" and working["display"]["controls"] == AGENT_CONTROLS
    assert working["display"]["reason"] == "The agent is working on the workflow step."
    pending = working["piworkflows"]["pending"]
    assert pending["kind"] == "agent" and pending["nodePath"] == "fix"
    request = pending["request"]
    assert request["prompt"] == "Fix the failing test." and request["status"] == "pending"
    assert request["expectedOutput"]["schema"]["required"] == ["summary"]
    assert request["activeTime"]["timeoutMs"] == 900_000  # PI_WORKFLOWS_AGENT_TIMEOUT_MS's default
    assert 0 < request["activeTime"]["usedMs"] and request["activeTime"]["leftMs"] < 900_000
    assert request["submissions"]["total"] == 0
    status = agent_server.cli("run", "status", run_id)
    assert "waiting (agent turn)" in status.stdout and "Fix the failing test." in status.stdout, status.stdout
    assert f"pi-workflows --state-dir {agent_server.state_dir} submit {run_id} fix 'JSON'" in status.stdout

    watched = agent_server.cli("run", "watch", run_id)  # follows through the agent step to the end
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "fix (agent) waits for its agent's result" in watched.stdout and f"{run_id} completed" in watched.stdout
    assert view(agent_server, run_id)["state"].get("finalOutput") == {"fix": {"summary": "fixed it"}}

    shown = agent_server.cli("run", "transcript", run_id)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "== fix (attempt-" in text and "Fix the failing test." in text, text
    assert '-> workflow {"action":"submit","output":{"summary":"fixed it"},"requestId":"request-' in text, text
    assert "toolResult workflow" in text and "\n  Accepted\n" in text, text
    of_node = agent_server.cli("run", "transcript", run_id, "fix")
    assert of_node.returncode == 0 and of_node.stdout == text
    lines = [json.loads(line) for line in agent_server.cli("run", "transcript", run_id, "--json").stdout.splitlines()]
    assert [item["runSeq"] for item in lines] == list(range(1, len(lines) + 1))
    assert {item["role"] for item in lines} >= {"user", "assistant", "toolResult"}
    assert all(json.loads(item["entry"])["id"] == item["piEntryId"] for item in lines)
    for node, why in (("nope", "has no node 'nope'"), ("done", "'done' is a compute node, not an agent step")):
        refused = agent_server.cli("run", "transcript", run_id, node)
        assert refused.returncode == 2 and why in refused.stderr and "its agent steps: fix" in refused.stderr


@pytest.mark.scripts({"stuck": [{"text": "Let me think about it.", "stall_ms": 120_000}]})
def test_an_operator_submits_the_output_of_a_waiting_step(agent_server, project):
    write(project, "one-step", ONE_STEP)
    run_id = start(agent_server, project, "one-step")
    wait_until(lambda: view(agent_server, run_id)["display"]["activity"] == "origin_turn", what="the model turn")
    not_json = agent_server.cli("submit", run_id, "fix", "{summary")
    assert not_json.returncode == 2 and "not JSON" in not_json.stderr
    elsewhere = agent_server.cli("submit", run_id, "done", '{"summary": "x"}')
    said = " ".join(elsewhere.stderr.split())
    assert elsewhere.returncode == 1 and "waits at an agent step, 'fix', not at 'done'; use: " in said, said

    bad = agent_server.cli("submit", run_id, "fix", '{"summary": 1}')
    assert bad.returncode == 1 and "rejected (validationFailed)" in bad.stderr, bad.stderr
    assert "1 is not of type 'string'" in bad.stderr, bad.stderr
    rejected = view(agent_server, run_id)["piworkflows"]["pending"]["request"]["submissions"]["items"]
    assert [(s["status"], s["errorCode"]) for s in rejected] == [("rejected", "validationFailed")]

    good = agent_server.cli("submit", run_id, "fix", '{"summary": "fixed by hand"}')
    assert good.returncode == 0 and f"accepted; {run_id} continues after fix" in good.stdout, good.stderr
    done = wait_status(agent_server, run_id, "completed", "failed", "timed_out", "cancelled")
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {
        "fix": {"summary": "fixed by hand"}
    }
    submitted = query(
        agent_server,
        "SELECT actor_class FROM events WHERE resource_id = ? AND event_type = 'interaction.submitted'",
        run_id,
    )
    assert submitted == [("operator",), ("operator",)]
    wait_until(  # the host on the stalled turn was ended; its segment closed
        lambda: (
            query(agent_server, "SELECT segment_status FROM session_segments WHERE run_id = ?", run_id) == [("closed",)]
        ),
        what="the segment closed",
    )


def test_a_run_whose_agent_cannot_start_is_queued_with_the_cause_and_wait_stops(tmp_path, project):
    """No Pi where the server looks: the run parks agentNoProgress; ``run start --wait`` stops there
    (by the display status and the park reason) and says why."""
    env = {**SCHEDULER_TICK, "HOME": str(tmp_path / "home"), "PI_WORKFLOWS_PI_COMMAND": str(tmp_path / "no-pi")}
    with serving(tmp_path / "s", env) as server:
        write(project, "one-step", ONE_STEP)
        started = server.cli("run", "start", "one-step", "--project", str(project), "--wait", "--json")
        assert started.returncode == 1, started.stderr
        final = json.loads(started.stdout.splitlines()[-1])
        assert final["piworkflows"]["parkReason"] == "agentNoProgress"
        assert final["display"]["status"] == "queued" and final["display"]["controls"] == ["resume", "cancel"]
        assert final["display"]["reason"].startswith("The agent made no progress: "), final["display"]
        cause = query(
            server,
            "SELECT b.bytes FROM workflow_updates u JOIN blobs b ON b.digest = u.body_digest "
            "WHERE u.run_id = ? AND u.update_kind = 'notification'",
            final["runId"],
        )
        assert final["display"]["reason"] == "The agent made no progress: " + cause[0][0].decode()
        told = server.cli("run", "status", final["runId"])
        assert "queued" in told.stdout and "The agent made no progress:" in told.stdout, told.stdout
        assert "controls: resume, cancel" in told.stdout

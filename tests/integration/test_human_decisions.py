"""Protected human decisions through a real server: the run waits with no runner, `pi-workflows
decide` answers it as the operator and the switch routes the choice; a model's answer and
checkpoint.answer are refused; the deadline timer applies the timeout policy or expires the
decision, also when the deadline passed while the server was down."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from tests.engine_util import start, view, wait_status, write
from tests.server_util import serving, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

APPROVE = """
from piworkflows.workflows import choice, compute, define_workflow, human_decision, switch, text_input
nodes = {{
    "approve": human_decision(
        audience="operator",
        choices={{
            "ship": choice("Ship it"),
            "replan": choice("Replan", input=text_input("instructions", "What should change?")),
        }},
        on_timeout={on_timeout},
        request=lambda ctx: {{"title": "Ship?", "summary": "all tests pass"}},
    ),
    "shipped": compute(lambda ctx: {{"shipped": True}}),
    "replanned": compute(lambda ctx: {{"todo": ctx.outputs["approve"]["input"]}}),
}}
edges = [switch("approve", on="$.choice", cases={{"ship": "shipped", "replan": "replanned"}})]
workflow = define_workflow("approve", "approve", nodes, edges)
"""


def test_the_operator_decides_and_the_choice_routes(server, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    waited = wait_status(server, run_id, "waiting")
    assert waited["display"]["controls"] == ["pause", "cancel", "human-answer"]
    decision = waited["piworkflows"]["pending"]["decision"]
    assert decision["request"] == {"title": "Ship?", "summary": "all tests pass"} and decision["deadline"] is None
    with server.client() as client:
        model = client.request(
            "decision.answer", {"nodePath": "approve", "choice": "ship", "source": "model"}, run_id=run_id
        )
        assert (model.outcome, model.receipt["code"]) == ("rejected", "modelAnswerRefused")
        checkpoint = client.request("checkpoint.answer", {"nodePath": "approve", "answer": {}}, run_id=run_id)
        assert (checkpoint.outcome, checkpoint.receipt["code"]) == ("rejected", "humanDecisionProtected")
    usage = server.cli("decide", run_id, "approve", "replan", "--input", "")
    assert usage.returncode == 2 and "--input" in usage.stderr
    done = server.cli("decide", run_id, "approve", "replan", "--input", "Split the change", "--json")
    assert done.returncode == 0, done.stderr
    receipt = json.loads(done.stdout)
    assert (receipt["resolution"], receipt["choice"], receipt["decisionId"]) == (
        "human",
        "replan",
        decision["decisionId"],
    )
    again = server.cli("decide", run_id, "approve", "ship")
    assert again.returncode == 1 and "human (replan) won" in again.stderr
    finished = wait_status(server, run_id, "completed")
    assert finished["state"]["outputs"]["replanned"] == {"todo": "Split the change"}
    assert finished["state"]["outputs"]["approve"] == {
        "choice": "replan",
        "input": "Split the change",
        "resolution": "human",
    }


def test_the_timer_applies_the_timeout_policy(server, project):
    write(project, "approve", APPROVE.format(on_timeout={"after_ms": 300, "response": {"choice": "ship"}}))
    run_id = start(server, project, "approve")
    finished = wait_status(server, run_id, "completed")
    assert finished["state"]["outputs"]["approve"] == {"choice": "ship", "resolution": "timeoutPolicy"}
    assert finished["state"]["outputs"]["shipped"] == {"shipped": True}


def test_a_decision_without_a_default_expires(server, project):
    write(project, "approve", APPROVE.format(on_timeout={"after_ms": 300}))
    run_id = start(server, project, "approve")
    ended = wait_status(server, run_id, "failed", "timed_out")
    (step,) = [s for s in ended["state"]["steps"] if s["nodeId"] == "approve"]
    assert (step["status"], step["errorCode"]) == ("timed_out", "decisionExpired")


def test_a_deadline_that_passed_while_the_server_was_down_is_applied_at_startup(tmp_path, config_dir, project):
    env = {"PI_WORKFLOWS_CONFIG_DIR": str(config_dir)}
    write(project, "approve", APPROVE.format(on_timeout={"after_ms": 1500, "response": {"choice": "ship"}}))
    with serving(tmp_path / "s", env) as first:
        run_id = start(first, project, "approve")
        deadline = wait_status(first, run_id, "waiting")["piworkflows"]["pending"]["decision"]["deadline"]
        assert deadline is not None
        assert first.stop() == 0
    due = datetime.fromisoformat(deadline).timestamp()
    wait_until(lambda: time.time() > due + 0.01, what="the deadline passing while the server is down")
    with serving(tmp_path / "s", env) as second:
        assert view(second, run_id)["state"]["outputs"]["approve"]["resolution"] == "timeoutPolicy"
        wait_status(second, run_id, "completed")

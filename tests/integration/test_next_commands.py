"""The commands an operator is told to run next are the ones that work, and an answer that no route
takes is refused before it changes anything (CLI and real servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_util import CHECKPOINT, start, view, wait_status, write
from tests.integration.test_human_decisions import APPROVE
from tests.server_util import query, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

# A shell step with an outside effect before the checkpoint: an answer that failed the run made a
# restart run the step again.
TOUCH_THEN_ASK = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge, idempotent_effect, shell, switch
workflow = define_workflow("touch-ask", "touch", {
    "touch": shell(effect=idempotent_effect("test.touch"), exec=lambda ctx: {"command": "true", "args": []}),
    "ask": checkpoint(summary="go on?"),
    "yes": compute(lambda ctx: {"went": True}),
    "no": compute(lambda ctx: {"went": False}),
}, [edge("touch", "ask"), switch("ask", on="$.go", cases={"true": "yes", "false": "no"})])
"""


def _said(done) -> str:
    return " ".join((done.stdout + done.stderr).split())


def test_an_answer_no_case_takes_is_refused_listing_the_cases_and_the_run_is_unchanged(server, project):
    write(project, "touch-ask", TOUCH_THEN_ASK)
    run_id = start(server, project, "touch-ask")
    before = wait_status(server, run_id, "waiting")
    refused = server.cli("answer", run_id, "ask", '{"go": "maybe"}')
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "no case for $.go = maybe (cases: false, true)" in _said(refused)
    after = view(server, run_id)
    assert after["runRevision"] == before["runRevision"] and after["display"]["status"] == "waiting"
    missing = server.cli("answer", run_id, "ask", '{"stop": true}')
    assert missing.returncode == 1 and "the output has no $.go" in _said(missing)
    done = server.cli("answer", run_id, "ask", '{"go": true}')
    assert done.returncode == 0, done.stderr
    finished = wait_status(server, run_id, "completed", "failed")
    assert finished["state"].get("finalOutput") == {"went": True}
    shells = query(server, "SELECT count(*) FROM effects WHERE run_id = ? AND effect_type = 'test.touch'", run_id)
    assert shells == [(1,)]  # the shell ran once


def test_watch_at_a_protected_decision_prints_decide_with_its_choices(server, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    done = server.cli("run", "start", "approve", "--project", str(project), "--wait")
    assert done.returncode == 1, done.stdout + done.stderr  # it waits for a person
    run_id = done.stdout.split()[0]
    said = _said(done)
    assert "pi-workflows answer" not in said
    assert "choice ship: Ship it" in said and "choice replan: Replan" in said
    assert f"decide {run_id} approve CHOICE [--input TEXT]" in said


def test_the_wrong_command_at_a_waiting_node_names_the_right_one(server, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    write(project, "ask", CHECKPOINT)
    decision = start(server, project, "approve")
    wait_status(server, decision, "waiting")
    answered = server.cli("answer", decision, "approve", "{}")
    assert answered.returncode == 1
    assert "'approve' is a protected human decision, not a checkpoint; use:" in _said(answered)
    assert f"decide {decision} approve CHOICE [--input TEXT] (CHOICE: replan, ship)" in _said(answered)
    elsewhere = server.cli("answer", decision, "shipped", "{}")
    assert f"{decision} waits at a protected human decision, 'approve', not at 'shipped'" in _said(elsewhere)
    submitted = server.cli("submit", decision, "approve", "{}")
    assert submitted.returncode == 1  # the run's state, not the arguments: as answer and decide
    assert "'approve' is a protected human decision, not an agent step" in _said(submitted)
    checkpoint = start(server, project, "ask")
    wait_status(server, checkpoint, "waiting")
    decided = server.cli("decide", checkpoint, "ask", "ship")
    assert decided.returncode == 1
    assert "'ask' is a checkpoint, not a protected human decision; use: pi-workflows" in _said(decided)
    assert f"answer {checkpoint} ask 'JSON'" in _said(decided)


def test_deciding_again_with_the_same_answer_exits_0(server, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    wait_status(server, run_id, "waiting")
    first = server.cli("decide", run_id, "approve", "replan", "--input", "Split it")
    assert first.returncode == 0 and first.stdout.strip() == f"decided replan; {run_id} continues", first.stderr
    wait_status(server, run_id, "completed")
    again = server.cli("decide", run_id, "approve", "replan", "--input", "Split it")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already decided replan")
    other = server.cli("decide", run_id, "approve", "ship")
    assert other.returncode == 1 and "human (replan) won" in other.stderr


def test_deciding_a_paused_run_says_it_stays_paused(server, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    wait_status(server, run_id, "waiting")
    assert server.cli("run", "pause", run_id).returncode == 0
    done = server.cli("decide", run_id, "approve", "ship")
    assert done.returncode == 0, done.stderr
    assert "continues" not in done.stdout
    assert f"{run_id} stays paused: resume it with 'pi-workflows" in done.stdout
    assert view(server, run_id)["display"]["status"] == "paused"


def test_an_answer_to_an_agent_step_names_submit(tmp_path: Path, server, project):
    write(
        project,
        "agent-one",
        "from piworkflows.workflows import agent, define_workflow\n"
        'workflow = define_workflow("agent-one", "fix", {"fix": agent("Fix it.", "a summary")}, [])\n',
    )
    run_id = start(server, project, "agent-one")
    wait_until(lambda: view(server, run_id)["piworkflows"]["pending"], what="the agent step's request")
    answered = server.cli("answer", run_id, "fix", "{}")
    assert answered.returncode == 1
    assert "'fix' is an agent step, not a checkpoint; use: pi-workflows" in _said(answered)
    assert f"submit {run_id} fix 'JSON'" in _said(answered)
    with server.client() as client:  # the server's own refusal says the same, whatever the client
        refused = client.request("checkpoint.answer", {"nodePath": "fix", "answer": {}}, run_id=run_id)
    assert refused.receipt["code"] == "notWaiting"
    assert "'fix' (agent) waits for an agent's output, not an answer" in refused.error


def test_a_source_edit_that_keeps_the_definition_does_not_park(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    path = project / ".pi" / "workflows" / "ask.workflow.py"
    path.write_text("# a comment, and a function body that changed\n" + CHECKPOINT.replace("go on?", "go on now?"))
    assert server.cli("answer", run_id, "ask", '{"go": true}').returncode == 0
    done = wait_status(server, run_id, "completed", "failed", "queued")
    assert done["display"]["status"] == "completed", done["display"]
    assert done["state"].get("finalOutput") == {"answered": True}


def test_a_changed_definition_parks_saying_what_changed_and_the_way_on(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    path = project / ".pi" / "workflows" / "ask.workflow.py"
    path.write_text(CHECKPOINT.replace('"no": compute(', '"extra": compute(lambda ctx: 1),\n    "no": compute('))
    assert server.cli("answer", run_id, "ask", '{"go": true}').returncode == 0
    wait_until(lambda: view(server, run_id)["piworkflows"]["parkReason"] == "workflowSourceChanged", what="the park")
    status = _said(server.cli("run", "status", run_id))
    assert f"the workflow file {path} changed since the run started, and its definition" in status
    assert f"restore the file, then: pi-workflows --state-dir {server.state_dir} run resume {run_id}" in status
    assert f"run cancel {run_id}; pi-workflows --state-dir {server.state_dir} run start ask --project" in status
    # resumed with the file still changed, it parks again with the same words: it never runs new code
    assert server.cli("run", "resume", run_id).returncode == 0
    wait_until(lambda: view(server, run_id)["piworkflows"]["parkReason"] == "workflowSourceChanged", what="again")
    write(project, "ask", CHECKPOINT)  # restored
    assert server.cli("run", "resume", run_id).returncode == 0
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {"answered": True}

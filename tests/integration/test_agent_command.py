"""Command steps end to end (``executor=command(argv)``): a real server runs workflows whose agent
nodes run a small Python script written by the test (no Pi, no model): the step message on its
stdin, its stdout the output, judged by the same validator as a Pi submission. The state each run
leaves verifies clean (``serving`` checks it after the server stopped)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_util import start, wait_status, write
from tests.server_util import SCHEDULER_TICK, ServerProcess, query, serving, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# The agent: saves the step message it read, then prints what its argv asks for.
AGENT = """
import json, os, sys, time
step = sys.stdin.read()
mode = sys.argv[1]
with open(os.path.join(os.environ["AGENT_LOG"], mode + "-" + str(os.getpid()) + ".txt"), "w") as saved:
    saved.write(step)
if mode == "plan":
    print(json.dumps({"steps": 3 if "Plan the change." in step else 0}))
elif mode == "summary":
    print("changed " + step.split("Carry out the ")[1].split(" ")[0] + " files")
elif mode == "words":
    print(json.dumps({"steps": "three"}))
elif mode == "prose":
    print("I would rather not answer in JSON.")
elif mode == "sleep":
    time.sleep(60)
elif mode == "once-slow":  # the first run hangs (its host is killed), the next one answers
    runs = len([name for name in os.listdir(os.environ["AGENT_LOG"]) if name.startswith("once-slow-")])
    if runs == 1:
        with open(os.path.join(os.environ["AGENT_LOG"], "host-pid"), "w") as saved:
            saved.write(str(os.getppid()))
        time.sleep(60)
    print(json.dumps({"steps": runs}))
elif mode == "fail":
    print("half an output")
    print("the build is broken", file=sys.stderr)
    sys.exit(3)
"""

SCHEMA = {"type": "object", "required": ["steps"], "properties": {"steps": {"type": "integer"}}}


def workflow(name: str, script: Path, mode: str, **options: object) -> str:
    """A one-step workflow whose ``ask`` node runs the agent script in ``mode``."""
    argv = [sys.executable, str(script), mode]
    extra = "".join(f", {key}={value!r}" for key, value in options.items())
    return f"""
from piworkflows.workflows import agent, command, define_workflow

workflow = define_workflow(
    name={name!r},
    start_at="ask",
    nodes={{"ask": agent(prompt="Plan the change.", expected_output={SCHEMA!r},
                         executor=command({argv!r}){extra})}},
    edges=[],
)
"""


TWO_STEPS = """
from piworkflows.workflows import agent, command, compute, define_workflow, edge

def short(output):
    return None if len(output) < 40 else "the summary is too long"

workflow = define_workflow(
    name="two-commands",
    start_at="plan",
    nodes={{
        "plan": agent(prompt="Plan the change.", expected_output={schema!r}, executor=command({plan!r})),
        "fix": agent(prompt=lambda ctx: f"Carry out the {{ctx.outputs['plan']['steps']}} steps.",
                     expected_output="a summary of what you changed", validate=short,
                     executor=command({summary!r})),
        "done": compute(run=lambda ctx: {{"plan": ctx.outputs["plan"], "fix": ctx.outputs["fix"]}}),
    }},
    edges=[edge("plan", "fix"), edge("fix", "done")],
)
"""


@pytest.fixture
def agent_log(tmp_path: Path) -> Path:
    path = tmp_path / "agent-log"
    path.mkdir()
    return path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(AGENT)
    return path


@pytest.fixture
def server(tmp_path: Path, agent_log: Path) -> Iterator[ServerProcess]:
    env = {
        **SCHEDULER_TICK,
        "HOME": str(tmp_path / "home"),
        "AGENT_LOG": str(agent_log),  # the command inherits the server's environment
        "PI_WORKFLOWS_PI_COMMAND": str(tmp_path / "no-pi-here"),  # a command step never looks for Pi
        "PI_WORKFLOWS_ACTIVE_SAMPLE_MS": "100",
        "PI_WORKFLOWS_AGENT_ABORT_GRACE_MS": "2000",
    }
    with serving(tmp_path / "s", env) as proc:
        yield proc


def finished(server: ServerProcess, run_id: str) -> dict[str, object]:
    return wait_status(server, run_id, "completed", "failed", "timed_out", "cancelled")


def test_two_command_steps_complete_the_run_with_their_outputs(server, project, script, agent_log):
    plan, summary = ([sys.executable, str(script), mode] for mode in ("plan", "summary"))
    write(project, "two-commands", TWO_STEPS.format(schema=SCHEMA, plan=plan, summary=summary))
    run_id = start(server, project, "two-commands")
    done = finished(server, run_id)
    assert done["display"]["status"] == "completed", done
    assert done["state"].get("finalOutput") == {"plan": {"steps": 3}, "fix": "changed 3 files"}  # each read its prompt
    (plan_step,) = (path.read_text() for path in agent_log.glob("plan-*.txt"))
    assert "Plan the change." in plan_step and "Expected output (JSON Schema)" in plan_step
    assert "on standard output" in plan_step and "workflow` tool" not in plan_step
    messages = query(
        server, "SELECT message_state, pi_entry_id FROM workflow_messages WHERE run_id = ? ORDER BY 1", run_id
    )
    assert [state for state, _ in messages] == ["sent", "sent"] and all(entry for _, entry in messages)
    entries = query(
        server,
        "SELECT e.entry_role, b.bytes FROM session_entries e JOIN blobs b ON b.digest = e.content_digest "
        "WHERE e.run_id = ? ORDER BY e.run_seq",
        run_id,
    )
    assert [role for role, _ in entries] == ["user", "assistant", "user", "assistant"]
    output_entry = json.loads(entries[1][1])
    assert output_entry["message"]["content"][0]["text"] == '{"steps": 3}\n'
    assert output_entry["message"]["exitCode"] == 0 and output_entry["parentId"] == json.loads(entries[0][1])["id"]
    linked = query(
        server,
        "SELECT count(*) FROM attempt_entries WHERE run_id = ? AND prompt_seq IS NOT NULL AND response_seq IS NOT NULL",
        run_id,
    )
    assert linked == [(2,)]
    turns = query(server, "SELECT turn_state, stop_reason FROM workflow_turns WHERE run_id = ?", run_id)
    assert turns == [("ended", "stop"), ("ended", "stop")]
    accepted = query(
        server,
        "SELECT s.idempotency_key FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
        "WHERE r.run_id = ? AND s.outcome = 'accepted'",
        run_id,
    )
    assert len(accepted) == 2 and all(key.startswith("command-segment-") for (key,) in accepted)
    intervals = query(
        server,
        "SELECT i.end_cause FROM attempt_active_intervals i JOIN node_attempts a USING (attempt_id) WHERE a.run_id = ?",
        run_id,
    )
    assert intervals == [("settlement",), ("settlement",)]


@pytest.mark.parametrize(
    ("mode", "code", "error"),
    [
        pytest.param("words", "validationFailed", "'three' is not of type 'integer'", id="schema-mismatch"),
        pytest.param(
            "prose", "commandFailed", "the command's stdout is not a JSON value a run can keep", id="not-json"
        ),
        pytest.param("fail", "commandFailed", "the command exited with status 3: the build is broken", id="exit-3"),
    ],
)
def test_a_command_without_an_accepted_output_fails_its_attempt_at_once(server, project, script, mode, code, error):
    write(project, "once", workflow("once", script, mode))
    run_id = start(server, project, "once")
    done = finished(server, run_id)
    assert done["display"]["status"] == "failed" and done["piworkflows"]["errorCode"] == code, done
    assert error in done["state"].get("error")
    attempt = query(server, "SELECT attempt_status, error_code FROM node_attempts WHERE run_id = ?", run_id)
    assert attempt == [("failed", code)]  # one attempt: a command is not reminded
    steps = query(server, "SELECT source_kind, message_state FROM workflow_messages WHERE run_id = ?", run_id)
    assert steps == [("interactive_request", "sent")]
    submissions = query(
        server,
        "SELECT s.outcome FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
        "WHERE r.run_id = ?",
        run_id,
    )
    assert submissions == ([("rejected",)] if code == "validationFailed" else [])
    (output,) = query(
        server, "SELECT count(*) FROM session_entries WHERE run_id = ? AND entry_role = 'assistant'", run_id
    )
    assert output == (1,)  # what it printed is captured either way


def test_a_command_past_its_budget_times_out_and_is_killed(server, project, script, agent_log):
    write(project, "slow", workflow("slow", script, "sleep", timeout_ms=1500))
    run_id = start(server, project, "slow")
    done = finished(server, run_id)
    assert done["display"]["status"] == "timed_out" and done["piworkflows"]["errorCode"] == "agentTimeout", done
    (saved,) = agent_log.glob("sleep-*.txt")
    pid = int(saved.stem.split("-")[1])
    wait_until(lambda: not _alive(pid), what="the command killed")
    (spent,) = query(
        server,
        "SELECT sum(i.elapsed_ms) FROM attempt_active_intervals i JOIN node_attempts a USING (attempt_id) "
        "WHERE a.run_id = ?",
        run_id,
    )
    assert spent[0] >= 1500
    turns = query(server, "SELECT turn_state, stop_reason FROM workflow_turns WHERE run_id = ?", run_id)
    assert turns == [("ended", "aborted")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_host_killed_mid_run_ends_its_command_and_the_next_host_runs_it_again(server, project, script, agent_log):
    write(project, "again", workflow("again", script, "once-slow"))
    run_id = start(server, project, "again")
    host_pid = wait_until(lambda: (agent_log / "host-pid").exists() and (agent_log / "host-pid").read_text())
    (first,) = agent_log.glob("once-slow-*.txt")
    os.kill(int(host_pid), signal.SIGKILL)
    done = finished(server, run_id)
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {"steps": 2}, done
    command_pid = int(first.stem.split("-")[2])
    wait_until(lambda: not _alive(command_pid), what="the first command killed with its host")
    second = next(path for path in agent_log.glob("once-slow-*.txt") if path != first)
    assert second.read_text().startswith("Resumed: ")  # the same attempt, on the resumed step
    assert query(server, "SELECT count(*) FROM node_attempts WHERE run_id = ?", run_id) == [(1,)]
    turns = query(server, "SELECT turn_state FROM workflow_turns WHERE run_id = ? ORDER BY started_at", run_id)
    assert turns == [("lost",), ("ended",)]
    steps = query(server, "SELECT message_state FROM workflow_messages WHERE run_id = ? ORDER BY session_order", run_id)
    assert steps == [("sent",), ("sent",)]

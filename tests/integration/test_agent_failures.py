"""Agent steps whose Pi cannot do the step: they end with Pi's own words, and never loop.

A model without a key parks the run at once; a Pi that keeps exiting is started again with a
backoff and then parks; a provider error fails the attempt with the provider's message; a model
that keeps submitting invalid output fails the attempt at the rejection cap. All on the real Pi
(and the scripted model where a model answers), through the CLI where a person would look.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from piworkflows.testing.scripted_model import ScriptedModel
from tests.engine_util import start, view, wait_status, write
from tests.pi_util import agent_env, submit
from tests.server_util import query, serving, wait_until

pytestmark = pytest.mark.timeout(180)

ONE_STEP = """
from piworkflows.workflows import agent, define_workflow

workflow = define_workflow(
    name="one-step",
    start_at="review",
    nodes={{
        "review": agent(
            prompt="Review the change.",
            expected_output={{"type": "object", "required": ["risk"], "properties": {{"risk": {{"enum": ["low"]}}}}}},
            {model}
        ),
    }},
    edges=[],
)
"""

# Forwards Pi's RPC input to the real Pi until the first prompt, then dies the way a crashing Pi
# does: its own message on stderr, a non-zero exit, mid-step.
DYING_PI = """#!{python}
import subprocess, sys
pi = subprocess.Popen([{pi!r}, *sys.argv[1:]], stdin=subprocess.PIPE)
for line in sys.stdin.buffer:
    if b'"type":"prompt"' in line.replace(b" ", b""):
        print("dying-pi: out of memory in the step", file=sys.stderr, flush=True)
        pi.kill()
        sys.exit(9)
    pi.stdin.write(line)
    pi.stdin.flush()
pi.stdin.close()
sys.exit(pi.wait())
"""


def one_step(project: Path, model: str | None = None) -> None:
    write(project, "one-step", ONE_STEP.format(model=f"model={model!r}," if model else ""))


def segments(server, run_id: str) -> int:
    ((count,),) = query(server, "SELECT count(*) FROM session_segments WHERE run_id = ?", run_id)
    return int(count)


def test_a_model_without_a_key_parks_the_run_at_once_with_pis_own_error(tmp_path, pi_command, project):
    env = {
        "HOME": str(tmp_path / "home"),
        "PI_WORKFLOWS_PI_COMMAND": pi_command[0],
        "PI_CODING_AGENT_DIR": str(tmp_path / "empty-pi"),
        "ANTHROPIC_API_KEY": "",
    }
    one_step(project, "anthropic/claude-sonnet-4-5")
    with serving(tmp_path / "s", env) as server:
        done = server.cli("run", "start", "one-step", "--project", str(project), "--wait", timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr  # it returns: the run waits for a person
        run_id, said = done.stdout.split()[0], " ".join(done.stdout.split())  # as wrapped to 80 columns
        assert "No API key found for anthropic." in said
        assert said.endswith(f"run resume {run_id}")
        shown = view(server, run_id)
        assert shown["piworkflows"]["parkReason"] == "agentNoProgress"
        assert segments(server, run_id) == 1  # one host, not one every second
        status = " ".join(server.cli("run", "status", run_id).stdout.split())
        assert "parked: The agent made no progress: Pi refused the step: No API key found" in status
        # the way on works: resume tries once more and parks again with the same cause
        assert server.cli("run", "resume", run_id).returncode == 0
        wait_until(lambda: segments(server, run_id) == 2 and view(server, run_id)["piworkflows"]["parkReason"])
        assert view(server, run_id)["piworkflows"]["parkReason"] == "agentNoProgress"
        assert server.server_log().count("ended: the agent host exited with code 5") == 2


def test_a_pi_that_keeps_exiting_is_backed_off_then_parks_naming_its_error(tmp_path, pi_command, project):
    dying = tmp_path / "dying-pi"
    dying.write_text(DYING_PI.format(python=sys.executable, pi=pi_command[0]))
    dying.chmod(dying.stat().st_mode | stat.S_IXUSR)
    with ScriptedModel({"never": []}) as model:
        env = {
            **agent_env(tmp_path, [str(dying)], model),
            "PI_WORKFLOWS_AGENT_HOST_FAILURE_LIMIT": "3",
            "PI_WORKFLOWS_AGENT_HOST_BACKOFF_MS": "200",
        }
        one_step(project)
        with serving(tmp_path / "s", env) as server:
            run_id = start(server, project, "one-step")
            wait_until(lambda: view(server, run_id)["piworkflows"]["parkReason"], timeout=90, what="the park")
            shown = view(server, run_id)
            assert shown["piworkflows"]["parkReason"] == "agentNoProgress"
            assert "dying-pi: out of memory in the step" in shown["display"]["reason"]
            assert segments(server, run_id) == 3
            log = server.server_log()
            assert "agent host 1 of 3 in a row ended without progress; the next starts in 200 ms" in log
            assert "agent host 2 of 3 in a row ended without progress; the next starts in 400 ms" in log
            assert "3 of 3" not in log
        assert model.requests == []  # the prompt never reached the model


def test_a_provider_error_fails_the_attempt_with_the_providers_message(tmp_path, pi_command, project):
    with ScriptedModel({"empty": []}) as model:  # every request is answered 400
        one_step(project)
        with serving(tmp_path / "s", agent_env(tmp_path, pi_command, model)) as server:
            run_id = start(server, project, "one-step")
            done = wait_status(server, run_id, "failed", "completed")
            (step,) = done["state"]["steps"]
            assert step["errorCode"] == "providerError", step
            status = " ".join(server.cli("run", "status", run_id).stdout.split())
            assert "the script of model 'empty' has no step 1" in status, status
        assert len(model.requests) == 1  # no reminders to a model that cannot answer


def test_rejected_submissions_are_capped_and_the_attempt_names_the_last(tmp_path, pi_command, project):
    with ScriptedModel({"stubborn": [submit({"risk": "high"})]}, cycle=True) as model:
        env = {**agent_env(tmp_path, pi_command, model), "PI_WORKFLOWS_AGENT_MAX_REJECTIONS": "3"}
        one_step(project)
        with serving(tmp_path / "s", env) as server:
            run_id = start(server, project, "one-step")
            done = wait_status(server, run_id, "failed", "completed")
            (step,) = done["state"]["steps"]
            assert step["errorCode"] == "tooManyRejections", step
            judged = query(
                server,
                "SELECT count(*) FROM interactive_submissions s JOIN interactive_requests r USING (request_id) "
                "WHERE r.run_id = ? AND s.receipt_digest IS NOT NULL",
                run_id,
            )
            assert judged == [(3,)]
            status = " ".join(server.cli("run", "status", run_id).stdout.split())
            assert "3 submissions were rejected (at most 3 per attempt); the last, validationFailed" in status


@pytest.fixture(autouse=True)
def _no_provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key in the test's own environment would let Pi reach a real provider."""
    for name in [name for name in os.environ if name.endswith("_API_KEY")]:
        monkeypatch.delenv(name)


def test_an_author_scripts_the_agents_answers_offline_with_dev_model(tmp_path, pi_command, project):
    """pi-workflows dev model serves the script and prints the settings; doctor's probe takes no
    step of it; the run's agent step gets the scripted answer."""
    script = tmp_path / "answers.json"
    answer = {
        "tool_calls": [
            {
                "name": "workflow",
                "arguments": {"action": "submit", "requestId": "${requestId}", "output": {"risk": "low"}},
            }
        ]
    }
    script.write_text(json.dumps({"reviewer": [answer]}))
    pi_dir = tmp_path / "pi-config"
    command = [
        sys.executable,
        "-m",
        "piworkflows.cli",
        "dev",
        "model",
        "--script",
        str(script),
        "--pi-dir",
        str(pi_dir),
    ]
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as dev:
        try:
            assert dev.stdout is not None
            printed = [dev.stdout.readline() for _ in range(5)]
            assert (
                printed[0].startswith("scripted model serving http://127.0.0.1:") and "(models: reviewer)" in printed[0]
            )
            assert printed[2].strip() == f"export PI_CODING_AGENT_DIR={pi_dir}"
            assert printed[3].strip() == "export PI_WORKFLOWS_AGENT_MODEL=scripted/reviewer"
            settings = {"PI_CODING_AGENT_DIR": str(pi_dir), "PI_WORKFLOWS_AGENT_MODEL": "scripted/reviewer"}
            probe = subprocess.run(
                [sys.executable, "-m", "piworkflows.cli", "doctor"],
                env={**env, **settings, "PI_WORKFLOWS_PI_COMMAND": pi_command[0]},
                capture_output=True,
                text=True,
                timeout=100,
            )
            assert probe.returncode == 0 and "probe:      answered (OK)" in probe.stdout, probe.stdout + probe.stderr
            one_step(project)
            server_env = {"HOME": str(tmp_path / "home"), "PI_WORKFLOWS_PI_COMMAND": pi_command[0], **settings}
            with serving(tmp_path / "s", server_env) as server:
                run_id = start(server, project, "one-step")
                done = wait_status(server, run_id, "completed", "failed")
                assert done["display"]["status"] == "completed", done["display"]  # the probe left the step
                assert done["state"]["finalOutput"] == {"risk": "low"}
        finally:
            dev.terminate()
            assert dev.wait(timeout=30) == 0

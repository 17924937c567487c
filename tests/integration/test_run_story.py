"""A run's story through the CLI on real servers: ``run status``, ``run watch``, ``run start --wait``
(human and --json), the commands it prints, and the answer refused for the wrong node."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys

import pytest

from piworkflows.isotime import epoch_ms
from tests.engine_util import BLOCKING, TENSTEP, start, start_waiting, view, wait_status, write
from tests.server_util import ServerProcess, check_state

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


# A shell node, a compute node and a checkpoint; the answer {"go": ...} is the run's output.
STORY = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge, idempotent_effect, shell
workflow = define_workflow("story", "say", {
    "say": shell(effect=idempotent_effect("test.say"),
                 exec=lambda ctx: {"command": "sh", "args": ["-c", "echo line-1; echo line-2; echo oops >&2"]}),
    "count": compute(lambda ctx: {"lines": len(ctx.outputs["say"]["stdout"].splitlines())}),
    "ask": checkpoint(summary=lambda ctx: f"{ctx.outputs['count']['lines']} lines: go on?",
                      run=lambda ctx: {"lines": ctx.outputs["count"]["lines"]}),
    "done": compute(lambda ctx: {"go": ctx.outputs["ask"]["go"]}),
}, [edge("say", "count"), edge("count", "ask"), edge("ask", "done")])
"""

# A manual command that outlives its timeout: its effect becomes ambiguous and the run needs review.
NAP = """
from piworkflows.workflows import define_workflow, manual_effect, shell
workflow = define_workflow("nap", "nap", {
    "nap": shell(effect=manual_effect("test.nap"),
                 exec=lambda ctx: {"command": "sleep", "args": ["30.5151"], "timeoutMs": 300}),
})
"""

BOOM = """
from piworkflows.workflows import compute, define_workflow
workflow = define_workflow("boom", "a", {"a": compute(lambda ctx: 1 / 0)})
"""


def printed_command(stdout: str, label: str) -> list[str]:
    """The command the CLI printed after ``label:`` (on that line, or the next when it did not fit),
    as argv for this interpreter."""
    lines = stdout.splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{label}:"))
    text = lines[index].split(f"{label}:", 1)[1].strip() or lines[index + 1].strip()
    argv = shlex.split(text)
    assert argv[0] == "pi-workflows", text
    return [sys.executable, "-m", "piworkflows.cli", *argv[1:]]


def run(argv: list[str], server: ServerProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=server.env, stdin=subprocess.DEVNULL)


def json_lines(stdout: str) -> list[dict]:
    """Every line of stdout is one JSON object."""
    lines = stdout.splitlines()
    assert lines, "no output"
    return [json.loads(line) for line in lines]


def test_run_status_tells_the_story_and_its_answer_command_works(server, project):
    write(project, "story", STORY)
    run_id = start(server, project, "story")
    wait_status(server, run_id, "waiting")

    shown = server.cli("run", "status", run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"{run_id}  story  waiting" in out
    assert "source: .pi/workflows/story.workflow.py, sha256 " in out and f"project: {project}" in out
    lines = [line.strip() for line in out.splitlines()]
    say = lines.index(next(line for line in lines if line.startswith("0  say")))
    assert lines[say].split()[2:5] == ["shell", "1/1", "completed"]
    assert lines[say + 1].startswith("exit code 0 after ")
    assert lines[say + 2 : say + 7] == ["stdout:", "line-1", "line-2", "stderr:", "oops"]
    assert 'output: {"lines":2}' in lines
    assert "question: 2 lines: go on?" in lines and 'details: {"lines":2}' in lines
    assert f"pi-workflows --state-dir {server.state_dir} answer {run_id} ask 'JSON'" in out
    assert lines[-1] == "controls: pause, cancel, answer"

    as_json = server.cli("run", "status", run_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    (story,) = json_lines(as_json.stdout)
    steps = {step["nodeId"]: step for step in story["state"]["steps"]}
    assert steps["say"]["output"]["stdout"] == "line-1\nline-2\n" and steps["say"]["output"]["stderr"] == "oops\n"
    assert steps["say"]["output"]["exitCode"] == 0 and steps["say"]["durationMs"] >= 0
    assert steps["count"]["output"] == {"lines": 2} and "error" not in steps["count"]
    assert steps["ask"]["request"] == {"summary": "2 lines: go on?", "details": {"lines": 2}}
    assert steps["ask"]["status"] == "waiting" and steps["ask"]["durationMs"] is None
    assert story["piworkflows"]["durationMs"] is None
    assert "currentStep" not in story["piworkflows"] and story["state"]["currentAttemptId"] == steps["ask"]["attemptId"]
    assert story["piworkflows"]["effects"] == []

    answer = printed_command(out, "answer it")
    answered = run([*answer[:-1], answer[-1].replace("JSON", '{"go": true}')], server)
    assert answered.returncode == 0, answered.stderr
    done = wait_status(server, run_id, "completed", "failed")
    assert done["state"].get("finalOutput") == {"go": True}
    finished, started = epoch_ms(done["queue"]["finishedAt"]), epoch_ms(done["queue"]["startedAt"])
    assert done["piworkflows"]["durationMs"] == finished - started
    assert "currentAttemptId" not in done["state"]
    final = server.cli("run", "status", run_id).stdout
    assert 'answer: {"go":true}' in final and "answer it" not in final and "controls: -" in final
    late = server.cli("answer", run_id, "ask", '{"go": false}')
    assert late.returncode == 1 and "winnerDecided" in late.stderr
    check_state(server.state_dir)


def test_an_answer_for_another_node_names_the_node_that_waits(server, project):
    run_id = start_waiting(server, project)
    wrong = server.cli("answer", run_id, "prepare", '{"go": true}')
    assert wrong.returncode == 1 and f"{run_id} waits at a checkpoint, 'ask', not at 'prepare'" in wrong.stderr
    with server.client() as client:
        refused = client.request("checkpoint.answer", {"nodePath": "prepare", "answer": {}}, run_id=run_id)
        assert (
            client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id).outcome
            == "accepted"
        )
    assert refused.outcome == "conflict"
    assert refused.receipt == {"code": "notWaiting", "nodePath": "prepare", "waitingNode": "ask"}
    wait_status(server, run_id, "completed")
    finished = server.cli("answer", run_id, "prepare", "{}")
    assert finished.returncode == 1 and f"run {run_id} does not wait at any checkpoint" in finished.stderr


def test_an_ambiguous_effect_shows_its_id_and_the_commands_that_settle_it(server, project):
    write(project, "nap", NAP)
    run_id = start(server, project, "nap")
    wait_status(server, run_id, "ambiguous")
    (effect,) = view(server, run_id)["piworkflows"]["effects"]
    effect_id = effect["effectId"]
    assert effect == {
        "effectId": effect_id,
        "effectType": "test.nap",
        "nodePath": "nap",
        "visit": 1,
        "controls": ["confirm", "retry"],
    }

    shown = server.cli("run", "status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "ambiguous: An external effect needs explicit recovery." in shown.stdout
    assert f"ambiguous effect {effect_id} (test.nap)" in shown.stdout
    assert f"pi-workflows --state-dir {server.state_dir} effect confirm {effect_id}" in shown.stdout
    assert f"pi-workflows --state-dir {server.state_dir} effect retry {effect_id}" in shown.stdout
    assert shown.stdout.splitlines()[-1] == "  controls: review"

    confirmed = run(printed_command(shown.stdout, "it acted"), server)
    assert confirmed.returncode == 0 and f"{effect_id} confirmed applied" in confirmed.stdout, confirmed.stderr
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed" and done["piworkflows"]["effects"] == []
    check_state(server.state_dir)


@pytest.mark.parametrize(
    "name, source, status, code",
    [("tenstep", TENSTEP, "completed", 0), ("story", STORY, "waiting", 1), ("boom", BOOM, "failed", 1)],
)
def test_run_start_wait_json_prints_only_json_lines(server, project, name, source, status, code):
    write(project, name, source)
    result = server.cli("run", "start", name, "--project", str(project), "--wait", "--json")
    assert result.returncode == code, result.stderr
    receipt, final = json_lines(result.stdout)  # exactly the receipt, then the final run view
    assert receipt["status"] == "queued" and receipt["runId"].startswith("run-")
    assert final["schema"] == "pi-workflows.run-view.v1" and final["runId"] == receipt["runId"]
    assert final["display"]["status"] == status


def test_run_watch_prints_step_lines_in_order_and_the_question(server, project):
    write(project, "story", STORY)
    waits = server.cli("run", "start", "story", "--project", str(project), "--wait")
    assert waits.returncode == 1, waits.stderr
    run_id = waits.stdout.splitlines()[0]
    expected = [
        "say (shell) started",
        "say (shell) completed",
        "count (compute) started",
        "count (compute) completed",
        "ask (checkpoint) started",
        f"{run_id} waits at ask",
        "question: 2 lines: go on?",
        "answer it",
        f"{run_id} waiting",
    ]
    for output in (waits.stdout, (watched := server.cli("run", "watch", run_id)).stdout):
        positions = [output.find(text) for text in expected]
        assert -1 not in positions and positions == sorted(positions), (positions, output)
    assert watched.returncode == 1, watched.stderr

    events = json_lines((as_json := server.cli("run", "watch", run_id, "--json")).stdout)
    assert as_json.returncode == 1
    assert [(e.get("event"), e.get("nodePath")) for e in events[:-1]] == [
        ("stepStarted", "say"),
        ("stepFinished", "say"),
        ("stepStarted", "count"),
        ("stepFinished", "count"),
        ("stepStarted", "ask"),
        ("waiting", "ask"),
    ]
    assert events[-2]["request"] == {"summary": "2 lines: go on?", "details": {"lines": 2}}
    assert events[1]["status"] == "completed" and events[1]["durationMs"] >= 0
    assert events[-1]["schema"] == "pi-workflows.run-view.v1" and events[-1]["display"]["status"] == "waiting"

    assert server.cli("answer", run_id, "ask", '{"go": false}').returncode == 0
    finished = server.cli("run", "watch", run_id, "--json")
    assert finished.returncode == 0, finished.stderr
    events = json_lines(finished.stdout)
    assert [e.get("event") for e in events[-4:-1]] == ["stepStarted", "stepFinished", "finished"]
    assert events[-2] == {"event": "finished", "runId": run_id, "status": "completed", "errorCode": None}
    assert events[-1]["state"]["finalOutput"] == {"go": False}


def test_ctrl_c_while_watching_exits_130_and_the_run_goes_on(server, project, tmp_path):
    write(project, "blocking", BLOCKING)
    flag = tmp_path / "flag"
    run_id = start(server, project, "blocking", {"flag": str(flag)})
    with server.cli_background("run", "watch", run_id) as watching:
        while "wait (compute) started" not in (line := watching.stdout.readline()):
            assert line, watching.stderr.read()  # it printed the step before it went on polling
        watching.send_signal(signal.SIGINT)
        _, stderr = watching.communicate(timeout=60)
    assert watching.returncode == 130, stderr
    assert f"{run_id} goes on" in stderr and "Traceback" not in stderr, stderr
    assert f"pi-workflows --state-dir {server.state_dir} run watch {run_id}" in stderr
    assert view(server, run_id)["display"]["status"] == "running"
    flag.write_text("go")
    assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"


def test_watch_without_a_server_says_so_at_once(tmp_path):
    stopped = ServerProcess(tmp_path / "none")  # never started: nothing listens on its socket
    result = stopped.cli("run", "watch", "run-x", timeout=10)
    assert result.returncode == 1 and "no Pi Workflows server is running" in result.stderr, result.stderr
    assert f"start it with 'pi-workflows --state-dir {stopped.state_dir} server start'" in result.stderr
    assert result.stdout == "" and not (tmp_path / "none" / "state.sqlite").exists()


def test_human_output_is_readable_at_80_columns(server, project):
    """Short values: every line fits 80 columns (paths are printed whole: the project's line is not
    counted) and nothing prints a Python repr."""
    write(project, "story", STORY)
    write(project, "nap", NAP)
    env = {**server.env, "PI_WORKFLOWS_STATE_DIR": str(server.state_dir)}  # commands without --state-dir

    def cli(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "piworkflows.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert "Traceback" not in result.stderr, result.stderr
        return result.stdout

    waiting = cli("run", "start", "story", "--project", str(project), "--wait")
    run_id = waiting.splitlines()[0]
    outputs = [waiting, cli("run", "status", run_id), cli("run", "watch", run_id)]
    cli("answer", run_id, "ask", '{"go": true}')
    outputs += [cli("run", "watch", run_id), cli("run", "status", run_id)]
    nap = start(server, project, "nap")
    wait_status(server, nap, "ambiguous")
    outputs += [cli("run", "status", nap), cli("run", "watch", nap)]
    for output in outputs:
        for line in output.splitlines():
            assert "None" not in line and "['" not in line and "{'" not in line, line
            assert len(line) <= 80 or str(project) in line, line
    assert f"  answer it: pi-workflows answer {run_id} ask 'JSON'" in waiting

"""A run never gets stuck in silence: workflow failures fail the run, dying runners leave their last words.

Through the CLI on real servers: a failure while a runner continues a run (the
route of an answered checkpoint, the module's load, an include's input) fails
the run with the node or file named; a runner that dies before it saved
progress parks ``runnerNoProgress`` with its last stderr lines in server.log and
a park detail in the run view; ``builtin:shell-check`` fails when the checked
command fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine_util import start, view, wait_status, write
from tests.server_util import ServerProcess, check_state, query, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

# The checkpoint is the last node: its answer is the run's output.
LAST_CHECKPOINT = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge
workflow = define_workflow("last", "prepare", {
    "prepare": compute(lambda ctx: {"ready": True}),
    "ask": checkpoint(summary="anything to add?"),
}, [edge("prepare", "ask")])
"""

# Loads in the resolver (argv "resolve"), raises when a runner (argv "run") loads it.
RAISES_IN_RUNNER = """
import sys
from piworkflows.workflows import compute, define_workflow
if sys.argv[-1] == "run":
    raise RuntimeError("no runner may load me")
workflow = define_workflow("fragile", "only", {"only": compute(lambda ctx: 1)})
"""

# The include's input function raises: the child's first node cannot get its input.
BAD_INCLUDE_INPUT = """
from piworkflows.workflows import compute, define_workflow, edge, include_workflow
child = define_workflow("child", "c1", {"c1": compute(lambda ctx: {"got": ctx.input})})
workflow = define_workflow("parent", "prep", {"prep": compute(lambda ctx: {"n": 1})},
                           [edge("prep", "sub")],
                           includes={"sub": include_workflow(child, input=lambda ctx: ctx.outputs["missing"])})
"""

# The checkpoint's own code (its summary) raises: the node fails, and its outcome edge applies.
BAD_SUMMARY = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge, switch
workflow = define_workflow("asks", "ask", {
    "ask": checkpoint(summary=lambda ctx: ctx.input["question"]),
    "sorry": compute(lambda ctx: {"asked": False}),
}, [switch("ask", on="$result.outcome", cases={"failed": "sorry"})])
"""

# Dies (exit 3) in the runner before anything is saved, after a last word on stderr.
DIES_IN_RUNNER = """
import os, sys
from piworkflows.workflows import compute, define_workflow
if sys.argv[-1] == "run":
    print("loading the helper table", file=sys.stderr)
    print("boom: ValueError('x')", file=sys.stderr, flush=True)
    os._exit(3)
workflow = define_workflow("dying", "only", {"only": compute(lambda ctx: 1)})
"""


# A compute node's output that no case of its switch takes (an answer or an agent's output is
# refused before it is taken: tests/integration/test_next_commands.py).
NO_CASE = """
from piworkflows.workflows import compute, define_workflow, switch
workflow = define_workflow("nocase", "pick", {
    "pick": compute(lambda ctx: {"go": "maybe"}),
    "yes": compute(lambda ctx: {"went": True}),
    "no": compute(lambda ctx: {"went": False}),
}, [switch("pick", on="$.go", cases={"true": "yes", "false": "no"})])
"""


def test_an_output_that_matches_no_case_fails_the_run_naming_the_node(server, project):
    write(project, "nocase", NO_CASE)
    done = server.cli("run", "start", "nocase", "--project", str(project), "--wait")
    assert done.returncode == 1, done.stdout + done.stderr
    run_id = done.stdout.splitlines()[0]
    failed = wait_status(server, run_id, "failed", "completed")
    assert failed["display"]["status"] == "failed" and failed["piworkflows"]["errorCode"] == "routingError"
    assert failed["state"].get("error") == "node 'pick': no case for $.go = maybe (cases: false, true)"
    assert failed["piworkflows"]["parkDetail"] is None
    status = server.cli("run", "status", run_id)
    assert status.returncode == 0 and "failed" in status.stdout and "routingError" in status.stdout
    assert "node 'pick': no case for $.go = maybe" in status.stdout
    assert [(s["nodeId"], s["status"]) for s in failed["state"]["steps"]] == [("pick", "completed")]
    check_state(server.state_dir)


def test_an_answer_to_the_last_node_completes_the_run_with_it(server, project):
    write(project, "last", LAST_CHECKPOINT)
    run_id = start(server, project, "last")
    wait_status(server, run_id, "waiting")
    assert server.cli("answer", run_id, "ask", '{"note": "none"}').returncode == 0
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed" and done["state"].get("finalOutput") == {"note": "none"}
    check_state(server.state_dir)


def test_a_module_that_fails_to_load_in_the_runner_fails_the_run_naming_the_file(server, project):
    write(project, "fragile", RAISES_IN_RUNNER)
    result = server.cli("run", "start", "fragile", "--project", str(project), "--wait")
    assert result.returncode == 1, result.stdout + result.stderr
    run_id = result.stdout.splitlines()[0]
    assert f"{run_id} failed" in result.stdout
    path = project.resolve() / ".pi" / "workflows" / "fragile.workflow.py"
    assert "error (loadFailed): the workflow module failed to load:" in result.stdout
    assert str(path) in result.stdout and ": RuntimeError: no runner may load me" in result.stdout
    failed = view(server, run_id)
    assert failed["piworkflows"]["errorCode"] == "loadFailed" and failed["piworkflows"]["parkReason"] is None
    assert f"{path}, line " in failed["state"].get("error")  # the file and the line, as run start reports a load error
    assert failed["state"]["steps"] == []
    check_state(server.state_dir)


def test_an_include_input_that_raises_fails_the_run_naming_the_node(server, project):
    write(project, "parent", BAD_INCLUDE_INPUT)
    result = server.cli("run", "start", "parent", "--project", str(project), "--wait")
    assert result.returncode == 1, result.stdout + result.stderr
    failed = view(server, result.stdout.splitlines()[0])
    assert failed["display"]["status"] == "failed" and failed["piworkflows"]["errorCode"] == "inputFailed"
    assert (
        failed["state"].get("error") == "node 'sub/c1': the input function of include 'sub' failed: KeyError: 'missing'"
    )
    assert [(s["nodeId"], s["status"]) for s in failed["state"]["steps"]] == [
        ("prep", "completed"),
        ("sub/c1", "failed"),
    ]
    check_state(server.state_dir)


def test_a_checkpoint_whose_summary_raises_fails_the_node_and_follows_its_outcome_edge(server, project):
    write(project, "asks", BAD_SUMMARY)
    result = server.cli("run", "start", "asks", "--project", str(project), "--wait")
    assert result.returncode == 0 and " completed" in result.stdout, result.stdout + result.stderr
    done = view(server, result.stdout.splitlines()[0])
    assert done["state"].get("finalOutput") == {"asked": False}
    assert [(s["nodeId"], s["status"]) for s in done["state"]["steps"]] == [("ask", "failed"), ("sorry", "completed")]


def test_a_runner_that_dies_before_progress_leaves_its_stderr_and_a_park_detail(server, project):
    write(project, "dying", DIES_IN_RUNNER)
    result = server.cli("run", "start", "dying", "--project", str(project), "--wait")
    assert result.returncode == 1 and "parked: The worker exited before it saved workflow progress." in result.stdout, (
        result.stdout + result.stderr
    )
    run_id = result.stdout.splitlines()[0]
    parked = wait_until(lambda: (v := view(server, run_id))["piworkflows"]["parkDetail"] and v, what="park detail")
    assert parked["piworkflows"]["parkReason"] == "runnerNoProgress"
    assert parked["piworkflows"]["parkDetail"] == "boom: ValueError('x')"
    status = server.cli("run", "status", run_id)
    assert "runner: boom: ValueError('x')" in status.stdout, status.stdout  # the detail, under the park reason
    log = wait_until(lambda: "boom: ValueError" in (text := server.server_log()) and text, what="stderr logged")
    assert f"runner of {run_id} stderr: loading the helper table" in log
    assert f"runner of {run_id} stderr: boom: ValueError('x')" in log
    # Resume works as before: one more runner, the same end, and its own detail.
    resumed = server.cli("run", "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    wait_until(lambda: server.server_log().count(f"runner of {run_id} stderr: boom") == 2, what="parked again")
    assert view(server, run_id)["piworkflows"]["parkDetail"] == "boom: ValueError('x')"
    check_state(server.state_dir)


# Dies (exit 4) in the resolver, after a last word on stderr.
DIES_IN_RESOLVER = """
import os, sys
if sys.argv[-1] == "resolve":
    print("resolver trouble: KeyError('k')", file=sys.stderr, flush=True)
    os._exit(4)
"""


def test_a_resolver_that_dies_leaves_its_stderr_in_server_log(server, project):
    write(project, "broken", DIES_IN_RESOLVER)
    result = server.cli("run", "start", "broken", "--project", str(project))
    assert result.returncode == 1 and "invalidDefinition" in result.stderr, result.stdout + result.stderr
    log = wait_until(lambda: "resolver trouble" in (text := server.server_log()) and text, what="stderr logged")
    line = next(line for line in log.splitlines() if "resolver trouble" in line)
    assert line.endswith(" stderr: resolver trouble: KeyError('k')") and " resolver " in line
    assert "the resolver exited with code 4" in log


def _shell_check(server: ServerProcess, project: Path, check: dict) -> tuple[int, str, dict]:
    result = server.cli(
        "run", "start", "builtin:shell-check", "--project", str(project), "--input", json.dumps(check), "--wait"
    )
    return result.returncode, result.stdout, view(server, result.stdout.splitlines()[0])


@pytest.mark.timeout(180)
def test_a_failing_shell_check_fails_its_run_naming_the_node_and_exit_code(server, project):
    code, out, failed = _shell_check(server, project, {"command": "false"})
    assert code == 1 and " failed" in out, out
    assert "error (nonZeroExit): node 'check': the command failed (exit code 1)" in out
    assert failed["piworkflows"]["errorCode"] == "nonZeroExit"
    assert [(s["nodeId"], s["status"]) for s in failed["state"]["steps"]] == [("check", "failed")]
    check = {"command": "sh", "args": ["-c", "echo yes; echo no >&2; exit 3"]}
    code, out, failed = _shell_check(server, project, check)
    assert code == 1 and "error (nonZeroExit): node 'check': the command failed (exit code 3): no" in out, out
    (output,) = query(
        server,
        "SELECT b.bytes FROM node_attempts a JOIN blobs b ON b.digest = a.output_digest WHERE a.run_id = ?",
        failed["runId"],
    )[0]
    assert {k: v for k, v in json.loads(output).items() if k != "durationMs"} == {  # the failed node keeps it
        "stdout": "yes\n",
        "stderr": "no\n",
        "exitCode": 3,
        "signal": None,
    }
    code, out, failed = _shell_check(server, project, {"command": "/nonexistent/pi-workflows-no-such-binary"})
    assert code == 1 and "node 'check': the command failed (exit code 127)" in out, out
    assert "pi-workflows-no-such-binary" in failed["state"].get("error")  # the shell's own complaint, from stderr
    code, out, passed = _shell_check(server, project, {"command": "sh", "args": ["-c", "echo fine"]})
    assert code == 0 and " completed" in out, out
    assert passed["state"].get("finalOutput") == {"kind": "final", "message": "passed"}
    assert [s["nodeId"] for s in passed["state"]["steps"]] == ["check", "report", "done"]
    check_state(server.state_dir)

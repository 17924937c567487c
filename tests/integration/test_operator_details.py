"""Small operator defects, each through the CLI on a real server: a node name that is no node, the
run input in run status, counts that tell waiting from parked, ISO times in run logs --json, runs of
a built-in found by its builtin: name, and Pi's extension cache kept private."""

from __future__ import annotations

import json
import os
import stat

import pytest

from piworkflows.testing.scripted_model import ScriptedModel
from tests.engine_util import CHECKPOINT, start, wait_status, write
from tests.pi_util import agent_env, submit
from tests.server_util import serving

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

TITLED = """
from piworkflows.workflows import compute, define_workflow
workflow = define_workflow("titled", "a", {"a": compute(lambda ctx: {"x": 1})}, [],
                           title=lambda ctx: "for " + ctx.input.get("who", "nobody"))
"""


def test_run_logs_of_a_node_the_run_does_not_have_is_a_usage_error_naming_its_nodes(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    typo = server.cli("run", "logs", run_id, "prepar")
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert "has no node 'prepar'; its nodes: ask, no, prepare, yes" in typo.stderr
    assert server.cli("run", "logs", run_id, "prepare").returncode == 0


def test_run_logs_json_times_are_iso_like_every_other_json(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    done = server.cli("run", "logs", run_id, "--json")
    assert done.returncode == 0, done.stderr
    (step,) = [json.loads(line) for line in done.stdout.splitlines() if json.loads(line)["nodePath"] == "prepare"]
    assert step["startedAt"].endswith("Z") and step["finishedAt"].endswith("Z")
    assert step["startedAt"][:4].isdigit() and "T" in step["startedAt"]


def test_run_status_shows_the_input_and_a_non_object_input_is_named_not_blamed_on_the_title(server, project):
    write(project, "titled", TITLED)
    run_id = start(server, project, "titled", {"who": "ops"})
    wait_status(server, run_id, "completed")
    shown = server.cli("run", "status", run_id)
    assert '  input: {"who":"ops"}' in shown.stdout, shown.stdout
    listed = server.cli("run", "start", "titled", "--project", str(project), "--input", "[1, 2]")
    assert listed.returncode == 1
    said = " ".join(listed.stderr.split())
    assert "the run input is [1,2], a JSON array" in said and "the title function expects an object" in said


def test_server_status_counts_a_waiting_run_as_waiting_not_parked(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    status = json.loads(server.cli("server", "status", "--json").stdout)
    assert (status["parkedRuns"], status["waitingRuns"]) == (0, 1), status
    assert "0 parked, 1 waiting" in server.cli("server", "status").stdout


def test_runs_finds_the_runs_of_a_built_in_by_its_builtin_name(server, project):
    write(project, "shell-check", CHECKPOINT.replace('"ask", "prepare"', '"shell-check", "prepare"'))
    ours = start(server, project, "shell-check")
    builtin = start(server, project, "builtin:shell-check", {"command": "true"})
    wait_status(server, builtin, "completed", "failed")
    by_builtin = server.cli("runs", "--workflow", "builtin:shell-check", "--json", "--all")
    assert by_builtin.returncode == 0, by_builtin.stderr
    assert [item["runId"] for line in by_builtin.stdout.splitlines() for item in json.loads(line)["items"]] == [builtin]
    by_name = server.cli("runs", "--workflow", "shell-check", "--json", "--all")
    found = [item["runId"] for line in by_name.stdout.splitlines() for item in json.loads(line)["items"]]
    assert sorted(found) == sorted([ours, builtin])


def test_pis_extension_cache_is_private_to_the_server_not_a_shared_tmp(tmp_path, pi_command, project):
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    with ScriptedModel({"cache": [submit({"done": True})]}) as model:
        env = {**agent_env(tmp_path, pi_command, model), "TMPDIR": str(shared)}
        write(
            project,
            "one",
            "from piworkflows.workflows import agent, define_workflow\n"
            'workflow = define_workflow("one", "a", {"a": agent("Do it.", "anything")}, [])\n',
        )
        with serving(tmp_path / "s", env) as server:
            run_id = start(server, project, "one")
            done = wait_status(server, run_id, "completed", "failed")
            assert done["display"]["status"] == "completed", done["display"]
            private = server.state_dir / "host" / "pi-tmp"
            assert stat.S_IMODE(private.stat().st_mode) == 0o700
            assert any(private.joinpath("jiti").iterdir())  # Pi's extension cache is here
            assert not (shared / "jiti").exists(), os.listdir(shared)


def test_runs_fits_80_columns_with_a_long_workflow_name(server, project):
    name = "a-workflow-with-a-long-name"
    write(project, name, CHECKPOINT.replace('"ask", "prepare"', f'"{name}", "prepare"'))
    run_id = start(server, project, name)
    wait_status(server, run_id, "waiting")
    table = server.cli("runs", env={"COLUMNS": "80"})
    assert table.returncode == 0 and run_id in table.stdout, table.stderr
    assert max(len(line) for line in table.stdout.splitlines()) <= 80, table.stdout

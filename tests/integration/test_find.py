"""Finding runs and workflows through the CLI on real servers: runs filters and pages, workflows
and workflow show, load errors a user can act on, shell completion."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from piworkflows.isotime import epoch_ms
from tests.engine_util import CHECKPOINT, start, wait_status, write
from tests.server_util import ServerProcess, query, serving

# No runners (except where a test starts its own server); the human output at 80 columns.
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.integration,
    pytest.mark.server_env(PI_WORKFLOWS_MAX_RUNNERS="0", COLUMNS="80"),
]

HELLO = 'from piworkflows.workflows import *\nworkflow = define_workflow("hello", "a", {"a": compute(lambda c: 1)})\n'


def json_lines(result, code: int = 0) -> list[dict]:
    assert result.returncode == code, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def listed(server: ServerProcess, *args: str) -> list[dict]:
    """Every run ``runs --all --json ARGS`` prints, page after page."""
    return [item for page in json_lines(server.cli("runs", "--all", "--json", *args)) for item in page["items"]]


@pytest.mark.timeout(240)
def test_runs_filters_and_pages_through_600_runs(server: ServerProcess, tmp_path: Path):
    projects = [tmp_path / "a", tmp_path / "b"]
    for project in projects:
        (project / ".pi" / "workflows").mkdir(parents=True)
        write(project, "hello", HELLO)
    names = ["builtin:demo", "builtin:shell-check", "hello"]
    planted = {}  # run id -> (project, workflow name, cancelled)
    with server.client() as client:
        for n in range(600):
            payload = {"projectPath": str(projects[n % 2]), "workflowName": names[n % 3]}
            run_id = client.request("run.start", payload).receipt["runId"]
            if n % 5 == 0:
                assert client.request("run.cancel", {}, run_id=run_id).outcome == "accepted"
            planted[run_id] = (projects[n % 2], names[n % 3].removeprefix("builtin:"), n % 5 == 0)

    pages = json_lines(server.cli("runs", "--all", "--json", "--limit", "100"))
    assert len(pages) == 6 and [page["cursor"] is None for page in pages] == [False] * 5 + [True]
    everything = [item for page in pages for item in page["items"]]
    assert sorted(item["runId"] for item in everything) == sorted(planted)
    keys = [(item["createdAt"], item["runId"]) for item in everything]
    assert keys == sorted(keys, reverse=True)  # newest first, across pages
    newest_first = [item["runId"] for item in everything]

    def expect(keep) -> list[str]:
        return [run_id for run_id in newest_first if keep(run_id, *planted[run_id])]

    assert [(page["start"], page["total"]) for page in pages] == [(100 * n, 600) for n in range(6)]
    middle = epoch_ms(everything[300]["createdAt"])
    since = datetime.fromtimestamp(middle / 1000, tz=UTC).isoformat(timespec="milliseconds")
    created = {item["runId"]: epoch_ms(item["createdAt"]) for item in everything}
    cases = {
        ("--status", "cancelled"): lambda r, p, w, c: c,
        ("--status", "queued", "--status", "cancelled"): lambda r, p, w, c: True,
        ("--workflow", "shell-check"): lambda r, p, w, c: w == "shell-check",
        ("--project", str(projects[1])): lambda r, p, w, c: p == projects[1],
        ("--since", since): lambda r, p, w, c: created[r] >= middle,
        ("--since", "2h"): lambda r, p, w, c: True,
        (
            "--project",
            str(projects[0]),
            "--workflow",
            "demo",
            "--status",
            "queued",
            "--since",
            since,
        ): lambda r, p, w, c: p == projects[0] and w == "demo" and not c and created[r] >= middle,
    }
    for args, keep in cases.items():
        found = [item["runId"] for item in listed(server, *args)]
        assert found == expect(keep) and found, args
    cancelled = listed(server, "--status", "cancelled")
    assert {item["display"]["status"] for item in cancelled} == {"cancelled"}
    assert all(item["manifest"]["finishedAt"] is not None for item in cancelled)

    table = server.cli("runs", "--all")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ID", "WORKFLOW", "TITLE", "STATUS", "AGE", "RAN"] and len(lines) == 601
    assert max(len(line) for line in lines) <= 80
    first = lines[1].split()
    assert first[0] == newest_first[0] and first[1] == planted[newest_first[0]][1]
    demo_line = next(line for line in lines if line.startswith(expect(lambda r, p, w, c: w == "demo" and c)[0]))
    assert "demo for…" in demo_line and "cancelled" in demo_line  # the title cut to the 80 columns
    one_page = server.cli("runs").stdout.splitlines()
    assert [line.split()[0] for line in one_page] == [line.split()[0] for line in lines[:51]]  # the first page

    with server.client() as client:  # view.runs.page: upstream's offset cursor, run.list's keyset cursor
        first = client.request("view.runs.page", {"cursor": 0, "revision": pages[0]["revision"], "limit": 100})
        assert first.outcome == "accepted" and first.receipt == pages[0]
        third = client.request("view.runs.page", {"cursor": 200, "revision": "any: not the first page", "limit": 100})
        assert third.receipt["start"] == 200 and third.receipt["items"] == pages[2]["items"]
        after = client.request("view.runs.page", {"cursor": pages[1]["cursor"], "revision": "any", "limit": 100})
        assert after.receipt == pages[2]
        stale = client.request("view.runs.page", {"cursor": 0, "revision": "0:0:0"})
        assert stale.outcome == "conflict" and stale.receipt["code"] == "staleRevision"
        assert stale.receipt["page"]["revision"] == pages[0]["revision"] and stale.receipt["page"]["start"] == 0
        assert client.request("run.cancel", {}, run_id=expect(lambda r, p, w, c: not c)[0]).outcome == "accepted"
        moved = client.request("view.runs.page", {"cursor": 0, "revision": pages[0]["revision"]})
        assert moved.outcome == "conflict" and moved.receipt["page"]["revision"] != pages[0]["revision"]
        assert moved.receipt["page"]["total"] == 600  # a visible change moves the revision, not the count
        bad = client.request("view.runs.page", {"cursor": True, "revision": "r"})
        assert bad.outcome == "rejected" and bad.receipt["code"] == "validationFailed"


@pytest.mark.parametrize("since", ["yesterday", "2x", "-3h", "2026-13-01"])
def test_runs_refuses_a_since_it_cannot_read_before_anything_is_sent(tmp_path: Path, since: str):
    result = ServerProcess(tmp_path / "never-started").cli("runs", "--since", since)
    assert result.returncode == 2 and "--since" in result.stderr and "90m, 2h, 3d" in result.stderr


def test_runs_says_so_when_nothing_matches(server: ServerProcess):
    result = server.cli("runs", "--status", "failed", "--all")
    assert result.returncode == 0 and result.stdout == "no runs\n"


# --- workflows and workflow show ----------------------------------------------------------------

BROKEN = {  # a module that fails to load: its source, the line to report, and what the report must say
    "syntax": (
        "from piworkflows.workflows import *\nworkflow = define_workflow(\n    'syntax', 'a',\n",
        2,
        ["SyntaxError: '(' was never closed", "    workflow = define_workflow(\n", "^"],
    ),
    "imports": (
        "import os\nimport no_such_module_for_piw\n",
        2,
        ["ModuleNotFoundError", "the missing module: no_such_module_for_piw", "import no_such_module_for_piw"],
    ),
    "raises": (
        "def helper():\n    return {}['key']\n\n\nhelper()\n",
        2,
        ["KeyError: 'key'", ", line 5, in <module>", "      helper()", ", line 2, in helper", "      return {}['key']"],
    ),
}


@pytest.fixture
def sources(tmp_path: Path, project: Path) -> dict[str, Path]:
    """A project and a user dir: hello in both (the user's is shadowed), demo in the user dir
    (it shadows the built-in), and a broken module in each."""
    user = tmp_path / "user-workflows"
    user.mkdir()
    write(project, "hello", HELLO.replace(")})", ")}, description='Says hello from the project.')"))
    (user / "hello.workflow.py").write_text(HELLO)
    (user / "demo.workflow.py").write_text(HELLO.replace('"hello"', '"demo"'))
    write(project, "syntax", BROKEN["syntax"][0])
    (user / "imports.workflow.py").write_text(BROKEN["imports"][0])
    return {"project": project / ".pi" / "workflows", "user": user}


@pytest.fixture
def user_server(tmp_path: Path, sources: dict[str, Path]):
    env = {"PI_WORKFLOWS_MAX_RUNNERS": "0", "PI_WORKFLOWS_USER_DIR": str(sources["user"]), "COLUMNS": "80"}
    with serving(tmp_path / "s", env) as proc:
        yield proc


def test_workflows_lists_project_user_and_builtin_sources_with_shadowing(user_server, project, sources):
    (receipt,) = json_lines(user_server.cli("workflows", "--project", str(project), "--json"), code=1)
    assert (receipt["projectDirectory"], receipt["userDirectory"]) == (str(sources["project"]), str(sources["user"]))
    assert receipt["truncated"] is False
    rows = [(item["name"], item["origin"], item["shadowedBy"], item["error"] is None) for item in receipt["items"]]
    assert rows == [
        ("agent-demo", "builtin", None, True),
        ("demo", "user", None, True),
        ("demo", "builtin", "user", True),
        ("hello", "project", None, True),
        ("hello", "user", "project", True),
        ("imports", "user", None, False),
        ("shell-check", "builtin", None, True),
        ("syntax", "project", None, False),
        ("telegram-demo", "builtin", None, True),
    ]
    by_key = {(item["name"], item["origin"]): item for item in receipt["items"]}
    assert by_key["hello", "project"]["description"] == "Says hello from the project."
    assert by_key["hello", "project"]["source"] == {
        "kind": "file",
        "path": str(sources["project"] / "hello.workflow.py"),
        "sha256": hashlib.sha256((sources["project"] / "hello.workflow.py").read_bytes()).hexdigest(),
    }
    assert by_key["demo", "builtin"]["source"] == {"kind": "builtin", "id": "builtin:demo", "revision": "4"}
    assert by_key["demo", "builtin"]["description"].startswith("Every node kind")
    error = by_key["syntax", "project"]["error"]
    assert (error["file"], error["line"]) == (str(sources["project"] / "syntax.workflow.py"), 2)

    table = user_server.cli("workflows", "--project", str(project))
    assert table.returncode == 1, table.stderr  # a module does not load: a check fails
    assert table.stderr == "pi-workflows: 2 workflow modules did not load: imports, syntax\n"
    lines = table.stdout.splitlines()
    assert (
        lines[0] == f"project workflows: {sources['project']}" and lines[1] == f"user workflows:    {sources['user']}"
    )
    assert any(
        line.split() == ["demo", "builtin", "builtin:demo", "revision", "4,", "shadowed", "by", "user"]
        for line in lines
    )
    assert "    Says hello from the project." in lines
    assert (
        f"    does not load: {sources['user'] / 'imports.workflow.py'}, line 2: ModuleNotFoundError: No module "
        "named 'no_such_module_for_piw'" in lines
    )


def test_workflow_show_prints_the_graph_and_json_the_definition_snapshot(user_server, project):
    shown = user_server.cli("workflow", "show", "builtin:demo", "--project", str(project))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "demo (builtin: builtin:demo revision 4)"
    assert (
        "  input: not declared (define_workflow takes no input schema; the description says what it expects)" in lines
    )
    for expected in [
        "  greet [compute] -> progress",
        "  hook [compute] switch on $.post",
        "      true -> post",
        "      false -> summary/count",
        "  summary/describe [compute] -> ask",
        "  stop [notify] (end)",
        "  summary/ is the included workflow demo-summary",
    ]:
        assert expected in lines, expected
    assert lines.index("  greet [compute] -> progress") < lines.index("  ask [checkpoint] switch on $.continue")

    (receipt,) = json_lines(user_server.cli("workflow", "show", "builtin:demo", "--project", str(project), "--json"))
    with user_server.client() as client:
        started = client.request("run.start", {"projectPath": str(project), "workflowName": "builtin:demo"})
        graph = client.request("run.status", {}, run_id=started.receipt["runId"]).receipt["workflow"]
    assert receipt["definitionDigest"] == started.receipt["definitionDigest"]  # the definition run start stores
    snapshot = receipt["snapshot"]
    assert snapshot["schema"] == "pi-workflows.definition-snapshot.v1"
    assert (snapshot["startAt"], snapshot["nodes"], snapshot["edges"]) == (
        graph["startAt"],
        graph["nodes"],
        graph["edges"],
    )
    assert receipt["origin"] == "builtin" and receipt["source"]["id"] == "builtin:demo"

    shadowing = json_lines(user_server.cli("workflow", "show", "demo", "--project", str(project), "--json"))[0]
    assert shadowing["origin"] == "user" and shadowing["snapshot"]["startAt"] == "a"  # the user's demo wins
    missing = user_server.cli("workflow", "show", "nope", "--project", str(project))
    assert missing.returncode == 1 and "workflowNotFound" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_module_that_fails_to_load_is_reported_with_file_and_line_everywhere(user_server, project, sources, name):
    source, line, says = BROKEN[name]
    write(project, name, source)  # the project's copy (for imports: it shadows the user's)
    path = sources["project"] / f"{name}.workflow.py"
    started = user_server.cli("run", "start", name, "--project", str(project))
    shown = user_server.cli("workflow", "show", name, "--project", str(project))
    for result in (started, shown):
        assert result.returncode == 1 and "invalidDefinition" in result.stderr, result
        assert f"{path}, line {line}: " in result.stderr, result.stderr
        for text in says:
            assert text in result.stderr, (text, result.stderr)
        assert "piworkflows/" not in result.stderr and "Traceback" not in result.stderr  # no frames of ours
    (receipt,) = json_lines(user_server.cli("workflows", "--project", str(project), "--json"), code=1)
    (item,) = [item for item in receipt["items"] if (item["name"], item["origin"]) == (name, "project")]
    assert (item["error"]["file"], item["error"]["line"]) == (str(path), line)
    assert all(text in item["error"]["text"] for text in says)
    listed = user_server.cli("workflows", "--project", str(project)).stdout
    assert f"    does not load: {path}, line {line}: " in listed


# --- shell completion ---------------------------------------------------------------------------


def complete(state_dir: Path, env: dict[str, str], *words: str) -> subprocess.CompletedProcess[str]:
    """What bash's completion function asks ``pi-workflows`` for: the candidates for the last word."""
    line = ["pi-workflows", "--state-dir", str(state_dir), *words]
    env = {
        **env,
        "_PI_WORKFLOWS_COMPLETE": "bash_complete",
        "COMP_WORDS": " ".join(line),
        "COMP_CWORD": str(len(line) - 1),
    }
    return subprocess.run(
        [sys.executable, "-m", "piworkflows.cli"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def candidates(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0 and result.stderr == "", result
    return [line.removeprefix("plain,") for line in result.stdout.splitlines() if line]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_script_for_each_shell(tmp_path: Path, shell: str):
    result = ServerProcess(tmp_path / "s").cli("completion", shell)
    assert result.returncode == 0 and "_PI_WORKFLOWS_COMPLETE" in result.stdout and "pi-workflows" in result.stdout
    if shell == "bash":
        assert "complete -o nosort -F _pi_workflows_completion pi-workflows" in result.stdout


def test_completion_offers_run_ids_workflow_names_and_checkpoints_from_the_running_server(user_server, project):
    with user_server.client() as client:
        run_ids = [
            client.request("run.start", {"projectPath": str(project), "workflowName": "builtin:demo"}).receipt["runId"]
            for _ in range(2)
        ]
    state, env = user_server.state_dir, user_server.env
    assert sorted(candidates(complete(state, env, "run", "status", ""))) == sorted(run_ids)
    assert candidates(complete(state, env, "run", "cancel", run_ids[0][:12])) == [
        run_id for run_id in reversed(run_ids) if run_id.startswith(run_ids[0][:12])
    ]
    assert sorted(candidates(complete(state, env, "effects", "--run", ""))) == sorted(run_ids)
    workflows = candidates(complete(state, env, "run", "start", "--project", str(project), ""))
    assert workflows == [
        "agent-demo",
        "demo",
        "hello",
        "imports",
        "shell-check",
        "syntax",
        "telegram-demo",
        "builtin:demo",
    ]
    assert candidates(complete(state, env, "workflow", "show", "--project", str(project), "he")) == ["hello"]
    assert candidates(complete(state, env, "answer", run_ids[0], "")) == ["ask"]  # not started: its checkpoints


def test_completion_offers_the_node_a_run_waits_at(tmp_path: Path, project: Path):
    write(
        project,
        "two",
        CHECKPOINT.replace('"ask", "prepare"', '"two", "prepare"').replace(
            '"no": compute', '"again": checkpoint(summary="again?"), "no": compute'
        ),
    )
    with serving(tmp_path / "s") as server:
        run_id = start(server, project, "two")
        wait_status(server, run_id, "waiting")
        assert candidates(complete(server.state_dir, server.env, "answer", run_id, "")) == ["ask"]  # not "again"
        assert candidates(complete(server.state_dir, server.env, "answer", "run-nope", "")) == []


def test_completion_without_a_server_completes_nothing_and_says_nothing(tmp_path: Path):
    for words in (("run", "status", ""), ("run", "start", ""), ("answer", "run-1", "")):
        assert candidates(complete(tmp_path / "no-server", dict(os.environ), *words)) == []
    assert not (tmp_path / "no-server" / "host").exists()  # none was started


def test_the_new_reads_follow_the_protocol_rules(user_server, project):
    schema = json.loads(user_server.cli("protocol", "schema").stdout)
    for operation in ("workflow.list", "workflow.show"):
        assert schema["operations"][operation]["stored"] is False
    assert "status" in schema["operations"]["run.list"]["payload"]["properties"]
    with user_server.client() as client:
        display_only = client.request("run.list", {"status": ["paused"]})
        relative = client.request("workflow.show", {"projectPath": "proj", "workflowName": "demo"})
        for refused in (display_only, relative):
            assert (refused.outcome, refused.receipt["code"]) == ("rejected", "validationFailed"), refused
        listed = client.request("workflow.list", {"projectPath": str(project)}, idempotency_key="same")
        again = client.request("workflow.list", {"projectPath": str(project)}, idempotency_key="same")
        assert (listed.outcome, again.outcome) == ("accepted", "accepted")  # a read: answered anew, never adopted
    assert query(user_server, "SELECT count(*) FROM host_commands") == [(0,)]


HANGS = """
import time
time.sleep(3600)
"""


@pytest.mark.timeout(120)
def test_a_module_that_hangs_at_import_is_named_not_taken_for_a_missing_server(tmp_path, project):
    """run start names the module that did not load in time (the server runs and answers); the
    listing names it too and exits 1; piped into head, the listing ends quietly."""
    (project / ".pi" / "workflows" / "hangs.workflow.py").write_text(HANGS)
    env = {"HOME": str(tmp_path / "home"), "PI_WORKFLOWS_RESOLVE_TIMEOUT_MS": "3000"}
    with serving(tmp_path / "s", env) as server:
        started = server.cli("run", "start", "hangs", "--project", str(project))
        assert started.returncode == 1
        said = " ".join(started.stderr.split())
        assert (
            f"the workflow module {project / '.pi' / 'workflows' / 'hangs.workflow.py'} did not load within 1 s" in said
        )
        assert "no server" not in said and "timed out" not in said
        listed = server.cli("workflows", "--project", str(project))
        assert listed.returncode == 1 and "hangs: did not load within 1 s" in listed.stdout
        assert listed.stderr == "pi-workflows: 1 workflow module did not load: hangs\n"
        piped = subprocess.run(
            f"{shlex.join(server.cli_command('workflows', '--project', str(project)))} | head -1",
            shell=True,
            capture_output=True,
            text=True,
            env=server.env,
            timeout=60,
        )
        assert piped.stdout.startswith("project workflows:")
        # the pipe closed quietly, or the whole list fit in it before head closed it: then the check
        assert piped.stderr in ("", "pi-workflows: 1 workflow module did not load: hangs\n"), piped.stderr

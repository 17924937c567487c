"""Finding runs and workflows through the CLI on real servers: runs filters and pages, workflows
and workflow show, load errors a user can act on, shell completion."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.engine_util import write
from tests.server_util import ServerProcess

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

HELLO = 'from piworkflows.workflows import *\nworkflow = define_workflow("hello", "a", {"a": compute(lambda c: 1)})\n'


@pytest.fixture
def server(tmp_path: Path):
    proc = ServerProcess(tmp_path / "s", env={"PI_WORKFLOWS_MAX_RUNNERS": "0", "COLUMNS": "80"}).start()
    yield proc
    proc.stop()


def json_lines(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
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

    middle = everything[300]["createdAt"]
    since = datetime.fromtimestamp(middle / 1000, tz=UTC).isoformat(timespec="milliseconds")
    created = {item["runId"]: item["createdAt"] for item in everything}
    cases = {
        ("--status", "cancelled"): lambda r, p, w, c: c,
        ("--status", "queued", "--status", "cancelled"): lambda r, p, w, c: True,
        ("--workflow", "shell-check"): lambda r, p, w, c: w == "shell-check",
        ("--project", str(projects[1])): lambda r, p, w, c: p == projects[1],
        ("--since", since): lambda r, p, w, c: created[r] >= middle,
        ("--since", "2h"): lambda r, p, w, c: True,
        ("--project", str(projects[0]), "--workflow", "demo", "--status", "queued", "--since", since):
            lambda r, p, w, c: p == projects[0] and w == "demo" and not c and created[r] >= middle,
    }  # fmt: skip
    for args, keep in cases.items():
        found = [item["runId"] for item in listed(server, *args)]
        assert found == expect(keep) and found, args
    cancelled = listed(server, "--status", "cancelled")
    assert {item["display"]["status"] for item in cancelled} == {"cancelled"}
    assert all(item["finishedAt"] is not None for item in cancelled)

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
    assert len(one_page) == 51 and one_page[1:] == lines[1:51]  # without --all: the first page


@pytest.mark.parametrize("since", ["yesterday", "2x", "-3h", "2026-13-01"])
def test_runs_refuses_a_since_it_cannot_read_before_anything_is_sent(tmp_path: Path, since: str):
    result = ServerProcess(tmp_path / "never-started").cli("runs", "--since", since)
    assert result.returncode == 2 and "--since" in result.stderr and "90m, 2h, 3d" in result.stderr


def test_runs_says_so_when_nothing_matches(server: ServerProcess):
    result = server.cli("runs", "--status", "failed", "--all")
    assert result.returncode == 0 and result.stdout == "no runs\n"

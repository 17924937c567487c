"""run.start through the socket: resolved in a child, committed queued with its receipt."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.server_util import ServerProcess, gone, query, wait_until

# No runners: these tests look at runs as run.start committed them.
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.integration,
    pytest.mark.server_env(PI_WORKFLOWS_RESOLVE_TIMEOUT_MS="3000", PI_WORKFLOWS_MAX_RUNNERS="0"),
]


def write_workflow(project: Path, name: str, body: str) -> Path:
    path = project / ".pi" / "workflows" / f"{name}.workflow.py"
    path.write_text("from piworkflows.workflows import *\n" + body)
    return path


def start(server: ServerProcess, payload: dict, key: str | None = None, **kwargs):
    with server.client(client_id="tests") as client:
        return client.request("run.start", payload, idempotency_key=key, **kwargs)


def test_a_builtin_run_is_committed_queued(server: ServerProcess, project: Path):
    response = start(server, {"projectPath": str(project), "workflowName": "builtin:demo", "input": {"who": "x"}})
    assert response.outcome == "accepted"
    run_id = response.receipt["runId"]
    assert response.receipt["status"] == "queued" and response.receipt["definitionDigest"].startswith("sha256:")
    assert query(server, "SELECT run_id, status, workflow_name, title FROM runs") == [
        (run_id, "queued", "demo", "demo for x")
    ]
    assert query(server, "SELECT queue_status FROM run_queue") == [("queued",)]
    assert query(server, "SELECT builtin_id, builtin_revision FROM run_sources") == [("builtin:demo", "4")]
    digest = query(server, "SELECT definition_digest FROM runs")[0][0]
    assert "sha256:" + digest.hex() == response.receipt["definitionDigest"]
    assert query(server, "SELECT canonical_path FROM projects") == [(str(project.resolve()),)]


def test_a_project_workflow_records_its_path_and_file_hash(server: ServerProcess, project: Path):
    path = write_workflow(project, "hello", 'workflow = define_workflow("hello", "a", {"a": compute(lambda c: 1)})\n')
    response = start(server, {"projectPath": str(project), "workflowName": "hello"})
    assert response.outcome == "accepted"
    assert query(server, "SELECT source_kind, source_path, source_sha256 FROM run_sources") == [
        ("file", str(path.resolve()), hashlib.sha256(path.read_bytes()).digest())
    ]


def test_a_retry_adopts_the_same_run_and_another_request_under_the_key_conflicts(server: ServerProcess, project):
    payload = {"projectPath": str(project), "workflowName": "builtin:demo"}
    first = start(server, payload, key="start-1")
    again = start(server, payload, key="start-1")
    assert (first.outcome, again.outcome) == ("accepted", "adopted")
    assert again.receipt == first.receipt  # the server-assigned run id too
    other = start(server, {**payload, "input": {"who": "else"}}, key="start-1")
    assert other.outcome == "conflict" and other.receipt["code"] == "idempotencyKeyReused"
    assert len(query(server, "SELECT run_id FROM runs")) == 1


def test_a_retry_is_adopted_even_after_its_workflow_changed_or_vanished(server: ServerProcess, project: Path):
    path = write_workflow(project, "hello", 'workflow = define_workflow("hello", "a", {"a": compute(lambda c: 1)})\n')
    payload = {"projectPath": str(project), "workflowName": "hello"}
    first = start(server, payload, key="start-2")
    path.write_text(path.read_text() + "# changed\n")  # another digest? the source hash changed
    changed = start(server, payload, key="start-2")
    path.unlink()
    vanished = start(server, payload, key="start-2")
    assert (first.outcome, changed.outcome, vanished.outcome) == ("accepted", "adopted", "adopted")
    assert changed.receipt == vanished.receipt == first.receipt
    fresh = start(server, payload, key="start-3")  # a new request for a vanished workflow is refused
    assert fresh.outcome == "notFound" and fresh.receipt["code"] == "workflowNotFound"
    assert len(query(server, "SELECT run_id FROM runs")) == 1


def test_invalid_definitions_fail_before_anything_is_written(server: ServerProcess, project: Path):
    write_workflow(
        project,
        "broken",
        'workflow = define_workflow("broken", "a", {"a": compute(lambda c: 1)}, [edge("a", "missing")])\n',
    )
    response = start(server, {"projectPath": str(project), "workflowName": "broken"})
    assert response.outcome == "rejected" and response.receipt["code"] == "invalidDefinition"
    assert "missing" in response.error and "a -> missing" in response.error
    unknown = start(server, {"projectPath": str(project), "workflowName": "nope"})
    assert unknown.outcome == "notFound" and unknown.receipt["code"] == "workflowNotFound"
    write_workflow(project, "syntax", "this is not python\n")
    syntax = start(server, {"projectPath": str(project), "workflowName": "syntax"})
    assert syntax.outcome == "rejected" and syntax.receipt["code"] == "invalidDefinition"
    for table in ("runs", "projects", "blobs", "host_commands"):
        assert query(server, f"SELECT count(*) FROM {table}") == [(0,)], table
    assert query(server, "SELECT resource_kind FROM resources") == [("server",)]


def test_an_upstream_digest_that_differs_is_a_conflict(server: ServerProcess, project: Path):
    payload = {"projectPath": str(project), "workflowName": "builtin:demo", "definitionDigest": "sha256:" + "0" * 64}
    response = start(server, payload)
    assert response.outcome == "conflict" and response.receipt["code"] == "workflowSourceChanged"
    assert query(server, "SELECT count(*) FROM runs") == [(0,)]


def test_workflow_code_that_prints_or_hangs_cannot_harm_the_server(server: ServerProcess, project: Path):
    noisy = 'print("hello from the module")\nworkflow = define_workflow("noisy", "a", {"a": compute(lambda c: 1)})\n'
    write_workflow(project, "noisy", noisy)
    assert start(server, {"projectPath": str(project), "workflowName": "noisy"}).outcome == "accepted"
    write_workflow(project, "hangs", "import time\ntime.sleep(600)\n")
    hung = start(server, {"projectPath": str(project), "workflowName": "hangs"})
    assert hung.outcome == "rejected" and "hangs.workflow.py did not load within" in hung.error
    assert start(server, {"projectPath": str(project), "workflowName": "noisy"}).outcome == "accepted"  # served on
    with server.client() as client:
        assert client.request("server.status").outcome == "accepted"


def test_the_cli_starts_a_run_and_prints_its_id(server: ServerProcess, project: Path):
    result = server.cli(
        "run", "start", "builtin:shell-check", "--project", str(project), "--input", '{"command": "true"}'
    )
    assert result.returncode == 0, result.stderr
    assert query(server, "SELECT run_id FROM runs") == [(result.stdout.strip(),)]


def test_ctrl_c_while_the_cli_waits_exits_130_and_the_run_goes_on(server: ServerProcess, project: Path):
    """No runners: the run stays queued while `run start --wait` polls; SIGINT as a terminal's Ctrl-C sends it."""
    with server.cli_background("run", "start", "builtin:demo", "--project", str(project), "--wait") as waiting:
        run_id = waiting.stdout.readline().strip()  # printed once the run is stored; then it waits
        assert run_id.startswith("run-"), waiting.stderr.read() if waiting.poll() is not None else run_id
        waiting.send_signal(signal.SIGINT)
        _, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 130, stderr
    assert f"{run_id} goes on" in stderr and "Traceback" not in stderr, stderr
    assert f"pi-workflows --state-dir {server.state_dir} run status {run_id}" in stderr
    assert f"pi-workflows --state-dir {server.state_dir} run cancel {run_id}" in stderr
    assert query(server, "SELECT run_id, status FROM runs") == [(run_id, "queued")]


def test_the_cli_lists_runs_and_shows_one(server: ServerProcess, project: Path):
    started = start(server, {"projectPath": str(project), "workflowName": "builtin:demo", "input": {"who": "cli"}})
    run_id = started.receipt["runId"]

    cli = server.cli
    listed = cli("runs")
    assert listed.returncode == 0 and run_id in listed.stdout and "demo for cli" in listed.stdout
    shown = cli("run", "status", run_id)
    assert shown.returncode == 0 and "queued" in shown.stdout and "controls: cancel" in shown.stdout
    view = json.loads(cli("run", "status", run_id, "--json").stdout)
    assert view["schema"] == "pi-workflows.run-view.v1" and view["runId"] == run_id
    assert view["revision"] == 1 and view["runRevision"] == 1
    page = json.loads(cli("runs", "--json", "--project", str(project)).stdout)
    assert [item["runId"] for item in page["items"]] == [run_id]
    missing = cli("run", "status", "run-nope")
    assert missing.returncode == 1 and "runNotFound" in missing.stderr
    with server.client() as client:
        no_run_id = client.request("run.status", {})
        assert no_run_id.outcome == "rejected" and no_run_id.receipt["code"] == "validationFailed"


@pytest.mark.parametrize("stop", ["graceful", "kill -9"])
def test_resolver_children_are_reused_and_never_outlive_the_server(tmp_path: Path, project: Path, stop: str):
    server = ServerProcess(tmp_path / "s", env={"PI_WORKFLOWS_MAX_RUNNERS": "0"}).start()
    payload = {"projectPath": str(project), "workflowName": "builtin:demo"}
    try:
        for _ in range(3):
            assert start(server, payload).outcome == "accepted"
        resolvers = [c for c in server.registry()["children"] if c["role"] == "resolver"]
        assert len(resolvers) == 1  # one idle child answered all three
        child = psutil.Process(resolvers[0]["pid"])
        assert child.create_time() == resolvers[0]["createTime"]
    finally:
        if stop == "graceful":
            server.stop()
        else:
            server.kill()
    wait_until(lambda: gone(child.pid, resolvers[0]["createTime"]), what="resolver gone")


def ended(server: ServerProcess) -> bool:
    """Every run of the server is completed."""
    return {status for (status,) in query(server, "SELECT status FROM runs")} == {"completed"}


def test_idle_resolver_and_runner_children_end_and_the_next_run_starts_others(tmp_path: Path, project: Path):
    env = {"PI_WORKFLOWS_CHILD_IDLE_EXIT_MS": "300"}
    server = ServerProcess(tmp_path / "s", env=env).start()

    def children() -> list[dict[str, Any]]:
        return [c for c in server.registry()["children"] if c["role"] in ("resolver", "runner")]

    try:
        for command in ("true", "pwd"):  # the second after the first one's children ended
            payload = {
                "projectPath": str(project),
                "workflowName": "builtin:shell-check",
                "input": {"command": command},
            }
            started = start(server, payload)
            assert started.outcome == "accepted", started
            wait_until(lambda: ended(server), what="the run completed")
            before = children()
            assert "runner" in {c["role"] for c in before}
            wait_until(lambda: children() == [], what="the idle children ended")
            assert all(gone(c["pid"], c["createTime"]) for c in before)
        assert "resolver " not in server.server_log()  # ended for idleness: nothing to report
    finally:
        server.stop()


def test_upstreams_workflow_source_set_is_checked_against_the_resolved_source(server: ServerProcess, project: Path):
    """run.start takes upstream's object form ``{root, mounted}`` as well as the source text: a root
    naming the resolved file (path relative or absolute, hash with or without ``sha256:``) or
    built-in (id and revision) starts the run; another is a conflict; mounted sources are refused."""
    path = write_workflow(project, "hello", 'workflow = define_workflow("hello", "a", {"a": compute(lambda c: 1)})\n')
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    base = {"projectPath": str(project), "workflowName": "hello"}

    def with_root(root: dict, mounted: list | None = None) -> Any:
        return start(server, {**base, "workflowSource": {"root": root, "mounted": mounted or []}})

    relative = {"kind": "file", "path": ".pi/workflows/hello.workflow.py", "hash": "sha256:" + digest}
    assert with_root(relative).outcome == "accepted"
    assert with_root({"kind": "file", "path": str(path), "hash": digest}).outcome == "accepted"
    other = with_root({**relative, "hash": "0" * 64})
    assert other.outcome == "conflict" and other.receipt["code"] == "workflowSourceChanged"
    assert "workflowSource.root" in other.error
    builtin = start(server, {"projectPath": str(project), "workflowName": "builtin:demo"})
    with server.client() as client:
        source = client.request("run.status", {}, run_id=builtin.receipt["runId"]).receipt["state"]["workflowSource"]
    demo = {"projectPath": str(project), "workflowName": "builtin:demo"}
    root = {"kind": "builtin", "id": "demo", "revision": source["revision"]}  # upstream's id: no builtin: prefix
    assert start(server, {**demo, "workflowSource": {"root": root, "mounted": []}}).outcome == "accepted"
    stale = start(server, {**demo, "workflowSource": {"root": {**root, "revision": "old"}, "mounted": []}})
    assert stale.outcome == "conflict" and stale.receipt["code"] == "workflowSourceChanged"
    mounted = with_root(relative, mounted=[{"kind": "file", "path": "x", "hash": digest}])
    assert mounted.outcome == "rejected" and mounted.receipt["code"] == "validationFailed"
    assert query(server, "SELECT count(*) FROM runs") == [(4,)]

"""A damaged state database: refused at start (untouched, with the way back), and at run time a
refusing server (every write refused ``databaseCorrupt``, reads answered) instead of a restart loop;
``state verify`` and the offline verify report the damage as a result, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from pathlib import Path

import psutil
import pytest

from piworkflows.paths import StatePaths
from stress.bench.trees import plant
from tests.server_util import ServerProcess, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

# No retention: it would delete the planted trees (and read the index this test damages).
ENV = {"PI_WORKFLOWS_RETENTION": "false"}
INDEX = "runs_finished_roots"  # read only by prune and retention: never in the writer's cache at start


def planted(tmp_path: Path) -> StatePaths:
    paths = StatePaths.resolve(tmp_path / "s")
    plant(paths, 300)
    return paths


def damage_pages(database: Path, name: str) -> list[int]:
    """Overwrite every page of table or index ``name`` in the main file with garbage."""
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        pages = [row[0] for row in conn.execute("SELECT pageno FROM dbstat WHERE name = ?", (name,))]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    assert pages, f"no pages of {name}"
    with open(database, "r+b") as f:
        for page in pages:
            f.seek((page - 1) * size)
            f.write(os.urandom(size))
        os.fsync(f.fileno())
    return pages


def files(paths: StatePaths) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (paths.database, paths.wal, paths.shm) if p.exists()}


def test_a_damaged_database_is_refused_at_start_untouched_with_the_way_back(tmp_path: Path):
    paths = planted(tmp_path)
    damage_pages(paths.database, INDEX)
    before = files(paths)
    server = ServerProcess(paths.state_dir, env=ENV)
    started = server.cli("server", "start")
    assert started.returncode == 1, started.stdout
    message = started.stderr
    assert "is damaged" in message and str(paths.database) in message and "quick_check" in message
    assert "state reset --backup" in message and "restore" in message
    assert files(paths) == before  # nothing written, not even a checkpoint
    assert "is damaged" in server.server_log() and "Traceback" not in server.server_log()
    assert not server.client(retry_for=0).running()


def test_damage_found_at_run_time_refuses_every_write_and_answers_reads(tmp_path: Path):
    paths = planted(tmp_path)
    server = ServerProcess(paths.state_dir, env=ENV).start()
    try:
        writer = server.child_pid("writer")
        with server.client(retry_for=0) as client:
            assert client.request("run.start", {"projectPath": "/", "workflowName": "builtin:demo"}).outcome == (
                "accepted"
            )
        damage_pages(paths.database, INDEX)
        dry_run = server.cli("state", "prune", "--before", "2030-01-01T00:00:00Z", "--dry-run")
        assert dry_run.returncode == 1 and "databaseCorrupt" in dry_run.stderr, dry_run.stderr
        with server.client(retry_for=0) as client:
            refused = client.request("run.start", {"projectPath": "/", "workflowName": "builtin:demo"})
            assert refused.outcome == "rejected" and refused.receipt["code"] == "databaseCorrupt", refused
            listed = client.request("run.list", {"limit": 5})
            assert listed.outcome == "accepted" and len(listed.receipt["items"]) == 5  # reads still answered
            status = client.request("server.status").receipt
        assert status["state"] == "refusing" and status["reason"]["code"] == "databaseCorrupt"
        assert str(paths.database) in status["reason"]["message"]
        human = server.cli("server", "status")
        assert "refusing" in human.stdout and "damaged" in human.stdout, human.stdout
        verified = server.cli("state", "verify", "--json")
        assert verified.returncode == 1 and "Traceback" not in verified.stderr
        assert json.loads(verified.stdout)["ok"] is False and json.loads(verified.stdout)["integrity"]
        assert server.child_pid("writer") == writer  # no restart loop
        log = server.server_log()
        assert log.count("the state database is damaged") == 1 and "Traceback" not in log
        assert server.cli("server", "stop").returncode == 0  # a stop needs no write
        assert server.popen.wait(30) == 0
    finally:
        if server.popen.poll() is None:
            server.kill()


def test_state_verify_reports_damage_found_by_integrity_check_and_then_refuses_writes(tmp_path: Path):
    paths = planted(tmp_path)
    server = ServerProcess(paths.state_dir, env=ENV).start()
    try:
        damage_pages(paths.database, INDEX)
        verified = server.cli("state", "verify")
        assert verified.returncode == 1 and "INTEGRITY" in verified.stdout, verified.stdout + verified.stderr
        assert "Traceback" not in verified.stderr
        with server.client(retry_for=0) as client:
            refused = client.request("run.start", {"projectPath": "/", "workflowName": "builtin:demo"})
        assert refused.outcome == "rejected" and refused.receipt["code"] == "databaseCorrupt", refused
    finally:
        server.stop()


def test_a_writer_that_cannot_restart_on_a_damaged_file_is_not_restarted_in_a_loop(tmp_path: Path):
    paths = planted(tmp_path)
    server = ServerProcess(paths.state_dir, env=ENV).start()
    try:
        writer = server.child_pid("writer")
        assert writer is not None
        damage_pages(paths.database, INDEX)
        psutil.Process(writer).kill()  # its restart verifies the file again and finds the damage
        with server.client(retry_for=0) as client:
            wait_until(lambda: client.request("server.status").receipt["state"] == "refusing", what="refusing")
            refused = client.request("run.start", {"projectPath": "/", "workflowName": "builtin:demo"})
        assert refused.outcome == "rejected" and refused.receipt["code"] == "databaseCorrupt", refused
        log = server.server_log()
        assert log.count("could not start") == 1 and "no more writer restarts" in log
        assert server.child_pid("writer") is None
    finally:
        assert server.stop() == 0


def test_offline_verify_of_a_damaged_copy_reports_it(tmp_path: Path):
    paths = planted(tmp_path)
    backups = tmp_path / "backups"
    backups.mkdir(mode=0o700)
    copy = backups / "copy.sqlite"
    source = sqlite3.connect(paths.database)
    target = sqlite3.connect(copy)
    source.backup(target)
    target.execute("PRAGMA journal_mode = DELETE")
    source.close()
    target.close()
    damage_pages(copy, INDEX)
    server = ServerProcess(tmp_path / "other", env=ENV)  # no server needed: the CLI opens the copy itself
    result = server.cli("state", "verify", str(copy), "--json")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["integrity"]


@pytest.mark.parametrize("kind", ["directory", "socket", "fifo"])
def test_a_state_sqlite_that_is_not_a_file_is_refused_naming_the_problem(tmp_path: Path, kind: str):
    paths = StatePaths.resolve(tmp_path / "s")
    paths.state_dir.mkdir(mode=0o700)
    if kind == "directory":
        paths.database.mkdir()
    elif kind == "fifo":
        os.mkfifo(paths.database, 0o600)
    else:
        bound = socket.socket(socket.AF_UNIX)
        bound.bind(str(paths.database))
        bound.close()
    server = ServerProcess(paths.state_dir, env=ENV)
    started = server.cli("server", "start")
    assert started.returncode == 1
    expected = {"directory": "is a directory", "socket": "is a socket", "fifo": "is a FIFO"}[kind]
    assert expected in started.stderr and str(paths.database) in started.stderr, started.stderr
    assert expected in server.server_log()


@pytest.mark.skipif(os.getuid() == 0, reason="root reads any file")
def test_an_unreadable_state_sqlite_is_refused_naming_the_problem(tmp_path: Path):
    paths = StatePaths.resolve(tmp_path / "s")
    paths.state_dir.mkdir(mode=0o700)
    paths.database.write_bytes(b"")
    paths.database.chmod(0o000)
    server = ServerProcess(paths.state_dir, env=ENV)
    started = server.cli("server", "start")
    assert started.returncode == 1 and "cannot be read and written" in started.stderr, started.stderr
    assert "cannot be read and written" in server.server_log()

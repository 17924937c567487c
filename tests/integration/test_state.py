"""``pi-workflows state status|verify`` against a live server (the CLI never opens SQLite)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from piworkflows.errors import StateIncompatible
from tests.engine_util import TENSTEP, start, wait_status, write
from tests.server_util import ServerProcess, check_state, serving, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


def test_state_status_and_verify_through_the_cli(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    with serving(tmp_path / "s") as server:
        run_id = start(server, project, "tenstep")
        assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"

        status = json.loads(server.cli("state", "status", "--json").stdout)
        assert status["counts"]["runs"] == {"completed": 1} and status["violations"] == {}
        assert status["fileBytes"] > 0 and status["pageCount"] > 0
        assert run_id not in json.dumps(status)  # ids only where an invariant is violated
        human = server.cli("state", "status")
        assert human.returncode == 0 and "1 completed" in human.stdout and "invariants: all hold" in human.stdout

        verified = server.cli("state", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "integrity_check ok, foreign_key_check ok" in verified.stdout
        assert json.loads(server.cli("state", "verify", "--json").stdout) == {
            "ok": True,
            "integrity": [],
            "violations": {},
        }
        assert server.cli("state", "verify", "--bogus").returncode == 2
    stopped = server.cli("state", "status")
    assert stopped.returncode == 1 and "no server is running" in stopped.stderr


def test_a_backup_while_runs_start_keeps_commands_flowing_and_verifies(tmp_path: Path, project: Path):
    """One page per step: the copy takes many steps, and the run starts sent meanwhile are answered
    between them; state.status shows the progress on a second connection."""
    write(project, "tenstep", TENSTEP)
    # 5 ms between steps, so a second connection sees the copy under way.
    env = {"PI_WORKFLOWS_BACKUP_STEP_PAGES": "1", "PIW_FAULTS": "writer.backup_step=sleep:5"}
    server = ServerProcess(tmp_path / "s", env=env).start()
    backups = tmp_path / "backups"
    try:
        for _ in range(20):  # some pages to copy
            start(server, project, "tenstep")
        seen: list[dict] = []
        answers: list = []

        def backup(key: str) -> None:
            with server.client(client_id="operator") as client:
                answers.append(
                    client.request("state.backup", {"destination": str(backups / "b1.sqlite")}, idempotency_key=key)
                )

        threads = [threading.Thread(target=backup, args=("backup-1",)) for _ in range(2)]  # one key, twice
        for thread in threads:
            thread.start()
        started = []
        with server.client() as client:
            while any(t.is_alive() for t in threads):
                progress = client.request("state.status").receipt["maintenance"]
                if progress is not None:
                    seen.append(progress)
                    if len(started) < 5:  # answered while the copy runs (their pages join the copy)
                        started.append(start(server, project, "tenstep"))
        for thread in threads:
            thread.join()
        assert sorted(a.outcome for a in answers) == ["accepted", "adopted"], answers
        assert answers[0].receipt == answers[1].receipt and answers[0].receipt["verified"] is True
        assert seen and all(p["operation"] == "backup" and 0 <= p["done"] <= p["total"] for p in seen)
        assert started  # commands kept flowing between the steps
        copy = backups / "b1.sqlite"
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600 and stat.S_IMODE(backups.stat().st_mode) == 0o700
        assert sorted(p.name for p in backups.iterdir()) == ["b1.sqlite"]  # one file, no -wal
        verified = server.cli("state", "verify", str(copy), "--json")
        assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True, verified.stdout

        with server.client() as client:
            relative = client.request("state.backup", {"destination": "b2.sqlite"})
            exists = client.request("state.backup", {"destination": str(copy)})
            (tmp_path / "open").mkdir(mode=0o755)
            open_dir = client.request("state.backup", {"destination": str(tmp_path / "open" / "b.sqlite")})
            into_state = client.request("state.backup", {"destination": str(server.state_dir / "b.sqlite")})
        assert relative.outcome == "rejected" and relative.receipt["code"] == "validationFailed"
        assert exists.outcome == "rejected" and exists.receipt["code"] == "resourceExists"
        assert open_dir.outcome == "rejected" and "chmod 700" in open_dir.error
        assert into_state.outcome == "rejected" and "state directory" in into_state.error
        made = server.cli("state", "backup", str(backups / "b3.sqlite"))
        assert made.returncode == 0 and "backed up and verified" in made.stdout, made.stderr
        again = server.cli("state", "backup", str(backups / "b3.sqlite"))  # a new request: the file exists
        assert again.returncode == 1 and "resourceExists" in again.stderr, again.stderr
    finally:
        assert server.stop() == 0, server.output()
    check_state(server.state_dir)


def test_the_backup_command_is_checked_again_after_a_refusal_and_copies_anew_each_time(tmp_path: Path):
    """Each `state backup` is a new request: a refusal is not adopted once its cause is fixed, and a
    repeat after the file was deleted makes a new file instead of answering the old receipt."""
    server = ServerProcess(tmp_path / "s").start()
    folder = tmp_path / "backups"
    folder.mkdir()
    os.chmod(folder, 0o755)
    destination = folder / "b.sqlite"
    try:
        refused = server.cli("state", "backup", str(destination))
        assert refused.returncode == 1 and f"chmod 700 {folder}" in refused.stderr, refused.stderr
        os.chmod(folder, 0o700)
        made = server.cli("state", "backup", str(destination))
        assert made.returncode == 0 and "backed up and verified" in made.stdout, made.stderr
        first = destination.read_bytes()
        destination.unlink()
        again = server.cli("state", "backup", str(destination))
        assert again.returncode == 0 and "backed up and verified" in again.stdout, again.stderr
        assert destination.exists() and len(destination.read_bytes()) == len(first)
        verified = server.cli("state", "verify", str(destination), "--json")
        assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True, verified.stdout
        exists = server.cli("state", "backup", str(destination))
        assert exists.returncode == 1 and "resourceExists" in exists.stderr, exists.stderr
    finally:
        assert server.stop() == 0, server.output()
    check_state(server.state_dir)


def test_prune_dry_run_then_apply_with_a_verified_backup(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    with serving(tmp_path / "s") as server:
        done = [start(server, project, "tenstep") for _ in range(3)]
        for run_id in done:
            assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
        with server.client() as client:
            paused = client.request("run.start", {"projectPath": str(project), "workflowName": "builtin:demo"})
            kept = paused.receipt["runId"]
            assert client.request("run.pause", {}, run_id=kept).outcome == "accepted"  # unfinished: kept
        cutoff = datetime.fromtimestamp(time.time() + 86_400, tz=UTC).isoformat()

        dry = server.cli("state", "prune", "--before", cutoff, "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        assert sorted(json.loads(dry.stdout)["eligible"]) == sorted(done)
        assert json.loads(server.cli("state", "status", "--json").stdout)["counts"]["runs"]["completed"] == 3

        backup = tmp_path / "backups" / "before-prune.sqlite"
        args = ("state", "prune", "--before", cutoff, "--backup", str(backup), "--apply", "--json")
        applied = server.cli(*args)
        assert applied.returncode == 0, applied.stderr
        receipt = json.loads(applied.stdout)
        assert receipt["applied"] is True and sorted(receipt["eligible"]) == sorted(done)
        assert receipt["deleted"]["trees"] == 3 and receipt["deleted"]["runs"] == 3 and receipt["deleted"]["blobs"] > 0
        assert receipt["vacuumed"] is True and receipt["integrity"] == [] and receipt["backup"] == str(backup)
        again = server.cli(*args)  # the same command: the first answer adopted, nothing copied or deleted
        assert again.returncode == 0 and json.loads(again.stdout)["deleted"] == receipt["deleted"], again.stderr

        with server.client() as client:
            listed = client.request("run.list", {"limit": 50}).receipt["items"]
            assert [item["runId"] for item in listed] == [kept]
            assert client.request("run.status", {}, run_id=done[0]).outcome == "notFound"
        assert json.loads(server.cli("state", "verify", "--json").stdout)["ok"] is True
        kept_copy = server.cli("state", "verify", str(backup), "--json")
        assert kept_copy.returncode == 0 and json.loads(kept_copy.stdout)["ok"] is True  # the runs live on there
        assert server.cli("state", "prune", "--before", cutoff, "--apply").returncode == 2  # no --backup


def test_automatic_retention_deletes_old_finished_trees_when_idle_and_keeps_the_rest(tmp_path: Path, project: Path):
    write(project, "tenstep", TENSTEP)
    env = {
        "PI_WORKFLOWS_RETENTION_AGE_MS": "1500",
        "PI_WORKFLOWS_RETENTION_INTERVAL_MS": "200",
        "PI_WORKFLOWS_RETENTION_IDLE_RETRY_MS": "200",
    }
    with serving(tmp_path / "s", env=env) as server:
        finished = start(server, project, "tenstep")
        assert wait_status(server, finished, "completed", "failed")["display"]["status"] == "completed"
        with server.client() as client:
            paused = client.request("run.start", {"projectPath": str(project), "workflowName": "builtin:demo"})
            kept = paused.receipt["runId"]
            assert client.request("run.pause", {}, run_id=kept).outcome == "accepted"

            def gone() -> bool:
                return client.request("run.status", {}, run_id=finished).outcome == "notFound"

            wait_until(gone, timeout=30, what="the finished run deleted by retention")
            assert client.request("run.status", {}, run_id=kept).outcome == "accepted"  # unfinished: kept
            status = client.request("state.status").receipt
        # the paused run only: queued, or running and parked if a runner had claimed it first
        assert sum(status["counts"]["runs"].values()) == 1 and status["violations"] == {}
        assert json.loads(server.cli("state", "verify", "--json").stdout)["ok"] is True
    assert "retention deleted 1 trees" in server.output()


def test_a_backup_while_four_clients_write_holds_every_run_acknowledged_before_it(tmp_path: Path, project: Path):
    """4 client threads start runs continuously; every start acknowledged before the backup was
    sent is in the verified copy."""
    server = ServerProcess(
        tmp_path / "s", env={"PI_WORKFLOWS_BACKUP_STEP_PAGES": "4", "PI_WORKFLOWS_MAX_RUNNERS": "0"}
    ).start()
    stop = threading.Event()
    acknowledged: list[tuple[float, str]] = []

    def writer() -> None:
        with server.client() as client:
            while not stop.is_set():
                answer = client.request("run.start", {"projectPath": str(project), "workflowName": "builtin:demo"})
                assert answer.outcome == "accepted", answer
                acknowledged.append((time.monotonic(), answer.receipt["runId"]))

    threads = [threading.Thread(target=writer) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: len(acknowledged) >= 40, what="runs acknowledged before the backup")
        sent = time.monotonic()
        before = {run_id for at, run_id in list(acknowledged) if at < sent}
        backups = tmp_path / "backups"
        with server.client() as client:
            made = client.request("state.backup", {"destination": str(backups / "b.sqlite")})
        assert made.outcome == "accepted", made
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert server.stop() == 0, server.output()
    assert json.loads(server.cli("state", "verify", str(backups / "b.sqlite"), "--json").stdout)["ok"] is True
    copy = sqlite3.connect(f"file:{backups / 'b.sqlite'}?mode=ro&immutable=1", uri=True)
    try:
        in_copy = {row[0] for row in copy.execute("SELECT run_id FROM runs")}
    finally:
        copy.close()
    assert before <= in_copy
    check_state(server.state_dir)


STATE_FILES = ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm")


def another_applications_database(state_dir: Path) -> dict[str, bytes]:
    """A WAL database of another application as state.sqlite, its table still in the -wal."""
    state_dir.mkdir(mode=0o700, parents=True)
    source = state_dir.parent / "elsewhere"
    source.mkdir()
    conn = sqlite3.connect(source / "state.sqlite", isolation_level=None)
    try:
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('kept')")
        for name in STATE_FILES:  # copied while open: the three files of a live WAL database
            shutil.copyfile(source / name, state_dir / name)
            (state_dir / name).chmod(0o600)  # private, as a server leaves them (a wider mode is refused first)
    finally:
        conn.close()
    return {name: (state_dir / name).read_bytes() for name in STATE_FILES}


def test_state_reset_moves_an_incompatible_database_aside_and_the_next_start_creates_a_new_one(tmp_path: Path):
    state_dir = tmp_path / "s"
    files = another_applications_database(state_dir)
    server = ServerProcess(state_dir)
    refused = server.cli("server", "start")
    assert refused.returncode == 1 and StateIncompatible.MESSAGE in refused.stderr, refused.stderr
    assert f"pi-workflows --state-dir {state_dir} state reset --backup" in refused.stderr  # the steps as one command
    foreground = server.cli("server", "run")  # the same words from a server in the foreground
    assert foreground.returncode == 1 and StateIncompatible.MESSAGE in foreground.stderr, foreground.stderr
    assert f"pi-workflows --state-dir {state_dir} state reset --backup" in foreground.stderr
    assert {name: (state_dir / name).read_bytes() for name in STATE_FILES} == files

    relative = server.cli("state", "reset", "--backup", "old-state")
    assert relative.returncode == 2 and "absolute" in relative.stderr, relative.stderr
    (tmp_path / "taken").mkdir()
    taken = server.cli("state", "reset", "--backup", str(tmp_path / "taken"))
    assert taken.returncode == 2 and "exists" in taken.stderr, taken.stderr
    assert {name: (state_dir / name).read_bytes() for name in STATE_FILES} == files

    backup = tmp_path / "kept" / "old-state"
    reset = server.cli("state", "reset", "--backup", str(backup))
    assert reset.returncode == 0, reset.stderr
    for name, content in files.items():
        assert f"{state_dir / name} -> {backup / name}" in reset.stdout
        assert (backup / name).read_bytes() == content and not (state_dir / name).exists()
    assert sorted(p.name for p in backup.iterdir()) == sorted(STATE_FILES)
    assert stat.S_IMODE(backup.stat().st_mode) == 0o700 and stat.S_IMODE(backup.parent.stat().st_mode) == 0o700

    server.start()  # a new database
    try:
        with server.client() as client:
            assert client.request("server.status").outcome == "accepted"
        busy = server.cli("state", "reset", "--backup", str(tmp_path / "again"))
        assert busy.returncode == 1 and "stop the server first: pi-workflows server stop" in busy.stderr, busy.stderr
        assert not (tmp_path / "again").exists()
    finally:
        assert server.stop() == 0, server.output()
    check_state(state_dir)
    healthy = server.cli("state", "reset", "--backup", str(tmp_path / "again"))  # no terminal, no --yes
    assert healthy.returncode == 2 and "is healthy" in healthy.stderr and "pass --yes" in healthy.stderr
    assert (state_dir / "state.sqlite").exists() and not (tmp_path / "again").exists()
    moved = server.cli("state", "reset", "--backup", str(tmp_path / "again"), "--yes")
    assert moved.returncode == 0 and not (state_dir / "state.sqlite").exists(), moved.stderr
    assert (backup / "state.sqlite").read_bytes() == files["state.sqlite"]  # never touched again

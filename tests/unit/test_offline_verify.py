"""``state verify BACKUP``: an inactive backup opened read-only; the active database refused by any name."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from piworkflows.writer import offline
from tests.support import run_create, run_group, take_epoch

pytestmark = pytest.mark.timeout(60)
NOW = 1_767_225_600_000


@pytest.fixture
def backup(executor, tmp_path: Path) -> Path:
    """A consistent backup of a database with one run, made with SQLite's backup API."""
    run_group(executor, take_epoch(), run_create("run-1"))
    path = tmp_path / "backups" / "state-backup.sqlite"
    path.parent.mkdir(mode=0o700)
    target = sqlite3.connect(path)
    executor.conn.backup(target)
    target.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
    target.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_consistent_backup_verifies_ok_and_stays_untouched(backup, paths):
    before = digest(backup)
    assert offline.verify_backup(backup, paths.database, NOW) == {
        "ok": True,
        "schema": None,
        "integrity": [],
        "violations": {},
    }
    assert digest(backup) == before
    assert sorted(p.name for p in backup.parent.iterdir()) == [backup.name]  # no -wal, no -shm


def test_a_violation_in_a_backup_is_reported_with_its_run(backup, paths):
    conn = sqlite3.connect(backup)
    conn.execute("UPDATE run_queue SET queue_status = 'done' WHERE run_id = 'run-1'")
    conn.commit()
    conn.close()
    result = offline.verify_backup(backup, paths.database, NOW)
    assert result["ok"] is False and result["violations"] == {"settledQueueOfLiveRun": ["run-1"]}


def test_a_database_that_is_not_ours_fails_on_its_schema(tmp_path, paths):
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    result = offline.verify_backup(other, paths.database, NOW)
    assert result["ok"] is False and result["schema"] == "not a backup of this build's state: wrong application id"


def test_the_active_database_is_refused_by_every_name(executor, paths, tmp_path, monkeypatch):
    run_group(executor, take_epoch())
    active = paths.database
    (tmp_path / "link").symlink_to(active)
    os.link(active, tmp_path / "hardlink")
    dotted = active.parent / ".." / active.parent.name / active.name
    monkeypatch.chdir(tmp_path)
    relative = Path(os.path.relpath(active, tmp_path))
    for name in (active, tmp_path / "link", tmp_path / "hardlink", dotted, relative):
        with pytest.raises(offline.NotABackup, match="is the active database"):
            offline.verify_backup(name, active, NOW)


def test_a_file_with_a_wal_beside_it_or_a_missing_one_is_refused(backup, paths):
    Path(f"{backup}-wal").write_bytes(b"")
    with pytest.raises(offline.NotABackup, match="-wal exists"):
        offline.verify_backup(backup, paths.database, NOW)
    with pytest.raises(offline.NotABackup, match="does not exist"):
        offline.verify_backup(backup.parent / "nope.sqlite", paths.database, NOW)


def test_the_cli_exits_0_for_a_good_backup_and_2_for_the_active_database(backup, paths):
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "piworkflows.cli", "--state-dir", str(paths.state_dir), "state", "verify", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    good = cli(str(backup))
    assert good.returncode == 0, good.stderr
    assert "integrity_check ok" in good.stdout and "invariants: all hold" in good.stdout
    refused = cli(str(paths.database))
    assert refused.returncode == 2 and "is the active database" in refused.stderr

"""``state reset`` (writer/reset.py): a stopped server's state moved aside, never copied or deleted."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from piworkflows.paths import StatePaths
from piworkflows.writer import reset
from tests.support import run_group, take_epoch

pytestmark = pytest.mark.timeout(60)


def YES(question: str) -> bool:  # noqa: N802 (a constant's name: the answer to every question)
    return True


def test_a_database_without_companions_moves_alone_into_new_private_dirs(executor, paths: StatePaths, tmp_path):
    run_group(executor, take_epoch())
    executor.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    executor.conn.close()  # the last connection removes -wal and -shm
    content = paths.database.read_bytes()
    target = tmp_path / "a" / "b" / "old"
    assert reset.reset(paths, target, YES) == [(paths.database, target / "state.sqlite")]
    assert (target / "state.sqlite").read_bytes() == content and not paths.database.exists()
    assert [stat.S_IMODE(d.stat().st_mode) for d in (target, target.parent, target.parent.parent)] == [0o700] * 3


def test_a_file_that_does_not_open_as_sqlite_is_refused_and_nothing_is_created(paths: StatePaths, tmp_path):
    paths.state_dir.mkdir(mode=0o700)
    paths.database.write_bytes(b"not a database " * 100)
    with pytest.raises(reset.ResetRefused, match="does not open as an SQLite database.*by hand"):
        reset.reset(paths, tmp_path / "old", YES)
    assert paths.database.read_bytes() == b"not a database " * 100 and not (tmp_path / "old").exists()


def test_another_filesystem_is_refused_before_anything_moves(executor, paths: StatePaths, tmp_path, monkeypatch):
    """EXDEV (the directory is on another filesystem): refused, never a copy; state.sqlite stays."""
    run_group(executor, take_epoch())
    real_rename = os.rename

    def across_filesystems(source, target):
        if Path(target).parent == tmp_path / "old":
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real_rename(source, target)

    monkeypatch.setattr(reset.os, "rename", across_filesystems)
    with pytest.raises(reset.ResetRefused, match="another filesystem.*nothing was moved"):
        reset.reset(paths, tmp_path / "old", YES)
    assert paths.database.exists() and paths.wal.exists() and list((tmp_path / "old").iterdir()) == []


def test_no_database_or_an_existing_or_relative_directory_is_refused(paths: StatePaths, tmp_path):
    with pytest.raises(reset.ResetRefused, match="there is no .*state.sqlite to move"):
        reset.reset(paths, tmp_path / "old", YES)
    (tmp_path / "old").mkdir()
    with pytest.raises(reset.ResetRefused, match="exists; name a new directory"):
        reset.reset(paths, tmp_path / "old", YES)
    with pytest.raises(reset.ResetRefused, match="not an absolute path"):
        reset.reset(paths, Path("relative"), YES)
    assert not paths.state_dir.exists()  # nothing was created


def test_a_healthy_database_moves_only_when_the_person_says_yes(executor, paths: StatePaths, tmp_path):
    run_group(executor, take_epoch())
    executor.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    executor.conn.close()
    asked: list[str] = []

    def no(question: str) -> bool:
        asked.append(question)
        return False

    with pytest.raises(reset.HealthyState, match="is healthy; nothing was moved \\(pass --yes"):
        reset.reset(paths, tmp_path / "old", no)
    assert asked == [f"{paths.database} is healthy (this build's schema, no damage found); move it aside anyway?"]
    assert paths.database.exists() and not (tmp_path / "old").exists()
    assert reset.reset(paths, tmp_path / "old", YES) == [(paths.database, tmp_path / "old" / "state.sqlite")]

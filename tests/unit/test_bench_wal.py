"""The WAL benchmark's reading of a WAL file (stress/bench/wal.py): frames, commits and the B-tree of
each frame's page, on a database whose WAL is never checkpointed."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from stress.bench import wal

pytestmark = pytest.mark.timeout(30)


def test_each_commit_and_the_pages_it_rewrote_are_read_from_the_wal(tmp_path):
    database = tmp_path / "db.sqlite"
    conn = sqlite3.connect(database, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE t (k BLOB PRIMARY KEY, v TEXT)")
    for _ in range(3):  # three commits of 50 rows each
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO t VALUES (randomblob(32), ?)", [("x" * 40,)] * 50)
        conn.execute("COMMIT")
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(database, copy)
    shutil.copyfile(f"{database}-wal", f"{copy}-wal")
    conn.close()

    page_size, frames = wal.wal_frames((tmp_path / "copy.sqlite-wal").read_bytes())
    assert page_size == 4096
    assert sum(1 for _, ends in frames if ends) == 4  # the CREATE TABLE and the three inserts
    assert frames[-1][1] and all(page >= 1 for page, _ in frames)
    owners = wal.page_owners(copy)
    if owners is None:
        pytest.skip("this SQLite has no dbstat")
    named = {owners.get(page) for page, _ in frames}
    assert {"t", "sqlite_autoindex_t_1", "sqlite_schema"} <= named

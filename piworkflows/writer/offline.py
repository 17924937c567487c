"""Inactive database files: the only SQLite opens outside the server's writer.

Verification of a backup::

    pi-workflows state verify BACKUP
      stat BACKUP ── same (device, inode) as the active state.sqlite? refused (a symlink, a
                     hard link, a ".." path or a bind mount of the state dir all name it)
      -wal/-shm beside it? refused (not an inactive, self-contained backup)
      open file:BACKUP?mode=ro&immutable=1, PRAGMA query_only = ON
      header and schema (writer/schema.py) ── integrity_check, foreign_key_check ── the
      spec's invariants (writer/invariants.py)

Nothing is written, created or repaired: not the backup, and no -wal or -shm.
``state reset`` (``writer/reset.py``) checks here that a stopped server's
state.sqlite opens before it moves it aside, the same way.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from piworkflows.errors import StateIncompatible
from piworkflows.writer import invariants, schema


class NotABackup(ValueError):
    """The path cannot be verified as an inactive backup (the message says why and what to do)."""


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def check_inactive(backup: Path, active_database: Path) -> None:
    """Refuse the active database under any name, and anything that is not a lone file."""
    try:
        found = os.stat(backup)
    except FileNotFoundError:
        raise NotABackup(f"{backup} does not exist") from None
    if not Path(backup).is_file():
        raise NotABackup(f"{backup} is not a file")
    try:
        active = os.stat(active_database)
    except FileNotFoundError:
        active = None
    if active is not None and same_file(found, active):
        raise NotABackup(
            f"{backup} is the active database (the same file as {active_database}); verify the live state "
            "with 'pi-workflows state verify' and a backup by its own path"
        )
    for suffix in ("-wal", "-shm"):
        if os.path.exists(f"{backup}{suffix}"):
            raise NotABackup(f"{backup}{suffix} exists: a backup is one self-contained file, not a live database")


def _read_only(database: Path) -> sqlite3.Connection:
    """``mode=ro&immutable=1``: SQLite writes nothing, takes no lock and makes no -wal or -shm
    (a -wal beside the file is ignored, not read)."""
    return sqlite3.connect("file:" + quote(str(Path(database).absolute())) + "?mode=ro&immutable=1", uri=True)


def schema_cookie(database: Path) -> int:
    """``PRAGMA schema_version`` of an inactive database file opened read-only (no byte changes);
    raises ``sqlite3.DatabaseError`` if it is not an SQLite database."""
    conn = _read_only(database)
    try:
        cookie: int = conn.execute("PRAGMA schema_version").fetchone()[0]
        return cookie
    finally:
        conn.close()


def verify_backup(backup: Path, active_database: Path, now_ms: int) -> dict[str, Any]:
    """The same checks as ``state.verify``, on an inactive backup opened read-only."""
    check_inactive(backup, active_database)
    conn = _read_only(backup)
    try:
        conn.execute("PRAGMA query_only = ON")
        try:
            schema.check_header(Path(backup))
            schema.check_contents(conn)
        except StateIncompatible as exc:  # the reason, not the live state's reset instruction
            return {
                "ok": False,
                "schema": f"not a backup of this build's state: {exc.reason}",
                "integrity": [],
                "violations": {},
            }
        report, _ = invariants.verify(conn, now_ms)
        return {**report, "schema": None}
    finally:
        conn.close()

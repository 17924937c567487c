"""``state.backup``: SQLite's online backup API on the writer's own connection.

::

    state.backup {destination} ── a stored answer for its key? adopted, nothing copied
      destination: absolute, new, in a private (0700) directory ── else refused (not stored:
        a repeat with the same key is checked again)
      create it 0600 ── connection.backup(pages=backup_step_pages, progress=between_steps):
        between two steps the writer loop runs the write groups waiting (commands keep
        flowing; writes on this same connection are carried into the copy, no restart)
        and state.status shows {operation: "backup", done, total}
      journal_mode DELETE (one self-contained file) ── fsync file and directory
      opened read-only and verified (writer/offline.py) ── the receipt commits

A backup from a second connection would restart for ever under continuous
writes; on the writer's connection it cannot.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.paths import DIR_MODE, FILE_MODE, fsync
from piworkflows.writer import offline


def check_destination(destination: str, active_database: Path) -> Path:
    """A new absolute path in a private directory (created 0700 if missing), never the state dir."""
    path = Path(destination)
    if not path.is_absolute():
        raise CommandError("validationFailed", "the backup destination must be an absolute path")
    if os.path.lexists(path):
        raise CommandError("resourceExists", "the backup destination exists; name a new file")
    parent = path.parent
    if parent.exists():
        mode = stat.S_IMODE(parent.stat().st_mode)
        if mode & 0o077:
            raise CommandError("validationFailed", f"the backup directory must be private: chmod 700 {parent}")
        if active_database.exists() and offline.same_file(parent.stat(), active_database.parent.stat()):
            raise CommandError("validationFailed", "the backup must not be written into the state directory")
    return path


def make_backup(
    conn: sqlite3.Connection,
    destination: Path,
    active_database: Path,
    now_ms: int,
    step_pages: int,
    between_steps: Callable[[int, int], None],
) -> dict[str, Any]:
    """Copy, make self-contained, fsync, verify. Raises CommandError (and removes the file) on failure."""
    destination.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.close(os.open(destination, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    try:
        target = sqlite3.connect(destination, isolation_level=None)
        try:
            conn.backup(
                target,
                pages=step_pages,
                sleep=0,
                progress=lambda status, remaining, total: between_steps(total - remaining, total),
            )
            target.execute("PRAGMA journal_mode = DELETE")
            pages = target.execute("PRAGMA page_count").fetchone()[0]
        finally:
            target.close()
        for path in (destination, destination.parent):
            fsync(path)
        verified = offline.verify_backup(destination, active_database, now_ms)
        if not verified["ok"]:
            raise CommandError("internalError", "the backup did not verify; it was removed")
    except BaseException:
        destination.unlink(missing_ok=True)
        raise
    return {"destination": str(destination), "bytes": destination.stat().st_size, "pages": pages}

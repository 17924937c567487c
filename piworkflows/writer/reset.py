"""``pi-workflows state reset --backup DIR``: the spec's reset instruction as one command.

::

    DIR absolute and new
    host/host.lock, non-blocking ── held: a server runs, refused (stop it first)
      state.sqlite opens read-only? (offline.py: immutable, no byte changes) ── else refused
      healthy (this build's schema, quick_check clean)? ── ``confirm`` says yes, else refused
      mkdir DIR 0700 (each missing parent 0700)
      rename state.sqlite, then -wal, then -shm into DIR ── fsync DIR and the state dir
    lock released ── the next start creates a new state.sqlite

Nothing is copied or deleted: the files keep their bytes under DIR. state.sqlite
moves first: a crash between two renames leaves a -wal without state.sqlite,
which the next start refuses (the reverse order could lose committed WAL
content). A rename across filesystems (EXDEV) is refused, never done as a copy.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from piworkflows.errors import StateCorrupt, StateIncompatible
from piworkflows.lock import AlreadyRunning, HostLock
from piworkflows.paths import StatePaths, ensure_private_dir, fsync
from piworkflows.writer import offline, schema


class ResetRefused(Exception):
    """The state cannot be moved (the message says why and what to do); nothing was moved."""


class HealthyState(ResetRefused):
    """The database is this build's and undamaged: it moves only when the person confirms."""


def reset(paths: StatePaths, backup_dir: Path, confirm: Callable[[str], bool]) -> list[tuple[Path, Path]]:
    """Move state.sqlite, -wal and -shm into the new directory ``backup_dir``; returns each move.
    A database the server could use (compatible, undamaged) moves only if ``confirm`` (asked with
    the reason) says yes: a reset is for a state the server refuses."""
    if not backup_dir.is_absolute():
        raise ResetRefused(f"{backup_dir} is not an absolute path")
    if os.path.lexists(backup_dir):
        raise ResetRefused(f"{backup_dir} exists; name a new directory")
    if not paths.database.exists():
        leftovers = [p.name for p in (paths.wal, paths.shm) if p.exists()]
        raise ResetRefused(
            f"there is no {paths.database} to move" + (f"; move {' and '.join(leftovers)} by hand" if leftovers else "")
        )
    lock = HostLock(paths)
    try:
        lock.acquire()
    except AlreadyRunning:
        raise ResetRefused(
            f"a server is running for {paths.state_dir}; stop the server first: pi-workflows server stop"
        ) from None
    try:
        try:
            offline.schema_cookie(paths.database)
        except sqlite3.DatabaseError as exc:
            raise ResetRefused(
                f"{paths.database} does not open as an SQLite database ({exc}); nothing was "
                "moved: move it with its -wal and -shm files by hand"
            ) from None
        try:
            schema.verify_database(paths)
        except (StateIncompatible, StateCorrupt):
            pass  # what a reset is for
        else:
            question = f"{paths.database} is healthy (this build's schema, no damage found); move it aside anyway?"
            if not confirm(question):
                raise HealthyState(f"{paths.database} is healthy; nothing was moved (pass --yes to move it anyway)")
        ensure_private_dir(backup_dir)  # with each missing parent, every one 0700
        fsync(backup_dir.parent)
        moved = []
        for source in (paths.database, paths.wal, paths.shm):
            if not source.exists():
                continue
            target = backup_dir / source.name
            try:
                os.rename(source, target)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                raise ResetRefused(
                    f"{backup_dir} is on another filesystem than {paths.state_dir}; nothing was "
                    "moved (the new directory stays, empty): name a new directory on the same "
                    "filesystem"
                ) from None
            moved.append((source, target))
        fsync(backup_dir)
        fsync(paths.state_dir)
        return moved
    finally:
        lock.release()

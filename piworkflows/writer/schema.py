"""Create a new state database, or verify an existing one without changing it.

::

    the state dir, state.sqlite, -wal, -shm: this user's, no links, 0600 (paths.py)
    state.sqlite missing ──> create in a private temp file ──> rename into place
    state.sqlite present ──> header bytes (magic, application id, user version)
                         ──> schema inspection, never on the live files:
                               no -wal/-shm: an immutable read-only open
                               -wal or -shm: a private copy of the three files
                         ──> schema_meta, DDL digest, exact sqlite_schema shape
                             (compared with schema.sql executed in memory)
                         ──> PRAGMA quick_check (the whole file, with its WAL)

A file that does not match raises ``StateIncompatible`` with the spec's
instruction, a damaged one ``StateCorrupt``, a path the server must not use
``StatePathRefused``; each leaves ``state.sqlite``, ``-wal`` and ``-shm``
byte-identical (a read-only SQLite open of a WAL database can still write
``-shm`` or create missing files, which is why inspection happens on a copy).
``check_open`` repeats the schema checks on the writer's own connection when
it reopens after a failed transaction (no copy: the disk may be full).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from piworkflows import __version__
from piworkflows.errors import StateCorrupt, StateIncompatible
from piworkflows.paths import FILE_MODE, StatePaths, check_private_file, ensure_private_dir, fsync
from piworkflows.writer import invariants

APPLICATION_ID = 0x50495746  # "PIWF"
USER_VERSION = 1
SCHEMA_NAME = "pi-workflows-state"
SCHEMA_VERSION = 1
DDL_PATH = Path(__file__).with_name("schema.sql")

_MAGIC = b"SQLite format 3\x00"
_CREATING_PREFIX = ".state.sqlite.creating-"


@lru_cache(maxsize=1)
def ddl_text() -> str:
    return DDL_PATH.read_bytes().decode("utf-8")


@lru_cache(maxsize=1)
def ddl_sha256() -> bytes:
    return hashlib.sha256(DDL_PATH.read_bytes()).digest()


def schema_shape(conn: sqlite3.Connection) -> list[tuple[str, str, str, str | None]]:
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT GLOB 'sqlite_stat*' ORDER BY type, name"
    ).fetchall()
    return [tuple(row) for row in rows]


@lru_cache(maxsize=1)
def expected_shape() -> tuple[tuple[str, str, str, str | None], ...]:
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(ddl_text())
        return tuple(schema_shape(conn))
    finally:
        conn.close()


def ensure_database(paths: StatePaths, now_ms: int) -> None:
    """Create the database if there is none; otherwise verify it. Changes nothing else."""
    ensure_private_dir(paths.state_dir)
    for path in (paths.database, paths.wal, paths.shm):
        check_private_file(path)
    if paths.database.exists():
        verify_database(paths)
        return
    if paths.wal.exists() or paths.shm.exists():
        raise StateIncompatible("a -wal or -shm file exists without state.sqlite")
    create_database(paths, now_ms)


def create_database(paths: StatePaths, now_ms: int) -> None:
    """Build the complete database in a temp file, then move it into place atomically."""
    for leftover in paths.state_dir.glob(_CREATING_PREFIX + "*"):
        leftover.unlink()  # ours, from a creation that crashed before the rename
    tmp = paths.state_dir / f"{_CREATING_PREFIX}{os.getpid()}"
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE))
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("BEGIN IMMEDIATE")
        for statement in _statements(ddl_text()):
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {USER_VERSION}")
        conn.execute(
            "INSERT INTO schema_meta (singleton, schema_name, schema_version, ddl_sha256, app_version, created_at) "
            "VALUES (1, ?, ?, ?, ?, ?)",
            (SCHEMA_NAME, SCHEMA_VERSION, ddl_sha256(), __version__, now_ms),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()  # the last connection checkpoints and removes -wal and -shm
    fsync(tmp)
    os.rename(tmp, paths.database)
    fsync(paths.state_dir)


def verify_database(paths: StatePaths) -> None:
    """Raise ``StateIncompatible`` unless the database is exactly ours, ``StateCorrupt`` if
    ``quick_check`` finds it damaged. Writes nothing."""
    check_header(paths.database)
    with _inspection_connection(paths) as conn:
        check_contents(conn, paths)
        damage = invariants.damage(conn, "quick_check")
    if damage:
        raise StateCorrupt(str(paths.database), f"PRAGMA quick_check: {damage[0]}")


def check_open(paths: StatePaths, conn: sqlite3.Connection) -> None:
    """The header and schema checks on the writer's own connection to the file it verified."""
    check_header(paths.database)
    check_contents(conn, paths)


def check_header(path: Path) -> None:
    with open(path, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_MAGIC):
        raise StateIncompatible("not an SQLite database")
    if int.from_bytes(header[68:72], "big") != APPLICATION_ID:
        raise StateIncompatible("wrong application id")
    if int.from_bytes(header[60:64], "big") != USER_VERSION:
        raise StateIncompatible("wrong user version")


@contextlib.contextmanager
def _inspection_connection(paths: StatePaths) -> Iterator[sqlite3.Connection]:
    companions = [p for p in (paths.wal, paths.shm) if p.exists()]
    if not companions:
        uri = paths.database.absolute().as_uri() + "?mode=ro&immutable=1"
        conn = sqlite3.connect(uri, uri=True)
        try:
            yield conn
        finally:
            conn.close()
        return
    copy_dir = Path(tempfile.mkdtemp(prefix=".verify-", dir=paths.state_dir))
    try:
        for source in [paths.database, *companions]:
            shutil.copyfile(source, copy_dir / source.name)
        conn = sqlite3.connect(copy_dir / paths.database.name)
        try:
            yield conn
        finally:
            conn.close()
    finally:
        shutil.rmtree(copy_dir, ignore_errors=True)


def check_contents(conn: sqlite3.Connection, paths: StatePaths | None = None) -> None:
    """Application id, user version, exact schema shape and schema_meta (``paths``: whose damage a
    read error reports as ``StateCorrupt``)."""
    try:
        if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            raise StateIncompatible("wrong application id")
        if conn.execute("PRAGMA user_version").fetchone()[0] != USER_VERSION:
            raise StateIncompatible("wrong user version")
        if tuple(schema_shape(conn)) != expected_shape():
            raise StateIncompatible("schema shape differs from this build's DDL")
        rows = conn.execute("SELECT schema_name, schema_version, ddl_sha256 FROM schema_meta").fetchall()
    except sqlite3.DatabaseError as exc:
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if paths is not None and code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            raise StateCorrupt(str(paths.database), str(exc)) from exc
        raise StateIncompatible(f"unreadable database: {exc}") from exc
    if rows != [(SCHEMA_NAME, SCHEMA_VERSION, ddl_sha256())]:
        raise StateIncompatible("schema_meta does not name this build's schema and DDL digest")


def _statements(script: str) -> Iterator[str]:
    """Split the DDL into complete statements (triggers contain inner semicolons)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            if statement and not all(
                part.strip().startswith("--") or not part.strip() for part in statement.splitlines()
            ):
                yield statement
            pending = ""

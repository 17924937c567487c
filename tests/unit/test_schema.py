"""Tests for piworkflows.writer.schema: create, verify, refuse, and the DDL's guarantees.

Every database here is a real SQLite file under ``tmp_path``. Incompatible
databases are made by building ours and damaging it with a plain ``sqlite3``
connection, or by writing a foreign file in its place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piworkflows import __version__
from piworkflows.clock import FakeClock
from piworkflows.errors import StateCorrupt, StateIncompatible
from piworkflows.paths import StatePaths, ensure_private_dir
from piworkflows.settings import Settings
from piworkflows.writer import db, schema

pytestmark = pytest.mark.timeout(60)

NOW = 1_767_225_600_000

SPEC_MESSAGE = (
    "Pi Workflows durable state is incompatible. Back up and move state.sqlite with its -wal and "
    "-shm files, then start Pi Workflows to create a new state.sqlite database. The incompatible "
    "state was not changed."
)


# ---------------------------------------------------------------- helpers


def snapshot(directory: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry of the state dir: mode, mtime and (for files) exact bytes."""
    result: dict[str, tuple[int, int, bytes | None]] = {}
    for entry in sorted(directory.iterdir()):
        st = entry.lstat()
        content = entry.read_bytes() if entry.is_file() else None
        result[entry.name] = (st.st_mode, st.st_mtime_ns, content)
    return result


def execute_plain(path: Path, *statements: str) -> None:
    """Run statements on a plain connection and close it (checkpointing any WAL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def make_ours(paths: StatePaths) -> None:
    ensure_private_dir(paths.state_dir)
    schema.create_database(paths, NOW)


@pytest.fixture(autouse=True)
def private_umask() -> Iterator[None]:
    """Files the tests plant are 0600, as the server's own are (a wider mode is refused first)."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def assert_refused(paths: StatePaths, call: Callable[[], object] | None = None) -> StateIncompatible:
    """The call fails with the spec's message and the state dir is exactly as before."""
    before = snapshot(paths.state_dir)
    with pytest.raises(StateIncompatible) as info:
        if call is None:
            schema.ensure_database(paths, NOW)
        else:
            call()
    assert str(info.value) == SPEC_MESSAGE
    assert str(info.value) == StateIncompatible.MESSAGE
    assert info.value.reason  # a log-only reason is always given
    assert_untouched(paths, before)
    return info.value


def assert_untouched(paths: StatePaths, before: dict[str, bytes]) -> None:
    after = snapshot(paths.state_dir)
    assert list(after) == list(before), "a file was created or removed"
    assert after == before, "a file changed"


def assert_damaged(paths: StatePaths) -> StateCorrupt:
    """Our header over a damaged body: refused as damaged (naming the file), untouched."""
    before = snapshot(paths.state_dir)
    with pytest.raises(StateCorrupt) as info:
        schema.ensure_database(paths, NOW)
    assert str(paths.database) in str(info.value) and "state reset --backup" in str(info.value)
    assert_untouched(paths, before)
    return info.value


def header(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(100)


def copy_with_companions(source: StatePaths, target: StatePaths) -> None:
    ensure_private_dir(target.state_dir)
    for src, dst in ((source.database, target.database), (source.wal, target.wal), (source.shm, target.shm)):
        shutil.copyfile(src, dst)


def crash_snapshot(tmp_path: Path, target: StatePaths, statements: list[str], *, ours: bool = True) -> None:
    """Leave ``target`` as a crash would: changes committed to the -wal, not yet checkpointed.

    The three files are copied while the changing connection is still open, so
    the main file does not contain the change and -wal/-shm are live.
    """
    scratch = StatePaths.resolve(tmp_path / "scratch")
    ensure_private_dir(scratch.state_dir)
    if ours:
        schema.create_database(scratch, NOW)
    conn = sqlite3.connect(scratch.database, isolation_level=None)
    try:
        assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        for statement in statements:
            conn.execute(statement)
        assert scratch.wal.stat().st_size > 0
        copy_with_companions(scratch, target)
    finally:
        conn.close()


# ---------------------------------------------------------------- 1. fresh create


def test_fresh_create_makes_our_database(paths: StatePaths, clock: FakeClock) -> None:
    assert not paths.state_dir.exists()

    schema.ensure_database(paths, clock.now_ms())

    assert paths.database.is_file()
    conn = sqlite3.connect(paths.database.absolute().as_uri() + "?mode=ro&immutable=1", uri=True)
    try:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x50495746
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        rows = conn.execute(
            "SELECT singleton, schema_name, schema_version, ddl_sha256, app_version, created_at FROM schema_meta"
        ).fetchall()
        assert rows == [(1, "pi-workflows-state", 1, schema.ddl_sha256(), __version__, clock.now_ms())]
        tables = [
            (name, strict)
            for _schema, name, kind, _ncol, _wr, strict in conn.execute("PRAGMA table_list").fetchall()
            if _schema == "main" and kind == "table" and not name.startswith("sqlite_")
        ]
        expected_tables = sorted(name for kind, name, _t, _s in schema.expected_shape() if kind == "table")
        assert sorted(name for name, _ in tables) == expected_tables
        assert expected_tables, "the DDL defines tables"
        not_strict = [name for name, strict in tables if strict != 1]
        assert not_strict == []
    finally:
        conn.close()


def test_fresh_create_header_fields(paths: StatePaths) -> None:
    schema.ensure_database(paths, NOW)
    head = header(paths.database)
    assert head.startswith(b"SQLite format 3\x00")
    assert int.from_bytes(head[68:72], "big") == 0x50495746  # "PIWF"
    assert head[68:72] == b"PIWF"
    assert int.from_bytes(head[60:64], "big") == 1
    # file format read/write version 2 means the database is in WAL mode
    assert head[18] == 2 and head[19] == 2


def test_fresh_create_is_in_wal_mode_for_other_connections(paths: StatePaths) -> None:
    schema.ensure_database(paths, NOW)
    conn = sqlite3.connect(paths.database)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_fresh_create_permissions_and_no_leftovers(paths: StatePaths) -> None:
    schema.ensure_database(paths, NOW)

    assert stat.S_IMODE(paths.state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(paths.database.stat().st_mode) == 0o600
    assert sorted(p.name for p in paths.state_dir.iterdir()) == ["state.sqlite"]


def test_fresh_create_with_permissive_umask_still_private(paths: StatePaths) -> None:
    old = os.umask(0)
    try:
        schema.ensure_database(paths, NOW)
    finally:
        os.umask(old)
    assert stat.S_IMODE(paths.state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(paths.database.stat().st_mode) == 0o600


def test_existing_state_dir_is_made_private(paths: StatePaths) -> None:
    paths.state_dir.mkdir(parents=True, mode=0o755)
    os.chmod(paths.state_dir, 0o755)
    schema.ensure_database(paths, NOW)
    assert stat.S_IMODE(paths.state_dir.stat().st_mode) == 0o700


def test_create_removes_temp_file_left_by_a_crashed_creation(paths: StatePaths) -> None:
    ensure_private_dir(paths.state_dir)
    leftover = paths.state_dir / ".state.sqlite.creating-999999"
    leftover.write_bytes(b"half written")

    schema.ensure_database(paths, NOW)

    assert sorted(p.name for p in paths.state_dir.iterdir()) == ["state.sqlite"]
    schema.verify_database(paths)


def test_created_database_verifies_clean(paths: StatePaths) -> None:
    schema.ensure_database(paths, NOW)
    conn = sqlite3.connect(paths.database.absolute().as_uri() + "?mode=ro&immutable=1", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


# ---------------------------------------------------------------- 2. verify accepts ours


def test_second_ensure_accepts_and_changes_nothing(paths: StatePaths) -> None:
    schema.ensure_database(paths, NOW)
    before = snapshot(paths.state_dir)
    mtime = paths.database.stat().st_mtime_ns

    schema.ensure_database(paths, NOW + 1000)
    schema.verify_database(paths)

    assert snapshot(paths.state_dir) == before
    assert paths.database.stat().st_mtime_ns == mtime


def test_verify_accepts_while_writer_has_wal_and_shm(paths: StatePaths, settings: Settings) -> None:
    schema.ensure_database(paths, NOW)
    conn = db.connect(paths, settings)
    try:
        conn.execute("INSERT INTO projects (project_id, canonical_path, created_at) VALUES ('p1', '/p1', ?)", (NOW,))
        assert paths.wal.exists() and paths.shm.exists()
        assert paths.wal.stat().st_size > 0
        before = snapshot(paths.state_dir)
        files = {p: p.read_bytes() for p in (paths.database, paths.wal, paths.shm)}

        schema.verify_database(paths)
        schema.ensure_database(paths, NOW)

        assert {p: p.read_bytes() for p in (paths.database, paths.wal, paths.shm)} == files
        assert snapshot(paths.state_dir) == before
        # the writer still sees its own row and can keep writing
        assert conn.execute("SELECT project_id FROM projects").fetchall() == [("p1",)]
        conn.execute("INSERT INTO projects (project_id, canonical_path, created_at) VALUES ('p2', '/p2', ?)", (NOW,))
    finally:
        conn.close()


def test_verify_accepts_crash_left_wal_with_committed_rows(tmp_path: Path, paths: StatePaths) -> None:
    crash_snapshot(
        tmp_path, paths, ["INSERT INTO projects (project_id, canonical_path, created_at) VALUES ('p1', '/p1', 1)"]
    )
    before = snapshot(paths.state_dir)

    schema.ensure_database(paths, NOW)

    assert snapshot(paths.state_dir) == before
    conn = db.open_database(paths, Settings(), FakeClock())
    try:
        assert conn.execute("SELECT project_id FROM projects").fetchall() == [("p1",)]
    finally:
        conn.close()


def test_verify_accepts_a_database_written_by_another_app_version(paths: StatePaths) -> None:
    # app_version is informational: the DDL digest and shape decide compatibility.
    make_ours(paths)
    execute_plain(paths.database, "UPDATE schema_meta SET app_version = '0.0.0-other'")
    schema.verify_database(paths)


def test_verify_accepts_state_dir_with_uri_special_characters(tmp_path: Path) -> None:
    paths = StatePaths.resolve(tmp_path / "my state #1 ?x=%20&y")
    schema.ensure_database(paths, NOW)
    before = snapshot(paths.state_dir)
    schema.ensure_database(paths, NOW)
    assert snapshot(paths.state_dir) == before


def test_verify_accepts_analyzed_database(paths: StatePaths) -> None:
    # ANALYZE (or PRAGMA optimize) adds sqlite_stat tables; that is still our schema.
    make_ours(paths)
    execute_plain(paths.database, "ANALYZE")
    schema.verify_database(paths)


# ---------------------------------------------------------------- 3. incompatibilities


def test_message_is_the_spec_instruction() -> None:
    assert StateIncompatible.MESSAGE == SPEC_MESSAGE
    assert str(StateIncompatible("any reason")) == SPEC_MESSAGE


DAMAGE = {
    "wrong application id": ["PRAGMA application_id = 1"],
    "zero application id": ["PRAGMA application_id = 0"],
    "wrong user version": ["PRAGMA user_version = 2"],
    "zero user version": ["PRAGMA user_version = 0"],
    "wrong ddl digest": ["UPDATE schema_meta SET ddl_sha256 = randomblob(32)"],
    "missing schema_meta row": ["DELETE FROM schema_meta"],
    "extra table": ["CREATE TABLE extra_table (x TEXT) STRICT"],
    "extra index": ["CREATE INDEX projects_by_created ON projects (created_at)"],
    "extra view": ["CREATE VIEW extra_view AS SELECT project_id FROM projects"],
    "extra trigger": [
        "CREATE TRIGGER extra_trigger AFTER INSERT ON projects BEGIN SELECT 1; END",
    ],
    "altered table": ["ALTER TABLE projects ADD COLUMN extra TEXT"],
    "renamed column": ["ALTER TABLE projects RENAME COLUMN created_at TO created_ms"],
    "dropped index": ["DROP INDEX leases_live_by_expiry"],
    "dropped unique partial index": ["DROP INDEX effect_attempts_one_applying"],
    "dropped trigger": ["DROP TRIGGER events_no_update"],
    "dropped table": ["DROP TABLE run_view_content"],
    "redefined index": [
        "DROP INDEX effects_one_deterministic_key",
        "CREATE UNIQUE INDEX effects_one_deterministic_key ON effects (idempotency_key, effect_type)",
    ],
}


@pytest.mark.parametrize("statements", list(DAMAGE.values()), ids=list(DAMAGE))
def test_damaged_database_is_refused_untouched(paths: StatePaths, statements: list[str]) -> None:
    make_ours(paths)
    execute_plain(paths.database, *statements)
    assert not paths.wal.exists() and not paths.shm.exists()  # the damage is in the main file

    assert_refused(paths)
    assert_refused(paths, lambda: schema.verify_database(paths))
    assert not paths.wal.exists() and not paths.shm.exists()


def test_extra_table_whose_name_resembles_sqlite_stat_is_refused(paths: StatePaths) -> None:
    make_ours(paths)
    execute_plain(paths.database, "CREATE TABLE sqlitexstat_extra (x TEXT) STRICT")
    assert_refused(paths)


def _foreign_program(path: Path) -> None:
    execute_plain(
        path, "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)", "INSERT INTO notes (body) VALUES ('x')"
    )


def _foreign_program_wal(path: Path) -> None:
    execute_plain(path, "PRAGMA journal_mode = WAL", "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")


def _our_ids_no_tables(path: Path) -> None:
    execute_plain(path, f"PRAGMA application_id = {0x50495746}", "PRAGMA user_version = 1")


def _our_ids_foreign_tables(path: Path) -> None:
    execute_plain(
        path,
        "PRAGMA journal_mode = WAL",
        f"PRAGMA application_id = {0x50495746}",
        "PRAGMA user_version = 1",
        "CREATE TABLE schema_meta (x TEXT)",
    )


def _older_alpha_layout(path: Path) -> None:
    # Our ids and schema_meta with this build's name and digest, but a different table layout.
    execute_plain(
        path,
        "PRAGMA journal_mode = WAL",
        f"PRAGMA application_id = {0x50495746}",
        "PRAGMA user_version = 1",
        "CREATE TABLE schema_meta (singleton INTEGER PRIMARY KEY, schema_name TEXT, schema_version INTEGER, "
        "ddl_sha256 BLOB, app_version TEXT, created_at INTEGER) STRICT",
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, snapshot BLOB) STRICT",
    )
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO schema_meta VALUES (1, 'pi-workflows-state', 1, ?, '0.0.1', 1)", (schema.ddl_sha256(),)
        )
    finally:
        conn.close()


def _random_bytes(path: Path) -> None:
    path.write_bytes(b"\x89NOT SQLITE" + os.urandom(8192))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _short_text(path: Path) -> None:
    path.write_text("state goes here\n")


def _magic_only(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00")


FOREIGN = {
    "another program": _foreign_program,
    "another program in wal mode": _foreign_program_wal,
    "our ids but no tables": _our_ids_no_tables,
    "our ids but foreign tables": _our_ids_foreign_tables,
    "older alpha layout": _older_alpha_layout,
    "random bytes": _random_bytes,
    "empty file": _empty,
    "short text file": _short_text,
    "only the sqlite magic": _magic_only,
}


@pytest.mark.parametrize("make", list(FOREIGN.values()), ids=list(FOREIGN))
def test_foreign_file_is_refused_untouched(paths: StatePaths, make: Callable[[Path], None]) -> None:
    ensure_private_dir(paths.state_dir)
    make(paths.database)
    assert not paths.wal.exists() and not paths.shm.exists()

    assert_refused(paths)
    assert not paths.wal.exists() and not paths.shm.exists()


def test_our_header_with_corrupt_body_is_refused_untouched(paths: StatePaths) -> None:
    make_ours(paths)
    data = bytearray(paths.database.read_bytes())
    data[100:4096] = os.urandom(4096 - 100)
    paths.database.write_bytes(bytes(data))

    assert_damaged(paths)


def test_truncated_database_is_refused_untouched(paths: StatePaths) -> None:
    make_ours(paths)
    data = paths.database.read_bytes()
    paths.database.write_bytes(data[:4096])
    assert header(paths.database)[68:72] == b"PIWF"

    assert_damaged(paths)


@pytest.mark.parametrize(
    "companions",
    [("state.sqlite-wal",), ("state.sqlite-shm",), ("state.sqlite-wal", "state.sqlite-shm")],
    ids=["wal", "shm", "wal+shm"],
)
def test_companions_without_database_are_refused_and_nothing_created(
    paths: StatePaths, companions: tuple[str, ...]
) -> None:
    ensure_private_dir(paths.state_dir)
    for name in companions:
        (paths.state_dir / name).write_bytes(os.urandom(512))

    assert_refused(paths)
    assert not paths.database.exists()


WAL_DAMAGE = {
    "application id in wal": ["PRAGMA application_id = 1"],
    "user version in wal": ["PRAGMA user_version = 7"],
    "ddl digest in wal": ["UPDATE schema_meta SET ddl_sha256 = randomblob(32)"],
    "altered table in wal": ["ALTER TABLE projects ADD COLUMN extra TEXT"],
    "extra table in wal": ["CREATE TABLE extra_table (x TEXT) STRICT"],
    "dropped index in wal": ["DROP INDEX leases_live_by_expiry"],
}


@pytest.mark.parametrize("statements", list(WAL_DAMAGE.values()), ids=list(WAL_DAMAGE))
def test_incompatibility_inside_wal_is_refused_and_all_three_files_untouched(
    tmp_path: Path, paths: StatePaths, statements: list[str]
) -> None:
    crash_snapshot(tmp_path, paths, statements)
    assert paths.wal.exists() and paths.shm.exists()
    # The main file alone is still ours: only the -wal carries the damage.
    main_only = StatePaths.resolve(tmp_path / "main-only")
    ensure_private_dir(main_only.state_dir)
    shutil.copyfile(paths.database, main_only.database)
    schema.verify_database(main_only)

    files = {p: p.read_bytes() for p in (paths.database, paths.wal, paths.shm)}
    assert_refused(paths)
    assert_refused(paths, lambda: schema.verify_database(paths))
    assert {p: p.read_bytes() for p in (paths.database, paths.wal, paths.shm)} == files


def test_foreign_wal_database_with_live_companions_is_refused_untouched(tmp_path: Path, paths: StatePaths) -> None:
    crash_snapshot(
        tmp_path,
        paths,
        ["CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)", "INSERT INTO notes (body) VALUES ('x')"],
        ours=False,
    )
    assert paths.wal.exists() and paths.shm.exists()
    assert_refused(paths)


def test_damage_made_by_a_live_connection_is_refused_while_it_stays_open(paths: StatePaths) -> None:
    make_ours(paths)
    conn = sqlite3.connect(paths.database, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE extra_table (x TEXT) STRICT")
        assert paths.wal.exists() and paths.shm.exists()
        assert_refused(paths)
    finally:
        conn.close()


# ---------------------------------------------------------------- 4. the writer entry point


@pytest.mark.parametrize(
    "statements",
    [DAMAGE["wrong application id"], DAMAGE["wrong ddl digest"], DAMAGE["altered table"]],
    ids=["application id", "ddl digest", "altered table"],
)
def test_open_database_refuses_incompatible_database(
    paths: StatePaths, settings: Settings, clock: FakeClock, statements: list[str]
) -> None:
    make_ours(paths)
    execute_plain(paths.database, *statements)
    assert_refused(paths, lambda: db.open_database(paths, settings, clock))


def test_open_database_refuses_foreign_file(paths: StatePaths, settings: Settings, clock: FakeClock) -> None:
    ensure_private_dir(paths.state_dir)
    _foreign_program(paths.database)
    assert_refused(paths, lambda: db.open_database(paths, settings, clock))


def test_open_database_refuses_orphan_wal(paths: StatePaths, settings: Settings, clock: FakeClock) -> None:
    ensure_private_dir(paths.state_dir)
    paths.wal.write_bytes(os.urandom(256))
    assert_refused(paths, lambda: db.open_database(paths, settings, clock))
    assert not paths.database.exists()


def test_open_database_creates_then_reopens(paths: StatePaths, settings: Settings, clock: FakeClock) -> None:
    conn = db.open_database(paths, settings, clock)
    try:
        conn.execute("INSERT INTO projects (project_id, canonical_path, created_at) VALUES ('p1', '/p1', ?)", (NOW,))
    finally:
        conn.close()
    conn = db.open_database(paths, settings, clock)
    try:
        assert conn.execute("SELECT project_id FROM projects").fetchall() == [("p1",)]
    finally:
        conn.close()


# ---------------------------------------------------------------- 5. DDL statements and shape


def test_statements_match_the_ddl_objects() -> None:
    statements = list(schema._statements(schema.ddl_text()))
    created_objects = [entry for entry in schema.expected_shape() if entry[3] is not None]
    assert len(statements) == len(created_objects)
    assert all(s.upper().lstrip().startswith("CREATE") or "\nCREATE" in s for s in statements)
    names = {name for _kind, name, _tbl, _sql in created_objects}
    assert len(names) == len(created_objects)


def test_statements_build_the_same_shape_as_the_script() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        for statement in schema._statements(schema.ddl_text()):
            conn.execute(statement)
        assert tuple(schema.schema_shape(conn)) == schema.expected_shape()
    finally:
        conn.close()


def test_statements_split_triggers_and_skip_comments() -> None:
    script = (
        "-- a heading; with a semicolon\n"
        "CREATE TABLE t (x INTEGER);\n"
        "\n"
        "-- only a comment\n"
        "CREATE TRIGGER t_no_update BEFORE UPDATE ON t\n"
        "BEGIN\n"
        "  SELECT RAISE(ABORT, 'no');\n"
        "END;\n"
        "-- trailing comment;\n"
    )
    statements = list(schema._statements(script))
    assert len(statements) == 2
    assert statements[0].endswith("CREATE TABLE t (x INTEGER);")
    assert statements[1].endswith("END;") and "RAISE(ABORT, 'no');" in statements[1]


def test_created_database_has_exactly_the_expected_shape(paths: StatePaths) -> None:
    schema.ensure_database(paths, NOW)
    conn = sqlite3.connect(paths.database.absolute().as_uri() + "?mode=ro&immutable=1", uri=True)
    try:
        assert tuple(schema.schema_shape(conn)) == schema.expected_shape()
    finally:
        conn.close()


def test_ddl_digest_is_sha256_of_schema_sql() -> None:
    assert schema.ddl_sha256() == hashlib.sha256(schema.DDL_PATH.read_bytes()).digest()
    assert len(schema.ddl_sha256()) == 32
    assert schema.ddl_text().encode("utf-8") == schema.DDL_PATH.read_bytes()


# ---------------------------------------------------------------- 6. integrity and writer pragmas


@pytest.fixture
def writer(paths: StatePaths, settings: Settings, clock: FakeClock) -> Iterator[sqlite3.Connection]:
    conn = db.open_database(paths, settings, clock)
    yield conn
    conn.close()


def test_fresh_database_integrity_and_foreign_keys_clean(writer: sqlite3.Connection) -> None:
    assert writer.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert writer.execute("PRAGMA foreign_key_check").fetchall() == []


def test_writer_connection_pragmas(writer: sqlite3.Connection, settings: Settings) -> None:
    assert writer.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert writer.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert writer.execute("PRAGMA journal_size_limit").fetchone()[0] == settings.journal_size_limit_bytes
    assert writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == settings.wal_autocheckpoint_pages


def test_writer_connection_uses_custom_settings(paths: StatePaths, clock: FakeClock) -> None:
    custom = Settings(wal_autocheckpoint_pages=200, journal_size_limit_bytes=2 * 1024 * 1024, busy_timeout_ms=1234)
    conn = db.open_database(paths, custom, clock)
    try:
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 200
        assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == 2 * 1024 * 1024
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1234
    finally:
        conn.close()


def test_writer_enforces_foreign_keys(writer: sqlite3.Connection) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        writer.execute(
            "INSERT INTO resources (resource_id, resource_kind, revision, project_id, created_at, updated_at) "
            "VALUES ('r1', 'run', 1, 'no-such-project', 1, 1)"
        )


def test_strict_tables_reject_wrong_types(writer: sqlite3.Connection) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        writer.execute("INSERT INTO projects (project_id, canonical_path, created_at) VALUES ('p', '/p', 'yesterday')")


# ---------------------------------------------------------------- row builders for 7 and 8


def atomic(method: Callable[..., None]) -> Callable[..., None]:
    """Each builder inserts all of its rows or none (a refused insert leaves nothing behind)."""

    def wrapper(self: Rows, *args: object, **kwargs: object) -> None:
        self.conn.execute("SAVEPOINT builder")
        try:
            method(self, *args, **kwargs)
        except BaseException:
            self.conn.execute("ROLLBACK TO builder")
            self.conn.execute("RELEASE builder")
            raise
        self.conn.execute("RELEASE builder")

    return wrapper


class Rows:
    """Minimal valid rows, inserted on a writer connection (foreign keys on)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.orders = 0
        conn.execute("INSERT INTO projects (project_id, canonical_path, created_at) VALUES ('p1', '/p1', ?)", (NOW,))
        self.resource("srv", "server")

    def blob(self, text: str) -> bytes:
        data = text.encode()
        digest = hashlib.sha256(data).digest()
        self.conn.execute(
            "INSERT OR IGNORE INTO blobs (digest, media_type, byte_length, bytes, created_at) "
            "VALUES (?, 'application/json', ?, ?, ?)",
            (digest, len(data), data, NOW),
        )
        return digest

    def resource(self, resource_id: str, kind: str) -> None:
        self.conn.execute(
            "INSERT INTO resources (resource_id, resource_kind, revision, project_id, created_at, updated_at) "
            "VALUES (?, ?, 1, 'p1', ?, ?)",
            (resource_id, kind, NOW, NOW),
        )

    def event(self, resource_id: str, revision: int = 1) -> None:
        self.conn.execute(
            "INSERT INTO events (resource_id, resource_revision, event_type, actor_class, committed_at) "
            "VALUES (?, ?, 'created', 'server', ?)",
            (resource_id, revision, NOW),
        )

    @atomic
    def run(
        self,
        run_id: str,
        *,
        status: str = "running",
        mode: str = "headless",
        session: str | None = None,
        recovery_of: tuple[str, str] | None = None,
    ) -> None:
        definition = self.blob('{"workflow":"w"}')
        self.conn.execute(
            "INSERT OR IGNORE INTO workflow_definitions (definition_digest, workflow_name, created_at) "
            "VALUES (?, 'w', ?)",
            (definition, NOW),
        )
        self.resource(run_id, "run")
        finished = NOW if status in ("completed", "failed", "timed_out", "cancelled") else None
        lineage, parent = ("recovery", recovery_of[0]) if recovery_of else ("root", None)
        self.conn.execute(
            "INSERT INTO runs (run_id, project_id, workflow_name, definition_digest, status, execution_mode, "
            "origin_session_id, input_digest, max_steps, lineage, root_run_id, parent_run_id, "
            "recovery_root_run_id, recovery_source_message_id, created_at, finished_at, updated_at) "
            "VALUES (?, 'p1', 'w', ?, ?, ?, ?, ?, 100, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                definition,
                status,
                mode,
                session,
                self.blob("{}"),
                lineage,
                recovery_of[0] if recovery_of else run_id,
                parent,
                recovery_of[0] if recovery_of else None,
                recovery_of[1] if recovery_of else None,
                NOW,
                finished,
                NOW,
            ),
        )

    def attempt(self, attempt_id: str, run_id: str, number: int = 1, status: str = "running") -> None:
        active = status in ("running", "waiting")
        self.conn.execute(
            "INSERT INTO node_attempts (attempt_id, run_id, node_path, node_kind, visit_number, attempt_number, "
            "attempt_status, outcome, lease_generation, started_at, finished_at) "
            "VALUES (?, ?, 'main', 'agent', 1, ?, ?, ?, 1, ?, ?)",
            (attempt_id, run_id, number, status, None if active else "ok", NOW, None if active else NOW),
        )

    def request(self, request_id: str, run_id: str, attempt_id: str, status: str = "pending") -> None:
        self.conn.execute(
            "INSERT INTO interactive_requests (request_id, run_id, attempt_id, target_session_id, contract_digest, "
            "request_status, revision, created_at, updated_at) VALUES (?, ?, ?, 's1', ?, ?, 1, ?, ?)",
            (request_id, run_id, attempt_id, self.blob('{"contract":1}'), status, NOW, NOW),
        )

    @atomic
    def message(
        self, message_id: str, run_id: str, *, kind: str = "notification", request_id: str | None = None
    ) -> None:
        self.resource(message_id, "workflow_message")
        self.orders += 1
        self.conn.execute(
            "INSERT INTO workflow_messages (workflow_message_id, run_id, request_id, target_session_id, "
            "message_kind, source_kind, source_id, idempotency_key, content_digest, session_order, "
            "message_state, created_at, updated_at) VALUES (?, ?, ?, 's1', ?, 'test', ?, ?, ?, ?, 'pending', ?, ?)",
            (
                message_id,
                run_id,
                request_id,
                kind,
                message_id,
                "key-" + message_id,
                self.blob('"hi"'),
                self.orders,
                NOW,
                NOW,
            ),
        )

    def turn(self, turn_id: str, message_id: str, run_id: str) -> None:
        self.conn.execute(
            "INSERT INTO workflow_turns (workflow_turn_id, workflow_message_id, run_id, target_session_id, "
            "turn_state, started_at) VALUES (?, ?, ?, 's1', 'open', ?)",
            (turn_id, message_id, run_id, NOW),
        )

    def worker(self, epoch: int, run_id: str) -> None:
        self.conn.execute(
            "INSERT INTO run_workers (runner_epoch, run_id, server_epoch, lease_generation, launch_command, "
            "start_revision, created_at) VALUES (?, ?, 1, 1, 'start', 1, ?)",
            (epoch, run_id, NOW),
        )

    @atomic
    def effect(self, effect_id: str, effect_type: str, key: str) -> None:
        self.resource(effect_id, "effect")
        self.conn.execute(
            "INSERT INTO effects (effect_id, source_resource_id, source_revision, effect_type, idempotency_key, "
            "request_fingerprint, payload_digest, effect_class, performer, recovery_policy, owner_scope, "
            "effect_status, available_at, max_attempts, created_at, updated_at) VALUES (?, 'srv', 1, ?, ?, ?, ?, "
            "'external', 'http.request', 'idempotent', 'server', 'pending', ?, 5, ?, ?)",
            (effect_id, effect_type, key, hashlib.sha256(key.encode()).digest(), self.blob('{"e":1}'), NOW, NOW, NOW),
        )

    def effect_attempt(self, effect_id: str, number: int) -> None:
        self.conn.execute(
            "INSERT INTO effect_attempts (effect_id, attempt_number, lease_generation, owner_id, attempt_status, "
            "started_at) VALUES (?, ?, 1, 'worker-1', 'applying', ?)",
            (effect_id, number, NOW),
        )

    @atomic
    def decision(self, decision_id: str, run_id: str, attempt_id: str) -> None:
        self.resource(decision_id, "decision")
        self.conn.execute(
            "INSERT INTO human_decisions (decision_id, run_id, attempt_id, audience, request_digest, "
            "continuation_id, created_at) VALUES (?, ?, ?, 'anyone', ?, ?, ?)",
            (decision_id, run_id, attempt_id, self.blob('{"ask":1}'), "cont-" + decision_id, NOW),
        )

    def resolution(self, decision_id: str) -> None:
        self.conn.execute(
            "INSERT INTO human_decision_resolutions (decision_id, resolution_kind, resolved_at) "
            "VALUES (?, 'cancellation', ?)",
            (decision_id, NOW),
        )


@pytest.fixture
def rows(writer: sqlite3.Connection) -> Rows:
    return Rows(writer)


# ---------------------------------------------------------------- 7. immutability triggers


def test_events_cannot_be_updated(rows: Rows) -> None:
    rows.resource("r1", "channel")
    rows.event("r1")
    with pytest.raises(sqlite3.IntegrityError, match="events are immutable"):
        rows.conn.execute("UPDATE events SET event_type = 'rewritten'")
    assert rows.conn.execute("SELECT event_type FROM events").fetchall() == [("created",)]


def test_events_cannot_be_deleted_outside_retention(rows: Rows) -> None:
    rows.resource("r1", "channel")
    rows.event("r1")
    with pytest.raises(sqlite3.IntegrityError, match="deleted only by retention"):
        rows.conn.execute("DELETE FROM events")
    # deleting the resource would cascade to its events, so it is refused too
    with pytest.raises(sqlite3.IntegrityError):
        rows.conn.execute("DELETE FROM resources WHERE resource_id = 'r1'")
    assert rows.conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1


def test_events_deleted_when_retention_is_deleting(rows: Rows) -> None:
    rows.resource("r1", "channel")
    rows.event("r1")
    rows.conn.create_function("piw_retention_deleting", 0, lambda: 1)
    rows.conn.execute("DELETE FROM events")
    assert rows.conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_events_are_unique_per_resource_revision(rows: Rows) -> None:
    rows.resource("r1", "channel")
    rows.event("r1")
    with pytest.raises(sqlite3.IntegrityError):
        rows.event("r1")


def test_node_attempt_started_at_never_changes(rows: Rows) -> None:
    rows.run("run1")
    rows.attempt("a1", "run1")
    with pytest.raises(sqlite3.IntegrityError, match="started_at never changes"):
        rows.conn.execute("UPDATE node_attempts SET started_at = started_at + 1 WHERE attempt_id = 'a1'")
    with pytest.raises(sqlite3.IntegrityError):
        rows.conn.execute("UPDATE node_attempts SET started_at = NULL WHERE attempt_id = 'a1'")
    # other columns (and a same-value write) still update
    rows.conn.execute(
        "UPDATE node_attempts SET attempt_status = 'completed', outcome = 'ok', finished_at = ?, "
        "started_at = started_at WHERE attempt_id = 'a1'",
        (NOW + 5,),
    )
    assert rows.conn.execute("SELECT started_at, attempt_status FROM node_attempts").fetchall() == [(NOW, "completed")]


def test_decision_resolution_is_immutable_and_single(rows: Rows) -> None:
    rows.run("run1")
    rows.attempt("a1", "run1")
    rows.decision("d1", "run1", "a1")
    rows.resolution("d1")
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        rows.conn.execute("UPDATE human_decision_resolutions SET resolution_kind = 'expiry'")
    # one decision winner
    with pytest.raises(sqlite3.IntegrityError):
        rows.resolution("d1")


def test_channel_messages_are_immutable(rows: Rows) -> None:
    rows.run("run1")
    rows.attempt("a1", "run1")
    rows.decision("d1", "run1", "a1")
    rows.resource("ch1", "channel")
    rows.conn.execute(
        "INSERT INTO channels (channel_id, channel_kind, profile_name, created_at, updated_at) "
        "VALUES ('ch1', 'telegram', 'default', ?, ?)",
        (NOW, NOW),
    )
    rows.effect("e1", "telegram.deliver", "k1")
    rows.conn.execute(
        "INSERT INTO channel_messages (channel_message_id, channel_id, decision_id, record_kind, effect_id, "
        "created_at) VALUES ('cm1', 'ch1', 'd1', 'delivery', 'e1', ?)",
        (NOW,),
    )
    with pytest.raises(sqlite3.IntegrityError, match="channel messages are immutable"):
        rows.conn.execute("UPDATE channel_messages SET record_kind = 'settlement'")


# ---------------------------------------------------------------- 8. partial unique indexes


UNIQUE_INDEXES = {
    "effects_one_deterministic_key": False,  # full unique index
    "effect_attempts_one_applying": True,
    "node_attempts_one_active_per_run": True,
    "run_workers_one_live_per_run": True,
    "workflow_turns_one_open_per_message": True,
    "workflow_messages_one_pending_step_per_request": True,
    "runs_one_unfinished_interactive_per_session": True,
    "runs_one_run_per_recovery_message": True,
    "interactive_requests_one_open_per_attempt": True,
    "attempt_active_intervals_one_open": True,
}


@pytest.mark.parametrize("name", list(UNIQUE_INDEXES))
def test_unique_index_exists(writer: sqlite3.Connection, name: str) -> None:
    table = writer.execute("SELECT tbl_name FROM sqlite_schema WHERE type = 'index' AND name = ?", (name,)).fetchone()
    assert table is not None, f"missing index {name}"
    listed = {row[1]: row for row in writer.execute(f"PRAGMA index_list({table[0]})").fetchall()}
    _seq, _name, unique, _origin, partial = listed[name]
    assert unique == 1
    assert partial == int(UNIQUE_INDEXES[name])


def test_one_deterministic_effect_key(rows: Rows) -> None:
    rows.effect("e1", "telegram.deliver", "k1")
    with pytest.raises(sqlite3.IntegrityError, match="effect_type, effects.idempotency_key"):
        rows.effect("e2", "telegram.deliver", "k1")
    rows.effect("e3", "telegram.deliver", "k2")  # another key
    rows.effect("e4", "telegram.settle", "k1")  # same key, another type


def test_one_applying_attempt_per_effect(rows: Rows) -> None:
    rows.effect("e1", "t", "k1")
    rows.effect("e2", "t", "k2")
    rows.effect_attempt("e1", 1)
    with pytest.raises(sqlite3.IntegrityError, match="effect_attempts.effect_id"):
        rows.effect_attempt("e1", 2)
    rows.effect_attempt("e2", 1)  # another effect may apply at the same time
    rows.conn.execute(
        "UPDATE effect_attempts SET attempt_status = 'failed', ended_at = ? WHERE effect_id = 'e1' "
        "AND attempt_number = 1",
        (NOW,),
    )
    rows.effect_attempt("e1", 2)  # the retry, once the first attempt ended


def test_one_active_node_attempt_per_run(rows: Rows) -> None:
    rows.run("run1")
    rows.run("run2")
    rows.attempt("a1", "run1", 1, "running")
    with pytest.raises(sqlite3.IntegrityError, match="node_attempts.run_id"):
        rows.attempt("a2", "run1", 2, "waiting")
    rows.attempt("b1", "run2", 1, "running")
    rows.attempt("a0", "run1", 3, "completed")  # finished attempts do not count
    rows.conn.execute(
        "UPDATE node_attempts SET attempt_status = 'failed', outcome = 'failed', finished_at = ? "
        "WHERE attempt_id = 'a1'",
        (NOW,),
    )
    rows.attempt("a2", "run1", 2, "running")


def test_one_live_runner_per_run(rows: Rows) -> None:
    rows.run("run1")
    rows.worker(1, "run1")
    with pytest.raises(sqlite3.IntegrityError, match="run_workers.run_id"):
        rows.worker(2, "run1")
    rows.conn.execute("UPDATE run_workers SET outcome = 'exited', ended_at = ? WHERE runner_epoch = 1", (NOW,))
    rows.worker(2, "run1")


def test_one_open_turn_per_workflow_message(rows: Rows) -> None:
    rows.run("run1")
    rows.message("m1", "run1")
    rows.message("m2", "run1")
    rows.turn("t1", "m1", "run1")
    with pytest.raises(sqlite3.IntegrityError, match="workflow_turns.workflow_message_id"):
        rows.turn("t2", "m1", "run1")
    rows.turn("t3", "m2", "run1")
    rows.conn.execute(
        "UPDATE workflow_turns SET turn_state = 'lost', ended_at = ? WHERE workflow_turn_id = 't1'", (NOW,)
    )
    rows.turn("t2", "m1", "run1")


def test_one_pending_step_message_per_request(rows: Rows) -> None:
    rows.run("run1")
    rows.attempt("a1", "run1")
    rows.request("req1", "run1", "a1")
    rows.message("m1", "run1", kind="step", request_id="req1")
    with pytest.raises(sqlite3.IntegrityError, match="workflow_messages.request_id"):
        rows.message("m2", "run1", kind="step", request_id="req1")
    rows.message("m3", "run1", kind="notification", request_id="req1")  # not a step
    rows.conn.execute("UPDATE workflow_messages SET message_state = 'cancelled' WHERE workflow_message_id = 'm1'")
    rows.message("m2", "run1", kind="step", request_id="req1")


def test_one_open_interactive_request_per_attempt(rows: Rows) -> None:
    rows.run("run1")
    rows.attempt("a1", "run1")
    rows.request("req1", "run1", "a1")
    with pytest.raises(sqlite3.IntegrityError, match="interactive_requests.attempt_id"):
        rows.request("req2", "run1", "a1", "validating")
    rows.request("req3", "run1", "a1", "cancelled")


@pytest.mark.parametrize("first_status", ["queued", "running", "waiting"])
def test_one_nonterminal_interactive_run_per_session(rows: Rows, first_status: str) -> None:
    rows.run("run1", status=first_status, mode="interactive", session="sess-1")
    with pytest.raises(sqlite3.IntegrityError, match="runs.origin_session_id"):
        rows.run("run2", status="queued", mode="interactive", session="sess-1")
    rows.run("run3", status="queued", mode="interactive", session="sess-2")  # another session
    rows.run("run4", status="running", mode="headless", session="sess-1")  # headless does not reserve
    rows.conn.execute("UPDATE runs SET paused = 1 WHERE run_id = 'run1'")
    with pytest.raises(sqlite3.IntegrityError):  # a paused run keeps its reservation
        rows.run("run2", status="queued", mode="interactive", session="sess-1")
    rows.conn.execute("UPDATE runs SET status = 'completed', finished_at = ? WHERE run_id = 'run1'", (NOW,))
    rows.run("run2", status="queued", mode="interactive", session="sess-1")


def test_one_run_per_recovery_source_message(rows: Rows) -> None:
    rows.run("run0", status="failed")
    rows.message("m0", "run0", kind="terminal")
    rows.message("m1", "run0", kind="terminal")
    rows.run("run1", recovery_of=("run0", "m0"))
    with pytest.raises(sqlite3.IntegrityError, match="runs.recovery_source_message_id"):
        rows.run("run2", recovery_of=("run0", "m0"))
    rows.run("run3", recovery_of=("run0", "m1"))


def test_one_open_active_interval_per_attempt(rows: Rows) -> None:
    rows.run("run1")
    rows.attempt("a1", "run1")
    insert = (
        "INSERT INTO attempt_active_intervals (attempt_id, interval_number, started_at, last_observed_at) "
        "VALUES ('a1', ?, ?, ?)"
    )
    rows.conn.execute(insert, (1, NOW, NOW))
    with pytest.raises(sqlite3.IntegrityError, match="attempt_active_intervals.attempt_id"):
        rows.conn.execute(insert, (2, NOW, NOW))
    rows.conn.execute(
        "UPDATE attempt_active_intervals SET ended_at = ?, end_cause = 'pause' WHERE interval_number = 1", (NOW,)
    )
    rows.conn.execute(insert, (2, NOW, NOW))


def test_row_chain_leaves_database_consistent(rows: Rows) -> None:
    rows.run("run1")
    rows.attempt("a1", "run1")
    rows.decision("d1", "run1", "a1")
    rows.effect("e1", "t", "k1")
    rows.effect_attempt("e1", 1)
    assert rows.conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert rows.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

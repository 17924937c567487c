"""A state dir prepared by someone else is not trusted: another owner, a planted symbolic link or a
wider mode is refused at start with the path and the fix, and nothing outside the state dir is
changed, re-moded or followed. A state dir given as a link to the user's own directory is fine."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.server_util import ServerProcess

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="only root can give a directory to another user")


def refused(state_dir: Path, *needles: str) -> str:
    """``server start`` exits 1 with a message holding every needle; no server serves."""
    server = ServerProcess(state_dir)
    started = server.cli("server", "start")
    assert started.returncode == 1, started.stdout + started.stderr
    for needle in needles:
        assert needle in started.stderr, started.stderr
    assert "Traceback" not in started.stderr
    assert not server.client(retry_for=0).running()
    return started.stderr


def fingerprint(path: Path) -> tuple[int, int, bytes]:
    info = path.stat()
    return stat.S_IMODE(info.st_mode), info.st_uid, path.read_bytes()


def prepared(tmp_path: Path) -> Path:
    """A state dir and host/ of this user's, as a first start leaves them (nothing else yet)."""
    state_dir = tmp_path / "s"
    (state_dir / "host").mkdir(parents=True, mode=0o700)
    state_dir.chmod(0o700)
    return state_dir


@as_root
@pytest.mark.parametrize("whose", ["state dir", "host", "state.sqlite"])
def test_what_another_user_owns_is_refused_untouched(tmp_path: Path, whose: str):
    state_dir = prepared(tmp_path)
    target = {"state dir": state_dir, "host": state_dir / "host", "state.sqlite": state_dir / "state.sqlite"}[whose]
    if whose == "state.sqlite":
        target.write_bytes(b"")
        target.chmod(0o600)
    else:
        target.chmod(0o755)
    os.chown(target, NOBODY, NOBODY)
    before = sorted(p.name for p in state_dir.rglob("*"))
    mode = stat.S_IMODE(target.stat().st_mode)
    refused(state_dir, str(target), f"belongs to uid {NOBODY}")
    assert stat.S_IMODE(target.stat().st_mode) == mode and target.stat().st_uid == NOBODY  # not re-moded
    created = set(p.name for p in state_dir.rglob("*")) - set(before)
    if whose == "state.sqlite":  # refused by the writer: only the server's own files in host/ were made
        assert created <= {"host.lock", "host.json", "server.log"} and target.read_bytes() == b""
    else:
        assert not created


@pytest.mark.parametrize("planted", ["host/server.log", "host/host.lock", "host", "state.sqlite", "state.sqlite-wal"])
def test_a_planted_link_is_refused_and_its_target_left_alone(tmp_path: Path, planted: str):
    state_dir = prepared(tmp_path)
    target = tmp_path / "precious"
    target.write_bytes(b"precious")
    target.chmod(0o644)
    before = fingerprint(target)
    link = state_dir / planted
    if planted == "host":
        (state_dir / "host").rmdir()
        link.symlink_to(tmp_path, target_is_directory=True)
    else:
        link.symlink_to(target)
    refused(state_dir, str(link), "symbolic link")
    assert fingerprint(target) == before
    assert link.is_symlink()  # left as it was


def test_a_planted_temp_file_link_is_replaced_never_followed(tmp_path: Path):
    """host/host.json.tmp is made new (O_EXCL) for each write: a link there is removed, not written through."""
    state_dir = prepared(tmp_path)
    target = tmp_path / "precious"
    target.write_bytes(b"precious")
    target.chmod(0o644)
    before = fingerprint(target)
    (state_dir / "host" / "host.json.tmp").symlink_to(target)
    server = ServerProcess(state_dir).start()
    try:
        assert fingerprint(target) == before
        assert not (state_dir / "host" / "host.json.tmp").exists()
        assert stat.S_IMODE((state_dir / "host" / "host.json").stat().st_mode) == 0o600
    finally:
        assert server.stop() == 0
    assert fingerprint(target) == before


def test_a_wider_database_file_is_refused_with_the_chmod_to_run(tmp_path: Path):
    state_dir = tmp_path / "s"
    server = ServerProcess(state_dir).start()
    assert server.stop() == 0
    database = state_dir / "state.sqlite"
    database.chmod(0o644)
    before = database.read_bytes()
    refused(state_dir, f"chmod 600 {database}")
    assert database.read_bytes() == before and stat.S_IMODE(database.stat().st_mode) == 0o644
    assert not (state_dir / "state.sqlite-wal").exists() and not (state_dir / "state.sqlite-shm").exists()
    database.chmod(0o600)
    server = ServerProcess(state_dir).start()
    try:
        for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm"):
            assert stat.S_IMODE((state_dir / name).stat().st_mode) == 0o600, name
    finally:
        assert server.stop() == 0


def test_a_state_dir_given_as_a_link_to_ones_own_directory_is_resolved_once(tmp_path: Path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    server = ServerProcess(link).start()
    try:
        assert (real / "host" / "host.sock").exists() and (real / "state.sqlite").exists()
        status = server.cli("server", "status")  # through the link too
        assert status.returncode == 0 and "running" in status.stdout, status.stdout + status.stderr
    finally:
        assert server.stop() == 0


def test_missing_parents_are_created_each_0700_and_a_wider_own_state_dir_made_0700(tmp_path: Path):
    state_dir = tmp_path / "a" / "b" / "s"
    server = ServerProcess(state_dir)
    for _ in range(2):
        started = server.cli("server", "start")
        assert started.returncode == 0, started.stderr
        assert server.cli("server", "stop").returncode == 0
        for directory in (tmp_path / "a", tmp_path / "a" / "b", state_dir, state_dir / "host"):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
        state_dir.chmod(0o755)  # the user's own state dir: made private again, through its own descriptor

"""The state directory and every file in it, resolved and checked in one place.

Order: an explicit ``--state-dir``, then ``PI_WORKFLOWS_STATE_DIR``, then
``~/.pi/agent/workflows``; a symlink there is resolved once (``resolve``).

::

    ensure_private_dir: missing parents created one by one, each 0700 ── the directory itself:
      opened O_NOFOLLOW|O_DIRECTORY ── owned by this uid? (else refused) ── wider mode: fchmod 0700
    open_private: O_NOFOLLOW|O_CLOEXEC (+ O_CREAT, 0600) ── fstat: a regular file of this uid with
      no group or other bits (else closed and refused)
    check_private_file (SQLite's files, which SQLite opens itself): the same facts by lstat

A refusal is ``StatePathRefused`` naming the path and the fix; nothing is
changed, re-moded or followed. The checks by name are sound because the state
directory and ``host/`` are checked first: only this uid (or root) can create
or rename anything inside them afterwards.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from piworkflows.errors import StatePathRefused

STATE_DIR_ENV = "PI_WORKFLOWS_STATE_DIR"
CONFIG_DIR_ENV = "PI_WORKFLOWS_CONFIG_DIR"
DIR_MODE = 0o700
FILE_MODE = 0o600


def default_state_dir() -> Path:
    return Path.home() / ".pi" / "agent" / "workflows"


def config_dir() -> Path:
    """The private config directory (0700, outside the state dir): ``PI_WORKFLOWS_CONFIG_DIR``,
    else ``~/.pi/agent/workflows-config``. Secrets live here, never in the database."""
    chosen = os.environ.get(CONFIG_DIR_ENV)
    return Path(chosen).expanduser().absolute() if chosen else Path.home() / ".pi" / "agent" / "workflows-config"


def credentials_file() -> Path:
    """``credentials.json`` (mode 0600): ``{"secrets": {"NAME": "value"}}``."""
    return config_dir() / "credentials.json"


@dataclass(frozen=True)
class StatePaths:
    state_dir: Path

    @classmethod
    def resolve(cls, state_dir: str | os.PathLike[str] | None = None) -> StatePaths:
        chosen = state_dir if state_dir is not None else os.environ.get(STATE_DIR_ENV) or default_state_dir()
        return cls(Path(os.path.realpath(Path(chosen).expanduser())))

    @property
    def database(self) -> Path:
        return self.state_dir / "state.sqlite"

    @property
    def wal(self) -> Path:
        return self.state_dir / "state.sqlite-wal"

    @property
    def shm(self) -> Path:
        return self.state_dir / "state.sqlite-shm"

    @property
    def host_dir(self) -> Path:
        return self.state_dir / "host"

    @property
    def lock(self) -> Path:
        return self.host_dir / "host.lock"

    @property
    def registry(self) -> Path:
        return self.host_dir / "host.json"

    @property
    def socket(self) -> Path:
        return self.host_dir / "host.sock"

    @property
    def log(self) -> Path:
        return self.host_dir / "server.log"

    @property
    def pi_tmp(self) -> Path:
        """TMPDIR of agent hosts and their Pi (0700): Pi's extension cache (jiti) goes there, never
        into a /tmp/jiti that other users share."""
        return self.host_dir / "pi-tmp"


# sockaddr_un.sun_path holds 108 bytes on Linux, one of them the terminating NUL.
SOCKET_PATH_LIMIT = 107


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` and each missing parent (0700); refuse an existing one that is a link, not a
    directory or another user's; make a wider directory of ours 0700 through its own descriptor."""
    missing = []
    parent = path
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile; checked below like any existing one
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _refused(path, exc) from None
    try:
        info = os.fstat(fd)
        _check_owner(path, info)
        if stat.S_IMODE(info.st_mode) != DIR_MODE:
            os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)


def free_bytes(path: Path) -> int:
    """What an unprivileged write could still use on the filesystem holding ``path``."""
    try:
        found = os.statvfs(path)
    except OSError:
        return 0
    return found.f_bavail * found.f_frsize


def fsync(path: Path) -> None:
    """Flush a file, or a directory's entries (a rename or a new file in it), to the disk."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_private(path: Path, flags: int, create: bool = False) -> int:
    """Open a file of the state dir without following a link: a regular file of this uid, 0600."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EIO, errno.ENOENT, errno.EDQUOT):
            raise  # a fault of the disk, or nothing there: not the path's fault
        raise _refused(path, exc) from None
    try:
        _check_file(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes, before_write: Callable[[], None] = lambda: None) -> None:
    """Replace ``path`` whole with ``data`` (0600, never through a link): a new file written and
    synced, renamed over the old, its directory synced. Raises OSError (or StatePathRefused) and
    leaves the old file as it was."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # one a crash left behind (unlinking a link removes the link only)
    fd = open_private(tmp, os.O_WRONLY | os.O_EXCL, create=True)
    try:
        with os.fdopen(fd, "wb") as f:
            before_write()
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync(path.parent)


def check_private_file(path: Path) -> None:
    """A file SQLite opens itself (the database, -wal, -shm): if it exists, a regular file of this
    uid, not a link, 0600, readable and writable. Refused otherwise, untouched."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise StatePathRefused(
            f"{path} is a symbolic link; the server does not follow links in its state "
            "directory: replace it with the file itself"
        )
    _check_file(path, info)
    if not os.access(path, os.R_OK | os.W_OK):
        raise StatePathRefused(f"{path} cannot be read and written by this user: check its permissions")


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _check_file(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise StatePathRefused(f"{path} is {kind}, not a file the server can use: move it aside")
    _check_owner(path, info)
    if info.st_mode & 0o077:
        raise StatePathRefused(
            f"{path} is readable or writable by others (mode {stat.S_IMODE(info.st_mode):o}): chmod 600 {path}"
        )


def _check_owner(path: Path, info: os.stat_result) -> None:
    if info.st_uid != os.getuid():
        raise StatePathRefused(
            f"{path} belongs to uid {info.st_uid}, not to uid {os.getuid()} that runs the server; use a state "
            "directory of your own (--state-dir or PI_WORKFLOWS_STATE_DIR)"
        )


def _refused(path: Path, exc: OSError) -> StatePathRefused:
    if exc.errno == errno.ELOOP or os.path.islink(path):
        return StatePathRefused(
            f"{path} is a symbolic link; the server does not follow links in its state "
            "directory: replace it with the directory or file itself"
        )
    if exc.errno == errno.ENOTDIR:
        return StatePathRefused(f"{path} is not a directory: move it aside or choose another state directory")
    return StatePathRefused(f"{path} cannot be used: {exc.strerror}")

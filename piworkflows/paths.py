"""The state directory and every file in it, resolved in one place.

Order: an explicit ``--state-dir``, then ``PI_WORKFLOWS_STATE_DIR``, then
``~/.pi/agent/workflows``. Directories are created 0700; files the server
creates are 0600.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

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
        return cls(Path(chosen).expanduser().absolute())

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


# sockaddr_un.sun_path holds 108 bytes on Linux, one of them the terminating NUL.
SOCKET_PATH_LIMIT = 107


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) and make the directory itself 0700."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)

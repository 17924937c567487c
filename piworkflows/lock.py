"""The global server lock: an exclusive flock on ``host/host.lock``.

Whoever holds it is the one live server for the state dir, however the dir
was named (a symlink or another working directory reach the same inode). The
kernel drops the lock when its holder dies, so a crashed server never blocks
the next one. The supervisor holds it while it serves; ``state reset`` holds it
while it moves a stopped server's files aside.
"""

from __future__ import annotations

import fcntl
import os

from piworkflows.paths import StatePaths, ensure_private_dir, open_private


class AlreadyRunning(Exception):
    """Another live server holds the lock for this state dir."""


class HostLock:
    def __init__(self, paths: StatePaths) -> None:
        self.paths = paths
        self._fd: int | None = None

    def acquire(self) -> None:
        ensure_private_dir(self.paths.state_dir)
        ensure_private_dir(self.paths.host_dir)
        fd = open_private(self.paths.lock, os.O_RDWR, create=True)  # never through a planted link
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(
                f"a Pi Workflows server is already running for {self.paths.state_dir}; "
                "use 'pi-workflows server status' or 'pi-workflows server stop'"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

"""``python -m piworkflows.supervisor``: run the server (the CLI's ``server run``/``start``).

With ``--ready-fd N`` the process writes one line to fd N once it serves
(``ready``), when another server holds the state dir's lock (``running:
<message>``: the starter connects to that one), or when it failed to start
(``error: <message>``), then closes it: the ``server start`` handshake.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import shlex
import sys

from piworkflows.errors import StateCorrupt, StateIncompatible, StatePathRefused
from piworkflows.lock import AlreadyRunning
from piworkflows.paths import StatePaths, ensure_private_dir, free_bytes
from piworkflows.settings import Settings
from piworkflows.supervisor import logs
from piworkflows.supervisor.main import StartupFailed, Supervisor
from piworkflows.supervisor.server import SocketPathTooLong
from piworkflows.writer.health import disk_full_message
from piworkflows.writer.process import WriterStartError

EXIT_OK = 0
EXIT_FAILED = 1
REFUSALS = (
    AlreadyRunning,
    StateIncompatible,
    StateCorrupt,
    StatePathRefused,
    SocketPathTooLong,
    StartupFailed,
    WriterStartError,
    OSError,
)


def serve(state_dir: str | None, foreground: bool, ready_fd: int | None = None) -> int:
    paths = StatePaths.resolve(state_dir)
    settings = Settings.from_env()

    def tell(line: str) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            os.write(ready_fd, (line + "\n").encode())
            os.close(ready_fd)
            ready_fd = None

    def refuse(exc: BaseException) -> int:
        message = _describe(exc, paths)
        tell(("running: " if isinstance(exc, AlreadyRunning) else "error: ") + message)
        print(f"pi-workflows: {message}", file=sys.stderr)
        if isinstance(exc, StateIncompatible):
            command = shlex.join(
                ["pi-workflows", "--state-dir", str(paths.state_dir), "state", "reset", "--backup", "/abs/new-dir/"]
            )
            print("  " + StateIncompatible.RESET_HINT.format(command=command), file=sys.stderr)
        return EXIT_FAILED

    try:  # nothing is written into a state dir the server must not use, not even its log
        ensure_private_dir(paths.state_dir)
        ensure_private_dir(paths.host_dir)
        logs.configure(paths, settings, to_stderr=foreground)
    except (StatePathRefused, OSError) as exc:
        return refuse(exc)
    try:
        asyncio.run(Supervisor(paths, settings).run(ready=lambda: tell("ready"), subreaper=True))
    except REFUSALS as exc:
        logging.getLogger("piworkflows.supervisor").error("the server did not start: %s", _describe(exc, paths))
        return refuse(exc)
    return EXIT_OK


def _describe(exc: BaseException, paths: StatePaths) -> str:
    """One sentence for the CLI and the log; a disk error says which disk and how full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return disk_full_message(paths.state_dir, free_bytes(paths.state_dir))
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m piworkflows.supervisor")
    parser.add_argument("--state-dir")
    parser.add_argument("--foreground", action="store_true")
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    return serve(args.state_dir, args.foreground, args.ready_fd)


if __name__ == "__main__":
    sys.exit(main())

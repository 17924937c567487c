"""``python -m piworkflows.supervisor``: run the server (the CLI's ``server run``/``start``).

With ``--ready-fd N`` the process writes one line to fd N once it serves
(``ready``) or failed to start (``error: <message>``), then closes it: the
``server start`` handshake.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from piworkflows.errors import StateIncompatible
from piworkflows.paths import StatePaths, ensure_private_dir
from piworkflows.settings import Settings
from piworkflows.supervisor import logs
from piworkflows.supervisor.lock import AlreadyRunning
from piworkflows.supervisor.main import StartupFailed, Supervisor
from piworkflows.supervisor.server import SocketPathTooLong
from piworkflows.writer.process import WriterStartError

EXIT_OK = 0
EXIT_FAILED = 1


def serve(state_dir: str | None, foreground: bool, ready_fd: int | None = None) -> int:
    paths = StatePaths.resolve(state_dir)
    settings = Settings.from_env()

    def tell(line: str) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            os.write(ready_fd, (line + "\n").encode())
            os.close(ready_fd)
            ready_fd = None

    try:
        ensure_private_dir(paths.state_dir)
        ensure_private_dir(paths.host_dir)
        logs.configure(paths, settings, to_stderr=foreground)
        asyncio.run(Supervisor(paths, settings).run(ready=lambda: tell("ready")))
    except (AlreadyRunning, StateIncompatible, SocketPathTooLong, StartupFailed, WriterStartError, OSError) as exc:
        message = str(exc)
        tell("error: " + message)
        print(f"pi-workflows: {message}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m piworkflows.supervisor")
    parser.add_argument("--state-dir")
    parser.add_argument("--foreground", action="store_true")
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    return serve(args.state_dir, args.foreground, args.ready_fd)


if __name__ == "__main__":
    sys.exit(main())

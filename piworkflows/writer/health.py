"""What a failure says about the disk and the file beneath the state database, and how the writer
answers while it lasts.

::

    a failed group, a failed open ── condition_of(exc): diskFull | ioError | databaseCorrupt | None
      ── health(code, ...): the WriterHealth told to the supervisor when it changes
      ── refusal(code, ...): the reply to each command it could not commit
    the writer cannot open the file ── fatal(exc, paths): its FATAL frame

diskFull and ioError fail each write group until one commits again (nothing of a failed group is
acknowledged: ``unavailable``, retried with the same key); databaseCorrupt refuses every write for
the life of the writer (``rejected``: an operator restores or moves the file aside).
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from piworkflows.errors import CommandError, StateCorrupt, StateIncompatible, StatePathRefused
from piworkflows.paths import StatePaths, free_bytes
from piworkflows.protocol.internal.writer import Fatal, Reply, WriterHealth

_SQLITE_CONDITIONS = {
    sqlite3.SQLITE_FULL: "diskFull",
    sqlite3.SQLITE_IOERR: "ioError",
    sqlite3.SQLITE_CORRUPT: "databaseCorrupt",
    sqlite3.SQLITE_NOTADB: "databaseCorrupt",
}
_OS_CONDITIONS = {errno.ENOSPC: "diskFull", errno.EDQUOT: "diskFull", errno.EIO: "ioError"}


def condition_of(exc: BaseException) -> str | None:
    """``diskFull``, ``ioError``, ``databaseCorrupt``, or None for any other failure."""
    if isinstance(exc, sqlite3.Error):
        return _SQLITE_CONDITIONS.get((getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF)
    if isinstance(exc, OSError):
        return _OS_CONDITIONS.get(exc.errno or 0)
    return None


def disk_full_message(state_dir: Path, free: int) -> str:
    return f"the disk holding {state_dir} is full ({free} bytes free)"


def health(code: str | None, paths: StatePaths, finding: str | None = None) -> WriterHealth:
    """What the writer can do after a failure of this condition (None: it commits)."""
    if code == "databaseCorrupt":
        message = str(StateCorrupt(str(paths.database), finding or "SQLITE_CORRUPT at run time"))
        return WriterHealth(code=code, message=message)
    if code == "diskFull":
        free = free_bytes(paths.state_dir)
        return WriterHealth(
            code=code, free_bytes=free, message=disk_full_message(paths.state_dir, free) + "; nothing was committed"
        )
    if code == "ioError":
        return WriterHealth(code=code, message=f"an I/O error on {paths.database}; nothing was committed")
    return WriterHealth(code=None)


def refusal(code: str | None, free: int | None = None) -> Reply:
    """The reply to a command the writer could not commit, by what failed."""
    if code == "databaseCorrupt":
        refused = CommandError(
            "databaseCorrupt",
            "the state database is damaged; every write is refused until an "
            "operator restores it ('pi-workflows server status')",
        )
    elif code == "diskFull":
        refused = CommandError(
            "diskFull",
            "the disk holding the state is full; retry with the same idempotency key once there is space",
            freeBytes=free,
        )
    elif code == "ioError":
        refused = CommandError("ioError", "an I/O error on the state database; retry with the same idempotency key")
    else:
        return unavailable()
    return Reply(outcome=refused.outcome, receipt=refused.receipt(), error=refused.message)


def unavailable(message: str = "the writer could not commit; retry with the same idempotency key") -> Reply:
    """Nothing of it was committed (or it cannot be known): the client retries with the same key."""
    return Reply(outcome="unavailable", receipt={"code": "unavailable"}, error=message)


def fatal(exc: BaseException, paths: StatePaths) -> Fatal:
    """Why the writer cannot open the state database, for the supervisor (and the user)."""
    if isinstance(exc, StateIncompatible):
        return Fatal(code="stateIncompatible", message=exc.MESSAGE)
    if isinstance(exc, StateCorrupt):
        return Fatal(code="databaseCorrupt", message=str(exc))
    if isinstance(exc, StatePathRefused):
        return Fatal(code="statePathRefused", message=str(exc))
    condition = condition_of(exc)
    if condition == "diskFull":
        free = free_bytes(paths.state_dir)
        return Fatal(code=condition, free_bytes=free, message=disk_full_message(paths.state_dir, free))
    if condition == "databaseCorrupt":
        return Fatal(code=condition, message=str(StateCorrupt(str(paths.database), str(exc))))
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return Fatal(code=condition or "cannotOpen", message=f"{paths.database} cannot be opened: {reason}")

"""The last lines a child wrote to stderr: a small ring, nothing else of stderr is kept.

::

    runner / resolver child ── stderr (a pipe) ──> one reader task: the last ``lines`` lines,
                                                    each cut to ``chars``, unprintables as "?"
    the child died ── drained (its end of the pipe closed; a bounded wait) ── take()
                   ── server.log (one line per stderr line) and a park detail (the last line)

Runner and resolver children execute workflow code, whose prints and
tracebacks go to stderr. What is kept is that code's own text, which may quote
the data it handles: the ring is small, and only what a child that died (or a
resolver that failed) left is written anywhere.
"""

from __future__ import annotations

import asyncio
import codecs
import signal
from collections import deque

CHUNK_BYTES = 1 << 16


class StderrTail:
    def __init__(self, stream: asyncio.StreamReader, lines: int, chars: int) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._chars = chars
        self._task = asyncio.create_task(self._read(stream), name="child-stderr")

    async def _read(self, stream: asyncio.StreamReader) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        partial = ""
        while chunk := await stream.read(CHUNK_BYTES):
            *complete, rest = (partial + decoder.decode(chunk)).split("\n")
            for line in complete:
                self._keep(line)
            partial = rest[: self._chars]  # a line longer than the bound keeps its start
        self._keep(partial + decoder.decode(b"", final=True))

    def _keep(self, line: str) -> None:
        line = "".join(c if c.isprintable() else "?" for c in line[: self._chars].rstrip())
        if line:
            self._lines.append(line)

    def take(self) -> list[str]:
        """The lines kept so far, oldest first; the ring starts empty again (the next run's own)."""
        lines = list(self._lines)
        self._lines.clear()
        return lines

    async def drained(self, timeout: float) -> None:
        """Until the child's stderr ended, at most ``timeout`` seconds (a process it left may hold the pipe)."""
        await asyncio.wait({self._task}, timeout=timeout)

    def close(self) -> None:
        self._task.cancel()


def exit_text(role: str, returncode: int) -> str:
    """How a child ended, in words: "the runner exited with code 3", "... was killed by SIGKILL"."""
    if returncode >= 0:
        return f"the {role} exited with code {returncode}"
    try:
        return f"the {role} was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"the {role} was killed by signal {-returncode}"


def park_detail(lines: list[str], returncode: int | None) -> str | None:
    """Why a runner ended without progress: its last stderr line (a traceback's last line is the
    exception class and message), else how its process ended; None for a live one that said nothing."""
    if lines:
        return lines[-1]
    return exit_text("runner", returncode) if returncode is not None else None

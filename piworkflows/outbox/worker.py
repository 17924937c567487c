"""An outbox worker child: performs the external effects its supervisor claimed for it.

::

    supervisor ── perform {effectId, performer, idempotencyKey, recoveryPolicy, payload} ──> worker
    worker ── spawned {pid} ──> supervisor (the command group into host.json) ── reply {accepted}
    worker ── settle {settlement, result?, error?, errorCode?} ──> supervisor ── effect.settle (writer)

The claim, its numbered attempt and the settlement are the supervisor's: the
worker holds no token and never opens SQLite. One effect at a time. A reader
thread watches stdin: when the supervisor is gone (end of file), the command
group the worker started is killed and the worker exits at once, so nothing
acts without an owner.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
from typing import Any, BinaryIO

from piworkflows import faults
from piworkflows.performers import Outcome, Performer
from piworkflows.performers.http import PERFORMER as HTTP
from piworkflows.performers.http import HttpPerformer
from piworkflows.performers.shell import PERFORMER as SHELL
from piworkflows.performers.shell import ShellPerformer
from piworkflows.protocol import frames

PERFORM, SPAWNED, SETTLE = "perform", "spawned", "settle"
PERFORMERS: dict[str, Performer] = {SHELL: ShellPerformer(), HTTP: HttpPerformer()}


class Worker:
    def __init__(self, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self.stdout = stdout
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.group: int | None = None  # the command group this worker started and has not seen end
        self.ids = 0
        threading.Thread(target=self._read, args=(stdin,), daemon=True).start()

    def _read(self, stdin: BinaryIO) -> None:
        decoder = frames.FrameDecoder()
        try:
            while data := stdin.read1(1 << 16):  # type: ignore[attr-defined]
                for frame in decoder.feed(data):
                    self.inbox.put(frame)
        finally:  # the supervisor is gone (or spoke nonsense): nothing may go on acting without an owner
            group = self.group
            if group is not None:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            os._exit(0)

    def send(self, kind: str, body: dict[str, Any]) -> int:
        self.ids += 1
        self.stdout.write(frames.encode(kind, self.ids, body))
        self.stdout.flush()
        return self.ids

    def spawned(self, pid: int) -> bool:
        """The supervisor records the group leader before the command runs anything."""
        self.group = pid
        self.send(SPAWNED, {"pid": pid})
        frame = self.inbox.get()
        return bool(frame and frame["b"].get("accepted"))

    def serve(self) -> None:
        while (frame := self.inbox.get()) is not None:
            if frame["k"] != PERFORM:
                continue
            task = frame["b"]
            faults.hit(faults.OUTBOX_AFTER_ATTEMPT_RECORDED)
            performer = PERFORMERS.get(task["performer"])
            if performer is None:
                outcome = Outcome("rejected", error=f"no performer {task['performer']!r}", error_code="noPerformer")
            else:
                try:
                    outcome = performer.perform(task["payload"], task["idempotencyKey"], task["recoveryPolicy"],
                                                self.spawned)  # fmt: skip
                except Exception as exc:  # a performer bug: the attempt may have acted
                    outcome = Outcome("ambiguous", error=f"the performer failed: {type(exc).__name__}",
                                      error_code="performerFailed")  # fmt: skip
            self.group = None
            self.send(SETTLE, {"effectId": task["effectId"], "settlement": outcome.settlement,
                               "result": outcome.result, "error": outcome.error, "errorCode": outcome.error_code,
                               "externalRef": outcome.external_ref})  # fmt: skip


def main() -> int:
    worker = Worker(sys.stdin.buffer, sys.stdout.buffer)
    sys.stdout = sys.stderr  # nothing printed may corrupt the channel
    worker.serve()
    return 0

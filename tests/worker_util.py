"""The supervisor's side of an outbox worker child's frames, spoken by a test (a real
``python -m piworkflows.outbox`` on the child's stdin and stdout)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any

from piworkflows.protocol import frames
from piworkflows.protocol.internal.outbox import WorkerReady
from piworkflows.protocol.internal.writer import Reply


class Supervisor:
    """This test, speaking the supervisor's side of the worker's frames."""

    def __init__(self) -> None:
        env = {**os.environ, "PI_WORKFLOWS_WRITER_RESTART_MIN_MS": "10"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "piworkflows.outbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.decoder = frames.FrameDecoder()
        self.waiting: list[dict[str, Any]] = []
        assert self.receive()["k"] == WorkerReady.kind  # said once, before its first effect

    def send(self, kind: str, corr_id: int, body: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(frames.encode(kind, corr_id, body))
        self.proc.stdin.flush()

    def receive(self, timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while not self.waiting:
            left = deadline - time.monotonic()
            assert left > 0, "no frame from the worker in time"
            if select.select([self.proc.stdout], [], [], left)[0]:
                data = os.read(self.proc.stdout.fileno(), 1 << 20)
                assert data, "the worker exited"
                self.waiting.extend(self.decoder.feed(data))
        return self.waiting.pop(0)

    def reply(self, frame: dict[str, Any], reply: Reply) -> None:
        self.send(reply.kind, frame["id"], reply.model_dump())

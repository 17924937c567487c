"""An outbox worker child: performs the external effects its supervisor claimed for it.

::

    supervisor ── perform PerformEffect ──> worker
    worker ── spawned CommandSpawned ──> supervisor (the command group into host.json) ── reply
    worker ── blob.put_part BlobPutPartFrame ──> supervisor ── blob.put / blob.put_part (writer)
             ── reply (each of a command's streams, stored before the settlement names it)
    worker ── effect.settle EffectSettleFrame ──> supervisor ── effect.settle (writer: the
             streams linked to the run in the same transaction)

The frames are the models of ``protocol/internal/outbox.py``; what the
supervisor sends is handled through one table, ``HANDLERS``.

The claim, its numbered attempt and the settlement are the supervisor's: the
worker holds no token and never opens SQLite. One effect at a time. A reader
thread watches stdin: when the supervisor is gone (end of file), the command
group the worker started is killed and the worker exits at once, so nothing
acts without an owner. Its own log records go to the supervisor as LOG frames
(protocol/child_log.py), and from there to server.log.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from piworkflows import faults
from piworkflows.performers import Outcome, Performer, Stream
from piworkflows.performers.http import PERFORMER as HTTP
from piworkflows.performers.http import HttpPerformer
from piworkflows.performers.shell import PERFORMER as SHELL
from piworkflows.performers.shell import ShellPerformer
from piworkflows.protocol import frames
from piworkflows.protocol.child_log import relay_logs
from piworkflows.protocol.internal.base import BlobValue, Frame
from piworkflows.protocol.internal.content import BlobPart, BlobPutPartFrame
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.outbox import CommandSpawned, PerformEffect, WorkerReady
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.states import MEDIA_TEXT

log = logging.getLogger("piworkflows.outbox")

STORED = ("accepted", "adopted")


class Worker:
    def __init__(self, stdin: BinaryIO, stdout: BinaryIO, settings: Settings) -> None:
        self.stdout = stdout
        self.settings = settings
        self.performers: dict[str, Performer] = {
            SHELL: ShellPerformer(settings.shell_stream_max_bytes),
            HTTP: HttpPerformer(),
        }
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

    def send(self, frame: Frame) -> int:
        self.ids += 1
        self.stdout.write(frames.encode(frame.kind, self.ids, frame.model_dump()))
        self.stdout.flush()
        return self.ids

    def spawned(self, pid: int) -> bool:
        """The supervisor records the group leader before the command runs anything."""
        self.group = pid
        self.send(CommandSpawned(pid=pid))
        frame = self.inbox.get()
        return frame is not None and Reply.model_validate(frame["b"]).outcome == "accepted"

    def store_streams(self, streams: dict[str, Stream]) -> tuple[dict[str, Any], list[str]]:
        """Each non-empty stream as one text blob (decoded as UTF-8, an invalid byte replaced: UTF-8
        output is stored exactly): the references the result names, and the digests stored."""
        refs: dict[str, Any] = {}
        stored: list[str] = []
        for name, stream in streams.items():
            text = _as_utf8(stream.kept)
            digest = self._store(text) if text else None
            if digest is not None:
                stored.append(digest)
            refs[name] = {
                "digest": None if digest is None else "sha256:" + digest,
                "mediaType": MEDIA_TEXT,
                "byteLength": len(text),
                "keptBytes": len(stream.kept),
                "seenBytes": stream.seen_bytes,
            }
        return refs, stored

    def _store(self, data: bytes) -> str | None:
        """Upload one value in parts through the supervisor; its digest (hex) once stored, None if
        refused. Unavailable (the writer's uploads are full, or it restarted and forgot the parts)
        or incomplete after the last part: every part is sent again after a growing delay."""
        delay_ms = self.settings.writer_restart_min_ms
        while True:
            for part in BlobPart.parts_of(data, MEDIA_TEXT):
                self.send(BlobPutPartFrame(part=part))
                frame = self.inbox.get()
                reply = Reply.model_validate(frame["b"]) if frame is not None else None
                if reply is None or reply.outcome not in STORED:
                    break
                if (reply.receipt or {}).get("complete"):
                    return part.digest.hex()
            if reply is not None and reply.outcome not in (*STORED, "unavailable"):
                return None  # refused: the settlement names the stream without a digest
            time.sleep(delay_ms / 1000)
            delay_ms = min(delay_ms * 2, self.settings.writer_restart_max_ms)

    def serve(self) -> None:
        while (frame := self.inbox.get()) is not None:
            handler = HANDLERS.get(frame["k"])
            if handler is not None:
                handler(self, frame["b"])

    def perform(self, body: dict[str, Any]) -> None:
        """One attempt of the effect, then its settlement (after the streams it names are stored)."""
        task = PerformEffect.model_validate(body)
        faults.hit(faults.OUTBOX_AFTER_ATTEMPT_RECORDED)
        performer = self.performers.get(task.performer)
        if performer is None:
            log.error("effect %s names no performer this worker has", task.effect_id)
            outcome = Outcome("rejected", error=f"no performer {task.performer!r}", error_code="noPerformer")
        else:
            try:
                outcome = performer.perform(task.payload, task.idempotency_key, task.recovery_policy, self.spawned)
            except Exception as exc:  # a performer bug: the attempt may have acted
                log.error(
                    "effect %s: the %s performer failed (%s); the attempt is ambiguous",
                    task.effect_id,
                    task.performer,
                    type(exc).__name__,
                )
                outcome = Outcome(
                    "ambiguous", error=f"the performer failed: {type(exc).__name__}", error_code="performerFailed"
                )
        self.group = None
        result, stored = outcome.result, list[str]()
        if outcome.streams:  # the command ran: its streams are stored before the result names them
            refs, stored = self.store_streams(outcome.streams)
            result = {**(result or {}), "streams": refs}
        self.send(
            EffectSettleFrame(
                effect_id=task.effect_id,
                settlement=outcome.settlement,
                result=BlobValue.of_json(result) if result is not None else None,
                error=BlobValue.of_text(outcome.error) if outcome.error is not None else None,
                error_code=outcome.error_code,
                external_ref=outcome.external_ref,
                view_content=[bytes.fromhex(digest) for digest in stored],
            )
        )


# How each frame from the supervisor is handled (protocol/internal/outbox.py POOL_FRAMES, one to one).
HANDLERS: dict[str, Callable[[Worker, dict[str, Any]], None]] = {PerformEffect.kind: Worker.perform}


def _as_utf8(data: bytes) -> bytes:
    """The stream as UTF-8 text: as it is when it is UTF-8, else with each invalid byte replaced."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace").encode("utf-8")
    return data


def main() -> int:
    worker = Worker(sys.stdin.buffer, sys.stdout.buffer, Settings.from_env())
    relay_logs(sys.stdout.buffer)
    sys.stdout = sys.stderr  # nothing printed may corrupt the channel
    worker.send(WorkerReady())
    worker.serve()
    return 0

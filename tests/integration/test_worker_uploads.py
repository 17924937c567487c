"""The outbox worker child stores a command's complete streams through its supervisor, then settles.

A real ``python -m piworkflows.outbox`` with this test as its supervisor (frames on the child's
stdin and stdout): a stream larger than one frame goes in parts; an ``unavailable`` answer (the
writer's uploads are full, or it restarted and forgot the parts) makes it send every part again;
the settlement names the streams it stored, and the node's output stays bounded.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator

import pytest

from piworkflows.performers import shell
from piworkflows.protocol.internal.base import MAX_INLINE_BLOB_BYTES
from piworkflows.protocol.internal.content import BlobPutPartFrame
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.outbox import CommandSpawned, PerformEffect
from piworkflows.protocol.internal.writer import Reply
from tests.worker_util import Supervisor

pytestmark = [pytest.mark.timeout(60), pytest.mark.integration]

SCRIPT = "import sys; sys.stdout.write('0123456789abcdef' * 131072); sys.stderr.write('a warning\\n')"
STDOUT = b"0123456789abcdef" * 131072  # 2 MiB: three parts


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    peer = Supervisor()
    try:
        yield peer
    finally:
        assert peer.proc.stdin is not None
        peer.proc.stdin.close()  # end of file: the worker exits
        peer.proc.wait(timeout=30)


def test_streams_are_uploaded_in_parts_again_after_unavailable_and_named_by_the_settlement(supervisor):
    payload = shell.payload(
        {"command": sys.executable, "args": ["-c", SCRIPT]}, max_output_chars=10, allow_non_zero_exit=False
    )
    perform = PerformEffect(
        effect_id="effect-1",
        performer=shell.PERFORMER,
        idempotency_key="key-1",
        recovery_policy="idempotent",
        payload=payload,
    )
    supervisor.send(perform.kind, 0, perform.model_dump())
    spawned = supervisor.receive()
    assert spawned["k"] == CommandSpawned.kind
    supervisor.reply(spawned, Reply(outcome="accepted"))  # its group recorded

    first = supervisor.receive()
    assert first["k"] == BlobPutPartFrame.kind
    assert BlobPutPartFrame.model_validate(first["b"]).part.offset == 0
    supervisor.reply(first, Reply(outcome="unavailable", receipt={"code": "uploadsFull"}, error="full"))
    received: dict[int, bytes] = {}
    digests = set()
    while True:  # sent again from the start: every part, in order, until the value is complete
        frame = supervisor.receive()
        part = BlobPutPartFrame.model_validate(frame["b"]).part
        if part.byte_length != len(STDOUT):
            break  # the next stream
        assert part.offset == sum(map(len, received.values())) and len(part.data) <= MAX_INLINE_BLOB_BYTES
        received[part.offset] = part.data
        digests.add(part.digest)
        complete = part.offset + len(part.data) == part.byte_length
        supervisor.reply(frame, Reply(outcome="accepted", receipt={"complete": complete}))
    assert b"".join(received.values()) == STDOUT and len(received) == 3
    assert digests == {hashlib.sha256(STDOUT).digest()}  # each part names the whole value

    assert (part.offset, part.data, part.byte_length) == (0, b"a warning\n", 10)  # stderr: one part
    supervisor.reply(frame, Reply(outcome="accepted", receipt={"complete": True}))
    settle = supervisor.receive()
    assert settle["k"] == EffectSettleFrame.kind
    report = EffectSettleFrame.model_validate(settle["b"])
    assert report.settlement == "applied" and report.result is not None
    result = json.loads(report.result.data)
    assert result["output"]["stdout"] == "0123456789"
    stdout_digest, stderr_digest = hashlib.sha256(STDOUT).hexdigest(), hashlib.sha256(b"a warning\n").hexdigest()
    assert result["streams"] == {
        "stdout": {
            "digest": "sha256:" + stdout_digest,
            "mediaType": "text/plain;charset=utf-8",
            "byteLength": len(STDOUT),
            "keptBytes": len(STDOUT),
            "seenBytes": len(STDOUT),
        },
        "stderr": {
            "digest": "sha256:" + stderr_digest,
            "mediaType": "text/plain;charset=utf-8",
            "byteLength": 10,
            "keptBytes": 10,
            "seenBytes": 10,
        },
    }
    assert report.view_content == [bytes.fromhex(stdout_digest), bytes.fromhex(stderr_digest)]

"""The outbox pool in-process: its claim step, renewal pass and settlement against a fake writer on a
fake clock (supervisor/outbox.py over the seams of supervisor/seams.py). No worker child is started."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from piworkflows.clock import FakeClock
from piworkflows.protocol import frames
from piworkflows.protocol.internal.base import BlobValue, server_owner_id
from piworkflows.protocol.internal.effects import EffectSettleFrame
from piworkflows.protocol.internal.outbox import PerformEffect
from piworkflows.protocol.internal.writer import LogRecord, Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.leftovers import Leftovers
from piworkflows.supervisor.outbox import Claimed, OutboxPool
from piworkflows.supervisor.registry import Identity
from piworkflows.supervisor.seams import HubWiring

pytestmark = pytest.mark.timeout(30)

CLAIMED = {
    "effectId": "effect-1",
    "runId": "run-1",
    "leaseGeneration": 4,
    "attemptNumber": 2,
    "performer": "shell.exec",
    "idempotencyKey": "key-1",
    "recoveryPolicy": "idempotent",
    "payload": {"argv": ["true"]},
}


class FakeWriter:
    """Answers each command with the next scripted reply for its kind (default: accepted)."""

    def __init__(self, scripts: dict[str, list[Reply]] | None = None) -> None:
        self.scripts = {kind: list(replies) for kind, replies in (scripts or {}).items()}
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.during: Any = None

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        self.sent.append((kind, body))
        if self.during is not None:
            self.during()
        script = self.scripts.get(kind)
        return script.pop(0) if script else Reply(outcome="accepted", revision=1, receipt={})


class Recorder:
    def __init__(self) -> None:
        self.forgotten: list[int] = []
        self.leftovers = Leftovers("test", recorded=set)

    def record_child(self, identity: Identity) -> None:
        pass

    def forget_child(self, pid: int) -> None:
        self.forgotten.append(pid)


def pool(writer: FakeWriter, workers: int = 2) -> tuple[OutboxPool, FakeClock, Recorder, list[str]]:
    clock, recorder, woken = FakeClock(), Recorder(), []
    built = OutboxPool(
        HubWiring(
            writer,
            recorder,
            Settings(outbox_workers=workers),
            clock,
            server_epoch=lambda: 7,
            wake_scheduler=lambda: woken.append("scheduler"),
        )
    )
    return built, clock, recorder, woken


def test_a_claim_step_claims_one_due_effect_for_the_slot_and_another_idle_slot_looks():
    async def scenario() -> None:
        writer = FakeWriter({"effect.claim": [Reply(outcome="accepted", revision=9, receipt=CLAIMED)]})
        built, _, _, _ = pool(writer)
        first, second = built.slots
        second.idle = True  # waiting for a notice
        step = await built.claim(first)
        assert step.task == PerformEffect(
            effect_id="effect-1",
            performer="shell.exec",
            idempotency_key="key-1",
            recovery_policy="idempotent",
            payload={"argv": ["true"]},
        )
        ((kind, body),) = writer.sent
        assert kind == "effect.claim" and body["actor"] == {"actor_class": "outbox", "actor_id": "outbox-0"}
        assert body["owner_id"] == server_owner_id(7)  # the claim names this server epoch
        assert set(body) == {"actor", "owner_id", "claim_token_hash", "ttl_ms"}  # the token stays here
        assert first.effect is not None
        assert (first.effect.effect_id, first.effect.run_id, first.effect.revision, first.effect.attempt) == (
            "effect-1",
            "run-1",
            9,
            2,
        )
        assert first.effect.claim["lease_generation"] == 4 and first.effect.claim["server_epoch"] == 7
        assert second.wakeup.is_set()  # more may be due: one more idle slot looks

    asyncio.run(scenario())


def nothing_due(next_due_at: int | None) -> Reply:
    receipt: dict[str, Any] = {"code": "nothingDue"}
    if next_due_at is not None:
        receipt["nextDueAt"] = next_due_at
    return Reply(outcome="notFound", receipt=receipt, error="nothing is due")


def test_with_nothing_due_the_slot_waits_until_the_next_retry_time_of_the_clock_at_most_the_idle_check():
    async def scenario() -> list[float]:
        writer = FakeWriter()
        built, clock, _, _ = pool(writer)
        slot = built.slots[0]
        waits = []
        for due in (clock.now_ms() + 2000, None, clock.now_ms() + 10 * 60_000, clock.now_ms() - 50):
            writer.scripts["effect.claim"] = [nothing_due(due)]
            step = await built.claim(slot)
            assert step.task is None and slot.effect is None
            waits.append(step.wait_ms)
        return waits

    idle_check = Settings().outbox_idle_check_ms
    assert asyncio.run(scenario()) == [2000, idle_check, idle_check, 5]


def test_a_notice_that_comes_while_the_slot_asks_makes_it_ask_again_at_once():
    async def scenario() -> float:
        writer = FakeWriter({"effect.claim": [nothing_due(None)]})
        built, _, _, _ = pool(writer)
        writer.during = built.wake  # an effect became due while the claim was on its way
        return (await built.claim(built.slots[0])).wait_ms

    assert asyncio.run(scenario()) == 0


def claimed(run_id: str = "run-1") -> Claimed:
    claim = {"owner_id": "owner", "claim_token_hash": b"h" * 32, "lease_generation": 4}
    return Claimed("effect-1", run_id, claim, 9, 2)


def test_renewal_renews_each_applying_effect_and_a_lost_claim_ends_its_command_groups():
    async def scenario() -> None:
        lost = Reply(outcome="claimLost", receipt={"code": "claimTokenMismatch"}, error="lost")
        writer = FakeWriter({"claim.renew": [lost]})
        built, _, recorder, _ = pool(writer)
        slot = built.slots[0]
        slot.effect = claimed()
        slot.commands = [Identity("command", 999_999_999, 1.0, "", processGroup=True)]  # already gone
        await built.renew()
        assert writer.sent == [
            ("claim.renew", {"actor": {"actor_class": "server"}, "resource_id": "effect-1", "claim": slot.effect.claim})
        ]
        assert slot.commands == [] and recorder.forgotten == [999_999_999]

    asyncio.run(scenario())


def test_a_settlement_is_sent_again_with_the_same_report_while_the_writer_restarts():
    async def scenario() -> None:
        restarting = Reply(outcome="unavailable", receipt={"code": "writerRestarting"}, error="restarting")
        writer = FakeWriter({"effect.settle": [restarting, restarting]})
        built, clock, _, woken = pool(writer)
        slot = built.slots[0]
        slot.effect = claimed()
        settled = built.watch("effect-1")  # a runner awaits it
        result = BlobValue.of_json({"exitCode": 0}).model_dump()
        report = {"effect_id": "effect-1", "settlement": "applied", "result": result}
        await clock.drive(built._settle(slot, report))
        bodies = [body for kind, body in writer.sent if kind == "effect.settle"]
        assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2]
        assert bodies[0]["worker_message"]["message_id"] == "4:settle"  # deduplicated by the writer
        assert clock.monotonic_ms() == 100 + 200  # writer_restart_min_ms, then twice that
        assert slot.effect is None and settled.is_set() and woken == ["scheduler"]

    asyncio.run(scenario())


def test_a_retry_settlement_is_due_again_after_a_backoff_from_the_clock():
    async def scenario() -> int:
        writer = FakeWriter()
        built, clock, _, _ = pool(writer)
        slot = built.slots[0]
        slot.effect = claimed()
        await built._settle(
            slot, {"effect_id": "effect-1", "settlement": "retry", "error": BlobValue.of_text("503").model_dump()}
        )
        ((_, body),) = writer.sent
        return int(body["retry_at"] - clock.now_ms())

    step = 2 * Settings().effect_retry_base_ms  # its second attempt: twice the base, with equal jitter
    assert step // 2 <= asyncio.run(scenario()) <= step  # counted from the clock's now


def test_a_cancel_kills_only_the_workers_applying_the_runs_effects():
    built, _, _, _ = pool(FakeWriter(), workers=3)
    built.slots[0].effect = claimed("run-1")
    built.slots[1].effect = claimed("run-2")
    built.cancel_run("run-1")
    assert [slot.cancelled for slot in built.slots] == [True, False, False]


def test_the_reader_relays_a_workers_log_records_to_the_server_log_and_hands_on_the_rest(
    caplog: pytest.LogCaptureFixture,
):
    async def scenario() -> list[Any]:
        built, _, _, _ = pool(FakeWriter())
        slot = built.slots[0]
        stdout = asyncio.StreamReader()
        worker = SimpleNamespace(pid=4242, stdout=stdout)
        reading = asyncio.ensure_future(built._read(slot, worker))  # type: ignore[arg-type]
        record = LogRecord(level=logging.ERROR, message="effect effect-1 names no performer this worker has")
        stdout.feed_data(frames.encode(LogRecord.kind, 0, record.model_dump()))
        stdout.feed_data(frames.encode(LogRecord.kind, 0, {"level": "loud"}))  # not a log record: said, not relayed
        stdout.feed_data(frames.encode(EffectSettleFrame.kind, 1, {"effect_id": "effect-1"}))
        stdout.feed_eof()
        await reading
        return list(slot.frames)

    with caplog.at_level(logging.INFO, logger="piworkflows"):
        handed_on = asyncio.run(scenario())
    assert [frame and frame["k"] for frame in handed_on] == [EffectSettleFrame.kind, None]  # None: the worker's end
    relayed = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert relayed == [
        ("piworkflows.outbox", logging.ERROR, "outbox worker 4242: effect effect-1 names no performer this worker has"),
        ("piworkflows.outbox", logging.WARNING, "outbox worker 4242 sent a malformed log record"),
    ]


def test_a_notice_wakes_an_idle_slot_whose_worker_lives_before_one_that_has_none():
    async def scenario() -> None:
        built, _, _, _ = pool(FakeWriter(), workers=3)
        without, living, busy = built.slots
        living.proc = SimpleNamespace(returncode=None)  # type: ignore[assignment]
        without.idle = living.idle = True
        built.wake()
        assert living.wakeup.is_set() and not without.wakeup.is_set() and not busy.wakeup.is_set()
        built.wake()  # the living one is woken already: the next notice starts a worker
        assert without.wakeup.is_set()

    asyncio.run(scenario())


def test_a_slot_without_a_worker_looks_without_claiming_and_starts_one_only_when_an_effect_is_due():
    async def scenario() -> None:
        writer = FakeWriter(
            {
                "effect.due": [
                    Reply(outcome="accepted", receipt={"due": False, "nextDueAt": None}),
                    Reply(outcome="accepted", receipt={"due": True, "nextDueAt": None}),
                ]
            }
        )
        built, clock, _, _ = pool(writer)
        slot = built.slots[0]
        waiting = await built.look(slot)
        assert (waiting.task, waiting.due, waiting.wait_ms) == (None, False, Settings().outbox_idle_check_ms)
        due = await built.look(slot)
        assert due.due and due.task is None
        assert writer.sent == [("effect.due", {"actor": slot.actor})] * 2  # nothing claimed, nothing written
        assert slot.effect is None

    asyncio.run(scenario())


def test_a_due_effect_gets_a_new_worker_only_when_no_other_slots_worker_waits_or_starts():
    built, _, _, _ = pool(FakeWriter())
    looking, other = built.slots
    assert not built._covered(looking)  # no other worker at all
    other.proc = SimpleNamespace(returncode=None)  # type: ignore[assignment]
    assert not built._covered(looking)  # busy with an effect
    other.idle = True
    assert built._covered(looking)  # waits for a notice: it claims the effect
    other.idle, other.proc, other.starting = False, None, True
    assert built._covered(looking)  # starting: it claims once ready

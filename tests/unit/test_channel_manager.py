"""The channel manager with a fake writer, a fake adapter pipe and a fake clock
(supervisor/channel_manager.py): how a call's outcome becomes an effect settlement, and how a
batch of updates is committed, acknowledged, retried under a new lease, or dropped."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from piworkflows.clock import FakeClock
from piworkflows.protocol import frames
from piworkflows.protocol.internal.channels import Performed, TelegramUpdate, Updates
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.channel_config import Profile
from piworkflows.supervisor.channel_manager import ChannelManager, InFlight

pytestmark = pytest.mark.timeout(30)

PROFILE = Profile("ops", "telegram:ops", "http://127.0.0.1:1", "telegram-ops", "1:t", "1", ("7",), ("7",))


class FakeWriter:
    def __init__(self, *answers: Reply) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answers = list(answers)

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        self.sent.append((kind, body))
        return self.answers.pop(0) if self.answers else Reply(outcome="accepted", revision=1, receipt={})


class FakeStdin:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.decoder = frames.FrameDecoder()

    def write(self, data: bytes) -> None:
        self.frames += self.decoder.feed(data)


class FakeProc:
    pid = 999_999_999  # no such process: a kill finds nothing

    def __init__(self) -> None:
        self.stdin = FakeStdin()
        self.returncode = None


def manager(writer: FakeWriter, clock: FakeClock) -> ChannelManager:
    made = ChannelManager(PROFILE, writer, None, Settings(), clock, lambda: 1, lambda: None)  # type: ignore[arg-type]
    made.proc = FakeProc()  # type: ignore[assignment]
    made.lease = {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": b"h" * 32,
        "lease_generation": 1,
        "ttl_ms": 1,
    }
    return made


def sync(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test on its own event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def in_flight(policy: str) -> InFlight:
    return InFlight("effect-1", {"lease_generation": 3}, 2, policy, 1, asyncio.get_running_loop().create_future())


@pytest.mark.parametrize(
    ("performed", "policy", "expected"),
    [
        (
            Performed(effect_id="effect-1", outcome="applied", result={"chatId": "7", "messageId": 4}),
            "manual",
            "applied",
        ),
        (
            Performed(effect_id="effect-1", outcome="rejected", error_code="telegram400", error="Bad Request"),
            "manual",
            "rejected",
        ),
        (
            Performed(
                effect_id="effect-1", outcome="failed", error_code="floodWait", retry_after_ms=3000, not_acted=True
            ),
            "manual",
            "retry",
        ),
        (Performed(effect_id="effect-1", outcome="uncertain", error_code="noAnswer"), "manual", "ambiguous"),
        (Performed(effect_id="effect-1", outcome="uncertain", error_code="telegram502"), "idempotent", "retry"),
    ],
)
@sync
async def test_a_call_outcome_becomes_its_settlement(performed, policy, expected):
    clock, writer = FakeClock(), FakeWriter()
    channel = manager(writer, clock)
    await channel._settle(in_flight(policy), performed)
    ((kind, body),) = writer.sent
    assert kind == "effect.settle" and body["settlement"] == expected
    assert body["claim"] == {"lease_generation": 3} and body["expected_revision"] == 2
    if expected == "applied":
        assert body["external_ref"] == "7:4"
    if performed.retry_after_ms is not None:  # Telegram's flood wait, exactly
        assert body["retry_at"] == clock.now_ms() + 3000 and body["not_acted"] is True
    elif expected == "retry":
        assert body["retry_at"] > clock.now_ms() and body["not_acted"] is False


def batch() -> Updates:
    update = TelegramUpdate(
        update_id=5, update_kind="callback", user_id="7", chat_id="7", callback_query_id="q", data="x"
    )
    return Updates(offset=5, next_offset=6, items=[update])


@sync
async def test_a_committed_batch_is_acknowledged_and_wakes_the_scheduler():
    clock = FakeClock()
    writer = FakeWriter(Reply(outcome="accepted", revision=3, receipt={"cursor": 6, "runIds": ["run-1"], "counts": {}}))
    channel = manager(writer, clock)
    woken: list[bool] = []
    channel.wake_scheduler = lambda: woken.append(True)
    await channel._updates(channel.proc, batch())  # type: ignore[arg-type]
    assert [kind for kind, _ in writer.sent] == ["channel.updates"]
    assert channel.proc.stdin.frames == [{"k": "ack", "id": 0, "b": {"cursor": 6}}]  # type: ignore[union-attr]
    assert woken == [True] and channel.last_poll_at == clock.now_ms()


@sync
async def test_a_lease_that_expired_while_idle_is_taken_again_and_the_batch_sent_once_more():
    expired = Reply(outcome="claimLost", receipt={"code": "claimExpired"})
    claimed = Reply(outcome="accepted", revision=4, receipt={"leaseGeneration": 2, "cursor": 5})
    done = Reply(outcome="accepted", revision=5, receipt={"cursor": 6, "runIds": [], "counts": {}})
    writer = FakeWriter(expired, claimed, done)
    channel = manager(writer, FakeClock())
    await channel._updates(channel.proc, batch())  # type: ignore[arg-type]
    assert [kind for kind, _ in writer.sent] == ["channel.updates", "channel.claim", "channel.updates"]
    assert writer.sent[2][1]["claim"]["lease_generation"] == 2
    assert channel.proc.stdin.frames == [{"k": "ack", "id": 0, "b": {"cursor": 6}}]  # type: ignore[union-attr]


@sync
async def test_a_batch_from_a_stale_cursor_is_never_acknowledged():
    writer = FakeWriter(Reply(outcome="claimLost", receipt={"code": "staleCursor", "cursor": 9}))
    channel = manager(writer, FakeClock())
    await channel._updates(channel.proc, batch())  # type: ignore[arg-type]
    assert [kind for kind, _ in writer.sent] == ["channel.updates"]
    assert channel.proc.stdin.frames == []  # the adapter is ended: a new one polls from the durable cursor

"""The Telegram adapter child (piworkflows/channels/adapter.py) against the fake Bot API, with the
test as its manager: configure, updates confirmed only after the ack, performs and their outcomes,
the flood gate, and a refused token (in a real child process: the adapter exits there).

The in-process adapter reads its frames from a pipe and writes them to another; its reader thread
ends the process when its stdin reaches end of file, so no test ever closes that pipe (the pipes
and the adapter's daemon threads live until pytest exits; each test closes the adapter's flood
gate at its end, so nothing of it reaches a later test's fake).
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piworkflows import faults
from piworkflows.channels.adapter import Adapter, normalise
from piworkflows.protocol import frames
from piworkflows.protocol.internal.channels import Ack, Configure, Perform, TelegramUpdate
from piworkflows.testing.fake_telegram import DropAfter, FakeTelegram, ServerError, TooMany
from tests.server_util import stays, wait_until

pytestmark = pytest.mark.timeout(60)

TOKEN = "424242:adapter-test-token-5f1e"
CHANNEL = "telegram:main"
CHAT, USER = 111, 7
REPO = Path(__file__).resolve().parents[2]
_KEEP: list[Any] = []  # every pipe end of an in-process adapter, never closed (see the docstring)


class Manager:
    """The manager's side of one in-process adapter: frames in, frames out."""

    def __init__(self) -> None:
        to_adapter, self._write = os.pipe()
        self._read, from_adapter = os.pipe()
        stdin, stdout = os.fdopen(to_adapter, "rb"), os.fdopen(from_adapter, "wb")
        _KEEP.extend((stdin, stdout, self._write, self._read))
        self.frames: queue.Queue[dict[str, Any]] = queue.Queue()
        self.adapter = Adapter(stdin, stdout)
        self._ids = 0
        threading.Thread(target=self.adapter.serve, daemon=True).start()
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        decoder = frames.FrameDecoder()
        while data := os.read(self._read, 1 << 16):
            for frame in decoder.feed(data):
                self.frames.put(frame)

    def send(self, kind: str, body: dict[str, Any]) -> None:
        self._ids += 1
        os.write(self._write, frames.encode(kind, self._ids, body))

    def configure(self, base_url: str, cursor: int = 0, token: str = TOKEN) -> None:
        config = Configure(
            channel_id=CHANNEL,
            base_url=base_url,
            token=token,
            cursor=cursor,
            poll_timeout_s=1,
            request_timeout_ms=2000,
        )
        self.send(Configure.kind, config.model_dump())

    def perform(self, effect_id: str, method: str, body: dict[str, Any]) -> None:
        self.send(Perform.kind, Perform(effect_id=effect_id, attempt=1, method=method, body=body).model_dump())

    def ack(self, cursor: int) -> None:
        self.send(Ack.kind, Ack(cursor=cursor).model_dump())

    def expect(self, kind: str, timeout: float = 20.0) -> dict[str, Any]:
        """The body of the next frame of ``kind`` (others, e.g. network faults, are passed over)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = self.frames.get(timeout=left)
            except queue.Empty:
                break
            if frame["k"] == kind:
                return frame["b"]
        raise AssertionError(f"no {kind} frame within {timeout} s")

    def performed(self, effect_id: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
        self.perform(effect_id, method, body)
        outcome = self.expect("performed")
        assert outcome["effect_id"] == effect_id
        return outcome

    def quiesce(self) -> None:
        """No request of this adapter goes out any more (its gate closed for longer than the run)."""
        self.adapter.close_gate(1e6)
        self.adapter.acks.put(None)  # a poll waiting for an ack ends


@pytest.fixture(autouse=True)
def no_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.setattr(faults, "_rules", {})  # parsed at import: none fires in this process


@pytest.fixture
def fake() -> Iterator[FakeTelegram]:
    with FakeTelegram(TOKEN) as served:
        yield served


@pytest.fixture
def manager() -> Iterator[Manager]:
    peer = Manager()
    yield peer
    peer.quiesce()


def getupdates_offsets(fake: FakeTelegram) -> list[Any]:
    return [body.get("offset") for body in fake.calls("getUpdates")]


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- normalise -------------------------------------------------------------------------------------


def test_normalise_takes_presses_and_text_messages_only() -> None:
    bot_message = {"message_id": 5, "chat": {"id": -100123, "type": "group"}, "date": 1, "text": "Ship?"}
    press = {
        "update_id": 10,
        "callback_query": {"id": "cb77", "from": {"id": 7}, "message": bot_message, "data": "piw:d:ship:x"},
    }
    assert normalise(press) == TelegramUpdate(
        update_id=10,
        update_kind="callback",
        user_id="7",
        chat_id="-100123",
        callback_query_id="cb77",
        data="piw:d:ship:x",
    )
    reply = {
        "update_id": 11,
        "message": {
            "message_id": 6,
            "from": {"id": 7},
            "chat": {"id": 111},
            "text": "Split the change",
            "reply_to_message": bot_message,
        },
    }
    assert normalise(reply) == TelegramUpdate(
        update_id=11,
        update_kind="message",
        user_id="7",
        chat_id="111",
        text="Split the change",
        reply_to_text="Ship?",
    )
    plain = normalise({"update_id": 12, "message": {"from": {"id": 7}, "chat": {"id": 111}, "text": "hi"}})
    assert plain is not None and plain.reply_to_text is None and plain.callback_query_id is None
    edited = {"update_id": 13, "edited_message": {"from": {"id": 7}, "chat": {"id": 111}, "text": "hi"}}
    assert normalise(edited) is None
    photo = {"update_id": 14, "message": {"from": {"id": 7}, "chat": {"id": 111}, "photo": []}}
    assert normalise(photo) is None  # a message without text
    assert normalise({"update_id": "15", "message": reply["message"]}) is None
    not_a_user = {"update_id": 16, "message": {"from": {"id": "@someone"}, "chat": {"id": 111}, "text": "hi"}}
    assert normalise(not_a_user) is None
    no_user = {"update_id": 17, "callback_query": {"id": "cb", "message": bot_message, "data": "x"}}
    assert normalise(no_user) is None  # "None" is not a Telegram id
    not_a_chat = {"update_id": 18, "message": {"from": {"id": 7}, "chat": {"id": "general"}, "text": "hi"}}
    assert normalise(not_a_chat) is None


# --- updates and the ack ---------------------------------------------------------------------------


def test_updates_are_confirmed_at_telegram_only_after_the_ack(fake: FakeTelegram, manager: Manager) -> None:
    first = fake.reply(CHAT, USER, "hi")
    second = fake.reply(CHAT, USER + 1, "there")
    manager.configure(fake.base_url)
    batch = manager.expect("updates")
    assert (batch["offset"], batch["next_offset"]) == (0, second + 1)
    assert [
        (item["update_id"], item["update_kind"], item["user_id"], item["chat_id"], item["text"])
        for item in batch["items"]
    ] == [
        (first, "message", str(USER), str(CHAT), "hi"),
        (second, "message", str(USER + 1), str(CHAT), "there"),
    ]
    polls = len(fake.calls("getUpdates"))
    # Until the ack no poll goes out, so nothing is confirmed at Telegram.
    stays(
        lambda: len(fake.calls("getUpdates")) == polls and second + 1 not in fake.confirmed,
        seconds=0.3,
        what="no poll before the ack",
    )
    assert fake.updates  # still pending at Telegram
    manager.ack(second + 1)
    wait_until(lambda: second + 1 in getupdates_offsets(fake), timeout=10, what="a poll from the acked cursor")
    assert second + 1 in fake.confirmed and not fake.updates
    assert getupdates_offsets(fake)[:polls] == [0] * polls  # every poll before the ack from the old cursor


def test_a_press_reaches_the_manager_and_is_answered(fake: FakeTelegram, manager: Manager) -> None:
    manager.configure(fake.base_url, cursor=1)
    keyboard = {"inline_keyboard": [[{"text": "Ship it", "callback_data": "piw:d:ship:x"}]]}
    sent = manager.performed("e1", "sendMessage", {"chat_id": str(CHAT), "text": "Ship?", "reply_markup": keyboard})
    pressed = fake.press(CHAT, USER, sent["result"]["messageId"], "piw:d:ship:x")
    batch = manager.expect("updates")
    assert (batch["offset"], batch["next_offset"]) == (1, pressed + 1)
    (item,) = batch["items"]
    assert TelegramUpdate.model_validate(item) == TelegramUpdate(
        update_id=pressed,
        update_kind="callback",
        user_id=str(USER),
        chat_id=str(CHAT),
        callback_query_id=f"cb{pressed}",
        data="piw:d:ship:x",
    )
    manager.ack(pressed + 1)
    answered = manager.performed("e2", "answerCallbackQuery", {"callback_query_id": item["callback_query_id"]})
    assert (answered["outcome"], answered["result"]) == ("applied", {"ok": True})
    assert fake.answered == {f"cb{pressed}": None}
    wait_until(lambda: pressed + 1 in fake.confirmed, timeout=10, what="the press confirmed")


# --- performs --------------------------------------------------------------------------------------


def test_send_message_is_applied_with_its_reference(fake: FakeTelegram, manager: Manager) -> None:
    manager.configure(fake.base_url)
    outcome = manager.performed("e1", "sendMessage", {"chat_id": str(CHAT), "text": "Ship?"})
    assert outcome["outcome"] == "applied" and outcome["not_acted"] is False
    assert outcome["result"] == {"chatId": str(CHAT), "messageId": 1}
    assert [(m.message_id, m.text) for m in fake.chat(CHAT)] == [(1, "Ship?")]
    again = manager.performed("e2", "sendMessage", {"chat_id": str(CHAT), "text": "Again?"})
    assert again["result"] == {"chatId": str(CHAT), "messageId": 2}


def test_an_unchanged_edit_is_applied_and_a_missing_message_rejected(fake: FakeTelegram, manager: Manager) -> None:
    manager.configure(fake.base_url)
    manager.performed("e1", "sendMessage", {"chat_id": str(CHAT), "text": "Ship?"})
    edit = {"chat_id": str(CHAT), "message_id": 1, "text": "Ship? Decided: Ship it"}
    edited = manager.performed("e2", "editMessageText", edit)
    assert (edited["outcome"], edited["result"]) == ("applied", {"chatId": str(CHAT), "messageId": 1})
    same = manager.performed("e3", "editMessageText", edit)
    assert (same["outcome"], same["result"]) == ("applied", {"notModified": True})
    missing = manager.performed("e4", "editMessageText", edit | {"message_id": 99})
    assert (missing["outcome"], missing["error_code"], missing["not_acted"]) == ("rejected", "telegram400", False)
    assert "not found" in missing["error"]
    assert [(m.text, m.edits) for m in fake.chat(CHAT)] == [("Ship? Decided: Ship it", 1)]


def test_a_429_fails_not_acted_and_closes_the_gate(fake: FakeTelegram, manager: Manager) -> None:
    manager.configure(fake.base_url)
    fake.script("sendMessage", TooMany(1))
    flooded = manager.performed("e1", "sendMessage", {"chat_id": str(CHAT), "text": "Ship?"})
    answered_at = time.monotonic()
    assert flooded["outcome"] == "failed" and flooded["error_code"] == "floodWait"
    assert (flooded["not_acted"], flooded["retry_after_ms"]) == (True, 1000)
    assert fake.chat(CHAT) == []
    manager.perform("e2", "sendMessage", {"chat_id": str(CHAT), "text": "Ship?"})
    # The second call waits for the gate: not at the fake before ~1 s after the 429's answer.
    stays(
        lambda: len(fake.calls("sendMessage")) == 1,
        seconds=0.9 - (time.monotonic() - answered_at),
        what="the gate closed",
    )
    wait_until(lambda: len(fake.calls("sendMessage")) == 2, timeout=10, what="the call after the gate")
    assert time.monotonic() - answered_at >= 0.9
    second = manager.expect("performed")
    assert (second["effect_id"], second["outcome"]) == ("e2", "applied")
    assert [m.text for m in fake.chat(CHAT)] == ["Ship?"]


def test_a_5xx_or_a_dropped_answer_is_uncertain(fake: FakeTelegram, manager: Manager) -> None:
    manager.configure(fake.base_url)
    fake.script("sendMessage", ServerError(502), DropAfter())
    bad_gateway = manager.performed("e1", "sendMessage", {"chat_id": str(CHAT), "text": "one"})
    assert (bad_gateway["outcome"], bad_gateway["error_code"], bad_gateway["not_acted"]) == (
        "uncertain",
        "telegram502",
        False,
    )
    assert fake.chat(CHAT) == []
    dropped = manager.performed("e2", "sendMessage", {"chat_id": str(CHAT), "text": "two"})
    assert (dropped["outcome"], dropped["error_code"], dropped["not_acted"]) == ("uncertain", "noAnswer", False)
    assert [m.text for m in fake.chat(CHAT)] == ["two"]  # it did act: why the outcome is uncertain


def test_a_connection_that_never_opened_failed_not_acted(manager: Manager) -> None:
    manager.configure(f"http://127.0.0.1:{closed_port()}")
    outcome = manager.performed("e1", "sendMessage", {"chat_id": str(CHAT), "text": "Ship?"})
    assert (outcome["outcome"], outcome["error_code"], outcome["not_acted"]) == ("failed", "notSent", True)
    assert manager.expect("fault")["fault"] == "network"  # the poll meets the same closed port


# --- a refused token (a real child: the adapter exits) --------------------------------------------


def test_a_refused_token_is_a_fault_then_exit_3(fake: FakeTelegram) -> None:
    wrong = "999:wrong-token-never-printed-8c2d"
    env = {name: value for name, value in os.environ.items() if name != faults.ENV}
    child = subprocess.Popen(
        [sys.executable, "-m", "piworkflows.channels"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    out, err = bytearray(), bytearray()

    def drain(stream: Any, into: bytearray) -> None:
        while data := stream.read1(1 << 16):
            into.extend(data)

    readers = [
        threading.Thread(target=drain, args=(child.stdout, out), daemon=True),
        threading.Thread(target=drain, args=(child.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        config = Configure(
            channel_id=CHANNEL, base_url=fake.base_url, token=wrong, cursor=0, poll_timeout_s=1, request_timeout_ms=2000
        )
        # stdin stays open: its end of file would end the child (code 0) before the poll's answer
        child.stdin.write(frames.encode(Configure.kind, 0, config.model_dump()))
        child.stdin.flush()
        assert child.wait(timeout=30) == 3
        for reader in readers:
            reader.join(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdin.close()
    sent = frames.FrameDecoder().feed(bytes(out))
    faults_sent = [frame["b"] for frame in sent if frame["k"] == "fault"]
    assert [fault["fault"] for fault in faults_sent] == ["unauthorized"]
    assert "401" in faults_sent[0]["detail"]
    assert [name for name, _ in fake.requests] == ["getUpdates"]
    for secret in (wrong, wrong.split(":", 1)[1]):
        assert secret.encode() not in out and secret.encode() not in err


def test_a_batch_too_big_for_one_frame_goes_one_update_a_frame_each_acknowledged():
    from piworkflows.channels.adapter import parts
    from piworkflows.protocol.internal.base import MAX_FRAME_BYTES

    quoted = {"message_id": 1, "chat": {"id": 111}, "text": "界" * 4096}
    batch = [
        {
            "update_id": 10 + n,
            "message": {
                "message_id": 2 + n,
                "from": {"id": 7},
                "chat": {"id": 111},
                "text": "界" * 4096,
                "reply_to_message": quoted,
            },
        }
        for n in range(100)
    ]
    split = parts(10, batch)
    assert len(split) == 100
    assert [(p.offset, p.next_offset) for p in split[:2]] == [(10, 11), (11, 12)] and split[-1].next_offset == 110
    assert all(len(frames.encode(p.kind, 0, p.model_dump())) <= MAX_FRAME_BYTES for p in split)
    small = parts(10, batch[:2])
    assert len(small) == 1 and (small[0].offset, small[0].next_offset, len(small[0].items)) == (10, 12, 2)

"""The fake Telegram Bot API (piworkflows/testing/fake_telegram.py): the five methods as the Bot API
answers them, the simulated users, and every scripted fault."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from piworkflows.testing.fake_telegram import DropAfter, DropBefore, FakeTelegram, ServerError, TooMany
from tests.server_util import wait_until

pytestmark = pytest.mark.timeout(30)

TOKEN = "424242:test-token"


def call(fake: FakeTelegram, method: str, body: dict[str, Any], token: str = TOKEN) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{fake.base_url}/bot{token}/{method}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def fake():
    with FakeTelegram(TOKEN) as served:
        yield served


def test_messages_are_sent_and_edited_as_the_bot_api_answers(fake):
    keyboard = {"inline_keyboard": [[{"text": "Ship it", "callback_data": "piw:d:ship:x"}]]}
    status, sent = call(fake, "sendMessage", {"chat_id": 111, "text": "Ship?", "reply_markup": keyboard})
    assert status == 200 and sent["ok"] is True
    message = sent["result"]
    assert (message["message_id"], message["chat"]["id"], message["text"]) == (1, 111, "Ship?")
    edited = call(fake, "editMessageText", {"chat_id": 111, "message_id": 1, "text": "Ship? Decided: Ship it"})
    assert edited[0] == 200 and "reply_markup" not in edited[1]["result"]  # the keyboard went with the edit
    same = call(fake, "editMessageText", {"chat_id": 111, "message_id": 1, "text": "Ship? Decided: Ship it"})
    assert same == (400, {"ok": False, "error_code": 400, "description": "Bad Request: message is not modified"})
    assert call(fake, "editMessageReplyMarkup", {"chat_id": 111, "message_id": 9})[0] == 400  # not found
    assert [m.text for m in fake.chat(111)] == ["Ship? Decided: Ship it"]
    assert call(fake, "sendMessage", {"chat_id": 111, "text": "x" * 4097})[0] == 400
    assert call(fake, "sendMessage", {"chat_id": 111, "text": "hi"}, token="0:wrong") == (
        401,
        {"ok": False, "error_code": 401, "description": "Unauthorized"},
    )
    assert call(fake, "deleteWebhook", {})[0] == 404
    assert all(TOKEN not in json.dumps(body) for _, body in fake.requests)  # the log never holds the token


def test_users_press_and_reply_and_updates_are_confirmed_by_offset(fake):
    call(fake, "sendMessage", {"chat_id": 111, "text": "Ship?"})
    pressed = fake.press(111, 7, 1, "piw:d:ship:x")
    replied = fake.reply(111, 7, "Split the change", reply_to=1)
    status, polled = call(fake, "getUpdates", {"offset": 0, "timeout": 0})
    assert status == 200 and [u["update_id"] for u in polled["result"]] == [pressed, replied]
    query = polled["result"][0]["callback_query"]
    assert (query["data"], query["from"]["id"], query["message"]["message_id"]) == ("piw:d:ship:x", 7, 1)
    assert polled["result"][1]["message"]["reply_to_message"]["message_id"] == 1
    assert call(fake, "answerCallbackQuery", {"callback_query_id": query["id"], "text": "Recorded"})[1]["result"]
    assert fake.answered == {query["id"]: "Recorded"}
    again = call(fake, "getUpdates", {"offset": pressed + 1, "timeout": 0})[1]["result"]
    assert [u["update_id"] for u in again] == [replied]  # the press confirmed, the reply not yet
    assert fake.confirmed == [pressed + 1]
    only_buttons = call(fake, "getUpdates", {"offset": pressed + 1, "allowed_updates": ["callback_query"]})
    assert only_buttons[1]["result"] == []


def test_a_long_poll_returns_when_a_user_acts(fake):
    call(fake, "sendMessage", {"chat_id": 111, "text": "Ship?"})
    polled: list[Any] = []
    poller = threading.Thread(target=lambda: polled.append(call(fake, "getUpdates", {"timeout": 4})))
    poller.start()
    wait_until(lambda: fake.calls("getUpdates"), what="the long poll in")
    fake.press(111, 7, 1, "piw:d:ship:x")
    poller.join(10)
    assert polled and len(polled[0][1]["result"]) == 1


def test_scripted_faults_meet_the_next_calls_in_order(fake):
    fake.script("sendMessage", TooMany(3), ServerError(502), DropBefore(), DropAfter())
    assert call(fake, "sendMessage", {"chat_id": 1, "text": "a"}) == (
        429,
        {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 3",
            "parameters": {"retry_after": 3},
        },
    )
    assert call(fake, "sendMessage", {"chat_id": 1, "text": "b"})[0] == 502
    for kept in (False, True):  # dropped before it was read: nothing sent; after: sent, no answer
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError, urllib.error.URLError)):
            call(fake, "sendMessage", {"chat_id": 1, "text": "c"})
        assert [m.text for m in fake.chat(1)] == (["c"] if kept else [])
    assert call(fake, "sendMessage", {"chat_id": 1, "text": "d"})[0] == 200  # the script is used up
    assert [m.text for m in fake.chat(1)] == ["c", "d"]

"""Protected human decisions answered through Telegram: a real server, its adapter child, and the
fake Bot API on loopback (piworkflows/testing/fake_telegram.py). The token is only in
credentials.json; the chat users are simulated by the fake."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from piworkflows.testing.fake_telegram import FakeTelegram
from tests.engine_util import start, wait_status, write
from tests.integration.test_human_decisions import APPROVE
from tests.server_util import ServerProcess, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

TOKEN = "424242:AAH-secret-token-for-tests-only"
OPS, ALICE, BOB, GROUP, MALLORY = 111, 111, 222, -100, 333


def configure(config_dir: Path, base_url: str, **profile: object) -> None:
    document = {
        "schema": "pi-workflows.channels.v1",
        "audiences": {"operator": {"channels": ["telegram:ops"]}},
        "telegramProfiles": {
            "ops": {
                "credential": "telegram-ops",
                "baseUrl": base_url,
                "allowedUserIds": [str(ALICE), str(BOB)],
                "allowedChatIds": [str(OPS), str(GROUP)],
                **profile,
            }
        },
    }
    for name, value in (("channels.json", document), ("credentials.json", {"secrets": {"telegram-ops": TOKEN}})):
        path = config_dir / name
        path.write_text(json.dumps(value))
        os.chmod(path, 0o600)


@pytest.fixture
def telegram(config_dir: Path) -> Iterator[FakeTelegram]:
    """The fake Bot API, and the channel configured for it (before the server starts)."""
    with FakeTelegram(TOKEN) as fake:
        configure(config_dir, fake.base_url)
        yield fake


def delivered(telegram: FakeTelegram, chat: int, count: int = 1) -> list:
    wait_until(lambda: len(telegram.chat(chat)) >= count, what=f"the decision delivered to chat {chat}")
    return telegram.chat(chat)


def button(message, label: str) -> str:
    for row in message.reply_markup["inline_keyboard"]:
        if row[0]["text"] == label:
            return str(row[0]["callback_data"])
    raise AssertionError(f"no button {label!r}")


def test_two_chats_answer_one_winner_and_both_messages_are_settled(telegram, server: ServerProcess, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    (private,) = delivered(telegram, OPS)
    (group,) = delivered(telegram, GROUP)
    assert private.text.startswith("Ship?") and "all tests pass" in private.text
    telegram.press(OPS, ALICE, private.message_id, button(private, "Ship it"))
    telegram.press(GROUP, BOB, group.message_id, button(group, "Replan"))
    finished = wait_status(server, run_id, "completed")
    assert finished["state"]["outputs"]["approve"] == {"choice": "ship", "resolution": "human"}
    wait_until(
        lambda: all(
            m.text.endswith("Decided: Ship it") and not (m.reply_markup or {}).get("inline_keyboard")
            for m in (*telegram.chat(OPS), *telegram.chat(GROUP))
        ),
        what="both messages edited to the winner",
    )
    wait_until(lambda: len(telegram.answered) == 2, what="both presses answered")
    assert sorted(telegram.answered.values()) == ["Already decided: Ship it", "Recorded: Ship it"]
    status = json.loads(server.cli("channels", "status", "--json").stdout)
    (channel,) = status["channels"]
    assert channel["state"] == "running" and channel["ambiguous"] == [] and channel["failed"] == 0
    assert str(ALICE) not in json.dumps(status) and TOKEN not in json.dumps(status)


def test_a_press_from_a_stranger_never_resolves(telegram, server: ServerProcess, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    (private,) = delivered(telegram, OPS)
    telegram.press(OPS, MALLORY, private.message_id, button(private, "Ship it"))
    wait_until(lambda: len(telegram.answered) == 1, what="the stranger's press answered")
    assert list(telegram.answered.values()) == ["You may not answer this decision."]
    assert wait_status(server, run_id, "waiting")["display"]["status"] == "waiting"
    assert server.cli("decide", run_id, "approve", "ship").returncode == 0
    assert wait_status(server, run_id, "completed")["state"]["outputs"]["approve"]["resolution"] == "human"


def test_a_choice_with_input_is_answered_by_a_reply(telegram, server: ServerProcess, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    (private,) = delivered(telegram, OPS)
    telegram.press(OPS, ALICE, private.message_id, button(private, "Replan"))
    _, prompt = delivered(telegram, OPS, 2)
    assert prompt.reply_markup == {"force_reply": True}
    telegram.reply(OPS, ALICE, "Split the change", reply_to=prompt.message_id)
    finished = wait_status(server, run_id, "completed")
    assert finished["state"]["outputs"]["replanned"] == {"todo": "Split the change"}

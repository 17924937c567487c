"""The crash harness's Telegram side (stress/crash/telegram.py, telegram_oracles.py): its oracles
can fail, each fed a database left by the real writer (a decision delivered to two chats and
pressed in both) with doctored evidence or a doctored snapshot; its config is one the server
accepts; its chat users press every decision message that shows a keyboard, and log each press."""

from __future__ import annotations

import json
import os
import stat
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from piworkflows.supervisor import channel_config
from piworkflows.testing.fake_telegram import FakeTelegram
from piworkflows.writer import channel_effects
from stress.crash import evidence, snapshot, telegram, telegram_oracles
from tests.unit.test_channel_writer import CHANNEL, ROUTES, effects, lease, press, register, send, updates
from tests.unit.test_decisions import waiting

pytestmark = pytest.mark.timeout(60)
WORKFLOW = "demo"  # run_create's workflow: the "decision runs" judged here


@pytest.fixture
def pressed(executor) -> dict[str, Any]:
    """run-1's decision delivered to both chats, pressed in both (update 7 accepted, 8 superseded),
    both messages edited, the run ended: the evidence a harness would hold."""
    register(executor)
    decision_id = waiting(executor, routes=ROUTES)
    deliveries = effects(executor, channel_effects.DELIVER)
    for number, delivery in enumerate(deliveries):
        send(executor, delivery["effectId"], 501 + number)
    ship = channel_effects.handle(decision_id, 1)
    presses = [press(7, ship, user="111", chat="111"), press(8, ship, user="222", chat="-100")]
    assert updates(executor, lease(executor), 0, presses).outcome == "accepted"
    for number, edit in enumerate(effects(executor, channel_effects.SETTLE)):
        send(executor, edit["effectId"], 600 + number)
    executor.conn.execute(  # the presses answered (answerCallbackQuery has no message to name)
        "UPDATE effects SET effect_status = 'applied', settled_at = 1 WHERE effect_type = ?", (channel_effects.ANSWER,)
    )
    executor.conn.execute("UPDATE runs SET status = 'completed', finished_at = 1 WHERE run_id = 'run-1'")
    return {
        "channelId": CHANNEL,
        "presses": [
            {"t": "press", "updateId": 7, "chat": 111, "runId": "run-1"},
            {"t": "press", "updateId": 8, "chat": -100, "runId": "run-1"},
        ],
        "sends": [{"chat": d["payload"]["body"]["chat_id"], "text": d["payload"]["body"]["text"]} for d in deliveries],
        "confirmed": [9],
        "lastUpdate": 8,
    }


def judge(paths, found: dict[str, Any], state: snapshot.State | None = None) -> dict[str, list[str]]:
    return telegram_oracles.judge(found, state or snapshot.read(paths.database, 10), WORKFLOW)


def test_consistent_evidence_passes(pressed, paths):
    state = snapshot.read(paths.database, 10)
    assert judge(paths, pressed, state) == {"lost": [], "duplicated": [], "violations": [], "stuck": []}
    assert sorted(s["outcome"] for s in state.decision_submissions) == ["accepted", "superseded"]
    assert state.cursors == {CHANNEL: 9} and all(d["resolutions"] == 1 for d in state.decisions.values())


def test_a_press_without_a_submission_is_lost(pressed, paths):
    pressed["presses"].append({"t": "press", "updateId": 6, "chat": 111, "runId": "run-1"})
    assert judge(paths, pressed)["lost"] == ["press 6 (chat 111, run run-1) has no submission"]


def test_a_press_with_two_submissions_is_duplicated_and_a_submission_nobody_pressed_a_violation(pressed, paths):
    state = snapshot.read(paths.database, 10)
    accepted = next(s for s in state.decision_submissions if s["outcome"] == "accepted")
    state.decision_submissions.append(dict(accepted))  # (the schema's unique key forbids it)
    assert telegram_oracles.update_id_of(accepted["key"], CHANNEL) == 7
    assert judge(paths, pressed, state)["duplicated"] == ["press 7 (chat 111, run run-1) has 2 submissions"]
    pressed["presses"] = pressed["presses"][:1]  # update 8 was never pressed by the users
    assert judge(paths, pressed)["violations"] == [
        f"a submission of channel {CHANNEL} names update 8, which no user made"
    ]


def test_a_decision_sent_twice_to_one_chat_is_duplicated(pressed, paths):
    pressed["sends"].append(pressed["sends"][0])
    chat = pressed["sends"][0]["chat"]
    assert judge(paths, pressed)["duplicated"] == [
        f"the decision of run run-1, node approve was sent to chat {chat} 2 times"
    ]


def test_an_offset_confirmed_before_its_commit_or_updates_left_unconsumed_are_violations(pressed, paths):
    pressed["confirmed"].append(12)
    assert judge(paths, pressed)["violations"] == ["getUpdates confirmed offset 12, past the committed cursor 9"]
    pressed["confirmed"].pop()
    pressed["presses"].append({"t": "press", "updateId": 10, "chat": 111, "runId": "run-1"})
    pressed["lastUpdate"] = 10
    found = judge(paths, pressed)
    assert found["violations"] == ["the final cursor is 9, not 11 (the last update 10 + 1)"]
    assert found["lost"] == ["press 10 (chat 111, run run-1) has no submission"]


def test_two_resolutions_or_none_for_an_ended_run_are_reported(pressed, paths):
    state = snapshot.read(paths.database, 10)
    (decision_id,) = state.decisions
    state.decisions[decision_id]["resolutions"] = 2
    assert judge(paths, pressed, state)["duplicated"] == [f"decision {decision_id} has 2 resolutions"]
    state.decisions[decision_id]["resolutions"] = 0
    assert judge(paths, pressed, state)["violations"] == [
        f"decision {decision_id} of run run-1 (completed) has no resolution"
    ]


def test_a_decision_run_not_ended_and_a_message_unsettled_are_stuck(executor, pressed, paths):
    executor.conn.execute("UPDATE runs SET status = 'waiting', finished_at = NULL WHERE run_id = 'run-1'")
    executor.conn.execute(
        "UPDATE effects SET effect_status = 'pending', settled_at = NULL WHERE effect_type = 'telegram.settle'"
    )
    stuck = judge(paths, pressed)["stuck"]
    assert stuck[0] == "decision run run-1 did not end: waiting (paused False, park None)"
    assert len(stuck) == 3 and all("(telegram.settle) is still pending" in line for line in stuck[1:])


def test_the_config_is_private_and_one_the_server_accepts(tmp_path):
    side = telegram.TelegramSide(tmp_path, seed=1, evidence_dir=tmp_path)
    try:
        side.write_config()
        side.write_config()  # before every start: replaced whole
        assert stat.S_IMODE(os.stat(side.config_dir).st_mode) == 0o700
        for name in ("channels.json", "credentials.json"):
            assert stat.S_IMODE(os.stat(side.config_dir / name).st_mode) == 0o600
        config = channel_config.load(side.config_dir)
        (profile,) = config.profiles.values()
        assert profile.channel_id == telegram.CHANNEL_ID and profile.base_url == side.base_url
        assert telegram.TOKEN not in (side.config_dir / "channels.json").read_text()
    finally:
        side.close()


def deliver(fake: FakeTelegram, chat: int, run_id: str) -> None:
    """What the adapter sends for a decision: its text names the run and node; two buttons."""
    keyboard = {"inline_keyboard": [[{"text": "Hold", "callback_data": "h"}], [{"text": "Ship", "callback_data": "s"}]]}
    body = {"chat_id": chat, "text": f"Release?\n\nRun {run_id}, node decide", "reply_markup": keyboard}
    request = urllib.request.Request(
        f"{fake.base_url}/bot{fake.token}/sendMessage",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answered:
        assert json.load(answered)["ok"]


def test_the_users_press_every_decision_once_sometimes_twice_or_in_both_chats(tmp_path: Path):
    log = evidence.EvidenceLog(tmp_path / "telegram.jsonl")
    with FakeTelegram(telegram.TOKEN) as fake:
        users = telegram.ChatUsers(fake, seed=4, log=log)
        runs = [f"run-{n}" for n in range(30)]
        for run_id in runs:
            for chat in telegram.CHATS:
                deliver(fake, chat, run_id)
        deliver(fake, telegram.PRIVATE, "run-settled")
        fake.chat(telegram.PRIVATE)[-1].reply_markup = None  # settled before it was seen: never pressed
        now = 0.0
        users.step(now)
        assert users.outlook()[1] > 0
        while users.outlook()[1]:
            now += 0.1
            users.step(now)
        log.close()
        presses = evidence.load(tmp_path / "telegram.jsonl")
        assert [p["updateId"] for p in presses] == list(range(1, len(presses) + 1))
        assert users.last_update == len(presses)
        by_run: dict[str, list[dict[str, Any]]] = {}
        for record in presses:
            by_run.setdefault(record["runId"], []).append(record)
        assert sorted(by_run) == sorted(runs)  # each decision at least once; the settled one never
        plans = {users.plans[run_id] for run_id in runs}
        assert plans == {"once", "twice", "both"}  # seed 4 draws every plan among 30 decisions
        for run_id, made in by_run.items():
            chats = [p["chat"] for p in made]
            assert len(made) == (1 if users.plans[run_id] == "once" else 2)
            assert len(set(chats)) == (2 if users.plans[run_id] == "both" else 1)
            assert all(p["user"] in ((telegram.PRIVATE,) if p["chat"] > 0 else telegram.GROUP_USERS) for p in made)
        assert len(fake.updates) == len(presses)  # each a callback_query waiting to be polled

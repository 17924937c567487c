"""The Telegram channel in the real writer, in-process with a fake clock (writer/commands/channels.py,
writer/channel_effects.py): a channel registered once per bot; a decision's deliveries reserved
with its wait; presses from allowed users in delivered chats resolve it once, everyone else's never;
the cursor advances only with what its updates caused; every sent message is edited once the
decision has its winner; ambiguous messages are recovered only through channel.recover."""

from __future__ import annotations

import json
from typing import Any

import pytest

from piworkflows import canonical
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import channel_effects
from tests.support import run_group, submitted, token_hash
from tests.unit.test_decisions import OPERATOR, answer, node, resolution, waiting

pytestmark = pytest.mark.timeout(60)

CHANNEL = "telegram:ops"
MANAGER = {"actor_class": "channel", "actor_id": CHANNEL}
ALLOW = {"user_ids": ["111", "222"], "chat_ids": ["111", "-100"], "audiences": {}}
ROUTES = [{"channel_id": CHANNEL, "chat_id": "111"}, {"channel_id": CHANNEL, "chat_id": "-100"}]


def one(executor, kind: str, body: dict[str, Any]):
    (reply,) = run_group(executor, submitted(kind, body))
    return reply


def register(executor, bot: str = "4242"):
    return one(
        executor, "channel.register", {"actor": MANAGER, "channel_id": CHANNEL, "profile_name": "ops", "bot_id": bot}
    )


def lease(executor) -> dict[str, Any]:
    reply = one(
        executor,
        "channel.claim",
        {
            "actor": MANAGER,
            "channel_id": CHANNEL,
            "owner_id": "server-1",
            "claim_token_hash": token_hash("ch"),
            "ttl_ms": 60_000,
        },
    )
    assert reply.outcome == "accepted", reply
    return {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": token_hash("ch"),
        "lease_generation": reply.receipt["leaseGeneration"],
        "ttl_ms": 60_000,
    }


def effects(executor, effect_type: str) -> list[dict[str, Any]]:
    rows = executor.conn.execute(
        "SELECT e.effect_id, e.effect_status, b.bytes, e.external_ref FROM effects e "
        "JOIN blobs b ON b.digest = e.payload_digest WHERE e.effect_type = ? ORDER BY e.created_at, e.effect_id",
        (effect_type,),
    ).fetchall()
    return [{"effectId": r[0], "status": r[1], "payload": json.loads(r[2]), "ref": r[3]} for r in rows]


def claim(executor, **target: str):
    """The manager claims an effect: ``effect_id=`` that one, ``channel_id=`` the channel's next."""
    claimed = one(
        executor,
        "effect.claim",
        {"actor": MANAGER, **target, "owner_id": "server-1", "claim_token_hash": token_hash("e"), "ttl_ms": 10_000},
    )
    assert claimed.outcome == "accepted", claimed
    return claimed


def held(claimed) -> dict[str, Any]:
    """The claim a settle or abandon of ``claimed`` presents."""
    return {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": token_hash("e"),
        "lease_generation": claimed.receipt["leaseGeneration"],
        "ttl_ms": 10_000,
    }


def settle_sent(executor, effect_id: str, claimed, chat: str, message_id: int) -> None:
    """Telegram answered the claimed send: it is ``message_id`` in ``chat``."""
    revision = executor.conn.execute("SELECT revision FROM resources WHERE resource_id = ?", (effect_id,)).fetchone()[0]
    settled = one(
        executor,
        "effect.settle",
        {
            "actor": MANAGER,
            "effect_id": effect_id,
            "expected_revision": revision,
            "claim": held(claimed),
            "settlement": "applied",
            "result": BlobValue.of_json({"chatId": chat, "messageId": message_id}).model_dump(),
            "external_ref": f"{chat}:{message_id}",
        },
    )
    assert settled.outcome == "accepted", settled


def send(executor, effect_id: str, message_id: int) -> None:
    """The manager claims the effect and settles it as Telegram answered: sent as ``message_id``."""
    claimed = claim(executor, effect_id=effect_id)
    settle_sent(executor, effect_id, claimed, effects_payload(executor, effect_id)["body"]["chat_id"], message_id)


def effects_payload(executor, effect_id: str) -> dict[str, Any]:
    (data,) = executor.conn.execute(
        "SELECT b.bytes FROM effects e JOIN blobs b ON b.digest = e.payload_digest WHERE e.effect_id = ?", (effect_id,)
    ).fetchone()
    return json.loads(data)


def press(update_id: int, data: str, user: str = "111", chat: str = "111") -> dict[str, Any]:
    return {
        "update_id": update_id,
        "update_kind": "callback",
        "user_id": user,
        "chat_id": chat,
        "callback_query_id": f"cq{update_id}",
        "data": data,
    }


def updates(executor, claim: dict[str, Any], offset: int, items: list[dict[str, Any]], allow=ALLOW):
    next_offset = max([offset - 1, *(item["update_id"] for item in items)]) + 1
    return one(
        executor,
        "channel.updates",
        {
            "actor": MANAGER,
            "channel_id": CHANNEL,
            "claim": claim,
            "offset": offset,
            "next_offset": next_offset,
            "items": items,
            "allow": allow,
        },
    )


def cursor(executor) -> int:
    return executor.conn.execute("SELECT cursor_position FROM channel_cursors").fetchone()[0]


def records(executor) -> list[tuple[str, str]]:
    return executor.conn.execute("SELECT channel_id, record_kind FROM channel_messages ORDER BY record_kind").fetchall()


def submissions(executor) -> list[tuple[str, str, str]]:
    return executor.conn.execute(
        "SELECT actor_class, actor_id, submission_outcome FROM human_decision_submissions ORDER BY created_at, "
        "idempotency_key"
    ).fetchall()


def test_a_channel_is_registered_once_and_refuses_another_bot(executor):
    assert register(executor).receipt == {"channelId": CHANNEL, "registered": True}
    again = register(executor)
    assert again.outcome == "accepted" and again.receipt == {"channelId": CHANNEL, "registered": False}
    other = register(executor, bot="9999")
    assert other.outcome == "rejected" and other.receipt["code"] == "channelBotChanged"
    assert cursor(executor) == 0


def test_two_chats_press_one_winner_the_other_superseded_and_both_messages_edited(executor):
    register(executor)
    decision_id = waiting(executor, routes=ROUTES)
    second, first = sorted(effects(executor, channel_effects.DELIVER), key=lambda e: e["payload"]["body"]["chat_id"])
    assert [e["payload"]["body"]["chat_id"] for e in (first, second)] == ["111", "-100"]
    body = first["payload"]["body"]
    assert first["payload"]["method"] == "sendMessage" and body["text"].startswith("Ship?")
    buttons = [row[0] for row in body["reply_markup"]["inline_keyboard"]]
    assert [b["text"] for b in buttons] == ["Replan", "Ship it"]  # the choices by key
    assert all(len(b["callback_data"].encode()) <= 64 for b in buttons)
    send(executor, first["effectId"], 501)
    (view,) = run_group(executor, submitted("run.get", {"actor": {"actor_class": "client"}, "run_id": "run-1"}))
    shown = view.receipt["piworkflows"]["pending"]["decision"]["deliveries"]
    assert shown == {"sent": 1, "pending": 1, "failed": 0, "ambiguous": 0}
    send(executor, second["effectId"], 502)
    assert records(executor) == [(CHANNEL, "delivery")]

    claim = lease(executor)
    ship = channel_effects.handle(decision_id, 1)
    reply = updates(
        executor, claim, 0, [press(7, ship, user="111", chat="111"), press(8, ship, user="222", chat="-100")]
    )
    assert reply.outcome == "accepted", reply
    assert reply.receipt["runIds"] == ["run-1"] and reply.receipt["counts"] == {"accepted": 1, "superseded": 1}
    assert cursor(executor) == 9
    assert node(executor) == ("completed", None, {"choice": "ship", "resolution": "human"})
    assert submissions(executor) == [("channel", "telegram:111", "accepted"), ("channel", "telegram:222", "superseded")]
    answers = sorted(e["payload"]["body"]["text"] for e in effects(executor, channel_effects.ANSWER))
    assert answers == ["Already decided: Ship it", "Recorded: Ship it"]
    edits = effects(executor, channel_effects.SETTLE)
    assert sorted(e["payload"]["body"]["message_id"] for e in edits) == [501, 502]
    assert all(e["payload"]["body"]["reply_markup"] == {"inline_keyboard": []} for e in edits)
    assert all(e["payload"]["body"]["text"].endswith("Decided: Ship it") for e in edits)
    for number, edit in enumerate(edits):
        send(executor, edit["effectId"], 600 + number)
    assert records(executor) == [(CHANNEL, "delivery"), (CHANNEL, "settlement")]


def test_updates_only_from_the_durable_cursor_and_never_twice(executor):
    register(executor)
    decision_id = waiting(executor, routes=ROUTES[:1])
    claim = lease(executor)
    ship = channel_effects.handle(decision_id, 1)
    assert updates(executor, claim, 0, [press(3, ship)]).outcome == "accepted"
    resent = updates(executor, claim, 0, [press(3, ship)])  # the same batch again: the cursor moved
    assert resent.outcome == "claimLost" and resent.receipt["code"] == "staleCursor" and resent.receipt["cursor"] == 4
    assert resolution(executor) == [("human",)] and len(submissions(executor)) == 1
    old = claim | {"lease_generation": claim["lease_generation"]}
    newer = lease(executor)  # a new adapter epoch: the old lease's batches are refused
    assert updates(executor, old, 4, []).outcome == "claimLost"
    assert updates(executor, newer, 4, []).outcome == "accepted"


def test_strangers_and_undelivered_chats_never_resolve(executor):
    register(executor)
    decision_id = waiting(executor, routes=ROUTES[:1])  # delivered to chat 111 only
    claim = lease(executor)
    ship = channel_effects.handle(decision_id, 1)
    reply = updates(
        executor,
        claim,
        0,
        [
            press(1, ship, user="333", chat="111"),  # not on the allow list
            press(2, ship, user="222", chat="-100"),  # an allowed user in a chat that did not get it
            press(3, "piw:" + "0" * 32 + ":1:00000000"),  # no such decision
            press(4, ship[:-1] + ("0" if ship[-1] != "0" else "1")),  # a forged check
        ],
    )
    assert reply.outcome == "accepted", reply
    assert reply.receipt["counts"] == {"rejected": 1, "unknown": 3}
    assert resolution(executor) == []
    assert submissions(executor) == [("channel", "telegram:333", "rejected")]
    texts = [e["payload"]["body"]["text"] for e in effects(executor, channel_effects.ANSWER)]
    assert texts.count("You may not answer this decision.") == 1 and len(texts) == 4
    narrowed = ALLOW | {"audiences": {"operator": {"user_ids": ["222"]}}}  # the audience narrows the profile's list
    assert updates(executor, claim, 5, [press(5, ship)], allow=narrowed).receipt["counts"] == {"rejected": 1}
    assert resolution(executor) == []


def test_a_choice_with_input_asks_for_it_and_the_reply_answers(executor):
    register(executor)
    decision_id = waiting(executor, routes=ROUTES[:1])
    claim = lease(executor)
    replan = channel_effects.handle(decision_id, 0)
    assert updates(executor, claim, 0, [press(1, replan)]).receipt["counts"] == {"prompted": 1}
    (asked,) = effects(executor, channel_effects.PROMPT)
    assert asked["payload"]["body"]["reply_markup"] == {"force_reply": True}
    assert resolution(executor) == []
    send(executor, asked["effectId"], 700)
    text = {"update_id": 2, "update_kind": "message", "user_id": "111", "chat_id": "111", "text": "Split it"}
    text["reply_to_text"] = asked["payload"]["body"]["text"]
    assert updates(executor, claim, 2, [text]).receipt["counts"] == {"accepted": 1}
    assert node(executor) == ("completed", None, {"choice": "replan", "input": "Split it", "resolution": "human"})
    (told,) = effects(executor, channel_effects.REPLY)
    assert told["payload"]["body"]["text"] == "Recorded: Replan"
    (edit,) = effects(executor, channel_effects.SETTLE)  # the prompt is edited too
    assert edit["payload"]["body"]["message_id"] == 700


def test_a_press_at_the_deadline_loses_to_the_timeout_policy(executor, clock):
    register(executor)
    decision_id = waiting(executor, after_ms=1_000, default={"choice": "ship"}, routes=ROUTES[:1])
    claim = lease(executor)
    clock.advance(1_000)  # exactly at the deadline: the deadline wins
    reply = updates(executor, claim, 0, [press(1, channel_effects.handle(decision_id, 1))])
    assert reply.receipt["counts"] == {"superseded": 1} and reply.receipt["runIds"] == ["run-1"]
    assert resolution(executor) == [("timeoutPolicy",)]
    (told,) = effects(executor, channel_effects.ANSWER)
    assert told["payload"]["body"]["text"] == "Already decided: Ship it (the default at the deadline)"


def test_a_resolution_cancels_unsent_deliveries_and_a_late_send_is_edited(executor):
    register(executor)
    waiting(executor, routes=ROUTES)
    first, second = effects(executor, channel_effects.DELIVER)
    claimed = claim(executor, channel_id=CHANNEL)
    assert claimed.receipt["effectId"] == first["effectId"] and claimed.receipt["payload"] == first["payload"]
    assert answer(executor, "ship").outcome == "accepted"  # the CLI answers while the first is being sent
    assert [e["status"] for e in effects(executor, channel_effects.DELIVER)] == ["applying", "cancelled"]
    assert effects(executor, channel_effects.SETTLE) == []
    settle_sent(executor, first["effectId"], claimed, "111", 9)
    (edit,) = effects(executor, channel_effects.SETTLE)
    assert edit["payload"]["body"]["message_id"] == 9


def test_an_ambiguous_send_is_recovered_only_through_channel_recover(executor):
    register(executor)
    waiting(executor, routes=ROUTES[:1])
    (delivery,) = effects(executor, channel_effects.DELIVER)
    claimed = claim(executor, channel_id=CHANNEL)
    abandon = {"actor": MANAGER, "effect_id": delivery["effectId"], "claim": held(claimed)}
    assert one(executor, "effect.abandon", abandon).receipt["effectStatus"] == "ambiguous"  # a manual send
    refused = one(executor, "effect.retry", {"actor": OPERATOR, "effect_id": delivery["effectId"]})
    assert refused.outcome == "rejected" and refused.receipt["code"] == "useChannelRecover"
    status = one(executor, "channel.status", {"actor": OPERATOR})
    (channel,) = status.receipt["channels"]
    assert channel["ambiguous"] == [
        {"messageId": delivery["effectId"], "effectType": channel_effects.DELIVER, "runId": "run-1", "attempts": 1}
    ]
    assert "111" not in canonical.dumps(status.receipt)  # no chat or user ids
    assert answer(executor, "ship").outcome == "accepted"
    confirm = {"actor": OPERATOR, "effect_id": delivery["effectId"], "action": "confirm", "telegram_message_id": 44}
    confirmed = one(executor, "channel.recover", confirm)
    assert confirmed.receipt == {"messageId": delivery["effectId"], "effectStatus": "applied", "settleReserved": True}
    again = one(executor, "channel.recover", confirm)
    assert again.outcome == "conflict" and again.receipt["code"] == "winnerDecided"
    (edit,) = effects(executor, channel_effects.SETTLE)
    assert edit["payload"]["body"]["message_id"] == 44


def test_cancel_resolves_and_leaves_channel_effects_eligible(executor):
    register(executor)
    waiting(executor, routes=ROUTES[:1])
    (delivery,) = effects(executor, channel_effects.DELIVER)
    send(executor, delivery["effectId"], 5)
    cancelled = one(executor, "run.cancel", {"actor": OPERATOR, "run_id": "run-1"})
    assert cancelled.outcome == "accepted", cancelled
    assert resolution(executor) == [("cancellation",)]
    (edit,) = effects(executor, channel_effects.SETTLE)
    assert edit["status"] == "pending" and edit["payload"]["body"]["text"].endswith("Cancelled: the run was cancelled")


def test_an_unsettled_edit_blocks_deleting_the_run_and_the_channel_outlives_it(executor, clock):
    register(executor)
    waiting(executor, routes=ROUTES[:1])
    (delivery,) = effects(executor, channel_effects.DELIVER)
    send(executor, delivery["effectId"], 5)
    assert one(executor, "run.cancel", {"actor": OPERATOR, "run_id": "run-1"}).outcome == "accepted"
    clock.advance(60_000)  # past the cancel (and every claim)
    blocked = one(executor, "run.delete", {"actor": OPERATOR, "run_id": "run-1"})
    assert blocked.outcome == "rejected" and "unsettledEffect" in json.dumps(blocked.receipt), blocked
    (edit,) = effects(executor, channel_effects.SETTLE)
    send(executor, edit["effectId"], 5)
    assert records(executor) == [(CHANNEL, "delivery"), (CHANNEL, "settlement")]
    deleted = one(executor, "run.delete", {"actor": OPERATOR, "run_id": "run-1"})
    assert deleted.outcome == "accepted", deleted
    assert executor.conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    assert records(executor) == []
    assert executor.conn.execute("SELECT channel_id, cursor_position FROM channel_cursors").fetchall() == [(CHANNEL, 0)]

"""A decision's Telegram messages: the effects that send and settle them, and their receipts.

::

    node.wait / channel.deliver ── deliver(): one telegram.deliver per route (sendMessage, a
                                   button row per choice), source: the decision
    effect.settle of a delivery ── settled(): applied -> a delivery receipt (channel_messages, the
                                   first of the channel); the decision already resolved -> settle it
    any resolution ── resolved(): pending deliveries and prompts cancelled; one telegram.settle per
                                   message sent (editMessageText: the winner line, no keyboard)
    the channel's last settle ── settled(): a settlement receipt

The writer renders every text here (plain text, at most 4096 characters); a payload is
``{method, body}`` with no token or URL. A message's Telegram reference (``{chatId, messageId}``)
is the effect's result and ``external_ref`` (``<chat>:<message>``); ``channel_messages`` only
records that a decision was delivered on a channel and that its messages were settled.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from typing import Any

from piworkflows import canonical, isotime
from piworkflows.protocol.internal.base import Actor, BlobValue
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.states import CHANNEL_PERFORMER, TELEGRAM_EFFECT_POLICIES, TELEGRAM_MAX_ATTEMPTS
from piworkflows.writer import records
from piworkflows.writer.views import touched

MAX_TEXT = 4096  # Telegram's bound on a message text
DELIVER, PROMPT, REPLY = "telegram.deliver", "telegram.prompt", "telegram.reply"
ANSWER, SETTLE, NOTIFY = "telegram.answerCallback", "telegram.settle", "telegram.notify"
SENT_KINDS = (DELIVER, PROMPT)  # the messages of a decision a settle edits
HANDLE = re.compile(r"piw:([0-9a-f]{32}):([0-9]{1,3}):([0-9a-f]{8})")

# How an edited message names the winner (the line), and how a late press is told of it (the name).
WINNER_LINES = {
    "human": "Decided: {label}",
    "timeoutPolicy": "Deadline passed: {label} (the default)",
    "expiry": "Expired: the deadline passed with no answer",
    "cancellation": "Cancelled: the run was cancelled",
}
WINNER_NAMES = {
    "human": "{label}",
    "timeoutPolicy": "{label} (the default at the deadline)",
    "expiry": "expired with no answer",
    "cancellation": "the run was cancelled",
}


def handle(decision_id: str, index: int) -> str:
    """A choice's callback data (and a prompt's handle): at most 64 bytes, as Telegram allows."""
    key = decision_id.removeprefix("decision-")
    check = hashlib.sha256(f"{decision_id}\0{index}".encode()).hexdigest()[:8]
    return f"piw:{key}:{index}:{check}"


def parse_handle(text: str | None) -> tuple[str, int] | None:
    """(decision id, choice index) of a handle in ``text`` whose check holds, else None."""
    found = HANDLE.search(text or "")
    if found is None:
        return None
    decision_id, index = "decision-" + found.group(1), int(found.group(2))
    return (decision_id, index) if handle(decision_id, index) == found.group(0) else None


def choice_keys(request: dict[str, Any]) -> list[str]:
    """A decision's choices in button order (their keys sorted)."""
    return sorted(request["choices"])


def label(request: dict[str, Any], choice: str) -> str:
    return str(request["choices"][choice]["label"])


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def request_text(conn: sqlite3.Connection, decision_id: str) -> tuple[str, dict[str, Any], str]:
    """The text a delivery shows (without its winner line), the stored request and the run id."""
    run_id, node_path, request_digest, default_digest, deadline = conn.execute(
        "SELECT d.run_id, a.node_path, d.request_digest, d.default_response_digest, d.deadline_at "
        "FROM human_decisions d JOIN node_attempts a ON a.attempt_id = d.attempt_id WHERE d.decision_id = ?",
        (decision_id,),
    ).fetchone()
    stored = records.read_json(conn, request_digest)
    asked = stored.get("request")
    lines = []
    if isinstance(asked, dict):
        lines.append(str(asked.get("title") or f"Decision needed: {node_path}"))
        for key in ("summary", "question", "details"):
            if isinstance(asked.get(key), str) and asked[key]:
                lines += ["", asked[key]]
    else:
        lines.append(f"Decision needed: {node_path}")
        if isinstance(asked, str) and asked:
            lines += ["", asked]
    lines += ["", f"Run {run_id}, node {node_path}"]
    if deadline is not None:
        if default_digest is not None:
            then = f"then: {label(stored, records.read_json(conn, default_digest)['choice'])}"
        else:
            then = "then it expires"
        lines.append(f"Answer before {isotime.iso(deadline)} ({then})")
    return "\n".join(lines), stored, run_id


def _request(
    effect_type: str, key: list[Any], payload: dict[str, Any], run_id: str | None, channel_id: str
) -> EffectRequest:
    return EffectRequest(
        effect_type=effect_type,
        idempotency_key=canonical.dumps(key),
        payload=BlobValue.of_json(payload),
        effect_class="external",
        performer=CHANNEL_PERFORMER,
        recovery_policy=TELEGRAM_EFFECT_POLICIES[effect_type],
        owner_scope="channel",
        run_id=run_id,
        channel_id=channel_id,
        max_attempts=TELEGRAM_MAX_ATTEMPTS,
    )


def reserve(conn: sqlite3.Connection, request: EffectRequest, source_id: str, actor: Actor, now: int) -> str:
    """Record one channel effect of a source resource (a decision, or the channel) at its revision."""
    source = records.get_resource(conn, source_id)
    assert source is not None
    return records.insert_effect(conn, request, source_id, source.revision, actor, now)[0]


def deliver(
    conn: sqlite3.Connection, decision_id: str, routes: list[tuple[str, str]], actor: Actor, now: int
) -> list[str]:
    """One delivery per route (channel, chat) of a decision still open; a route that has one adopts
    it. Returns the effects reserved now."""
    known = {row[0] for row in conn.execute("SELECT channel_id FROM channels")}
    routes = [route for route in routes if route[0] in known]  # a profile not registered delivers nothing
    if not routes:
        return []
    text, stored, run_id = request_text(conn, decision_id)
    keyboard = [
        [{"text": label(stored, choice), "callback_data": handle(decision_id, index)}]
        for index, choice in enumerate(choice_keys(stored))
    ]
    made = []
    for channel_id, chat_id in routes:
        key = [decision_id, channel_id, chat_id]
        exists = conn.execute(
            "SELECT 1 FROM effects WHERE effect_type = ? AND idempotency_key = ?", (DELIVER, canonical.dumps(key))
        ).fetchone()
        if exists:
            continue
        body = {"chat_id": chat_id, "text": _clip(text), "reply_markup": {"inline_keyboard": keyboard}}
        made.append(
            reserve(
                conn,
                _request(DELIVER, key, {"method": "sendMessage", "body": body}, run_id, channel_id),
                decision_id,
                actor,
                now,
            )
        )
    return made


def prompt(
    conn: sqlite3.Connection,
    decision_id: str,
    channel_id: str,
    chat_id: str,
    user_id: str,
    choice: str,
    actor: Actor,
    now: int,
) -> str:
    """Ask a user who pressed a choice with input for its text: a force-reply message carrying the
    choice's handle (the reply quotes it)."""
    _, stored, run_id = request_text(conn, decision_id)
    index = choice_keys(stored).index(choice)
    asked = stored["choices"][choice]["input"]
    text = (
        f"{label(stored, choice)}: {asked['prompt']}\n"
        f"Reply to this message with your answer. [{handle(decision_id, index)}]"
    )
    body = {"chat_id": chat_id, "text": _clip(text), "reply_markup": {"force_reply": True}}
    key = [decision_id, channel_id, chat_id, user_id, choice]
    request = _request(PROMPT, key, {"method": "sendMessage", "body": body}, run_id, channel_id)
    return reserve(conn, request, decision_id, actor, now)


def notify(
    conn: sqlite3.Connection,
    run_id: str,
    attempt_id: str,
    routes: list[tuple[str, str]],
    output: BlobValue,
    actor: Actor,
    now: int,
) -> list[str]:
    """A notify node's message to its audience's chats: one send per route, keyed by the node visit."""
    known = {row[0] for row in conn.execute("SELECT channel_id FROM channels")}
    node_path, visit = conn.execute(
        "SELECT node_path, visit_number FROM node_attempts WHERE attempt_id = ?", (attempt_id,)
    ).fetchone()
    text = _clip(str(json.loads(output.data).get("message") or node_path))
    made = []
    for channel_id, chat_id in routes:
        if channel_id not in known:
            continue
        key = [run_id, node_path, visit, channel_id, chat_id]
        body = {"chat_id": chat_id, "text": text}
        request = _request(NOTIFY, key, {"method": "sendMessage", "body": body}, run_id, channel_id)
        made.append(reserve(conn, request, run_id, actor, now))
    return made


def answer_callback(
    conn: sqlite3.Connection,
    channel_id: str,
    callback_query_id: str,
    text: str,
    run_id: str | None,
    actor: Actor,
    now: int,
) -> str:
    """Every press is answered (Telegram's button stops spinning), with a short text."""
    body = {"callback_query_id": callback_query_id, "text": text[:200]}
    request = _request(
        ANSWER, [channel_id, callback_query_id], {"method": "answerCallbackQuery", "body": body}, run_id, channel_id
    )
    return reserve(conn, request, channel_id, actor, now)


def reply(
    conn: sqlite3.Connection,
    channel_id: str,
    update_id: int,
    chat_id: str,
    text: str,
    run_id: str | None,
    actor: Actor,
    now: int,
) -> str:
    """A text answer that was refused or came late is told so."""
    body = {"chat_id": chat_id, "text": _clip(text)}
    request = _request(REPLY, [channel_id, update_id], {"method": "sendMessage", "body": body}, run_id, channel_id)
    return reserve(conn, request, channel_id, actor, now)


def winner_line(
    conn: sqlite3.Connection, decision_id: str, stored: dict[str, Any], forms: dict[str, str] = WINNER_LINES
) -> str | None:
    """The decision's winner in words (``forms``: WINNER_LINES or WINNER_NAMES), None while open."""
    row = conn.execute(
        "SELECT resolution_kind, response_digest FROM human_decision_resolutions WHERE decision_id = ?", (decision_id,)
    ).fetchone()
    if row is None:
        return None
    kind, response = row
    chosen = label(stored, records.read_json(conn, response)["choice"]) if response is not None else ""
    return forms[kind].format(label=chosen)


def _settle(conn: sqlite3.Connection, decision_id: str, message_effect_id: str, actor: Actor, now: int) -> bool:
    """Edit one sent message of a resolved decision: the winner line, no keyboard. False: its
    Telegram message id is not known (an operator confirmed it without one)."""
    effect_type, channel_id, external_ref, payload_digest = conn.execute(
        "SELECT effect_type, channel_id, external_ref, payload_digest FROM effects WHERE effect_id = ?",
        (message_effect_id,),
    ).fetchone()
    if not external_ref:
        return False
    chat_id, message_id = external_ref.rsplit(":", 1)
    text, stored, run_id = request_text(conn, decision_id)
    line = winner_line(conn, decision_id, stored)
    assert line is not None
    if effect_type == PROMPT:
        text = records.read_json(conn, payload_digest)["body"]["text"]
    body = {
        "chat_id": chat_id,
        "message_id": int(message_id),
        "text": _clip(f"{text}\n\n{line}"),
        "reply_markup": {"inline_keyboard": []},
    }
    request = _request(
        SETTLE, [decision_id, message_effect_id], {"method": "editMessageText", "body": body}, run_id, channel_id
    )
    reserve(conn, request, decision_id, actor, now)
    return True


def resolved(conn: sqlite3.Connection, decision_id: str, actor: Actor, now: int) -> None:
    """A decision got its winner: its messages not sent yet never will be, the sent ones are edited."""
    rows = conn.execute(
        "SELECT e.effect_id, e.effect_status, r.revision FROM effects e "
        "JOIN resources r ON r.resource_id = e.effect_id WHERE e.source_resource_id = ? AND e.effect_type IN (?, ?)",
        (decision_id, *SENT_KINDS),
    ).fetchall()
    for effect_id, status, revision in rows:
        if status == "pending":
            conn.execute(
                "UPDATE effects SET effect_status = 'cancelled', settled_at = ?, updated_at = ? WHERE effect_id = ?",
                (now, now, effect_id),
            )
            records.write_event(
                conn,
                effect_id,
                records.increment_revision(conn, effect_id, revision, now),
                "effect.cancelled",
                actor,
                now,
            )
        elif status == "applied":
            _settle(conn, decision_id, effect_id, actor, now)
        # applying: settled() edits it once it is sent; ambiguous: channel.recover does


def settled(conn: sqlite3.Connection, effect_id: str, status: str, actor: Actor, now: int) -> bool:
    """After a channel effect's status changed (settled, abandoned, recovered, confirmed or retried by
    an operator): the waiting view's delivery counts, the receipts, and the edit of a message sent
    after its decision was resolved. True if that edit was reserved. Other effects: nothing."""
    effect_type, decision_id, channel_id = conn.execute(
        "SELECT e.effect_type, d.decision_id, e.channel_id FROM effects e "
        "LEFT JOIN human_decisions d ON d.decision_id = e.source_resource_id WHERE e.effect_id = ?",
        (effect_id,),
    ).fetchone()
    if decision_id is None:
        return False
    edited = False
    is_resolved = (
        conn.execute("SELECT 1 FROM human_decision_resolutions WHERE decision_id = ?", (decision_id,)).fetchone()
        is not None
    )
    if effect_type == DELIVER and not is_resolved:  # the waiting view counts its deliveries
        touched.touch(conn, run_id_of(conn, decision_id))
    if effect_type in SENT_KINDS and status == "applied":
        if effect_type == DELIVER:
            _record(conn, channel_id, decision_id, "delivery", effect_id, now)
        if is_resolved:
            edited = _settle(conn, decision_id, effect_id, actor, now)
    if (
        is_resolved
        and not conn.execute(
            "SELECT 1 FROM effects WHERE source_resource_id = ? AND channel_id = ? AND effect_type IN (?, ?, ?) "
            "AND effect_status IN ('pending', 'applying', 'ambiguous')",
            (decision_id, channel_id, *SENT_KINDS, SETTLE),
        ).fetchone()
        and conn.execute(
            "SELECT 1 FROM effects WHERE source_resource_id = ? AND channel_id = ? AND effect_type = ?",
            (decision_id, channel_id, SETTLE),
        ).fetchone()
    ):
        _record(conn, channel_id, decision_id, "settlement", effect_id, now)
    return edited


def _record(conn: sqlite3.Connection, channel_id: str, decision_id: str, kind: str, effect_id: str, now: int) -> None:
    """An immutable receipt: the first delivery of a decision on a channel, or its settlement."""
    ident = hashlib.sha256(f"{channel_id}\0{decision_id}\0{kind}".encode()).hexdigest()[:32]
    conn.execute(
        "INSERT INTO channel_messages (channel_message_id, channel_id, decision_id, record_kind, effect_id, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (f"chanmsg-{ident}", channel_id, decision_id, kind, effect_id, now),
    )


DELIVERY_STATE = {"applied": "sent", "pending": "pending", "applying": "pending", "rejected": "failed"}


def run_id_of(conn: sqlite3.Connection, decision_id: str) -> str:
    (run_id,) = conn.execute("SELECT run_id FROM human_decisions WHERE decision_id = ?", (decision_id,)).fetchone()
    return str(run_id)


def delivery_counts(conn: sqlite3.Connection, decision_id: str) -> dict[str, int]:
    """How an open decision's deliveries stand (the waiting view): sent, pending, failed, ambiguous."""
    counts = dict.fromkeys(("sent", "pending", "failed", "ambiguous"), 0)
    for status, number in conn.execute(
        "SELECT effect_status, count(*) FROM effects WHERE source_resource_id = ? AND effect_type = ? "
        "GROUP BY effect_status",
        (decision_id, DELIVER),
    ):
        state = DELIVERY_STATE.get(status, status)
        if state in counts:
            counts[state] += number
    return counts

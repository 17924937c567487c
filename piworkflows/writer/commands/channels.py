"""The Telegram channel's commands: register, claim, updates, deliver, status, recover.

::

    channel.register   the channel resource, its row and its cursor (0); its bot id in the
                       channel.registered event; another bot later: channelBotChanged
    channel.claim      a new lease generation for the channel's manager; the cursor to poll from
    channel.updates    under that lease and only from the durable cursor (else staleCursor): each
                       update in update-id order; then the cursor is the batch's next offset
    channel.deliver    deliveries of the open decisions of routed audiences that have none yet
    channel.status     per channel: cursor and its messages by status (no ids of chats or users)
    channel.recover    an operator settles an ambiguous message: confirm (sent) or retry

A press from an allowed user, in a chat the decision was delivered to, of a choice without input
is a submission keyed ``[channelId, updateId]``: accepted (the decision's human winner, while its
deadline has not passed), or superseded (another winner; the press is told which). A choice with
input asks for it with a force-reply prompt; the reply quoting the prompt's handle is the
submission. Anyone else's press is a rejected submission (at most 64 a decision) and never competes.
Every press is answered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from piworkflows import canonical
from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import Actor, BlobValue
from piworkflows.protocol.internal.channels import (
    ChannelAllow,
    ChannelClaim,
    ChannelDeliver,
    ChannelRecover,
    ChannelRegister,
    ChannelStatus,
    ChannelUpdates,
    TelegramUpdate,
)
from piworkflows.protocol.internal.decisions import MAX_DECISION_TEXT
from piworkflows.writer import channel_effects, decisions, records
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx, adoption

MAX_REJECTED = 64  # rejected submissions recorded per decision (a stranger's presses beyond are only answered)
CHANNEL_ACTORS = frozenset({"server", "channel"})


def channel_target(tx: Tx, channel_id: str, claim: Any = None) -> Target:
    resource = records.get_resource(tx.conn, channel_id)
    if resource is None or resource.resource_kind != "channel":
        raise CommandError("channelNotFound", "no such channel", channelId=channel_id)
    return Target(channel_id, resource.revision, claim=claim)


def registered_bot(tx: Tx, channel_id: str) -> str | None:
    row = tx.conn.execute(
        "SELECT payload_digest FROM events WHERE resource_id = ? AND event_type = 'channel.registered' "
        "ORDER BY resource_revision LIMIT 1",
        (channel_id,),
    ).fetchone()
    return records.read_json(tx.conn, row[0])["botId"] if row else None


class RegisterChannel(ResourceHandler[ChannelRegister]):
    """A configured profile's channel, once: a cursor belongs to one bot."""

    model = ChannelRegister
    actors = CHANNEL_ACTORS
    fenced_by_transition = True  # its manager's lease does not stop a reload from confirming it

    def target(self, tx: Tx, cmd: ChannelRegister) -> Target:
        resource = records.get_resource(tx.conn, cmd.channel_id)
        if resource is None:
            return Target(cmd.channel_id, None, create_kind="channel")
        return channel_target(tx, cmd.channel_id)

    def transition(self, tx: Tx, cmd: ChannelRegister, resource: records.Resource | None) -> Change:
        if resource is not None:
            bot = registered_bot(tx, cmd.channel_id)
            if bot != cmd.bot_id:
                raise CommandError(
                    "channelBotChanged",
                    f"the token of profile {cmd.profile_name!r} belongs to another bot than the one its cursor "
                    "was kept for: use a new profile name for a new bot",
                    channelId=cmd.channel_id,
                )
            return adoption({"channelId": cmd.channel_id, "registered": False})
        payload = BlobValue.of_json({"botId": cmd.bot_id, "profile": cmd.profile_name})

        def apply(stamp: Stamp) -> None:
            tx.conn.execute(
                "INSERT INTO channels (channel_id, channel_kind, profile_name, created_at, updated_at) "
                "VALUES (?, 'telegram', ?, ?, ?)",
                (cmd.channel_id, cmd.profile_name, tx.now, tx.now),
            )
            tx.conn.execute(
                "INSERT INTO channel_cursors (channel_id, cursor_position, updated_at) VALUES (?, 0, ?)",
                (cmd.channel_id, tx.now),
            )

        return Change(
            event_type="channel.registered",
            apply=apply,
            blobs=[payload],
            event_payload=payload.digest,
            receipt={"channelId": cmd.channel_id, "registered": True},
        )


class ClaimChannel(Handler[ChannelClaim]):
    """The channel's lease for its manager: always a new generation (the adapter's epoch), the old
    one ended (one manager per channel serves under the server's lock)."""

    model = ChannelClaim
    actors = CHANNEL_ACTORS

    def execute(self, tx: Tx, cmd: ChannelClaim) -> Result:
        conn, now = tx.conn, tx.now
        target = channel_target(tx, cmd.channel_id)
        lease = records.get_lease(conn, cmd.channel_id)
        if lease is not None and lease.owner_id is not None:
            records.release_lease(conn, cmd.channel_id, lease.lease_generation)
        generation = records.acquire_lease(conn, cmd.channel_id, cmd.owner_id, cmd.claim_token_hash, cmd.ttl_ms, now)
        assert target.expected_revision is not None
        revision = records.increment_revision(conn, cmd.channel_id, target.expected_revision, now)
        records.write_event(conn, cmd.channel_id, revision, "channel.claimed", tx.actor, now, generation)
        (cursor,) = conn.execute(
            "SELECT cursor_position FROM channel_cursors WHERE channel_id = ?", (cmd.channel_id,)
        ).fetchone()
        return Result(revision=revision, receipt={"leaseGeneration": generation, "cursor": cursor})


@dataclass
class _Batch:
    """What one batch of updates did: the runs whose decision it resolved (with the decision's
    attempt), and counts."""

    runs: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


class ApplyUpdates(ResourceHandler[ChannelUpdates]):
    """One batch of updates, exactly once: only from the durable cursor, under the channel's lease."""

    model = ChannelUpdates
    actors = CHANNEL_ACTORS
    claim_required = True

    def target(self, tx: Tx, cmd: ChannelUpdates) -> Target:
        return channel_target(tx, cmd.channel_id, cmd.claim)

    def transition(self, tx: Tx, cmd: ChannelUpdates, resource: records.Resource | None) -> Change:
        (cursor,) = tx.conn.execute(
            "SELECT cursor_position FROM channel_cursors WHERE channel_id = ?", (cmd.channel_id,)
        ).fetchone()
        if cursor != cmd.offset:
            raise CommandError(
                "staleCursor", "the updates are not from the channel's cursor: poll from it", cursor=cursor
            )
        if cmd.next_offset < cmd.offset or any(item.update_id < cmd.offset for item in cmd.items):
            raise CommandError("validationFailed", "the updates are not at or past the offset")
        batch = _Batch()
        receipt: dict[str, Any] = {"cursor": cmd.next_offset, "counts": batch.counts}

        def apply(stamp: Stamp) -> None:
            for item in sorted(cmd.items, key=lambda update: update.update_id):
                _update(tx, cmd.channel_id, cmd.allow, item, batch)
            for run_id, attempt_id in sorted(batch.runs.items()):
                run = records.get_resource(tx.conn, run_id)
                assert run is not None
                revision = records.increment_revision(tx.conn, run_id, run.revision, tx.now)
                event = ("decision.resolved", tx.actor, tx.now, None, None, attempt_id)
                records.write_event(tx.conn, run_id, revision, *event)
            tx.conn.execute(
                "UPDATE channel_cursors SET cursor_position = ?, updated_at = ? WHERE channel_id = ?",
                (cmd.next_offset, tx.now, cmd.channel_id),
            )
            receipt["runIds"] = sorted(batch.runs)  # the scheduler queues them

        return Change(event_type="channel.updates", apply=apply, receipt=receipt)


def _update(tx: Tx, channel_id: str, allow: ChannelAllow, item: TelegramUpdate, batch: _Batch) -> None:
    """One update: a press (always answered), a reply to a prompt, or anything else (ignored)."""
    if item.update_kind == "callback":
        assert item.callback_query_id is not None
        said, run_id = _press(tx, channel_id, allow, item, channel_effects.parse_handle(item.data), None, batch)
        channel_effects.answer_callback(tx.conn, channel_id, item.callback_query_id, said, run_id, tx.actor, tx.now)
        return
    handle = channel_effects.parse_handle(item.reply_to_text)
    if handle is None or item.chat_id is None or not item.text:
        batch.count("ignored")
        return
    text = item.text
    if len(text) > MAX_DECISION_TEXT:
        said, run_id = f"Your answer is too long: at most {MAX_DECISION_TEXT} characters.", None
    else:
        said, run_id = _press(tx, channel_id, allow, item, handle, text, batch)
    channel_effects.reply(tx.conn, channel_id, item.update_id, item.chat_id, said, run_id, tx.actor, tx.now)


def _press(
    tx: Tx,
    channel_id: str,
    allow: ChannelAllow,
    item: TelegramUpdate,
    handle: tuple[str, int] | None,
    text: str | None,
    batch: _Batch,
) -> tuple[str, str | None]:
    """A choice pressed (``text`` None) or its input replied: what the user is told, and the run."""
    conn, now = tx.conn, tx.now
    row = None
    if handle is not None:
        row = conn.execute(
            "SELECT run_id, audience, request_digest FROM human_decisions WHERE decision_id = ?", (handle[0],)
        ).fetchone()
    if handle is None or row is None:
        batch.count("unknown")
        return "This button belongs to no decision waiting here.", None
    decision_id, index = handle
    run_id, audience, request_digest = row
    stored = records.read_json(conn, request_digest)
    keys = channel_effects.choice_keys(stored)
    delivered = (
        item.chat_id is not None
        and conn.execute(
            "SELECT 1 FROM effects WHERE effect_type = ? AND idempotency_key = ?",
            (channel_effects.DELIVER, canonical.dumps([decision_id, channel_id, item.chat_id])),
        ).fetchone()
    )
    if index >= len(keys) or not delivered:
        batch.count("unknown")
        return "This button belongs to no decision waiting here.", run_id
    choice = keys[index]
    response = {"choice": choice} if text is None else {"choice": choice, "input": text}
    key = canonical.dumps([channel_id, item.update_id])
    actor = Actor(actor_class="channel", actor_id=f"telegram:{item.user_id}")
    if not _allowed(allow, audience, item):
        if _count_rejected(tx, decision_id) < MAX_REJECTED:
            _submit(tx, decision_id, key, actor, channel_id, response, "rejected")
        batch.count("rejected")
        return "You may not answer this decision.", run_id
    decision = decisions.waiting(conn, run_id)
    if (
        decision is not None
        and decision.decision_id == decision_id
        and decisions.apply_deadline(conn, decision, tx.actor, now)
    ):
        batch.runs[run_id] = decision.attempt_id  # the deadline came first: it wins, this press is superseded
        decision = None
    if decision is None or decision.decision_id != decision_id:
        _submit(tx, decision_id, key, actor, channel_id, response, "superseded")
        batch.count("superseded")
        return f"Already decided: {_winner(conn, decision_id, stored)}", run_id
    if text is None and stored["choices"][choice]["input"] is not None:
        assert item.chat_id is not None
        channel_effects.prompt(conn, decision_id, channel_id, item.chat_id, item.user_id, choice, tx.actor, now)
        batch.count("prompted")
        return f"{channel_effects.label(stored, choice)}: reply to the message that asks for your text.", run_id
    submission_id = _submit(tx, decision_id, key, actor, channel_id, response, "accepted")
    decisions.resolve(conn, decision, "human", actor, now, response, submission_id)
    batch.runs[run_id] = decision.attempt_id
    batch.count("accepted")
    return f"Recorded: {channel_effects.label(stored, choice)}", run_id


def _allowed(allow: ChannelAllow, audience: str, item: TelegramUpdate) -> bool:
    """The profile's allow lists, narrowed by the audience's own."""
    narrowed = allow.audiences.get(audience)
    users = allow.user_ids if narrowed is None or narrowed.user_ids is None else narrowed.user_ids
    chats = allow.chat_ids if narrowed is None or narrowed.chat_ids is None else narrowed.chat_ids
    return (
        item.user_id in allow.user_ids
        and item.user_id in users
        and item.chat_id in allow.chat_ids
        and item.chat_id in chats
    )


def _count_rejected(tx: Tx, decision_id: str) -> int:
    (count,) = tx.conn.execute(
        "SELECT count(*) FROM human_decision_submissions WHERE decision_id = ? AND submission_outcome = 'rejected'",
        (decision_id,),
    ).fetchone()
    return int(count)


def _submit(
    tx: Tx, decision_id: str, key: str, actor: Actor, channel_id: str, response: dict[str, Any], outcome: str
) -> str:
    """A channel submission of the decision, keyed by the channel and the update id."""
    submission_id = "submission-" + hashlib.sha256(f"{decision_id}\0{key}".encode()).hexdigest()[:32]
    value = BlobValue.of_json(response)
    records.put_blob(tx.conn, value, tx.now)
    tx.conn.execute(
        "INSERT INTO human_decision_submissions (submission_id, decision_id, idempotency_key, actor_class, actor_id, "
        "channel_id, response_digest, submission_outcome, created_at) VALUES (?, ?, ?, 'channel', ?, ?, ?, ?, ?)",
        (submission_id, decision_id, key, actor.actor_id, channel_id, value.digest, outcome, tx.now),
    )
    return submission_id


def _winner(conn: Any, decision_id: str, stored: dict[str, Any]) -> str:
    name = channel_effects.winner_line(conn, decision_id, stored, channel_effects.WINNER_NAMES)
    return name or "the decision is no longer waiting"


class DeliverDecisions(Handler[ChannelDeliver]):
    """Every open decision of a routed audience gets its missing deliveries (after a reload, or when
    a channel's manager starts). Receipt: the effects reserved."""

    model = ChannelDeliver
    actors = CHANNEL_ACTORS

    def execute(self, tx: Tx, cmd: ChannelDeliver) -> Result:
        conn, now = tx.conn, tx.now
        made: list[str] = []
        if cmd.routes:
            marks = ", ".join("?" for _ in cmd.routes)
            open_decisions = conn.execute(
                "SELECT d.decision_id, d.audience FROM human_decisions d "
                "JOIN node_attempts a ON a.attempt_id = d.attempt_id "
                f"WHERE a.attempt_status = 'waiting' AND d.audience IN ({marks}) "
                "AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id) "
                "ORDER BY d.created_at",
                sorted(cmd.routes),
            ).fetchall()
            for decision_id, audience in open_decisions:
                routes = [(route.channel_id, route.chat_id) for route in cmd.routes[audience]]
                made += channel_effects.deliver(conn, decision_id, routes, tx.actor, now)
        return Result(receipt={"effectIds": made})


class ReadChannelStatus(Handler[ChannelStatus]):
    """Per channel: its cursor, its messages by status, the ambiguous ones, and the open decisions
    delivered nowhere. No chat or user ids, texts or tokens."""

    model = ChannelStatus
    actors = frozenset({"server", "client", "operator", "channel"})
    read_only = True

    def execute(self, tx: Tx, cmd: ChannelStatus) -> Result:
        conn = tx.conn
        channels = []
        for channel_id, profile, cursor, updated_at in conn.execute(
            "SELECT c.channel_id, c.profile_name, k.cursor_position, k.updated_at FROM channels c "
            "JOIN channel_cursors k ON k.channel_id = c.channel_id ORDER BY c.channel_id"
        ).fetchall():
            counts = dict(
                conn.execute(
                    "SELECT effect_status, count(*) FROM effects WHERE channel_id = ? GROUP BY effect_status",
                    (channel_id,),
                ).fetchall()
            )
            ambiguous = [
                {"messageId": effect_id, "effectType": effect_type, "runId": run_id, "attempts": attempts}
                for effect_id, effect_type, run_id, attempts in conn.execute(
                    "SELECT effect_id, effect_type, run_id, attempt_count FROM effects "
                    "WHERE channel_id = ? AND effect_status = 'ambiguous' ORDER BY created_at LIMIT 100",
                    (channel_id,),
                ).fetchall()
            ]
            channels.append(
                {
                    "channelId": channel_id,
                    "profile": profile,
                    "cursor": cursor,
                    "cursorUpdatedAt": updated_at,
                    "pending": counts.get("pending", 0) + counts.get("applying", 0),
                    "applied": counts.get("applied", 0),
                    "failed": counts.get("rejected", 0),
                    "ambiguous": ambiguous,
                }
            )
        (unrouted,) = conn.execute(
            "SELECT count(*) FROM human_decisions d JOIN node_attempts a ON a.attempt_id = d.attempt_id "
            "WHERE a.attempt_status = 'waiting' "
            "AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id) "
            "AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.source_resource_id = d.decision_id "
            f"AND e.effect_type = '{channel_effects.DELIVER}')"
        ).fetchone()
        return Result(receipt={"channels": channels, "unroutedDecisions": unrouted})


class RecoverMessage(ResourceHandler[ChannelRecover]):
    """An operator's evidence about an ambiguous channel message: it was sent (``confirm``, with its
    Telegram message id when known: then a resolved decision's settle edits it) or it was not
    (``retry``: pending now; its claim records a new numbered attempt)."""

    model = ChannelRecover
    actors = frozenset({"client", "operator"})
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: ChannelRecover) -> Target:
        resource = records.get_resource(tx.conn, cmd.effect_id)
        if resource is None or resource.resource_kind != "effect":
            raise CommandError("effectNotFound", "no such channel message", messageId=cmd.effect_id)
        return Target(cmd.effect_id, resource.revision)

    def transition(self, tx: Tx, cmd: ChannelRecover, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        status, channel_id, payload_digest = conn.execute(
            "SELECT effect_status, channel_id, payload_digest FROM effects WHERE effect_id = ?", (cmd.effect_id,)
        ).fetchone()
        if channel_id is None:
            raise CommandError("validationFailed", "not a channel message: use effect.confirm or effect.retry")
        if status != "ambiguous":
            code = "winnerDecided" if status in ("applied", "rejected", "cancelled") else "invalidTransition"
            raise CommandError(code, f"the message is {status}, not ambiguous", messageId=cmd.effect_id, status=status)
        receipt: dict[str, Any] = {"messageId": cmd.effect_id, "settleReserved": False}
        if cmd.action == "retry":
            receipt["effectStatus"] = "pending"

            def retry(stamp: Stamp) -> None:
                records.retry_effect(conn, cmd.effect_id, now)
                channel_effects.settled(conn, cmd.effect_id, "pending", tx.actor, now)

            return Change(event_type="effect.retried", apply=retry, receipt=receipt)
        chat_id = records.read_json(conn, payload_digest)["body"].get("chat_id")
        message_id = cmd.telegram_message_id
        result = BlobValue.of_json({"chatId": chat_id, "messageId": message_id, "confirmedBy": tx.actor.actor_class})
        ref = f"{chat_id}:{message_id}" if message_id is not None and chat_id is not None else None
        receipt["effectStatus"] = "applied"

        def confirm(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE effects SET effect_status = 'applied', result_digest = ?, external_ref = ?, settled_at = ?, "
                "updated_at = ? WHERE effect_id = ?",
                (result.digest, ref, now, now, cmd.effect_id),
            )
            receipt["settleReserved"] = channel_effects.settled(conn, cmd.effect_id, "applied", tx.actor, now)

        return Change(
            event_type="effect.confirmed", apply=confirm, blobs=[result], event_payload=result.digest, receipt=receipt
        )


HANDLERS = (
    RegisterChannel(),
    ClaimChannel(),
    ApplyUpdates(),
    DeliverDecisions(),
    ReadChannelStatus(),
    RecoverMessage(),
)

"""The Telegram channel: the supervisor's channel manager and the writer (writer/commands/channels.py),
and the manager and its adapter child (channels/adapter.py).

::

    manager ── channel.register {channel, profile, bot id} ──> writer: the channel and its cursor
    manager ── channel.claim {channel, owner, token hash} ──> writer: the channel's lease, its cursor
    manager ── channel.updates {claim, offset, next offset, updates, allow} ──> writer: submissions,
               answers to presses, prompts; the cursor advanced (one transaction)
    manager ── channel.deliver {routes} ──> writer: deliveries of open decisions not yet routed
    client ── channel.status / channel.recover ──> writer

    manager ── configure {channel, base url, token, cursor} ──> adapter (the token only here)
    adapter ── updates {offset, next offset, items} ──> manager ── ack {cursor} ──> adapter
    manager ── perform {effect, attempt, method, body} ──> adapter ── performed {...} ──> manager
    adapter ── fault {kind, retry after} ──> manager

Ids of Telegram chats and users are decimal strings (a channel's allow lists, routes, and the
normalised updates); none of them reaches a receipt a client reads.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from piworkflows.protocol.internal.base import Claim, Command, Digest, Frame, Id, Model, ReadCommand
from piworkflows.protocol.internal.values import (
    ChannelFault,
    ChannelRecoverAction,
    TelegramCallOutcome,
    TelegramMethod,
    TelegramUpdateKind,
)

TelegramId = str  # a decimal id, as the config writes it ("-1001234567890")
DECIMAL_ID = r"^-?[0-9]{1,20}$"
CHANNEL_ID = r"^telegram:[a-z0-9][a-z0-9_-]{0,31}$"
MAX_UPDATES = 100  # getUpdates answers at most 100 updates
EXIT_UNAUTHORIZED = 3  # an adapter whose token was refused exits so: not restarted until a reload


class ChannelRoute(Model):
    """Where a decision of an audience is delivered: a chat of a channel."""

    channel_id: str = Field(pattern=CHANNEL_ID)
    chat_id: TelegramId = Field(pattern=DECIMAL_ID)


class AudienceAllow(Model):
    """An audience's own lists, narrowing the profile's (None: the profile's)."""

    user_ids: list[TelegramId] | None = None
    chat_ids: list[TelegramId] | None = None


class ChannelAllow(Model):
    """Who may answer through the channel: the profile's allow lists and each audience's."""

    user_ids: list[TelegramId] = Field(default_factory=list, max_length=1000)
    chat_ids: list[TelegramId] = Field(default_factory=list, max_length=1000)
    audiences: dict[str, AudienceAllow] = Field(default_factory=dict)


class ChannelRegister(Command):
    """A configured profile's channel: created with its cursor at 0, or confirmed for the same bot
    (another bot is refused: channelBotChanged; a cursor belongs to one bot)."""

    kind: ClassVar[str] = "channel.register"
    channel_id: str = Field(pattern=CHANNEL_ID)
    profile_name: str = Field(min_length=1, max_length=32)
    bot_id: TelegramId = Field(pattern=DECIMAL_ID)


class ChannelClaim(Command):
    """The channel's lease for its manager (a new generation each time); the receipt names the
    cursor the adapter polls from."""

    kind: ClassVar[str] = "channel.claim"
    channel_id: str = Field(pattern=CHANNEL_ID)
    owner_id: Id
    claim_token_hash: Digest
    ttl_ms: int = Field(ge=1)


class TelegramUpdate(Model):
    """One update as the adapter normalised it: a button press (callback) or a text message."""

    update_id: int = Field(ge=0)
    update_kind: TelegramUpdateKind
    user_id: TelegramId = Field(pattern=DECIMAL_ID)
    chat_id: TelegramId | None = Field(default=None, pattern=DECIMAL_ID)
    callback_query_id: str | None = Field(default=None, max_length=256)
    data: str | None = Field(default=None, max_length=256)  # a press's callback data
    text: str | None = Field(default=None, max_length=8192)  # a message's text
    reply_to_text: str | None = Field(default=None, max_length=8192)  # the text it replies to

    @model_validator(mode="after")
    def _shape(self) -> TelegramUpdate:
        if (self.update_kind == "callback") != (self.callback_query_id is not None):
            raise ValueError("a callback, and only it, has a callback query id")
        return self


class ChannelUpdates(Command):
    """A batch of updates from ``offset``, under the channel's lease: what they cause and the cursor
    advanced to ``next_offset``, in one transaction (only from the durable cursor: staleCursor)."""

    kind: ClassVar[str] = "channel.updates"
    channel_id: str = Field(pattern=CHANNEL_ID)
    claim: Claim
    offset: int = Field(ge=0)
    next_offset: int = Field(ge=0)
    items: list[TelegramUpdate] = Field(default_factory=list, max_length=MAX_UPDATES)
    allow: ChannelAllow


class ChannelDeliver(Command):
    """Deliveries for every open decision of these audiences that has none on a route yet (after a
    reload or at the manager's start); a repeat adopts the deliveries made."""

    kind: ClassVar[str] = "channel.deliver"
    routes: dict[str, list[ChannelRoute]] = Field(default_factory=dict)


class ChannelStatus(ReadCommand):
    """Per channel: cursor, pending, failed and ambiguous messages, unrouted decisions. No chat or
    user ids, texts or tokens."""

    kind: ClassVar[str] = "channel.status"


class ChannelRecover(Command):
    """An operator settles an ambiguous channel message: confirm it was sent (its Telegram message
    id, when known, lets the decision's settle edit it) or retry (a new numbered attempt)."""

    kind: ClassVar[str] = "channel.recover"
    effect_id: Id
    action: ChannelRecoverAction
    telegram_message_id: int | None = Field(default=None, ge=1)


# --- frames between the manager and its adapter child ----------------------------------------


class Configure(Frame):
    """The first frame to an adapter: its channel, the Bot API and the cursor to poll from. The token
    travels only here (never argv, environment, database, host.json or logs)."""

    kind: ClassVar[str] = "configure"
    channel_id: str = Field(pattern=CHANNEL_ID)
    base_url: str
    token: str = Field(min_length=1, max_length=256)
    cursor: int = Field(ge=0)
    poll_timeout_s: int = Field(ge=0, le=50)
    request_timeout_ms: int = Field(ge=100)


class Updates(Frame):
    """A getUpdates batch from ``offset``: ``next_offset`` is one past its last update id."""

    kind: ClassVar[str] = "updates"
    offset: int = Field(ge=0)
    next_offset: int = Field(ge=0)
    items: list[TelegramUpdate] = Field(max_length=MAX_UPDATES)


class Ack(Frame):
    """The batch committed: the adapter polls from ``cursor`` (which confirms the batch at Telegram)."""

    kind: ClassVar[str] = "ack"
    cursor: int = Field(ge=0)


class Perform(Frame):
    """One Bot API call of a claimed channel effect; its numbered attempt is recorded."""

    kind: ClassVar[str] = "perform"
    effect_id: Id
    attempt: int = Field(ge=1)
    method: TelegramMethod
    body: dict[str, Any]


class Performed(Frame):
    """How the call ended. ``not_acted``: the request surely never reached Telegram (a manual send
    may be repeated); ``retry_after_ms``: Telegram's 429 flood wait."""

    kind: ClassVar[str] = "performed"
    effect_id: Id
    outcome: TelegramCallOutcome
    result: dict[str, Any] | None = None
    error_code: str | None = Field(default=None, max_length=64)
    error: str | None = Field(default=None, max_length=512)
    retry_after_ms: int | None = Field(default=None, ge=0)
    not_acted: bool = False


class Fault(Frame):
    """Polling met a fault: the token refused (unauthorized), another poller (pollConflict), a flood
    wait, or the network."""

    kind: ClassVar[str] = "fault"
    fault: ChannelFault
    retry_after_ms: int | None = Field(default=None, ge=0)
    detail: str = Field(default="", max_length=256)


MANAGER_FRAMES: dict[str, type[Frame]] = {model.kind: model for model in (Configure, Ack, Perform)}
ADAPTER_FRAMES: dict[str, type[Frame]] = {model.kind: model for model in (Updates, Performed, Fault)}

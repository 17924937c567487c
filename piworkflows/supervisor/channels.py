"""The server's channels: the configuration in force, and a manager per Telegram profile.

::

    start, channel.reload ── channels.json + credentials.json (supervisor/channel_config.py;
           invalid: channelConfigInvalid, unsafe: configUnsafe, both naming paths, never values)
        ── channel.register per profile (another bot: channelBotChanged; the reload is refused
           and the configuration in force stays)
        ── managers started, stopped or restarted (a changed profile: restarted)
        ── channel.deliver: every waiting decision of a routed audience gets its deliveries
    node.wait of a decision ── routes(audience): its deliveries, reserved in the same commit
    post-commit notice ── wake(): each manager looks for a due channel effect
    channel.status ── the writer's counts, with each manager's state, last poll and fault

At startup an invalid or unsafe configuration is logged and the server runs without channels
(``channels reload`` says why); the decision timer has already swept before managers start.
"""

from __future__ import annotations

import logging
from typing import Any

from piworkflows import paths
from piworkflows.errors import CommandError
from piworkflows.protocol.internal.writer import Reply
from piworkflows.supervisor import channel_config
from piworkflows.supervisor.channel_config import ChannelConfig, ChannelConfigError
from piworkflows.supervisor.channel_manager import ChannelManager
from piworkflows.supervisor.seams import ChildHub, HubWiring

log = logging.getLogger("piworkflows.supervisor")

SERVER = {"actor_class": "server"}


class Channels(ChildHub):
    def __init__(self, wiring: HubWiring) -> None:
        super().__init__(wiring)
        self.config: ChannelConfig = channel_config.EMPTY
        self.managers: dict[str, ChannelManager] = {}

    async def start(self) -> None:
        """Channel messages an older server left applying end uncertain first (a send: ambiguous)."""
        if (paths.config_dir() / channel_config.CHANNELS_FILE).exists():
            await self.writer.request("effect.recover", {"actor": SERVER})
        try:
            await self.reload()
        except CommandError as exc:
            log.warning("channels not started: %s (fix it, then run pi-workflows channels reload)", exc)

    async def stop(self) -> None:
        for manager in list(self.managers.values()):
            await manager.stop()
        self.managers.clear()

    def routes(self, audience: str) -> list[dict[str, str]]:
        """Where a decision of ``audience`` is delivered (node.wait carries them)."""
        return [{"channel_id": channel, "chat_id": chat} for channel, chat in self.config.routes(audience)]

    def wake(self) -> None:
        for manager in self.managers.values():
            manager.wake()

    async def reload(self) -> dict[str, Any]:
        """Read both files again and bring the managers in line: {configDigest, added, removed,
        restarted, deliveriesReserved}. A refusal (CommandError) keeps the configuration in force."""
        try:
            config = channel_config.load()
        except ChannelConfigError as exc:
            raise CommandError(exc.code, str(exc), paths=exc.paths) from None
        for profile in config.profiles.values():
            body = {"channel_id": profile.channel_id, "profile_name": profile.name, "bot_id": profile.bot_id}
            reply = await self.writer.request("channel.register", {"actor": SERVER, **body})
            if reply.outcome not in ("accepted", "adopted"):
                raise _refusal(reply)
        old = self.config
        added = sorted(set(config.profiles) - set(old.profiles))
        removed = sorted(set(old.profiles) - set(config.profiles))
        restarted = sorted(
            channel
            for channel in set(config.profiles) & set(old.profiles)
            if config.profiles[channel] != old.profiles[channel]
            or (channel in self.managers and self.managers[channel].state == "fatal")
        )
        self.config = config
        for channel in removed + restarted:
            manager = self.managers.pop(channel, None)
            if manager is not None:
                await manager.stop()
        for channel in sorted(config.profiles):
            if channel not in self.managers:
                self._start(channel)
            self.managers[channel].allow = config.allow(channel)
        reserved: list[str] = []
        routes = {
            audience: [{"channel_id": c, "chat_id": chat} for c, chat in pairs]
            for audience, pairs in config.all_routes().items()
            if pairs
        }
        if routes:
            reply = await self.writer.request("channel.deliver", {"actor": SERVER, "routes": routes})
            if reply.outcome != "accepted":
                raise _refusal(reply)
            reserved = (reply.receipt or {}).get("effectIds", [])
            self.wake()
        if added or removed or restarted:
            log.info(
                "channels: %d configured (%d added, %d removed, %d restarted)",
                len(config.profiles),
                len(added),
                len(removed),
                len(restarted),
            )
        return {
            "configDigest": config.digest,
            "added": added,
            "removed": removed,
            "restarted": restarted,
            "deliveriesReserved": len(reserved),
        }

    def _start(self, channel: str) -> None:
        manager = ChannelManager(
            self.config.profiles[channel],
            self.writer,
            self.recorder,
            self.settings,
            self.clock,
            self.server_epoch,
            self.wake_scheduler,
        )
        self.managers[channel] = manager
        manager.start()

    async def status(self) -> Reply:
        """channel.status: the writer's per-channel counts with each manager's state."""
        reply = await self.writer.request("channel.status", {"actor": SERVER})
        if reply.outcome != "accepted" or reply.receipt is None:
            return reply
        for item in reply.receipt["channels"]:
            manager = self.managers.get(item["channelId"])
            item["configured"] = manager is not None
            item["state"] = manager.state if manager is not None else "stopped"
            item["lastPollAt"] = manager.last_poll_at if manager is not None else None
            item["lastFault"] = manager.last_fault if manager is not None else None
        reply.receipt["configDigest"] = self.config.digest
        return reply


def _refusal(reply: Reply) -> CommandError:
    receipt = dict(reply.receipt or {})
    code = receipt.pop("code", "unavailable")
    return CommandError(code, reply.error or "the channels could not be configured", **receipt)

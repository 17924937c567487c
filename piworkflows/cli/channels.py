"""``pi-workflows channels status|reload|recover``: the Telegram channel, for operators."""

from __future__ import annotations

import sys
from typing import Any

import click

from piworkflows import canonical, isotime
from piworkflows.cli.base import EXIT_RUNTIME, accepted, main, request, say
from piworkflows.paths import StatePaths


@main.group("channels")
def channels_group() -> None:
    """The Telegram channels that deliver protected human decisions.

    Example: pi-workflows channels status
    """


@channels_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="The status as one JSON object.")
@click.pass_obj
def channels_status(paths: StatePaths, as_json: bool) -> None:
    """Each channel: its adapter's state, cursor, last poll, and its messages pending, failed and
    ambiguous (an ambiguous one waits for 'pi-workflows channels recover'). No chat or user ids,
    texts or tokens. Exits 1 when one needs attention: an ambiguous message, or a stopped channel.

    Example: pi-workflows channels status
    """
    status: dict[str, Any] = accepted(request(paths, "channel.status", {}))
    if as_json:
        click.echo(canonical.dumps(status))
    else:
        _show(status)
    if any(channel["ambiguous"] or channel["state"] == "fatal" for channel in status["channels"]):
        sys.exit(EXIT_RUNTIME)  # attention needed: an ambiguous message, or a channel stopped


def _show(status: dict[str, Any]) -> None:
    if not status["channels"]:
        say("no channels (configure channels.json, then run 'pi-workflows channels reload')")
    for channel in status["channels"]:
        polled = isotime.iso(channel["lastPollAt"]) if channel.get("lastPollAt") else "never"
        fault = f", last fault {channel['lastFault']}" if channel.get("lastFault") else ""
        say(
            f"{channel['channelId']}  {channel['state']}  cursor {channel['cursor']}  last poll {polled}{fault}  "
            f"pending {channel['pending']}  failed {channel['failed']}  ambiguous {len(channel['ambiguous'])}"
        )
        for message in channel["ambiguous"]:
            say(
                f"  ambiguous {message['messageId']}  {message['effectType']}  run {message['runId'] or '-'}  "
                f"attempts {message['attempts']}"
            )
    if status["unroutedDecisions"]:
        say(f"{status['unroutedDecisions']} waiting decision(s) delivered to no channel")


@channels_group.command("reload")
@click.pass_obj
def channels_reload(paths: StatePaths) -> None:
    """Read channels.json and credentials.json again and restart the adapters whose profile changed.

    An invalid or unsafe file is refused as a whole (the paths named, never a value) and the
    configuration in force stays.

    Example: pi-workflows channels reload
    """
    receipt = accepted(request(paths, "channel.reload", {}))
    click.echo(
        f"channels reloaded (config {receipt['configDigest'][:12]}): added {len(receipt['added'])}, "
        f"removed {len(receipt['removed'])}, restarted {len(receipt['restarted'])}, "
        f"{receipt['deliveriesReserved']} deliveries reserved"
    )


@channels_group.command("recover")
@click.argument("message_id")
@click.argument("action", type=click.Choice(["confirm", "retry"]))
@click.option("--telegram-message-id", type=click.IntRange(min=1), help="The message's id in Telegram, if known.")
@click.pass_obj
def channels_recover(paths: StatePaths, message_id: str, action: str, telegram_message_id: int | None) -> None:
    """Settle an ambiguous channel message: confirm (it reached Telegram) or retry (send it again).

    With --telegram-message-id, a confirmed message of a decided decision is edited to show its
    winner. Repeating the same command is harmless (the first answer is adopted).

    Example: pi-workflows channels recover effect-0123abcd confirm --telegram-message-id 42
    """
    payload: dict[str, Any] = {"messageId": message_id, "action": action}
    if telegram_message_id is not None:
        payload["telegramMessageId"] = telegram_message_id
    response = request(paths, "channel.recover", payload, idempotency_key=f"channel.recover:{message_id}:{action}")
    receipt = accepted(response)
    again = " (already)" if response.outcome == "adopted" else ""
    if action == "confirm":
        edit = "; its decision's edit is reserved" if receipt["settleReserved"] else ""
        click.echo(f"{message_id} confirmed sent{again}{edit}")
    else:
        click.echo(f"{message_id} will be sent again{again}")

"""``python -m piworkflows.demo telegram``: a protected decision answered by a simulated chat user.

Starts the fake Telegram Bot API on loopback (piworkflows/testing/fake_telegram.py: no network),
writes a private config directory (channels.json, and the bot token through the same code as
``pi-workflows secrets set``), starts a real server on a temporary state dir, and runs
builtin:telegram-demo. The server's adapter child delivers the decision to the chat; the
simulated user presses "Hold", is asked why (a force-reply) and answers; the message is edited to
the winner. A second run is shipped, and its notice reaches the chat. Prints the chat as it ends.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piworkflows import credentials, paths
from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from piworkflows.testing.fake_telegram import FakeTelegram, Message

TOKEN = "100200300:demo-token-never-sent-anywhere"
CHAT, USER = 5550001, 5550001  # a private chat: its id is its user's


def until(found: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := found()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.05)
    return value


def configure(config_dir: Path, base_url: str) -> None:
    """channels.json (0600, in a 0700 directory) and the token in credentials.json."""
    os.environ[paths.CONFIG_DIR_ENV] = str(config_dir)
    config_dir.mkdir(mode=0o700)
    document = {
        "schema": "pi-workflows.channels.v1",
        "audiences": {"operator": {"channels": ["telegram:demo"]}},
        "telegramProfiles": {
            "demo": {
                "credential": "telegram-demo",
                "baseUrl": base_url,
                "allowedUserIds": [str(USER)],
                "allowedChatIds": [str(CHAT)],
            }
        },
    }
    paths.write_private(config_dir / "channels.json", json.dumps(document, indent=2).encode())
    credentials.store_secret("telegram-demo", TOKEN)


def button(message: Message, label: str) -> str:
    markup = message.reply_markup or {}
    return next(str(row[0]["callback_data"]) for row in markup["inline_keyboard"] if row[0]["text"] == label)


def show_chat(telegram: FakeTelegram) -> None:
    for message in telegram.chat(CHAT):
        lines = message.text.splitlines()
        print(f"  [{message.message_id}] " + "\n      ".join(lines))


def wait_run(client: WorkflowClient, run_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        view: dict[str, Any] = client.request("view.run.get", {}, run_id=run_id).receipt
        return view if view["display"]["status"] in ("completed", "failed", "cancelled", "timed_out") else None

    done: dict[str, Any] = until(ended, f"run {run_id}")
    return done


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="piw-telegram-demo-") as tmp, FakeTelegram(TOKEN) as telegram:
        state = StatePaths.resolve(Path(tmp) / "state")
        configure(Path(tmp) / "config", telegram.base_url)
        print(f"state dir: {state.state_dir}; fake Bot API: {telegram.base_url}")
        start_server(state)
        try:
            with WorkflowClient(state.state_dir) as client:
                start = {"projectPath": tmp, "workflowName": "builtin:telegram-demo", "input": {"release": "1.2.0"}}
                held = client.request("run.start", start).receipt["runId"]
                print(f"run {held}: the decision is delivered to the chat")
                (asked,) = until(lambda: telegram.chat(CHAT), "the delivery")
                print(f"the user presses 'Hold' on message {asked.message_id}")
                telegram.press(CHAT, USER, asked.message_id, button(asked, "Hold"))
                prompt = until(lambda: telegram.chat(CHAT)[1:], "the prompt for a reason")[0]
                print("the bot asks why; the user replies")
                telegram.reply(CHAT, USER, "the changelog is not ready", reply_to=prompt.message_id)
                done = wait_run(client, held)
                print(f"run {held} {done['display']['status']}: {json.dumps(done['state']['outputs']['held'])}")

                shipped = client.request("run.start", {**start, "input": {"release": "1.2.1"}}).receipt["runId"]
                latest = until(lambda: [m for m in telegram.chat(CHAT) if "1.2.1" in m.text], "the second delivery")[0]
                print(f"run {shipped}: the user presses 'Ship it'")
                telegram.press(CHAT, USER, latest.message_id, button(latest, "Ship it"))
                done = wait_run(client, shipped)
                until(lambda: any("is shipping" in m.text for m in telegram.chat(CHAT)), "the notice")
                until(
                    lambda: all(not (m.reply_markup or {}).get("inline_keyboard") for m in telegram.chat(CHAT)),
                    "the edits",
                )
                print(f"run {shipped} {done['display']['status']}; the chat now reads:")
                show_chat(telegram)
                status = client.request("channel.status", {}).receipt["channels"][0]
                calls = f"{status['applied']} Bot API calls done"
                print(f"channel {status['channelId']}: {status['state']}, cursor {status['cursor']}, {calls}")
        finally:
            stop_server(state)
    return 0 if done["display"]["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

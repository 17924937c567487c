"""Protected human decisions answered through Telegram: a real server, its adapter child, and the
fake Bot API on loopback (piworkflows/testing/fake_telegram.py). The token is only in
credentials.json; the chat users are simulated by the fake."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piworkflows.testing.fake_telegram import FakeTelegram, TooMany
from tests.engine_util import start, wait_status, write
from tests.integration.test_human_decisions import APPROVE
from tests.server_util import SCHEDULER_TICK, ServerProcess, serving, wait_until

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
    assert ALICE not in leaves(status) and str(ALICE) not in leaves(status)  # a value, not a digest's digits
    assert TOKEN not in json.dumps(status)


def leaves(value: Any) -> list[Any]:
    """Every scalar in a JSON value, and every word of its strings."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in leaves(item)]
    return [value, *value.replace(":", " ").split()] if isinstance(value, str) else [value]


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


def status(server: ServerProcess) -> dict:
    (channel,) = json.loads(server.cli("channels", "status", "--json").stdout)["channels"]
    return dict(channel)


def test_a_cancel_wins_over_a_later_press_and_the_message_says_so(telegram, server: ServerProcess, project):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    (private,) = delivered(telegram, OPS)
    ship = button(private, "Ship it")  # (the message object is edited in place)
    assert server.cli("run", "cancel", run_id).returncode == 0
    wait_status(server, run_id, "cancelled")
    wait_until(lambda: telegram.chat(OPS)[0].text.endswith("Cancelled: the run was cancelled"), what="the edit")
    telegram.press(OPS, ALICE, private.message_id, ship)
    wait_until(lambda: telegram.answered, what="the late press answered")
    assert list(telegram.answered.values()) == ["Already decided: the run was cancelled"]


def test_a_decision_with_no_default_expires_and_its_message_says_so(telegram, server: ServerProcess, project):
    write(project, "approve", APPROVE.format(on_timeout={"after_ms": 1500}))
    run_id = start(server, project, "approve")
    delivered(telegram, OPS)
    wait_status(server, run_id, "failed", "timed_out")
    wait_until(
        lambda: telegram.chat(OPS)[0].text.endswith("Expired: the deadline passed with no answer"),
        what="the message edited to the expiry",
    )


@pytest.mark.server_env(PIW_FAULTS="channel.after_request_sent=crash@1")
def test_an_adapter_killed_after_its_send_was_processed_leaves_it_ambiguous_until_recovered(
    telegram, server: ServerProcess, project
):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    wait_until(lambda: status(server)["ambiguous"], what="the interrupted send ambiguous")
    (ambiguous,) = status(server)["ambiguous"]
    assert ambiguous["effectType"] == "telegram.deliver" and ambiguous["attempts"] == 1
    # the interrupted one (Telegram processed it) and, by the restarted adapter, the other chat's
    wait_until(lambda: telegram.chat(OPS) and telegram.chat(GROUP), what="a message in each chat")
    assert server.cli("effect", "retry", ambiguous["messageId"]).returncode == 1  # useChannelRecover
    assert len(telegram.calls("sendMessage")) == 2  # never sent again on its own
    # the operator finds the message in the chat and confirms it with its id
    confirmed = server.cli("channels", "recover", ambiguous["messageId"], "confirm", "--telegram-message-id", "1")
    assert confirmed.returncode == 0, confirmed.stderr
    assert status(server)["ambiguous"] == []
    assert server.cli("decide", run_id, "approve", "ship").returncode == 0
    wait_until(
        lambda: all(telegram.chat(c)[0].text.endswith("Decided: Ship it") for c in (OPS, GROUP)),
        what="both messages edited, the confirmed one too",
    )
    assert len(telegram.calls("sendMessage")) == 2


def test_a_429_is_honoured_before_the_next_request_of_the_bot(telegram, server: ServerProcess, project):
    telegram.script("sendMessage", TooMany(2))
    write(project, "approve", APPROVE.format(on_timeout=None))
    start(server, project, "approve")
    first = wait_until(lambda: telegram.calls("sendMessage"), what="the first send (429)")
    refused_at = time.monotonic()
    assert len(first) == 1
    wait_until(lambda: len(telegram.calls("sendMessage")) >= 2, what="the send again after retry_after")
    assert time.monotonic() - refused_at >= 1.8  # retry_after 2 s (less the poll's 20 ms steps)
    delivered(telegram, OPS)
    delivered(telegram, GROUP)


@pytest.mark.parametrize("point", ["channel.after_updates_received", "channel.after_updates_committed"])
def test_an_adapter_killed_around_a_batch_commit_accepts_each_press_once(
    telegram, config_dir, tmp_path, project, point
):
    write(project, "approve", APPROVE.format(on_timeout=None))
    env = {**SCHEDULER_TICK, "PI_WORKFLOWS_CONFIG_DIR": str(config_dir), "PIW_FAULTS": f"{point}=crash@1"}
    with serving(tmp_path / "s", env) as server:
        run_id = start(server, project, "approve")
        (private,) = delivered(telegram, OPS)
        telegram.press(OPS, ALICE, private.message_id, button(private, "Ship it"))
        finished = wait_status(server, run_id, "completed")
        assert finished["state"]["outputs"]["approve"] == {"choice": "ship", "resolution": "human"}
        wait_until(lambda: telegram.answered, what="the press answered")
        assert list(telegram.answered.values()) == ["Recorded: Ship it"]  # once: one submission
        assert "adapter exited" in server.server_log()
        state = json.loads(server.cli("state", "status", "--json").stdout)
    assert state["counts"]["decisions"] == 1
    # the batch's offset was confirmed at Telegram only after its commit: every confirmation came
    # from a getUpdates whose offset the database held
    assert telegram.confirmed and max(telegram.confirmed) == 2


def test_the_token_is_in_no_file_of_the_state_dir_backup_or_log(telegram, server: ServerProcess, project, tmp_path):
    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    (private,) = delivered(telegram, OPS)
    telegram.press(OPS, ALICE, private.message_id, button(private, "Ship it"))
    wait_status(server, run_id, "completed")
    backup = tmp_path / "backup.sqlite"
    assert server.cli("state", "backup", str(backup)).returncode == 0
    secret = TOKEN.encode()
    files = [p for p in server.state_dir.rglob("*") if p.is_file()] + [backup]
    assert any(p.name.endswith("-wal") or p.suffix == ".sqlite" for p in files)
    for path in files:
        assert secret not in path.read_bytes(), path
    assert TOKEN not in server.output()


NOTIFY = """
from piworkflows.workflows import compute, define_workflow, edge, notify
nodes = {
    "build": compute(lambda ctx: {"version": "1.2"}),
    "tell": notify("progress", lambda ctx: f"built {ctx.outputs['build']['version']}", audience="operator"),
}
workflow = define_workflow("tell", "build", nodes, [edge("build", "tell")])
"""


def test_a_notify_with_an_audience_is_sent_to_its_chats_once(telegram, server: ServerProcess, project):
    write(project, "tell", NOTIFY)
    run_id = start(server, project, "tell")
    wait_status(server, run_id, "completed")
    wait_until(lambda: telegram.chat(OPS) and telegram.chat(GROUP), what="the notice in both chats")
    assert [m.text for m in (*telegram.chat(OPS), *telegram.chat(GROUP))] == ["built 1.2", "built 1.2"]
    assert status(server)["applied"] == 2


def test_the_telegram_demo_runs_end_to_end(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "piworkflows.demo", "telegram"],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert '{"held": true, "reason": "the changelog is not ready"}' in result.stdout
    assert "Decided: Ship it" in result.stdout and "Release 1.2.1 is shipping." in result.stdout
    assert "demo-token" not in result.stdout + result.stderr
    assert not (tmp_path / ".pi").exists()


def test_a_reload_refuses_an_unsafe_file_and_another_bot_and_keeps_the_channel(telegram, server, config_dir):
    wait_until(lambda: status(server)["state"] == "running", what="the channel running")
    os.chmod(config_dir / "channels.json", 0o644)
    unsafe = server.cli("channels", "reload")
    assert unsafe.returncode == 1 and "configUnsafe" in unsafe.stderr and "chmod 600" in unsafe.stderr
    os.chmod(config_dir / "channels.json", 0o600)
    other = config_dir / "credentials.json"
    other.write_text(json.dumps({"secrets": {"telegram-ops": "999999:another-bot"}}))
    changed = server.cli("channels", "reload")
    assert changed.returncode == 1 and "channelBotChanged" in changed.stderr
    assert "another-bot" not in changed.stderr + server.server_log()
    other.write_text(json.dumps({"secrets": {"telegram-ops": TOKEN}}))
    again = server.cli("channels", "reload")
    assert again.returncode == 0 and "added 0, removed 0, restarted 0" in again.stdout, again.stderr
    assert status(server)["state"] == "running"
    shown = server.cli("channels", "status")
    assert shown.returncode == 0 and "telegram:ops  running" in shown.stdout


def test_a_press_after_the_deadline_loses_to_the_timeout_policy(telegram, server: ServerProcess, project):
    write(project, "approve", APPROVE.format(on_timeout={"after_ms": 1500, "response": {"choice": "ship"}}))
    run_id = start(server, project, "approve")
    (private,) = delivered(telegram, OPS)
    replan = button(private, "Replan")
    finished = wait_status(server, run_id, "completed")
    assert finished["state"]["outputs"]["approve"] == {"choice": "ship", "resolution": "timeoutPolicy"}
    telegram.press(OPS, ALICE, private.message_id, replan)
    wait_until(lambda: telegram.answered, what="the late press answered")
    assert list(telegram.answered.values()) == ["Already decided: Ship it (the default at the deadline)"]
    wait_until(lambda: telegram.chat(OPS)[0].text.endswith("Deadline passed: Ship it (the default)"), what="the edit")

"""The harness's Telegram side (``--telegram``): the fake Bot API, the configuration the servers
read, the simulated chat users, and the quiet period's decisions.

::

    harness process ── FakeTelegram (127.0.0.1, piworkflows/testing/fake_telegram.py)
                          <── each server's adapter child (host.json role "channel": a kill target)
    config dir (0700), written before every server start: channels.json (profile ``crash``, both
        chats allowed, audience ``operator``) and credentials.json (the token), each 0600
    chat users (a thread): every decision message that shows a keyboard is pressed once, a seeded
        button after a seeded delay of up to 1 s, from the private chat's user or one of the
        group's two; for some decisions twice (the same message) or in both chats (a second press:
        superseded); every press's update id is logged (telegram.jsonl) before it counts
    quiet period: a paused or parked decision run is resumed; a waiting decision whose deliveries
        are all settled, whose messages were all pressed and whose presses were all consumed (the
        channel's cursor past the last update) is answered by the operator (decision.answer,
        source operator); an ambiguous message is never retried (``channels recover`` is never
        used): the report counts them

The oracles that judge this evidence are in ``telegram_oracles.py``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from piworkflows import paths
from piworkflows.testing.fake_telegram import FakeTelegram, Message
from stress.crash import evidence, telegram_oracles, workload
from stress.crash.snapshot import State
from stress.crash.telegram_oracles import decision_of

TOKEN = "515151:crash-harness-token-only-on-loopback"
PROFILE, CREDENTIAL = "crash", "telegram-crash"
CHANNEL_ID = f"telegram:{PROFILE}"
PRIVATE = 7001  # a private chat: its id is its user's
GROUP, GROUP_USERS = -7002, (7001, 7003)  # a group where both may answer
CHATS = (PRIVATE, GROUP)
CHOICES = ("hold", "ship")
# How the users treat a decision they see first: press once, twice (the same message), or in both
# chats (when the other chat's message still shows its keyboard).
PLANS, PLAN_WEIGHTS = ("once", "twice", "both"), (70, 15, 15)
PRESS_DELAY_S = 1.0  # a press comes up to this long after the message is seen
AGAIN_DELAY_S = 0.3  # a second press of the same message, this long at most after the first
LOOK_S = 0.05  # how often the users look at their chats
OPERATOR_AFTER_S = 20.0  # a decision still waiting this long in the quiet period is answered anyway
RESUME_AGAIN_S = 2.0
# The channel's durations (the defaults: an adapter killed again and again would back off for a minute).
SERVER_ENV = {
    "PI_WORKFLOWS_CHANNEL_RESTART_MIN_MS": "20",
    "PI_WORKFLOWS_CHANNEL_RESTART_MAX_MS": "300",
    "PI_WORKFLOWS_TELEGRAM_POLL_TIMEOUT_S": "2",
    "PI_WORKFLOWS_TELEGRAM_REQUEST_TIMEOUT_MS": "10000",
}


def _buttons(message: Message) -> list[str]:
    """The callback data of a message's keyboard (none once its decision was settled)."""
    rows = (message.reply_markup or {}).get("inline_keyboard") or []
    return [str(row[0]["callback_data"]) for row in rows if row]


class ChatUsers:
    """The simulated people in both chats: a thread pressing the decision messages' buttons."""

    def __init__(self, fake: FakeTelegram, seed: int, log: evidence.EvidenceLog) -> None:
        self.fake, self.log = fake, log
        self.rng = random.Random(f"{seed}:telegram")
        self.lock = threading.Lock()
        self.seen: set[tuple[int, int]] = set()  # (chat, message id) looked at
        self.plans: dict[str, str] = {}  # run id -> how its decision is pressed
        self.due: list[dict[str, Any]] = []  # presses to make: at, chat, message, run, times
        self.last_update: int | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="crash-chat-users", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.step(time.monotonic())
            self.stopping.wait(LOOK_S)

    def step(self, now: float) -> None:
        with self.lock:
            for chat in CHATS:
                for message in self.fake.chat(chat):
                    self._look(chat, message, now)
            for press in [p for p in self.due if p["at"] <= now]:
                self.due.remove(press)
                self._press(press, now)

    def _look(self, chat: int, message: Message, now: float) -> None:
        where = (chat, message.message_id)
        if where in self.seen or not _buttons(message):
            return
        self.seen.add(where)
        shown = decision_of(message.text)
        if shown is None:
            return
        run_id = shown[0]
        plan = self.plans.get(run_id)
        if plan is None:
            plan = self.plans[run_id] = self.rng.choices(PLANS, PLAN_WEIGHTS)[0]
        elif plan != "both":
            return  # its decision was pressed in the other chat
        times = 2 if plan == "twice" else 1
        at = now + self.rng.uniform(0, PRESS_DELAY_S)
        self.due.append({"at": at, "chat": chat, "message": message.message_id, "runId": run_id, "times": times})

    def _press(self, press: dict[str, Any], now: float) -> None:
        chat, message_id = press["chat"], press["message"]
        found = [m for m in self.fake.chat(chat) if m.message_id == message_id]
        buttons = _buttons(found[0]) if found else []
        if not buttons:
            return  # settled meanwhile: its keyboard is gone
        data = self.rng.choice(buttons)
        user = PRIVATE if chat == PRIVATE else self.rng.choice(GROUP_USERS)
        update_id = self.fake.press(chat, user, message_id, data)
        self.log.append(
            {
                "t": "press",
                "updateId": update_id,
                "chat": chat,
                "user": user,
                "messageId": message_id,
                "runId": press["runId"],
                "data": data,
                "at": time.time(),
            }
        )
        self.last_update = update_id
        if press["times"] > 1:
            again = now + self.rng.uniform(0, AGAIN_DELAY_S)
            self.due.append({**press, "at": again, "times": press["times"] - 1})

    def outlook(self) -> tuple[set[str], int]:
        """The runs whose decision the users may still press, and how many presses may still come:
        one due, or a message that shows its keyboard and was not looked at yet."""
        with self.lock:
            busy = {press["runId"] for press in self.due}
            outstanding = len(self.due)
            for chat in CHATS:
                for message in self.fake.chat(chat):
                    shown = decision_of(message.text)
                    if shown and (chat, message.message_id) not in self.seen and _buttons(message):
                        busy.add(shown[0])
                        outstanding += 1
            return busy, outstanding


class TelegramSide:
    """The fake Bot API (served until :meth:`close`), the config dir, the users and the operator."""

    def __init__(self, work: Path, seed: int, evidence_dir: Path) -> None:
        self.config_dir = work / "config"
        self.fake = FakeTelegram(TOKEN)
        self.base_url = self.fake.start()
        self.log_path = evidence_dir / "telegram.jsonl"
        self.log = evidence.EvidenceLog(self.log_path)
        self.users = ChatUsers(self.fake, seed, self.log)
        self.rng = random.Random(f"{seed}:operator")
        self.retry: dict[str, tuple[str, Any, str]] = {}  # key -> (op, payload, run): no final answer yet
        self.asked: set[str] = set()  # decisions the operator answered
        self.resumed: dict[str, float] = {}  # run -> when the quiet period last resumed it
        self.waiting_since: dict[str, float] = {}  # decision -> when the quiet period first saw it waiting

    def env(self) -> dict[str, str]:
        return {**SERVER_ENV, paths.CONFIG_DIR_ENV: str(self.config_dir)}

    def write_config(self) -> None:
        """channels.json and credentials.json (0600) in a 0700 directory, before a server starts."""
        self.config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.config_dir, 0o700)
        allowed_users = sorted({str(PRIVATE), *map(str, GROUP_USERS)})
        document = {
            "schema": "pi-workflows.channels.v1",
            "telegramProfiles": {
                PROFILE: {
                    "credential": CREDENTIAL,
                    "baseUrl": self.base_url,
                    "allowedUserIds": allowed_users,
                    "allowedChatIds": [str(chat) for chat in CHATS],
                }
            },
            "audiences": {"operator": {"channels": [CHANNEL_ID]}},
        }
        paths.write_private(self.config_dir / "channels.json", json.dumps(document, indent=2).encode())
        secrets = {"secrets": {CREDENTIAL: TOKEN}}
        paths.write_private(self.config_dir / "credentials.json", json.dumps(secrets).encode())

    # --- the quiet period ---------------------------------------------------------------------

    def settle(self, final: workload.Client) -> int:
        """One look at the decision runs in the quiet period: what is left (decision runs not ended,
        updates not consumed, channel messages unsettled). Paused or parked decision runs are
        resumed; a waiting decision nobody can press any more is answered by the operator."""
        for key, (op, payload, run_id) in list(self.retry.items()):
            self._send(final, op, payload, run_id, key)
        # In this order: a decision whose deliveries were all settled when its view was read has its
        # messages at the fake; the users had looked at them (not busy) and every press they made
        # had been consumed (the cursor read last) or the decision would not wait.
        views = {run_id: final.status(run_id) for run_id in _unended(final)}
        busy, outstanding = self.users.outlook()
        last = self.users.last_update
        channel = self._channel(final)
        behind = last is not None and channel["cursor"] < last + 1
        left = len(views) + outstanding + int(behind) + channel["pending"]
        now = time.monotonic()
        for run_id, view in views.items():
            if view is None:
                continue
            ours = view["piworkflows"]
            if view["state"]["paused"] or ours["parkReason"]:
                if now - self.resumed.get(run_id, -RESUME_AGAIN_S) >= RESUME_AGAIN_S:
                    self.resumed[run_id] = now
                    self._send(final, "run.resume", None, run_id, f"quiet-resume-{run_id}-{final.sent}")
                continue
            pending = ours.get("pending") or {}
            if ours["status"] != "waiting" or pending.get("kind") != "human_decision":
                continue
            decision = pending["decision"]
            decision_id = decision["decisionId"]
            waited = now - self.waiting_since.setdefault(decision_id, now)
            pressable = behind or decision["deliveries"]["pending"] > 0 or run_id in busy
            if decision_id not in self.asked and (not pressable or waited > OPERATOR_AFTER_S):
                self.asked.add(decision_id)
                answer = {
                    "nodePath": pending["nodePath"],
                    "choice": self.rng.choice(CHOICES),
                    "source": "operator",
                    "decisionId": decision_id,
                }
                self._send(final, "decision.answer", answer, run_id, f"quiet-decide-{decision_id}")
        return left

    def _send(self, final: workload.Client, op: str, payload: Any, run_id: str, key: str) -> None:
        """A command with its key, sent again with it until it has a final answer."""
        response = final.send(op, payload, run_id, key=key)
        if response is None or response.outcome == "unavailable":
            self.retry[key] = (op, payload, run_id)
        else:
            self.retry.pop(key, None)

    @staticmethod
    def _channel(final: workload.Client) -> dict[str, Any]:
        response = final.client.request("channel.status", {})
        if response.outcome != "accepted":
            raise ConnectionError(f"channel.status: {response.outcome}")
        for channel in response.receipt["channels"]:
            if channel["channelId"] == CHANNEL_ID:
                return dict(channel)
        return {"cursor": 0, "pending": 1}  # not registered yet: wait for it

    # --- evidence and report -------------------------------------------------------------------

    def evidence(self) -> dict[str, Any]:
        """After the server stopped: every press, every sendMessage that reached the fake, and the
        offsets getUpdates confirmed."""
        presses = [record for record in evidence.load(self.log_path) if record["t"] == "press"]
        sends = [{"chat": body.get("chat_id"), "text": body.get("text")} for body in self.fake.calls("sendMessage")]
        return {
            "channelId": CHANNEL_ID,
            "presses": presses,
            "sends": sends,
            "confirmed": list(self.fake.confirmed),
            "lastUpdate": max((press["updateId"] for press in presses), default=None),
        }

    def close(self) -> None:
        self.users.stop()
        self.fake.stop()
        self.log.close()


def _unended(final: workload.Client) -> list[str]:
    """The decision runs (restarted ones too) that have not ended."""
    payload: dict[str, Any] = {
        "workflowName": workload.DECISION_WORKFLOW,
        "status": ["queued", "running", "waiting"],
        "limit": 256,
    }
    found = []
    while True:
        response = final.client.request("run.list", payload)
        if response.outcome != "accepted":
            raise ConnectionError(f"run.list: {response.outcome}")
        page = response.receipt
        found += [item["runId"] for item in page["items"]]
        if page["cursor"] is None:
            return found
        payload["cursor"] = page["cursor"]


def counts(found: dict[str, Any], state: State) -> dict[str, Any]:
    """The report's Telegram figures."""
    seen = found["telegram"]
    runs = [run["status"] for run in state.runs.values() if run["workflow"] == workload.DECISION_WORKFLOW]
    submissions = [s["outcome"] for s in state.decision_submissions if s["channelId"] == seen["channelId"]]
    deliveries = Counter(e["status"] for e in state.channel_effects.values() if e["type"] == "telegram.deliver")
    operator = {
        (ack["clientId"], ack["key"])
        for ack in found["acks"]
        if ack["op"] == "decision.answer" and ack["outcome"] in ("accepted", "adopted")
    }
    return {
        "decisionRuns": len(runs),
        "ended": {status: runs.count(status) for status in sorted(telegram_oracles.TERMINAL)},
        "decisions": len(state.decisions),
        "resolutions": dict(
            sorted(Counter(d["resolution"] for d in state.decisions.values() if d["resolution"]).items())
        ),
        "presses": len(seen["presses"]),
        "submissions": {outcome: submissions.count(outcome) for outcome in ("accepted", "superseded", "rejected")},
        "operatorAnswers": len(operator),
        "sendMessages": len(seen["sends"]),
        "deliveries": dict(sorted(deliveries.items())),
        "ambiguousMessages": sum(e["status"] == "ambiguous" for e in state.channel_effects.values()),
        "channelEffects": len(state.channel_effects),
        "cursor": state.cursors.get(seen["channelId"]),
        "lastUpdate": seen["lastUpdate"],
    }

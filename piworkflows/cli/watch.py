"""Following a run from the CLI (``run watch``, ``run start --wait``): poll run.status, print what changed.

::

    CLI ── run.status ──> server        every watch_poll_min_ms after a change, doubling to
        <── run view ───                watch_poll_max_ms while nothing changes
    Follower: this view against the last one -> stepStarted / stepFinished / waiting / finished
    stop once the run is settled: finished, paused, ambiguous, waiting for a person (an agent step
    goes on by itself), or parked (not for a shutdown)

Human output is one plain line per event; on a terminal a status line (the current node and the
elapsed time) is redrawn with \\r and cleared before each event line. With --json each event is one
JSON object per line. Polling stands in until live subscriptions (view.run.watch) exist.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import click

from piworkflows import canonical
from piworkflows.cli import story
from piworkflows.cli.base import EXIT_INTERRUPTED, accepted, command_line, fail
from piworkflows.client import ClientError, ServerNotRunning, WorkflowClient
from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.states import ACTIVE_ATTEMPT_STATUSES, AGENT_NODE_KINDS, TERMINAL_RUN_STATUSES

# Display statuses after which a run moves on only when someone acts (a waiting or queued run:
# see settled).
SETTLED = TERMINAL_RUN_STATUSES | {"paused", "ambiguous"}


def settled(view: dict[str, Any]) -> bool:
    """Whether the run moves on only when someone acts: it ended, is paused or ambiguous, waits for
    a person (not at an agent step: the server's agent works on that), or is parked for a reason
    other than a shutdown (the run's park reason fact; never the display's words)."""
    status = view["display"]["status"]
    if status == "waiting":
        current = view["piworkflows"]["currentStep"]
        return current is None or current["nodeKind"] not in AGENT_NODE_KINDS
    if status == "queued":
        return view["run"]["parkReason"] not in (None, "shutdown")
    return status in SETTLED


def _step_fields(step: dict[str, Any]) -> dict[str, Any]:
    names = ("stepIndex", "nodePath", "nodeKind", "visit", "attempt", "startedAt")
    return {name: step[name] for name in names}


class Follower:
    """Successive run views as events: each step's start and end once, each wait once, the end once.

    Events are ``(event, step)``: the JSON object printed with --json, and the step it is about.
    """

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}  # step index -> the status last seen
        self.waited: str | None = None  # the attempt whose wait was reported
        self.ended = False

    def events(self, view: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        run_id, status = view["runId"], view["display"]["status"]
        steps = list(view["steps"]["items"])
        current = view["piworkflows"]["currentStep"]
        if current is not None and all(s["stepIndex"] != current["stepIndex"] for s in steps):
            steps.append(current)  # past the steps' page
        events: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        for step in steps:
            before = self.seen.get(step["stepIndex"])
            if before is None:
                events.append(({"event": "stepStarted", "runId": run_id, **_step_fields(step)}, step))
            if step["status"] not in ACTIVE_ATTEMPT_STATUSES and (before is None or before in ACTIVE_ATTEMPT_STATUSES):
                ended = {name: step[name] for name in ("status", "outcome", "finishedAt", "durationMs", "errorCode")}
                events.append(({"event": "stepFinished", "runId": run_id, **_step_fields(step), **ended}, step))
            self.seen[step["stepIndex"]] = step["status"]
        if status == "waiting" and current is not None and current["attemptId"] != self.waited:
            self.waited = current["attemptId"]
            events.append(
                (
                    {
                        "event": "waiting",
                        "runId": run_id,
                        **_step_fields(current),
                        "status": "waiting",
                        "request": current["request"],
                    },
                    current,
                )
            )
        if status in TERMINAL_RUN_STATUSES and not self.ended:
            self.ended = True
            events.append(
                ({"event": "finished", "runId": run_id, "status": status, "errorCode": view["run"]["errorCode"]}, None)
            )
        return events


def event_lines(event: dict[str, Any], step: dict[str, Any] | None) -> list[str]:
    """An event for people; the run's end is told by ``story.outcome`` after the watch."""
    if step is None:
        return []
    label = story.step_label(step)
    if event["event"] == "stepStarted":
        return [f"{story.clock(step['startedAt'])}  {label} started"]
    if event["event"] == "stepFinished":
        line = f"{story.clock(step['finishedAt'])}  {label} {step['status']}, {story.duration(step['durationMs'])}"
        error = step.get("error")
        if isinstance(error, str) and error:
            line += f": {error.splitlines()[0]}"
        return [story.cut(line, story.WIDTH)]
    if step["nodeKind"] in AGENT_NODE_KINDS:  # the server's agent works on it: the run goes on
        return [story.cut(f"{story.clock(step['startedAt'])}  {label} waits for its agent's result", story.WIDTH)]
    return [
        story.cut(f"{event['runId']} waits at {step['nodePath']}", story.WIDTH),
        *story.question(event["runId"], step, indent=2),
    ]


class _LiveLine:
    """On a terminal: one status line, redrawn in place and cleared before anything else is printed."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.drawn = enabled, False

    def clear(self) -> None:
        if self.drawn:
            click.echo("\r" + " " * (story.WIDTH - 1) + "\r", nl=False)
            self.drawn = False

    def draw(self, view: dict[str, Any]) -> None:
        if not self.enabled:
            return
        now = int(time.time() * 1000)
        run, current, display = view["run"], view["piworkflows"]["currentStep"], view["display"]
        elapsed = story.duration(max(0, now - (run["startedAt"] or run["createdAt"])))
        if current is not None:
            step_time = story.duration(max(0, now - current["startedAt"]))
            text = f"{story.step_label(current)} {current['status']} for {step_time}; run time {elapsed}"
        else:
            text = f"{story.status_text(display)}; run time {elapsed}"
        click.echo("\r" + story.cut(text, story.WIDTH - 1).ljust(story.WIDTH - 1), nl=False)
        self.drawn = True


def follow(
    paths: StatePaths, run_id: str, emit: Callable[[dict[str, Any], dict[str, Any] | None], None] | None, live: bool
) -> dict[str, Any]:
    """Poll the run until it is settled; hand each event to ``emit`` (None: print nothing); return the
    last view. ``live``: keep the status line on a terminal."""
    settings = Settings.from_env()
    follower, line = Follower(), _LiveLine(live and sys.stdout.isatty())
    delay = settings.watch_poll_min_ms
    try:
        with WorkflowClient(paths.state_dir) as client:
            client.connect()  # no server: said at once (a later loss is retried like any request)
            while True:
                view: dict[str, Any] = accepted(client.request("run.status", {}, run_id=run_id))
                events = follower.events(view)
                if events:
                    line.clear()
                    delay = settings.watch_poll_min_ms
                for event, step in events:
                    if emit is not None:
                        emit(event, step)
                if settled(view):
                    return view
                line.draw(view)
                time.sleep(delay / 1000)
                delay = min(delay * 2, settings.watch_poll_max_ms)
    except ServerNotRunning as exc:
        fail(f"{exc}; start it with '{command_line('server', 'start')}'")
    except (ClientError, OSError) as exc:  # lost for longer than the client retries
        fail(f"the server stopped answering ({exc}); watch again with '{command_line('run', 'watch', run_id)}'")
    finally:
        line.clear()


def interrupted(run_id: str) -> NoReturn:
    """Ctrl-C while following: the run goes on; say how to find it again, exit 130."""
    click.echo(f"\npi-workflows: interrupted; {run_id} goes on", err=True)
    for label, words in (
        ("see it", ("run", "status")),
        ("watch it", ("run", "watch")),
        ("cancel it", ("run", "cancel")),
    ):
        click.echo(f"  {label + ':':<10} {command_line(*words, run_id)}", err=True)
    sys.exit(EXIT_INTERRUPTED)


def print_human(event: dict[str, Any], step: dict[str, Any] | None) -> None:
    for text in event_lines(event, step):
        click.echo(text)


def print_json(event: dict[str, Any], step: dict[str, Any] | None) -> None:
    click.echo(canonical.dumps(event))

"""Following a run from the CLI (``run watch``, ``run start --wait``): watch the run's view, print
what changed.

::

    CLI ── view.run.watch ──> server    (views/watch.py: its own connection)
        <── run_snapshot ───            now and after each change; the newest when several waited
    Follower: this view against the last one -> stepStarted / stepFinished / waiting / finished
    stop once the run is settled: finished, paused, ambiguous, waiting for a person (an agent step
    goes on by itself), or parked (not for a shutdown)

Human output is one plain line per event; on a terminal a status line (the current node and the
elapsed time) is redrawn with \\r and cleared before each event line. With --json each event is one
JSON object per line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import click

from piworkflows import canonical
from piworkflows.cli import run_view, story
from piworkflows.cli.base import EXIT_INTERRUPTED, command_line, fail, say
from piworkflows.client import ClientError, ServerNotRunning, WorkflowClient
from piworkflows.paths import StatePaths
from piworkflows.states import ACTIVE_ATTEMPT_STATUSES, AGENT_NODE_KINDS, TERMINAL_RUN_STATUSES
from piworkflows.views.watch import RunWatch, WatchEnded

# Display statuses after which a run moves on only when someone acts (a waiting or queued run:
# see settled).
SETTLED = TERMINAL_RUN_STATUSES | {"paused", "ambiguous"}
TICK_S = 0.5  # the status line's elapsed times are redrawn this often while nothing changes


def settled(view: dict[str, Any]) -> bool:
    """Whether the run moves on only when someone acts: it ended, is paused or ambiguous, waits for
    a person (not at an agent step: the server's agent works on that), or is parked for a reason
    other than a shutdown (the run's park reason fact; never the display's words)."""
    status = view["display"]["status"]
    if status == "waiting":
        current = run_view.current_step(view)
        return current is None or current["nodeType"] not in AGENT_NODE_KINDS
    if status == "queued":
        return view["piworkflows"]["parkReason"] not in (None, "shutdown")
    return status in SETTLED


def _step_fields(step: dict[str, Any]) -> dict[str, Any]:
    """A step in an event, named as ``run logs`` names steps."""
    named = {"stepIndex": step["index"], "nodePath": step["nodeId"], "nodeKind": step["nodeType"]}
    return named | {name: step[name] for name in ("visit", "attempt", "startedAt")}


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
        steps = run_view.steps(view)
        current = next((step for step in steps if step["status"] in ("running", "waiting")), None)
        events: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        for step in steps:
            before = self.seen.get(step["index"])
            if before is None:
                events.append(({"event": "stepStarted", "runId": run_id, **_step_fields(step)}, step))
            if step["status"] not in ACTIVE_ATTEMPT_STATUSES and (before is None or before in ACTIVE_ATTEMPT_STATUSES):
                ended = {name: step[name] for name in ("status", "outcome", "finishedAt", "durationMs", "errorCode")}
                events.append(({"event": "stepFinished", "runId": run_id, **_step_fields(step), **ended}, step))
            self.seen[step["index"]] = step["status"]
        if status == "waiting" and current is not None and current["attemptId"] != self.waited:
            self.waited = current["attemptId"]
            events.append(
                (
                    {
                        "event": "waiting",
                        "runId": run_id,
                        **_step_fields(current),
                        "status": "waiting",
                        "request": current.get("request"),
                    },
                    {**current, "pending": view["piworkflows"].get("pending")},  # what waits, for its command
                )
            )
        if status in TERMINAL_RUN_STATUSES and not self.ended:
            self.ended = True
            events.append(
                (
                    {
                        "event": "finished",
                        "runId": run_id,
                        "status": status,
                        "errorCode": view["piworkflows"]["errorCode"],
                    },
                    None,
                )
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
    if step["nodeType"] in AGENT_NODE_KINDS:  # the server's agent works on it: the run goes on
        return [story.cut(f"{story.clock(step['startedAt'])}  {label} waits for its agent's result", story.WIDTH)]
    waits = story.cut(f"{event['runId']} waits at {step['nodeId']}", story.WIDTH)
    pending = step.get("pending")
    if pending is not None and pending["kind"] == "human_decision":  # decided, never answered
        return [waits, *story.decision_wait(event["runId"], pending, indent=2)]
    return [waits, *story.question(event["runId"], step, indent=2)]


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
        current, display = run_view.current_step(view), view["display"]
        elapsed = story.duration(max(0, now - story.epoch_ms(view["state"]["startedAt"])))
        if current is not None:
            step_time = story.duration(max(0, now - story.epoch_ms(current["startedAt"])))
            text = f"{story.step_label(current)} {current['status']} for {step_time}; run time {elapsed}"
        else:
            text = f"{story.status_text(display)}; run time {elapsed}"
        click.echo("\r" + story.cut(text, story.WIDTH - 1).ljust(story.WIDTH - 1), nl=False)
        self.drawn = True


def follow(
    paths: StatePaths, run_id: str, emit: Callable[[dict[str, Any], dict[str, Any] | None], None] | None, live: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Watch the run until it is settled; hand each event to ``emit`` (None: print nothing); return
    the last view as the server sent it and as shown (cli/run_view.py). ``live``: keep the status
    line on a terminal (redrawn every TICK_S)."""
    follower, line = Follower(), _LiveLine(live and sys.stdout.isatty())
    view: dict[str, Any] | None = None
    try:
        with WorkflowClient(paths.state_dir) as client, RunWatch(paths.state_dir, run_id) as watch:
            contents = run_view.Contents(client, run_id)
            while True:
                sent = watch.next(timeout=TICK_S)
                if sent is None:  # nothing changed: the elapsed times go on
                    if view is not None:
                        line.draw(view)
                    continue
                view = run_view.shown(contents, sent)
                events = follower.events(view)
                if events:
                    line.clear()
                for event, step in events:
                    if emit is not None:
                        emit(event, step)
                if settled(view):
                    return sent, view
                line.draw(view)
    except WatchEnded as exc:
        fail(f"{exc.outcome} ({exc.code}): {exc}")
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
        say(text)


def print_json(event: dict[str, Any], step: dict[str, Any] | None) -> None:
    click.echo(canonical.dumps(event))

"""What the viewer shows, as plain lines: the run list and a run (``--once`` prints them; the
Textual screens show the same facts). Only what the server sent is rendered.

::

    list_lines(page, now)   one line per run: its id, status, workflow, title, age, duration
    run_lines(view)         cli/story.py's story of the run (its view with references read back)
    trace_lines(view)       the trace window: seq, time, event type, its node, actor
    transcript_lines(view)  the settled Pi session entries of the view's window
    history_lines(steps, start, total)   steps older than the view's window (view.page pages)
"""

from __future__ import annotations

import json
from typing import Any

from piworkflows.cli import story
from piworkflows.cli.agent_steps import entry_lines
from piworkflows.cli.base import visible

COLUMNS = ("run", "status", "workflow", "title", "age", "duration")  # the id first: whole at 80 columns


def list_row(item: dict[str, Any], now_ms: int) -> tuple[str, ...]:
    """A run-list item's cells, in COLUMNS order."""
    created = story.epoch_ms(item["createdAt"])
    started = item["piworkflows"]["startedAt"]
    finished = item["manifest"].get("finishedAt")
    duration = None
    if started is not None:
        end = story.epoch_ms(finished) if finished is not None else now_ms
        duration = max(0, end - story.epoch_ms(started))
    return (
        visible(item["runId"]),
        story.status_text(item["display"]),
        visible(item["workflowName"]),
        visible(item["piworkflows"]["title"] or "-"),
        story.duration(max(0, now_ms - created)),
        story.duration(duration),
    )


def list_lines(page: dict[str, Any], now_ms: int) -> list[str]:
    rows = [COLUMNS, *(list_row(item, now_ms) for item in page["items"])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    more = page["total"] - page["start"] - len(page["items"])
    return lines + ([f"({more} more)"] if more > 0 else []) if page["items"] else ["no runs"]


def run_lines(view: dict[str, Any]) -> list[str]:
    return [visible(line) for line in story.story(view)]


def trace_lines(view: dict[str, Any]) -> list[str]:
    page = view["tracePage"]
    return [
        visible(f"{item['seq']:>5}  {story.clock(item['at'])}  {item['type']}{_node(item)}  ({_actor(item)})")
        for item in page["items"]
    ] or ["no events"]


def _actor(item: dict[str, Any]) -> str:
    return str(item["piworkflows"]["actor"])


def _node(item: dict[str, Any]) -> str:
    """`` at NODE`` for an event about a node attempt."""
    node = item.get("nodeId")
    return f" at {node}" if isinstance(node, str) else ""


def transcript_lines(view: dict[str, Any]) -> list[str]:
    """The view's settled Pi entries (a too large one shows as its size)."""
    lines: list[str] = []
    for item in view["session"]["entryPage"]["items"]:
        entry = item["entry"]
        size = story.omitted(entry)
        if size is not None:
            lines.append(f"#{item['seq']} ({size} bytes: pi-workflows run transcript shows it)")
            continue
        text = entry if isinstance(entry, str) else json.dumps(entry)
        role = _role(text)
        lines += entry_lines({"runSeq": item["seq"], "role": role, "settledAt": item["at"], "entry": text})
    return [visible(line) for line in lines] or ["no conversation captured"]


def _role(text: str) -> str:
    try:
        entry = json.loads(text)
    except ValueError:
        return "entry"
    message = entry.get("message") if isinstance(entry, dict) else None
    if isinstance(message, dict) and isinstance(message.get("role"), str):
        return str(message["role"])
    return str(entry.get("type", "entry")) if isinstance(entry, dict) else "entry"


def history_lines(steps: list[dict[str, Any]], start: int, total: int) -> list[str]:
    """Steps from position ``start`` of the run's ``total``: index, node, type, status, duration."""
    if not steps:
        return ["no older steps: the Story tab shows them all"]
    lines = [f"steps {start + 1}-{start + len(steps)} of {total} (o: older)"]
    for index, step in enumerate(steps, start + 1):
        took = story.duration(step["durationMs"])
        lines.append(f"{index:>5}  {step['nodeId']}  {step['nodeType']}  {step['status']}  {took}")
    return lines

"""``pi-workflows runs``, ``workflows`` and ``workflow show``: find runs and workflows.

::

    runs ──────────── run.list (pages, metadata only) ──────────> server ── writer
    workflows ─────── workflow.list {projectPath} ──────────────> server ── resolver child
    workflow show ─── workflow.show {projectPath, workflowName} ─> server ── resolver child

All three are reads (never stored). The resolver child discovers, loads and
compiles the workflows: the CLI runs no workflow code.
"""

from __future__ import annotations

import os
import re
import shutil
import textwrap
import time
from datetime import datetime
from typing import Any

import click

from piworkflows import canonical
from piworkflows.cli.base import accepted, fail, main, request, say, span, visible
from piworkflows.isotime import epoch_ms
from piworkflows.paths import StatePaths
from piworkflows.states import RUN_STATUS_VALUES

DURATION = re.compile(r"([1-9][0-9]*)([smhdw])\Z")
UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def since_ms(value: str, now_ms: int) -> int:
    """``--since``: how long ago (``90m``, ``2h``, ``3d``, ``1w``) or an ISO 8601 time (without a
    zone: local time), as epoch milliseconds; ValueError, its message the fix, for anything else."""
    if match := DURATION.match(value):
        return max(0, now_ms - int(match[1]) * UNIT_MS[match[2]])
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("pass a duration ago (90m, 2h, 3d, 1w) or an ISO 8601 time (2026-08-01T09:00:00Z)") from None
    return max(0, round(moment.astimezone().timestamp() * 1000))  # a naive time is local time


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return since_ms(value, int(time.time() * 1000))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.command("runs")
@click.option("--project", type=click.Path(file_okay=False), help="Only runs of this project directory.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(RUN_STATUS_VALUES),
    help="Only runs with this durable status; repeat for several.",
)
@click.option("--workflow", help="Only runs of this workflow: its name (demo), or builtin:NAME for the built-in only.")
@click.option(
    "--since",
    callback=_since,
    help="Only runs created since: a duration ago (90m, 2h, 3d, 1w) or an ISO 8601 time (without a zone: local time).",
)
@click.option("--limit", type=click.IntRange(1, 256), default=50, show_default=True, help="Runs per page.")
@click.option("--all", "every_page", is_flag=True, help="Follow the cursor through every page.")
@click.option("--json", "as_json", is_flag=True, help="One run-list page object per line, as the server answered.")
@click.pass_obj
def runs(
    paths: StatePaths,
    project: str | None,
    statuses: tuple[str, ...],
    workflow: str | None,
    since: int | None,
    limit: int,
    every_page: bool,
    as_json: bool,
) -> None:
    """List runs, newest first (metadata only): id, workflow, title, status, age, duration.

    The STATUS column is the display status (paused, ambiguous, ...); --status filters by the
    durable status beneath it (a paused run is queued, running or waiting). Filters combine.
    Without --all one page is shown (--limit runs).

    Example: pi-workflows runs --status failed --since 2h --all
    """
    payload: dict[str, Any] = {"limit": limit}
    if project is not None:
        payload["projectPath"] = os.path.abspath(project)
    if statuses:
        payload["status"] = sorted(set(statuses))
    if workflow is not None:
        payload["workflowName"] = workflow
    if since is not None:
        payload["since"] = since
    table: _RunTable | None = None
    while True:
        page = accepted(request(paths, "run.list", payload))
        if as_json:
            click.echo(canonical.dumps(page))
        elif page["items"]:
            table = table or _RunTable(page["items"])
            table.echo(page["items"], int(time.time() * 1000))
        if not every_page or page["cursor"] is None:
            break
        payload["cursor"] = page["cursor"]
    if not as_json and table is None:
        say("no runs")


class _RunTable:
    """Columns sized by the first page, the title cut to what the terminal (at least 80) leaves."""

    STATUS, SPAN = 9, 5

    def __init__(self, first_page: list[dict[str, Any]]) -> None:
        self.id_width = max(len("ID"), *(len(item["runId"]) for item in first_page))
        self.workflow_width = min(16, max(len("WORKFLOW"), *(len(item["workflowName"]) for item in first_page)))
        fixed = self.id_width + self.workflow_width + self.STATUS + 2 * self.SPAN + 5  # five separating spaces
        self.title_width = max(4, max(80, shutil.get_terminal_size((80, 24)).columns) - fixed)  # 80 at most
        say(self._line("ID", "WORKFLOW", "TITLE", "STATUS", "AGE", "RAN"))

    def echo(self, items: list[dict[str, Any]], now: int) -> None:
        for item in items:
            ours = item["piworkflows"]
            finished = item["manifest"].get("finishedAt")  # (its startedAt is the creation until it starts)
            started = epoch_ms(ours["startedAt"]) if ours["startedAt"] is not None else None
            ran = span((epoch_ms(finished) if finished else now) - started) if started is not None else "-"
            say(
                self._line(
                    item["runId"],
                    item["workflowName"],
                    ours["title"] or "",
                    item["display"]["status"],
                    span(now - epoch_ms(item["createdAt"])),
                    ran,
                )
            )

    def _line(self, run_id: str, workflow: str, title: str, status: str, age: str, ran: str) -> str:
        return (
            f"{run_id:<{self.id_width}} {_cut(workflow, self.workflow_width):<{self.workflow_width}} "
            f"{_cut(title, self.title_width):<{self.title_width}} {status:<{self.STATUS}} "
            f"{age:>{self.SPAN}} {ran:>{self.SPAN}}"
        ).rstrip()


def _cut(text: str, width: int) -> str:
    text = visible(" ".join(text.split()))  # one line, then cut: never inside an escape's characters
    return text if len(text) <= width else text[: width - 1] + "…"


_PROJECT = click.option(
    "--project",
    type=click.Path(exists=True, file_okay=False),
    default=".",
    show_default=True,
    help="Project directory (its .pi/workflows is searched first).",
)


@main.command("workflows")
@_PROJECT
@click.option("--json", "as_json", is_flag=True, help="Print the workflow.list receipt as one line of JSON.")
@click.pass_obj
def workflows(paths: StatePaths, project: str, as_json: bool) -> None:
    """List every workflow the server would find: the project's, the user dir's and the
    built-ins, with its source and description. A name found twice is shadowed by the first
    (run start finds that one; builtin:NAME still reaches a built-in). A module that does not
    load is listed with its file, line and what went wrong, and the command then exits 1 (a
    check for CI).

    Example: pi-workflows workflows --project ~/src/app
    """
    receipt = accepted(request(paths, "workflow.list", {"projectPath": os.path.abspath(project)}))
    if as_json:
        click.echo(canonical.dumps(receipt))
        _lint(receipt)
        return
    say(f"project workflows: {receipt['projectDirectory']}")
    say(f"user workflows:    {receipt['userDirectory']}")
    width = max([len(item["name"]) for item in receipt["items"]], default=0)
    for item in receipt["items"]:
        shadowed = f", shadowed by {item['shadowedBy']}" if item["shadowedBy"] else ""
        say(f"{item['name']:<{width}}  {item['origin']:<7}  {_source(item['source'])}{shadowed}")
        if item["error"] is not None:
            for index, line in enumerate(item["error"]["text"].split("\n")):
                say(("    does not load: " if index == 0 else "    ") + line)
        elif item["description"]:
            say("    " + _cut(item["description"], 76))
    if receipt["truncated"]:
        say(f"(only the first {len(receipt['items'])}: list them with --json, or look in the directories)")
    _lint(receipt)


def _lint(receipt: dict[str, Any]) -> None:
    """Exit 1 when a module does not load, so the listing works as a check (after the list)."""
    broken = [item["name"] for item in receipt["items"] if item["error"] is not None]
    if broken:
        fail(f"{len(broken)} workflow module{'s' * (len(broken) > 1)} did not load: {', '.join(broken)}")


@main.group("workflow")
def workflow_group() -> None:
    """Look at one workflow as the server compiles it.

    Example: pi-workflows workflow show builtin:demo
    """


@workflow_group.command("show")
@click.argument("workflow", metavar="NAME")
@_PROJECT
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the workflow.show receipt (with the definition snapshot) as one line of JSON.",
)
@click.pass_obj
def workflow_show(paths: StatePaths, workflow: str, project: str, as_json: bool) -> None:
    """Show the workflow NAME (or builtin:NAME) that run start would find: its source,
    description and graph, one line per node ("node [kind] -> next", a switch as its cases).

    Example: pi-workflows workflow show demo --json
    """
    payload = {"projectPath": os.path.abspath(project), "workflowName": workflow}
    shown = accepted(request(paths, "workflow.show", payload))
    if as_json:
        click.echo(canonical.dumps(shown))
        return
    snapshot = shown["snapshot"]
    say(f"{shown['workflowName']} ({shown['origin']}: {_source(shown['source'])})")
    if shown["description"]:
        for line in textwrap.wrap(shown["description"], 76):
            say("  " + line)
    say(f"  definition {shown['definitionDigest']}")
    say("  input: not declared (define_workflow takes no input schema; the description says what it expects)")
    say(f"  starts at {snapshot['startAt']}; at most {snapshot['maxSteps']} steps")
    routes = {edge["from"]: edge for edge in snapshot["edges"]}
    for path in _graph_order(snapshot["startAt"], snapshot["nodes"], routes):
        line = f"  {path} [{snapshot['nodes'][path]['kind']}]"
        edge = routes.get(path)
        if edge is None:
            say(f"{line} (end)")
        elif "to" in edge:
            say(f"{line} -> {edge['to']}")
        else:
            say(f"{line} switch on {edge['on']}")
            for value, target in edge["cases"].items():
                say(f"      {value} -> {target}")
    for mount, included in snapshot["mounts"].items():
        say(f"  {mount}/ is the included workflow {included['workflow']}")


def _graph_order(start: str, nodes: dict[str, Any], routes: dict[str, dict[str, Any]]) -> list[str]:
    """Nodes from the start along the edges (breadth first), then any the edges do not reach."""
    order, queue = [], [start]
    while queue:
        path = queue.pop(0)
        if path in order or path not in nodes:
            continue
        order.append(path)
        edge = routes.get(path, {})
        queue += [edge["to"]] if "to" in edge else list(edge.get("cases", {}).values())
    return order + sorted(set(nodes) - set(order))


def _source(source: dict[str, str] | None) -> str:
    if source is None:
        return "(unreadable)"
    if source["kind"] == "builtin":
        return f"{source['id']} revision {source['revision']}"
    return source["path"]

"""``pi-workflows run ...`` and ``answer``: start, watch and control workflow runs."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from piworkflows import canonical
from piworkflows.cli.base import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    accepted,
    check,
    command_line,
    fail,
    main,
    request,
    start_failed,
)
from piworkflows.client import ServerNotRunning, ServerRefused, StartFailed, WorkflowClient
from piworkflows.paths import StatePaths


@main.group("run")
def run_group() -> None:
    """Start, inspect and control workflow runs.

    Example: pi-workflows run start builtin:demo --input '{"who": "me"}'
    """


@run_group.command("start")
@click.argument("workflow")
@click.option("--project", type=click.Path(exists=True, file_okay=False), default=".", show_default=True,
              help="Project directory (its .pi/workflows is searched first).")  # fmt: skip
@click.option("--input", "input_json", default="{}", show_default=True, help="The run input as JSON.")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.option("--wait", is_flag=True, help="Wait until the run ends or needs someone; exit 0 only if it completed "
              "(Ctrl-C: exit 130, the run goes on).")  # fmt: skip
@click.pass_obj
def run_start(paths: StatePaths, workflow: str, project: str, input_json: str, as_json: bool, wait: bool) -> None:
    """Start WORKFLOW (a name from the project, the user dir, or builtin:NAME) and print the run id.

    The server is started on demand. Example: pi-workflows run start shell-check --input '{"command": "true"}'
    """
    try:
        input_value = json.loads(input_json)
    except ValueError as exc:
        raise click.BadParameter(f'not JSON ({exc}); pass e.g. --input \'{{"key": "value"}}\'') from None
    payload = {"projectPath": os.path.abspath(project), "workflowName": workflow, "input": input_value,
               "executionMode": "headless"}  # fmt: skip
    check("run.start", payload)
    try:
        with WorkflowClient(paths.state_dir) as client:
            client.ensure_running()
            response = client.request("run.start", payload)
    except StartFailed as exc:
        start_failed(exc)
    except (ServerNotRunning, ServerRefused, OSError, ConnectionError) as exc:
        fail(str(exc))
    receipt = accepted(response)
    click.echo(canonical.dumps(receipt) if as_json else receipt["runId"])
    if wait:
        try:
            view = _wait_until_settled(paths, receipt["runId"])
        except KeyboardInterrupt:
            run_id = receipt["runId"]
            watch, cancel = command_line("run", "status", run_id), command_line("run", "cancel", run_id)
            click.echo(f"\npi-workflows: interrupted; {run_id} goes on. Watch it: {watch}; cancel it: {cancel}",
                       err=True)  # fmt: skip
            sys.exit(EXIT_INTERRUPTED)
        display = view["display"]
        click.echo(f"{view['runId']} {display['status']}" + (f" ({display['reason']})" if display["reason"] else ""))
        if view["output"] is not None:
            click.echo(f"  output: {canonical.dumps(view['output'])[:2000]}")
        if view["error"] is not None:
            click.echo(f"  error: {view['error'][:2000]}")
        if display["status"] != "completed":
            sys.exit(EXIT_RUNTIME)


# Display statuses after which a run moves on only when someone acts.
SETTLED = frozenset({"completed", "failed", "timed_out", "cancelled", "waiting", "paused", "ambiguous"})


def _wait_until_settled(paths: StatePaths, run_id: str) -> dict[str, Any]:
    """Poll run.status (live views come with view.run.watch) until the run is settled."""
    delay = 0.02
    with WorkflowClient(paths.state_dir) as client:
        while True:
            view = accepted(client.request("run.status", {}, run_id=run_id))
            parked = view["display"]["activity"] == "parked" and view["display"]["reason"] != "shutdown"
            if view["display"]["status"] in SETTLED or parked:
                return view  # type: ignore[no-any-return]
            time.sleep(delay)
            delay = min(delay * 2, 0.25)


@run_group.command("status")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the pi-workflows.run-view.v1 object as one line.")
@click.pass_obj
def run_status(paths: StatePaths, run_id: str, as_json: bool) -> None:
    """Show one run: status, current node, steps, display controls.

    Example: pi-workflows run status run-0123abcd --json
    """
    view = accepted(request(paths, "run.status", {}, run_id=run_id))
    if as_json:
        click.echo(canonical.dumps(view))
        return
    run, display = view["run"], view["display"]
    click.echo(f"{view['runId']}  {run['workflowName']}  {display['status']} ({display['activity']})")
    if run["title"]:
        click.echo(f"  title: {run['title']}")
    click.echo(f"  project: {run['projectPath']}")
    click.echo(f"  controls: {', '.join(display['controls']) or '-'}")
    if view["output"] is not None:
        click.echo(f"  output: {canonical.dumps(view['output'])[:500]}")
    if view["error"] is not None:
        click.echo(f"  error ({run['errorCode'] or 'failed'}): {view['error'][:500]}")
    steps = view["steps"]["items"]
    click.echo(f"  steps: {len(steps)}" + ("" if steps else " (none yet)"))
    for step in steps:
        click.echo(f"    {step['stepIndex']:>3} {step['nodePath']} [{step['nodeKind']}] {step['status']}")


def _control(name: str, summary: str, done: str) -> None:
    """``pi-workflows run NAME RUN_ID``: one stored control operation; prints what happened."""

    @run_group.command(name, help=f"{summary}\n\nExample: pi-workflows run {name} run-0123abcd")
    @click.argument("run_id")
    @click.pass_obj
    def command(paths: StatePaths, run_id: str) -> None:
        receipt = accepted(request(paths, f"run.{name}", {}, run_id=run_id))
        click.echo(done.format(run_id=run_id, status=receipt["status"]))


_control("cancel", "Cancel a run: it ends cancelled, then its runner is stopped.", "{run_id} cancelled")
_control("pause", "Pause a run at its last durable boundary (an applying effect settles first).", "{run_id} paused")
_control("resume", "Resume a paused run (or one parked for runnerNoProgress or workflowSourceChanged).",
         "{run_id} resumed ({status})")  # fmt: skip


@run_group.command("restart")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def run_restart(paths: StatePaths, run_id: str, as_json: bool) -> None:
    """Start a finished run again as a new child run (same definition and input); print its id.

    Example: pi-workflows run restart run-0123abcd
    """
    view = accepted(request(paths, "run.status", {}, run_id=run_id))
    response = request(paths, "run.restart", {}, run_id=run_id, expected_revision=view["runRevision"])
    receipt = accepted(response)
    click.echo(canonical.dumps(receipt) if as_json else receipt["runId"])


@main.command("answer")
@click.argument("run_id")
@click.argument("node")
@click.argument("answer_json")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def answer(paths: StatePaths, run_id: str, node: str, answer_json: str, as_json: bool) -> None:
    """Answer the checkpoint NODE of a waiting run; the answer becomes the node's output.

    Example: pi-workflows answer run-0123abcd ask '{"continue": true}'
    """
    try:
        value = json.loads(answer_json)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc}); pass e.g. '{{\"continue\": true}}'") from None
    receipt = accepted(request(paths, "checkpoint.answer", {"nodePath": node, "answer": value}, run_id=run_id))
    click.echo(canonical.dumps(receipt) if as_json else f"answered; {run_id} continues")

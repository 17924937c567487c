"""``pi-workflows run ...`` and ``answer``: start, follow, show and control workflow runs."""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

import click

from piworkflows import canonical
from piworkflows.cli import run_view, story, watch
from piworkflows.cli.base import (
    ANSWER_WAIT_S,
    EXIT_RUNTIME,
    accepted,
    check,
    check_run_id,
    command_line,
    connection,
    fail,
    json_argument,
    main,
    request,
    say,
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
@click.option(
    "--project",
    type=click.Path(exists=True, file_okay=False),
    default=".",
    show_default=True,
    help="Project directory (its .pi/workflows is searched first).",
)
@click.option("--input", "input_json", default="{}", show_default=True, help="The run input as JSON.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the receipt as one line of JSON (with --wait, then the final run view).",
)
@click.option(
    "--wait",
    is_flag=True,
    help="Follow the run until it ends or needs someone (a line per step); exit 0 "
    "only if it completed (Ctrl-C: exit 130, the run goes on).",
)
@click.pass_obj
def run_start(paths: StatePaths, workflow: str, project: str, input_json: str, as_json: bool, wait: bool) -> None:
    """Start WORKFLOW (a name from the project, the user dir, or builtin:NAME) and print the run id.

    The server is started on demand. With --json stdout holds only JSON lines.

    Example: pi-workflows run start shell-check --input '{"command": "true"}' --wait
    """
    input_value = json_argument(input_json, '{"key": "value"}', "--input")
    payload = {
        "projectPath": os.path.abspath(project),
        "workflowName": workflow,
        "input": input_value,
        "executionMode": "headless",
    }
    check("run.start", payload)
    try:
        with WorkflowClient(paths.state_dir, timeout=ANSWER_WAIT_S) as client:
            client.ensure_running()
            response = client.request("run.start", payload)
    except StartFailed as exc:
        start_failed(exc)
    except TimeoutError:  # it runs but did not answer: never "no server" nor a bare "timed out"
        status = command_line("server", "status")
        fail(f"the server did not answer within {ANSWER_WAIT_S:g} s; '{status}' shows whether it is busy or stuck")
    except (ServerNotRunning, ServerRefused, OSError, ConnectionError) as exc:
        fail(str(exc))
    receipt = accepted(response)
    try:  # the run is stored: a Ctrl-C says it goes on, also one before the following began
        click.echo(canonical.dumps(receipt) if as_json else receipt["runId"])
        if wait:
            _follow_and_exit(paths, receipt["runId"], as_json, events=not as_json)
    except KeyboardInterrupt:
        watch.interrupted(receipt["runId"])


def _follow_and_exit(paths: StatePaths, run_id: str, as_json: bool, events: bool) -> None:
    """Follow the run until it is settled; print the final view (--json) or how it stands; exit 0
    only if it completed."""
    emit = (watch.print_json if as_json else watch.print_human) if events else None
    try:
        sent, view = watch.follow(paths, run_id, emit, live=not as_json)
    except KeyboardInterrupt:
        watch.interrupted(run_id)
    if as_json:
        click.echo(canonical.dumps(sent))
    else:
        for line in story.outcome(view):
            say(line)
    if view["display"]["status"] != "completed":
        sys.exit(EXIT_RUNTIME)


@run_group.command("watch")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event line, then the final run view.")
@click.pass_obj
def run_watch(paths: StatePaths, run_id: str, as_json: bool) -> None:
    """Follow a run: a line as each step starts and ends, the question when it waits at a checkpoint.

    Stops when the run ends or needs someone (waiting, paused, ambiguous, parked); exits 0 only if it
    completed. On a terminal a status line shows the current node and the elapsed time. Ctrl-C: exit
    130, the run goes on. Events with --json: stepStarted, stepFinished, waiting, finished.

    Example: pi-workflows run watch run-0123abcd
    """
    check_run_id("run watch", run_id)
    _follow_and_exit(paths, run_id, as_json, events=True)


@run_group.command("status")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the pi-workflows.run-view.v1 object as one line.")
@click.pass_obj
def run_status(paths: StatePaths, run_id: str, as_json: bool) -> None:
    """Show a run's full story: status and why, source, times, every step with its output or error,
    a waiting checkpoint's question and the command that answers it, effects to review, the controls.

    Example: pi-workflows run status run-0123abcd --json
    """
    if as_json:
        click.echo(canonical.dumps(accepted(request(paths, "run.status", {}, run_id=run_id))))
        return
    check_run_id("view.run.get", run_id)  # its payload is always {}
    with connection(paths) as client:
        view = run_view.get(client, run_id)
    for line in story.story(view):
        say(line)


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
_control(
    "resume",
    "Resume a paused run (or one parked for runnerNoProgress or workflowSourceChanged).",
    "{run_id} resumed ({status})",
)


@run_group.command("restart")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def run_restart(paths: StatePaths, run_id: str, as_json: bool) -> None:
    """Start a finished run again as a new child run (same definition and input); print its id.

    Example: pi-workflows run restart run-0123abcd
    """
    view = accepted(request(paths, "run.status", {}, run_id=run_id))
    revision = view["runRevision"]
    # The key names the run as this command saw it: restarts that saw the same finished run adopt one
    # child (a competing one at another key is a conflict: the restart advanced the run's revision).
    seen = hashlib.sha256(f"{run_id}\n{revision}".encode()).hexdigest()[:32]
    response = request(
        paths, "run.restart", {}, run_id=run_id, expected_revision=revision, idempotency_key=f"run.restart:{seen}"
    )
    receipt = accepted(response)
    click.echo(canonical.dumps(receipt) if as_json else receipt["runId"])
    if response.outcome == "adopted" and not as_json:
        click.echo(f"pi-workflows: {run_id} was already restarted as {receipt['runId']}", err=True)


@main.command("decide")
@click.argument("run_id")
@click.argument("node")
@click.argument("choice")
@click.option("--input", "text", help="The text the choice asks for (its text_input).")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def decide(paths: StatePaths, run_id: str, node: str, choice: str, text: str | None, as_json: bool) -> None:
    """Answer the protected human decision NODE of a waiting run with CHOICE, as its operator.

    Exit 0 when the answer won (or this answer was given already), 1 when another outcome won (it is
    named) or the run does not wait there.

    Example: pi-workflows decide run-0123abcd approve replan --input "Split the change"
    """
    if text is not None and not 1 <= len(text) <= 4000:
        raise click.BadParameter("--input takes 1-4000 characters", param_hint="--input")
    view = accepted(request(paths, "run.status", {}, run_id=run_id))
    pending = view["piworkflows"]["pending"]
    if pending is not None and (pending["kind"] != "human_decision" or pending["nodePath"] != node):
        fail(story.not_here(run_id, node, "human_decision", pending))
    payload: dict[str, Any] = {"nodePath": node, "choice": choice, "source": "operator"}
    if text is not None:
        payload["input"] = text
    visit = "latest"
    if pending is not None:  # this visit's decision only: a later visit of the node is another decision
        visit = payload["decisionId"] = pending["decision"]["decisionId"]
    # The key is the answer's: the same answer again adopts its receipt (and the writer adopts a
    # repeat of the answer that won, whatever its key).
    answered = hashlib.sha256(canonical.dumps_bytes([run_id, node, choice, text])).hexdigest()[:32]
    response = request(paths, "decision.answer", payload, run_id=run_id, idempotency_key=f"decide:{visit}:{answered}")
    receipt = accepted(response)
    if as_json:
        click.echo(canonical.dumps(receipt))
        return
    # with no decision waiting the writer accepts only a repeat of the answer that won
    done = "already decided" if response.outcome == "adopted" or pending is None else "decided"
    click.echo(f"{done} {receipt['choice']}; {_goes_on(run_id, view)}")


def _goes_on(run_id: str, before: dict[str, Any]) -> str:
    """What the run does after an answer: it continues, or it stays paused until resumed."""
    if before["display"]["status"] == "paused":
        return f"{run_id} stays paused: resume it with '{command_line('run', 'resume', run_id)}'"
    return f"{run_id} continues"


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
    value = json_argument(answer_json, '{"continue": true}', "ANSWER_JSON")
    view = accepted(request(paths, "run.status", {}, run_id=run_id))
    pending = view["piworkflows"]["pending"]
    if pending is not None and (pending["kind"] != "checkpoint" or pending["nodePath"] != node):
        fail(story.not_here(run_id, node, "checkpoint", pending))
    receipt = accepted(request(paths, "checkpoint.answer", {"nodePath": node, "answer": value}, run_id=run_id))
    click.echo(canonical.dumps(receipt) if as_json else f"answered; {_goes_on(run_id, view)}")

"""``pi-workflows``: the maintenance CLI. Thin wrappers over ``piworkflows.client``.

Exit codes: 0 success, 1 runtime error, 2 usage error (click prints the fix),
130 interrupted (Ctrl-C). Whatever the CLI can check itself (arguments, JSON,
the request against the protocol's models) is a usage error before anything
is sent.
The CLI never executes workflow code and opens SQLite only read-only on
inactive files (``writer/offline.py``): to verify a backup (``state verify
BACKUP``) and, with the server stopped, to check the state ``state reset``
moves aside.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import TypeAdapter, ValidationError

from piworkflows import canonical
from piworkflows.client import (
    ClientError,
    ServerNotRunning,
    ServerRefused,
    StartFailed,
    StopTimedOut,
    WorkflowClient,
    start_server,
    stop_server,
)
from piworkflows.errors import StateIncompatible
from piworkflows.paths import StatePaths
from piworkflows.protocol import client_v1
from piworkflows.settings import Settings
from piworkflows.states import EFFECT_STATUSES
from piworkflows.supervisor import registry

EXIT_RUNTIME = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
OPERATOR_CLIENT_ID = "pi-workflows-cli-operator"  # stored receipts are per client id


def fail(message: str) -> NoReturn:
    click.echo(f"pi-workflows: {message}", err=True)
    sys.exit(EXIT_RUNTIME)


class _Main(click.Group):
    """Ctrl-C anywhere exits 130 (click's own handling would print "Aborted!" and exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\npi-workflows: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Main)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="State directory (default: $PI_WORKFLOWS_STATE_DIR, else ~/.pi/agent/workflows).",
)
@click.version_option(package_name="piworkflows")
@click.pass_context
def main(ctx: click.Context, state_dir: str | None) -> None:
    """Pi Workflows durable workflow server.

    Example: pi-workflows server start && pi-workflows server status
    """
    ctx.obj = StatePaths.resolve(state_dir)


@main.group()
def server() -> None:
    """Start, inspect and stop the workflow server.

    Example: pi-workflows --state-dir /tmp/piw server run
    """


@server.command("run")
@click.pass_obj
def server_run(paths: StatePaths) -> None:
    """Run the server in the foreground, logging to stderr (Ctrl-C stops it).

    Example: pi-workflows server run
    """
    from piworkflows.supervisor.__main__ import serve

    sys.exit(serve(str(paths.state_dir), foreground=True))


@server.command("start")
@click.pass_obj
def server_start(paths: StatePaths) -> None:
    """Start the server in the background and wait until it serves.

    Example: pi-workflows server start
    """
    try:
        start_server(paths)
    except StartFailed as exc:
        _start_failed(exc)
    click.echo(f"server started for {paths.state_dir}")


def _start_failed(exc: StartFailed) -> NoReturn:
    """Why the server did not start; for an incompatible state also the one command that does the
    instruction's steps."""
    message = str(exc)
    if message == StateIncompatible.MESSAGE:
        message += "\n  " + StateIncompatible.RESET_HINT.format(
            command=_command("state", "reset", "--backup", "/abs/new-dir/"))
    fail(message)


@server.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status receipt as one line of JSON.")
@click.pass_obj
def server_status(paths: StatePaths, as_json: bool) -> None:
    """Show whether the server runs, its epoch and safe counts (no ids or payloads).

    Example: pi-workflows server status --json
    """
    try:
        with WorkflowClient(paths.state_dir, retry_for=0) as client:
            response = client.request("server.status")
    except ServerRefused as exc:
        fail(str(exc))
    except (ServerNotRunning, OSError, ConnectionError):
        # No answer: stopping while a process host.json records lives (identity checked).
        pids = [identity.pid for identity in registry.live(paths.registry)]
        if as_json:
            click.echo(canonical.dumps({"pids": pids, "socketAvailable": False, "state": "stopping"} if pids
                                       else {"socketAvailable": False, "state": "stopped"}))  # fmt: skip
        elif pids:
            click.echo(f"stopping (pids: {', '.join(map(str, pids))}) for {paths.state_dir}")
            click.echo(f"  wait, or end them with '{_command('server', 'stop', '--kill')}'")
        else:
            click.echo(f"not running ({paths.state_dir})")
        sys.exit(EXIT_RUNTIME)
    receipt = _accepted(response)
    if as_json:
        click.echo(canonical.dumps(receipt))
        return
    counts = {name: "-" if value is None else value for name, value in receipt.items()}  # null: not readable now
    click.echo(f"{receipt['state']} ({paths.state_dir}), server epoch {receipt['epoch']}")
    if receipt["reason"] is not None:
        click.echo(f"  {receipt['reason']['code']}: {receipt['reason']['message']}")
    click.echo(f"  runs: {counts['queuedRuns']} queued, {counts['runningRuns']} running, "
               f"{counts['parkedRuns']} parked, {counts['waitingRuns']} waiting")  # fmt: skip
    click.echo(f"  active runners: {counts['activeRunners']}, expired claims: {counts['expiredClaims']}")
    click.echo(f"  pending interactions: {counts['pendingInteractions']}, "
               f"ambiguous effects: {counts['ambiguousEffects']}")  # fmt: skip
    click.echo(f"  connections: {receipt['connections']} of at most {receipt['maxConnections']}, "
               f"fd limit {receipt['fdLimit'] or 'unlimited'}")  # fmt: skip


@server.command("stop")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait for the server to exit.")  # fmt: skip
@click.option("--kill", is_flag=True, help="If it has not exited within --timeout, SIGKILL its recorded processes.")
@click.pass_obj
def server_stop(paths: StatePaths, timeout: float, kill: bool) -> None:
    """Stop the server: in-flight commands commit, children stop, the lock is released.

    Done when no process host.json records lives (a server whose socket is gone
    but whose processes live is waited for too). After --timeout it exits 1;
    with --kill it sends SIGKILL instead to the supervisor and to every recorded
    child (a process group a child leads as a whole), each only after its
    identity (pid, start time, command line) matched, and prints what it killed.

    Example: pi-workflows server stop --timeout 30 --kill
    """
    try:
        stopped = stop_server(paths, timeout)
    except StopTimedOut as exc:
        if not kill:
            fail(f"{exc}; wait, or end its processes with '{_command('server', 'stop', '--kill')}'")
        _kill_server(paths)
        return
    except ClientError as exc:
        fail(str(exc))
    if not stopped:
        click.echo(f"not running ({paths.state_dir})")
        return
    click.echo("server stopped")


def _kill_server(paths: StatePaths) -> None:
    """``server stop --kill`` after the timeout: SIGKILL what host.json records; say what."""
    killed = registry.kill_recorded(paths.registry, Settings.from_env().stop_grace_ms / 1000)
    for identity in killed:
        click.echo(f"killed {identity.role} (pid {identity.pid})" + (" and its process group" if identity.processGroup
                                                                     else ""))  # fmt: skip
    left = registry.live(paths.registry)
    if left:
        fail(f"still running after SIGKILL: pids {', '.join(str(identity.pid) for identity in left)}")
    click.echo("server stopped (killed)" if killed else "server stopped")  # it may have exited meanwhile


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
    _check("run.start", payload)
    try:
        with WorkflowClient(paths.state_dir) as client:
            client.ensure_running()
            response = client.request("run.start", payload)
    except StartFailed as exc:
        _start_failed(exc)
    except (ServerNotRunning, ServerRefused, OSError, ConnectionError) as exc:
        fail(str(exc))
    receipt = _accepted(response)
    click.echo(canonical.dumps(receipt) if as_json else receipt["runId"])
    if wait:
        try:
            view = _wait_until_settled(paths, receipt["runId"])
        except KeyboardInterrupt:
            run_id = receipt["runId"]
            click.echo(f"\npi-workflows: interrupted; {run_id} goes on. Watch it: {_command('run', 'status', run_id)}"
                       f"; cancel it: {_command('run', 'cancel', run_id)}", err=True)  # fmt: skip
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
            view = _accepted(client.request("run.status", {}, run_id=run_id))
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
    view = _accepted(_request(paths, "run.status", {}, run_id=run_id))
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
        receipt = _accepted(_request(paths, f"run.{name}", {}, run_id=run_id))
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
    view = _accepted(_request(paths, "run.status", {}, run_id=run_id))
    response = _request(paths, "run.restart", {}, run_id=run_id, expected_revision=view["runRevision"])
    receipt = _accepted(response)
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
    receipt = _accepted(_request(paths, "checkpoint.answer", {"nodePath": node, "answer": value}, run_id=run_id))
    click.echo(canonical.dumps(receipt) if as_json else f"answered; {run_id} continues")


@main.command("runs")
@click.option("--project", type=click.Path(file_okay=False), help="Only runs of this project directory.")
@click.option("--limit", type=click.IntRange(1, 256), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the run-list page as one line of JSON.")
@click.pass_obj
def runs(paths: StatePaths, project: str | None, limit: int, as_json: bool) -> None:
    """List runs, newest first (metadata only).

    Example: pi-workflows runs --project . --json
    """
    payload: dict[str, Any] = {"limit": limit}
    if project is not None:
        payload["projectPath"] = os.path.abspath(project)
    page = _accepted(_request(paths, "run.list", payload))
    if as_json:
        click.echo(canonical.dumps(page))
        return
    if not page["items"]:
        click.echo("no runs")
    for item in page["items"]:
        click.echo(f"{item['runId']}  {item['workflowName']:<20} {item['display']['status']:<10} {item['title'] or ''}")


@main.group("state")
def state_group() -> None:
    """Inspect, back up, prune and verify the durable state through the server; move an
    incompatible one aside with the server stopped (state reset)."""


@state_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status receipt as one line of JSON.")
@click.pass_obj
def state_status(paths: StatePaths, as_json: bool) -> None:
    """Database size, safe counts and invariant violations (with the affected run ids).

    Example: pi-workflows state status
    """
    status = _accepted(_request(paths, "state.status", {}))
    if as_json:
        click.echo(canonical.dumps(status))
        return
    pages = f"{status['pageCount']} pages of {status['pageSize']} bytes, {status['freelistCount']} free"
    click.echo(f"database  {status['fileBytes']} bytes (+ {status['walBytes']} in the WAL); {pages}")
    counts = dict(status["counts"])
    runs = counts.pop("runs")
    click.echo("runs      " + (", ".join(f"{n} {s}" for s, n in sorted(runs.items())) or "none"))
    for name, value in counts.items():
        click.echo(f"{name:<20}{value}")
    _print_violations(status["violations"])


def _print_violations(violations: dict[str, list[str]]) -> None:
    if not violations:
        click.echo("invariants: all hold")
    for name, run_ids in violations.items():
        click.echo(f"VIOLATED {name}: {', '.join(run_ids)}")


def _with_progress(
    paths: StatePaths, operation: str, payload: dict[str, Any], key: str | None, show: bool
) -> client_v1.Response:
    """Send a long maintenance request; on a terminal, draw its progress from state.status polled
    on a second connection meanwhile."""
    _check(operation, payload)  # a usage error is raised here, not in the thread below
    answer: list[client_v1.Response] = []
    worker = threading.Thread(target=lambda: answer.append(_request(paths, operation, payload, idempotency_key=key)),
                              daemon=True)  # fmt: skip
    worker.start()
    if show and sys.stdout.isatty():
        with WorkflowClient(paths.state_dir, retry_for=0) as watcher:
            while worker.is_alive():
                progress = watcher.request("state.status").receipt.get("maintenance") or {}
                if progress:
                    done, total = progress["done"], max(progress["total"], 1)
                    bar = "#" * (30 * done // total)
                    click.echo(f"\r{progress['operation']:<7} [{bar:<30}] {done}/{total}", nl=False)
                worker.join(0.2)
        click.echo("\r" + " " * 60 + "\r", nl=False)
    worker.join()
    if not answer:  # _request said why (no server)
        sys.exit(EXIT_RUNTIME)
    return answer[0]


@state_group.command("backup")
@click.argument("destination", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def state_backup(paths: StatePaths, destination: str, as_json: bool) -> None:
    """Back up the live state into DESTINATION, a new file (its directory private, 0700).

    The server copies it with SQLite's online backup API between its write groups
    (commands keep flowing), then verifies the copy before it answers. On a
    terminal a progress line follows state.status from a second connection.
    Each command is a new request: repeating it makes a new backup, and a
    DESTINATION that exists is refused.

    Example: pi-workflows state backup ~/backups/state-2026-12-02.sqlite
    """
    target = os.path.abspath(destination)
    receipt = _accepted(_with_progress(paths, "state.backup", {"destination": target}, None, show=not as_json))
    if as_json:
        click.echo(canonical.dumps(receipt))
    else:
        click.echo(f"backed up and verified: {receipt['destination']} ({receipt['bytes']} bytes)")


def _prune_before(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        client_v1.prune_before_ms(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@state_group.command("prune")
@click.option("--before", required=True, callback=_prune_before,
              help="Cutoff, ISO 8601 with a zone, e.g. 2026-08-01T00:00:00Z.")  # fmt: skip
@click.option("--dry-run", "dry_run", is_flag=True, help="Only list eligible and blocked trees (the default).")
@click.option("--apply", "apply", is_flag=True, help="Delete the eligible trees (needs --backup).")
@click.option("--backup", "backup_path", type=click.Path(dir_okay=False), help="A new file for the backup first.")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def state_prune(paths: StatePaths, before: str, dry_run: bool, apply: bool, backup_path: str | None,
                as_json: bool) -> None:  # fmt: skip
    """Remove complete terminal root-run trees whose runs all finished before --before.

    --dry-run lists what is eligible and what a safety check blocks, changing
    nothing. --apply makes and verifies a backup first, rechecks the same
    selection in one transaction, deletes the trees and unreferenced blobs,
    truncates the WAL, vacuums, and checks integrity.

    Example: pi-workflows state prune --before 2026-08-01T00:00:00Z --backup /abs/before-prune.sqlite --apply
    """
    if apply and dry_run:
        raise click.UsageError("choose one: --dry-run or --apply")
    if apply and backup_path is None:
        raise click.UsageError("--apply needs --backup with a new file path (the backup is made first)")
    if backup_path is not None and not apply:
        raise click.UsageError("--backup is made only with --apply; add --apply, or drop --backup for a dry run")
    payload: dict[str, Any] = {"before": before, "apply": apply}
    if backup_path is not None:
        payload["backupPath"] = os.path.abspath(backup_path)
    key = f"state.prune:{before}:{payload.get('backupPath')}" if apply else None  # a repeat adopts the apply
    receipt = _accepted(_with_progress(paths, "state.prune", payload, key, show=apply and not as_json))
    if as_json:
        click.echo(canonical.dumps(receipt))
        return
    click.echo(f"eligible trees: {len(receipt['eligible'])}" + ("" if apply else " (dry run: nothing changed)"))
    for root in receipt["eligible"]:
        click.echo(f"  {root}")
    for blocked in receipt["blocked"]:
        click.echo(f"blocked  {blocked['rootRunId']}: {blocked['blocker']}")
    if apply:
        deleted = receipt["deleted"]
        click.echo(f"deleted {deleted['trees']} trees, {deleted['runs']} runs, {deleted['blobs']} blobs; "
                   f"backup {receipt['backup']}")  # fmt: skip
        if receipt.get("integrity"):
            fail("integrity problems after the prune: " + "; ".join(receipt["integrity"]))


def _new_absolute_dir(ctx: click.Context, param: click.Parameter, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise click.BadParameter(f"{value} is not absolute; pass e.g. --backup /abs/new-dir/")
    if os.path.lexists(path):
        raise click.BadParameter(f"{path} exists; name a new directory (it is created 0700)")
    return path


@state_group.command("reset")
@click.option("--backup", "backup_dir", required=True, callback=_new_absolute_dir,
              help="A new absolute directory on the same filesystem (created 0700) the files move into.")  # fmt: skip
@click.pass_obj
def state_reset(paths: StatePaths, backup_dir: Path) -> None:
    """With the server stopped, move state.sqlite with its -wal and -shm into a new directory.

    The spec's instruction for an incompatible state as one command: it holds
    the server lock throughout (refused while a server runs), checks that
    state.sqlite opens read-only (changing no byte; if it does not, move it by
    hand), renames the files (state.sqlite first) into --backup and prints
    each move. Nothing is copied or deleted. The next 'pi-workflows server
    start' creates a new database.

    Example: pi-workflows state reset --backup /home/me/pi-workflows-state-2026-12-02/
    """
    from piworkflows.writer import reset

    try:
        moved = reset.reset(paths, backup_dir)
    except (reset.ResetRefused, OSError) as exc:
        fail(str(exc))
    for source, target in moved:
        click.echo(f"moved {source} -> {target}")
    click.echo(f"the next '{_command('server', 'start')}' creates a new state database")


@state_group.command("verify")
@click.argument("backup", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the verification receipt as one line of JSON.")
@click.pass_obj
def state_verify(paths: StatePaths, backup: str | None, as_json: bool) -> None:
    """Check the live database through the server, or an inactive BACKUP file: SQLite
    integrity and foreign keys, then the spec's invariants.

    A BACKUP is opened read-only here (writer/offline.py, as for the check before
    state reset: the only SQLite opens outside the server); the active database
    is refused under any name. Repairs nothing. Exits 0 only if
    everything holds.

    Example: pi-workflows state verify ~/backups/state-2026-12-02.sqlite
    """
    if backup is None:
        result = _accepted(_request(paths, "state.verify", {}))
    else:
        from piworkflows.writer import offline

        try:
            result = offline.verify_backup(Path(backup), paths.database, int(time.time() * 1000))
        except offline.NotABackup as exc:
            raise click.BadParameter(str(exc), param_hint="BACKUP") from None
    if as_json:
        click.echo(canonical.dumps(result))
    elif result.get("schema"):
        click.echo(f"SCHEMA {result['schema']}")  # nothing else was checked
    else:
        for problem in result["integrity"]:
            click.echo(f"INTEGRITY {problem}")
        if not result["integrity"]:
            click.echo("integrity_check ok, foreign_key_check ok")
        _print_violations(result["violations"])
    if not result["ok"]:
        sys.exit(EXIT_RUNTIME)


@main.command("effects")
@click.option("--run", "run_id", help="Only effects of this run.")
@click.option("--all", "show_all", is_flag=True, help="Settled effects too (applied, rejected, cancelled).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line per effect.")
@click.pass_obj
def effects(paths: StatePaths, run_id: str | None, show_all: bool, as_json: bool) -> None:
    """List unsettled and ambiguous effects, newest first: id, type, status, run, node, attempts, age.

    No payloads, results or secrets. An ambiguous effect waits for 'pi-workflows effect confirm'
    or 'pi-workflows effect retry'.

    Example: pi-workflows effects --json
    """
    payload: dict[str, Any] = {}
    if show_all:
        payload["statuses"] = sorted(EFFECT_STATUSES)
    page = _accepted(_request(paths, "effect.list", payload, run_id=run_id))
    if as_json:
        for item in page["items"]:
            click.echo(canonical.dumps(item))
        return
    if not page["items"]:
        click.echo("no effects")
    for item in page["items"]:
        age = _age(page["now"] - item["createdAt"])
        node = f"{item['nodePath']}#{item['visit']}" if item["nodePath"] else "-"
        click.echo(f"{item['effectId']}  {item['effectType']:<18} {item['status']:<10} {item['runId'] or '-'}  "
                   f"{node:<16} attempts {item['attempts']}/{item['maxAttempts']}  {age}")  # fmt: skip


def _age(ms: int) -> str:
    seconds = max(0, ms) // 1000
    if seconds < 120:
        return f"{seconds}s"
    return f"{seconds // 60}m" if seconds < 7200 else f"{seconds // 3600}h"


@main.group("effect")
def effect_group() -> None:
    """Operator recovery of an ambiguous effect (the run view's review control)."""


def _effect(paths: StatePaths, effect_id: str) -> dict[str, Any]:
    """One effect as effect.list shows it, whatever its status."""
    payload = {"effectId": effect_id, "statuses": sorted(EFFECT_STATUSES)}
    items = _accepted(_request(paths, "effect.list", payload))["items"]
    if not items:
        fail(f"no effect {effect_id}; list them with 'pi-workflows effects'")
    item: dict[str, Any] = items[0]
    return item


@effect_group.command("confirm")
@click.argument("effect_id")
@click.option("--note", default="", help="Why you know it acted (kept with the effect).")
@click.option("--output", "output_json", help="The node's output as JSON (default null).")
@click.pass_obj
def effect_confirm(paths: StatePaths, effect_id: str, note: str, output_json: str | None) -> None:
    """Confirm an ambiguous effect acted: it becomes applied and its parked run continues.

    Repeating the same command is harmless (the first answer is adopted).

    Example: pi-workflows effect confirm effect-0123abcd --note "deploy log shows it ran"
    """
    payload: dict[str, Any] = {"effectId": effect_id, "note": note}
    if output_json is not None:
        try:
            payload["output"] = json.loads(output_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON ({exc}); pass e.g. '{{\"ok\": true}}'", param_hint="--output") from None
    response = _request(paths, "effect.confirm", payload, idempotency_key=f"effect.confirm:{effect_id}")
    _accepted(response)
    click.echo(f"{effect_id} confirmed applied" + (" (already)" if response.outcome == "adopted" else ""))


@effect_group.command("retry")
@click.argument("effect_id")
@click.pass_obj
def effect_retry(paths: StatePaths, effect_id: str) -> None:
    """Ask for a new numbered attempt of an ambiguous effect; its parked run continues.

    Repeating the same command before that attempt starts is harmless (adopted). A node's effect
    whose run has ended (cancelled, failed, ...) is never attempted again: confirm it instead.

    Example: pi-workflows effect retry effect-0123abcd
    """
    attempts = _effect(paths, effect_id)["attempts"]
    key = f"effect.retry:{effect_id}:{attempts}"  # one retry per attempt number: a repeat adopts it
    response = _request(paths, "effect.retry", {"effectId": effect_id}, idempotency_key=key)
    _accepted(response)
    click.echo(f"{effect_id} will be attempted again" + (" (already)" if response.outcome == "adopted" else ""))


def _command(*args: str) -> str:
    """A command line for the user to run next, with --state-dir when one was given."""
    context = click.get_current_context()
    state_dir = ["--state-dir", str(context.obj.state_dir)] if context.find_root().params["state_dir"] else []
    return shlex.join(["pi-workflows", *state_dir, *args])


_ID = TypeAdapter(client_v1.Id)


def _check(operation: str, payload: Any, run_id: str | None = None) -> None:
    """What the CLI can check itself, with the protocol's own models: a usage error, nothing sent."""
    try:
        client_v1.OPERATION_SHAPES[operation][0].model_validate(payload)
        if run_id is not None:
            _ID.validate_python(run_id)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'RUN_ID'}: {e['msg']}" for e in exc.errors())
        raise click.UsageError(f"{operation}: {problems}") from None


def _request(
    paths: StatePaths,
    operation: str,
    payload: Any,
    run_id: str | None = None,
    expected_revision: int | None = None,
    idempotency_key: str | None = None,
) -> client_v1.Response:
    """Check what the CLI can (a usage error, nothing sent), then send one request."""
    _check(operation, payload, run_id)
    try:
        # Operator recovery keys are derived from the effect: one client id makes a repeat adopt.
        client_id = OPERATOR_CLIENT_ID if idempotency_key is not None else None
        with WorkflowClient(paths.state_dir, retry_for=0, client_id=client_id) as client:
            return client.request(operation, payload, run_id=run_id, expected_revision=expected_revision,
                                  idempotency_key=idempotency_key)  # fmt: skip
    except ServerRefused as exc:
        fail(str(exc))
        raise  # unreachable: fail exits
    except (ServerNotRunning, OSError, ConnectionError):
        fail(f"no server is running for {paths.state_dir}; start it with 'pi-workflows server start'")
        raise  # unreachable: fail exits


@main.group()
def protocol() -> None:
    """The client protocol pi-workflows.client.v1."""


@protocol.command("schema")
def protocol_schema() -> None:
    """Print the JSON Schema of every message, payload and receipt.

    Example: pi-workflows protocol schema > schema.json
    """
    click.echo(json.dumps(client_v1.schema_document(), indent=2, sort_keys=True))


def _accepted(response: client_v1.Response) -> Any:
    if response.outcome not in ("accepted", "adopted"):
        code = (response.receipt or {}).get("code", "?") if isinstance(response.receipt, dict) else "?"
        fail(f"{response.outcome} ({code}): {response.error}")
    return response.receipt


if __name__ == "__main__":
    main()

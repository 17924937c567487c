"""``pi-workflows state ...``: status, backup, prune, reset and verify of the durable state."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from piworkflows import canonical
from piworkflows.cli.base import EXIT_RUNTIME, accepted, check, command_line, fail, main, request
from piworkflows.cli.runs import run_group
from piworkflows.client import WorkflowClient
from piworkflows.isotime import prune_before_ms
from piworkflows.paths import StatePaths
from piworkflows.protocol import envelope


@main.group("state")
def state_group() -> None:
    """Inspect, back up, prune and verify the durable state through the server; move an
    incompatible one aside with the server stopped (state reset).

    Example: pi-workflows state status
    """


@state_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status receipt as one line of JSON.")
@click.pass_obj
def state_status(paths: StatePaths, as_json: bool) -> None:
    """Database size, safe counts and invariant violations (with the affected run ids).

    Example: pi-workflows state status
    """
    status = accepted(request(paths, "state.status", {}))
    if as_json:
        click.echo(canonical.dumps(status))
        return
    pages = f"{status['pageCount']} pages of {status['pageSize']} bytes, {status['freelistCount']} free"
    click.echo(f"database  {status['fileBytes']} bytes (+ {status['walBytes']} in the WAL); {pages}")
    counts = dict(status["counts"])
    runs, channel = counts.pop("runs"), counts.pop("channelEffects")
    click.echo("runs      " + (", ".join(f"{n} {s}" for s, n in sorted(runs.items())) or "none"))
    for name, value in counts.items():
        click.echo(f"{name:<20}{value}")
    click.echo(f"{'channelEffects':<20}" + (", ".join(f"{n} {s}" for s, n in sorted(channel.items())) or "none"))
    _print_violations(status["violations"])


def _print_violations(violations: dict[str, list[str]]) -> None:
    if not violations:
        click.echo("invariants: all hold")
    for name, run_ids in violations.items():
        click.echo(f"VIOLATED {name}: {', '.join(run_ids)}")


def _with_progress(
    paths: StatePaths, operation: str, payload: dict[str, Any], key: str | None, show: bool
) -> envelope.Response:
    """Send a long maintenance request; on a terminal, draw its progress from state.status polled
    on a second connection meanwhile."""
    check(operation, payload)  # a usage error is raised here, not in the thread below
    answer: list[envelope.Response] = []
    worker = threading.Thread(
        target=lambda: answer.append(request(paths, operation, payload, idempotency_key=key)), daemon=True
    )
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
    receipt = accepted(_with_progress(paths, "state.backup", {"destination": target}, None, show=not as_json))
    if as_json:
        click.echo(canonical.dumps(receipt))
    else:
        click.echo(f"backed up and verified: {receipt['destination']} ({receipt['bytes']} bytes)")


def _prune_before(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        prune_before_ms(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@state_group.command("prune")
@click.option(
    "--before", required=True, callback=_prune_before, help="Cutoff, ISO 8601 with a zone, e.g. 2026-08-01T00:00:00Z."
)
@click.option("--dry-run", "dry_run", is_flag=True, help="Only list eligible and blocked trees (the default).")
@click.option("--apply", "apply", is_flag=True, help="Delete the eligible trees (needs --backup).")
@click.option("--backup", "backup_path", type=click.Path(dir_okay=False), help="A new file for the backup first.")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def state_prune(
    paths: StatePaths, before: str, dry_run: bool, apply: bool, backup_path: str | None, as_json: bool
) -> None:
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
    receipt = accepted(_with_progress(paths, "state.prune", payload, key, show=apply and not as_json))
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
        click.echo(
            f"deleted {deleted['trees']} trees, {deleted['runs']} runs, {deleted['blobs']} blobs; "
            f"backup {receipt['backup']}"
        )
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
@click.option(
    "--backup",
    "backup_dir",
    required=True,
    callback=_new_absolute_dir,
    help="A new absolute directory on the same filesystem (created 0700) the files move into.",
)
@click.option("--yes", is_flag=True, help="Move a healthy database too, without asking.")
@click.pass_obj
def state_reset(paths: StatePaths, backup_dir: Path, yes: bool) -> None:
    """With the server stopped, move state.sqlite with its -wal and -shm into a new directory.

    The spec's instruction for an incompatible state as one command: it holds
    the server lock throughout (refused while a server runs), checks that
    state.sqlite opens read-only (changing no byte; if it does not, move it by
    hand), renames the files (state.sqlite first) into --backup and prints
    each move. Nothing is copied or deleted. The next 'pi-workflows server
    start' creates a new database. A database the server could still use
    (this build's schema, undamaged) moves only after a yes on a terminal, or
    with --yes.

    Example: pi-workflows state reset --backup /home/me/pi-workflows-state-2026-12-02/
    """
    from piworkflows.writer import reset

    def confirm(question: str) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            raise click.UsageError(f"{question} stdin is not a terminal: pass --yes to move it")
        return click.confirm(question, default=False)

    try:
        moved = reset.reset(paths, backup_dir, confirm)
    except (reset.ResetRefused, OSError) as exc:
        fail(str(exc))
    for source, target in moved:
        click.echo(f"moved {source} -> {target}")
    click.echo(f"the next '{command_line('server', 'start')}' creates a new state database")


@run_group.command("delete")
@click.argument("run_id")
@click.option("--yes", is_flag=True, help="Delete without asking (needed when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def run_delete(paths: StatePaths, run_id: str, yes: bool, as_json: bool) -> None:
    """Delete one finished run for good, with every run of its tree (its restarts).

    The same safety checks as 'state prune' apply, whatever the run's age: a run
    that has not finished, an unsettled or ambiguous effect, a live claim or a
    reference from another run keeps it, and the refusal names what. Asks first
    on a terminal; --yes skips the question.

    Example: pi-workflows run delete run-0123abcd --yes
    """
    check("run.delete", {}, run_id)
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("stdin is not a terminal: pass --yes to delete without a question")
        run = accepted(request(paths, "run.status", {}, run_id=run_id))
        question = (
            f"Delete run {run_id} ({run['state']['workflowName']}, {run['display']['status']}) and every "
            "run of its tree for good?"
        )
        if not click.confirm(question, default=False):
            fail("nothing was deleted")
    receipt = accepted(request(paths, "run.delete", {}, run_id=run_id))
    if as_json:
        click.echo(canonical.dumps(receipt))
        return
    deleted = receipt["deleted"]
    click.echo(f"deleted {run_id}: {deleted['runs']} runs, {deleted['blobs']} stored values")


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
        result = accepted(request(paths, "state.verify", {}))
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

"""``pi-workflows server``: start, inspect and stop the workflow server."""

from __future__ import annotations

import sys

import click

from piworkflows import canonical
from piworkflows.cli.base import EXIT_RUNTIME, accepted, command_line, fail, main, start_failed
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
from piworkflows.paths import StatePaths


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
        start_failed(exc)
    click.echo(f"server started for {paths.state_dir}")


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
        from piworkflows.supervisor import registry  # psutil: only when the server did not answer

        pids = [identity.pid for identity in registry.live(paths.registry)]
        if as_json:
            click.echo(
                canonical.dumps(
                    {"pids": pids, "socketAvailable": False, "state": "stopping"}
                    if pids
                    else {"socketAvailable": False, "state": "stopped"}
                )
            )
        elif pids:
            click.echo(f"stopping (pids: {', '.join(map(str, pids))}) for {paths.state_dir}")
            click.echo(f"  wait, or end them with '{command_line('server', 'stop', '--kill')}'")
        else:
            click.echo(f"not running ({paths.state_dir})")
        sys.exit(EXIT_RUNTIME)
    receipt = accepted(response)
    if as_json:
        click.echo(canonical.dumps(receipt))
        return
    counts = {name: "-" if value is None else value for name, value in receipt.items()}  # null: not readable now
    click.echo(f"{receipt['state']} ({paths.state_dir}), server epoch {receipt['epoch']}")
    if receipt["reason"] is not None:
        click.echo(f"  {receipt['reason']['code']}: {receipt['reason']['message']}")
    click.echo(
        f"  runs: {counts['queuedRuns']} queued, {counts['runningRuns']} running, "
        f"{counts['parkedRuns']} parked, {counts['waitingRuns']} waiting"
    )
    click.echo(f"  active runners: {counts['activeRunners']}, expired claims: {counts['expiredClaims']}")
    ambiguous = f"ambiguous effects: {counts['ambiguousEffects']}"
    if receipt.get("ambiguousEffectsOfEndedRuns"):  # never attempted again: only a confirmation is left
        ambiguous += (
            f" ({receipt['ambiguousEffectsOfEndedRuns']} of ended runs: list them with "
            f"'{command_line('effects')}', record one that acted with '{command_line('effect', 'confirm', 'ID')}')"
        )
    click.echo(f"  pending interactions: {counts['pendingInteractions']}, {ambiguous}")
    click.echo(
        f"  connections: {receipt['connections']} of at most {receipt['maxConnections']}, "
        f"fd limit {receipt['fdLimit'] or 'unlimited'}"
    )


@server.command("stop")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the server to exit.",
)
@click.option("--kill", is_flag=True, help="If it has not exited within --timeout, SIGKILL its recorded processes.")
@click.pass_obj
def server_stop(paths: StatePaths, timeout: float, kill: bool) -> None:
    """Stop the server: in-flight commands commit, children stop, the lock is released.

    Done when no process host.json records lives (a server whose socket is gone
    but whose processes live is waited for too). After --timeout it exits 1;
    with --kill it sends SIGKILL instead to the supervisor and to every recorded
    child (a process group a child leads as a whole), each only after its
    identity (pid, start time, command line) matched, then to every process of
    yours that descends from this server's children (their lineage in its
    environment), and prints what it killed.

    Example: pi-workflows server stop --timeout 30 --kill
    """
    try:
        stopped = stop_server(paths, timeout)
    except StopTimedOut as exc:
        if not kill:
            fail(f"{exc}; wait, or end its processes with '{command_line('server', 'stop', '--kill')}'")
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
    from piworkflows.settings import Settings  # pydantic: only where a setting is read
    from piworkflows.supervisor import lineage, registry

    killed = registry.kill_recorded(paths.registry, Settings.from_env().stop_grace_ms / 1000)
    for identity in killed:
        click.echo(
            f"killed {identity.role} (pid {identity.pid})" + (" and its process group" if identity.processGroup else "")
        )
    left_behind = lineage.end(lineage.find(lineage.state_tag(paths.state_dir)))
    if left_behind:
        click.echo(f"killed what its children left behind: pids {', '.join(map(str, left_behind))}")
    left = registry.live(paths.registry)
    if left:
        fail(f"still running after SIGKILL: pids {', '.join(str(identity.pid) for identity in left)}")
    click.echo("server stopped (killed)" if killed else "server stopped")  # it may have exited meanwhile

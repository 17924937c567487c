"""``pi-workflows view [RUN_ID] [--once]``: the terminal viewer (piworkflows/viewer/).

--once prints one plain render instead (the run list, or the run's story) and exits: 0, or 1
when the run is unknown or no server runs. Without a terminal on stdin and stdout the live
viewer is a usage error that names ``--once`` (it would wait for keys no one can press).
"""

from __future__ import annotations

import sys
import time

import click

from piworkflows.cli import run_view
from piworkflows.cli.base import accepted, check, command_line, connection, fail, main, say
from piworkflows.paths import StatePaths


@main.command("view")
@click.argument("run_id", required=False)
@click.option("--once", is_flag=True, help="Print one plain render and exit (for scripts).")
@click.pass_obj
def view(paths: StatePaths, run_id: str | None, once: bool) -> None:
    """Watch the runs live in the terminal: the run list (s: status filter, w: workflow filter,
    enter: open), a run's status, steps, outputs, question, transcript and trace, with keys for
    the controls it allows now (p pause, r resume, c cancel, a answer).

    Example: pi-workflows view run-0123abcd
    """
    from piworkflows.viewer import text

    if once:
        if run_id is not None:
            check("view.run.get", {}, run_id)
        with connection(paths) as client:
            if run_id is None:
                lines = text.list_lines(accepted(client.request("run.list", {"limit": 50})), int(time.time() * 1000))
            else:
                lines = text.run_lines(run_view.get(client, run_id))
        for line in lines:
            say(line)
        return
    if run_id is not None:  # an unknown run is an error here, not an empty screen
        check("view.run.get", {}, run_id)
        with connection(paths) as client:
            found = client.request("run.status", {}, run_id=run_id)
        if found.outcome == "notFound":
            fail(f"no run {run_id} in {paths.state_dir}; list the runs with '{command_line('runs')}'")
        accepted(found)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # the full-screen app needs a terminal both ways
        raise click.UsageError(
            "the live viewer needs a terminal (stdin and stdout); for one plain render run "
            + command_line("view", *([run_id] if run_id else []), "--once")
        )
    from piworkflows.viewer.app import Viewer  # Textual loads only for the live viewer

    Viewer(paths, run_id).run()

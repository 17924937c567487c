"""``pi-workflows setup pi``: install the pinned Pi coding agent for agent nodes."""

from __future__ import annotations

import sys

import click

from piworkflows.agents import pi
from piworkflows.cli.base import fail, main


@main.group("setup")
def setup_group() -> None:
    """Install what agent nodes need.

    Example: pi-workflows setup pi
    """


@setup_group.command("pi")
def setup_pi() -> None:
    """Install the Pi coding agent (the pinned @mariozechner/pi-coding-agent) with npm into
    ${XDG_DATA_HOME:-~/.local/share}/piworkflows/pi and print the path of its command. Nothing is
    installed when that version is there already. Needs Node.js >= 20.6 with npm; the server uses
    PI_WORKFLOWS_PI_COMMAND instead when it is set.

    Example: pi-workflows setup pi
    """
    say = (lambda text: click.echo(text, err=True)) if sys.stderr.isatty() else (lambda text: None)
    try:
        command, _ = pi.install(pi.install_dir(), say)
    except pi.PiSetupError as exc:
        fail(str(exc))
    click.echo(str(command))

"""``pi-workflows doctor``: what agent steps would run on here, and whether it answers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import click

from piworkflows.agents import pi
from piworkflows.cli.base import EXIT_RUNTIME, command_line, main

if TYPE_CHECKING:
    from piworkflows.settings import Settings

PROBE_TIMEOUT_S = 120


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """Exit code (None: it could not run or timed out) and its output: stdout when it succeeded,
    else the cause it gave (``cause``)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:g} s"
    except OSError as exc:
        return None, exc.strerror or str(exc)
    if done.returncode == 0 and done.stdout.strip():
        return 0, done.stdout.strip()
    return done.returncode, cause(done.stderr) or done.stdout.strip()


def cause(stderr: str) -> str:
    """What a failed command said first, its first paragraph on one line: Pi puts the cause ("No
    API key found for anthropic.") before the help that follows it (paths to its docs)."""
    paragraph = stderr.strip().split("\n\n", 1)[0] if stderr.strip() else ""
    return " ".join(line.strip() for line in paragraph.splitlines() if line.strip())


def _where_pi(settings: Settings) -> str:
    if settings.pi_command:
        return "PI_WORKFLOWS_PI_COMMAND"
    if pi.installed_command(pi.install_dir()).exists():
        return "installed by pi-workflows setup pi"
    return "PATH"


@main.command("doctor")
@click.option("--offline", is_flag=True, help="Skip the probe that asks the model for one word.")
def doctor(offline: bool) -> None:
    """Report what agent steps need: Node.js, the Pi command (path, version, where it was found),
    the model setting, Pi's configuration directory, and whether the model answers a one-word
    probe (skipped with --offline). Exits 1 when something agent steps need is missing.

    Example: pi-workflows doctor --offline
    """
    from piworkflows.settings import Settings  # pydantic: only this command

    settings = Settings.from_env()
    problems = 0
    node = shutil.which("node")
    node_version = _run([node, "--version"], 10)[1] if node else None
    click.echo(f"node:       {node_version or 'not found'}{f' ({node})' if node else ''}")
    command = pi.find_pi(settings)
    version = None
    if command is None:
        click.echo(f"pi:         not found: {pi.NEEDS_PI}")
        problems += 1
    else:
        code, said = _run([command, "--version"], 30)
        version = said if code == 0 else None
        found = f"{version or 'does not run: ' + said} ({command}, {_where_pi(settings)})"
        click.echo(f"pi:         {found}")
        if version is None:
            problems += 1
        elif version != pi.PI_VERSION:
            click.echo(f"            this build is tested with Pi {pi.PI_VERSION}")
    model = settings.agent_model
    click.echo(f"model:      {model or 'Pi default (a node or workflow may name one)'}")
    config = os.environ.get("PI_CODING_AGENT_DIR") or str(Path.home() / ".pi" / "agent")
    click.echo(f"pi config:  {config} (models.json and auth stay there, never in the database)")
    if offline or command is None or version is None:
        click.echo("probe:      skipped")
    else:
        argv = [command, "--no-extensions", "--no-session"]
        if model:
            argv += ["--model", model]
        code, said = _run([*argv, "-p", pi.PROBE_PROMPT], PROBE_TIMEOUT_S, env={**os.environ, "PI_OFFLINE": "1"})
        if code == 0 and said:
            click.echo(f"probe:      answered ({said.splitlines()[0][:60]})")
        else:
            click.echo(f"probe:      failed: {said[:300] or 'no answer'}")
            click.echo("            agent steps on this model park until Pi can reach it: give Pi the")
            click.echo("            model's key or log it in (docs/agents.md, The model), then run")
            click.echo(f"            '{command_line('doctor')}' again")
            problems += 1
    if problems:
        raise SystemExit(EXIT_RUNTIME)

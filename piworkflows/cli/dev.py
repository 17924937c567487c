"""``pi-workflows dev model --script FILE``: an author's offline model for agent steps.

Serves the scripted model (testing/scripted_model.py) on 127.0.0.1, writes a Pi configuration
directory whose ``models.json`` names it as provider ``scripted``, prints the settings that point a
server at it, and serves until Ctrl-C. The script format is in docs/authoring.md.
"""

from __future__ import annotations

import json
import shlex
import signal
import tempfile
from pathlib import Path
from typing import Any

import click

from piworkflows.cli.base import command_line, main, say


@main.group("dev")
def dev_group() -> None:
    """Tools for workflow authors: a scripted model for agent steps, offline.

    Example: pi-workflows dev model --script answers.json
    """


@dev_group.command("model")
@click.option(
    "--script",
    "script_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='A JSON file: {"MODEL": [step, ...]} (docs/authoring.md, An offline model).',
)
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0: any free port.")
@click.option("--cycle", is_flag=True, help="Start a script again from its first step after its last.")
@click.option(
    "--pi-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write Pi's models.json (default: a new temporary directory).",
)
def dev_model(script_file: Path, port: int, cycle: bool, pi_dir: Path | None) -> None:
    """Serve a scripted OpenAI-compatible model for agent steps, with no network and no API key,
    and print the Pi configuration to use with it. Each request to model MODEL takes the next
    step of its script; one past the end is answered 400 naming the model. 'pi-workflows doctor'
    does not use up a step.

    Example: pi-workflows dev model --script answers.json
    """
    from piworkflows.testing.scripted_model import PROVIDER, ScriptedModel

    scripts = _read_script(script_file)
    try:
        model = ScriptedModel(scripts, port=port, cycle=cycle)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--script") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot listen on port {port}: {exc.strerror}", param_hint="--port") from None
    with model:
        directory = model.write_pi_config(pi_dir or Path(tempfile.mkdtemp(prefix="piw-model-")))
        first = f"{PROVIDER}/{model.models()[0]}"
        say(f"scripted model serving {model.url} (models: {', '.join(model.models())})")
        say("start a server that uses it (agent steps that name no model take the first):")
        say(f"  export PI_CODING_AGENT_DIR={shlex.quote(str(directory))}")
        say(f"  export PI_WORKFLOWS_AGENT_MODEL={first}")
        say(f"  {command_line('server', 'start')}")
        say(f"or name it in the workflow: agent(..., model={first!r}); Ctrl-C stops this model")
        _serve_until_interrupted()


def _read_script(path: Path) -> dict[str, list[Any]]:
    try:
        scripts = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.BadParameter(f"{path} is not a JSON file: {exc}", param_hint="--script") from None
    if not isinstance(scripts, dict) or not scripts or not all(isinstance(v, list) for v in scripts.values()):
        raise click.BadParameter(
            f'{path} must hold {{"MODEL": [step, ...], ...}}, e.g. {{"review": [{{"text": "done"}}]}}',
            param_hint="--script",
        )
    return scripts


def _serve_until_interrupted() -> None:
    """Until Ctrl-C or SIGTERM, both the normal way to stop it (the model serves in its thread)."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        say("stopped")

"""Every CLI command and group explains itself with an example, within 80 columns."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from piworkflows.cli import COMMAND_MODULES, main

pytestmark = pytest.mark.timeout(30)


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of the group and of every command and group below it, as click lists them."""
    found = [path]
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None, name
        found += commands(command, (*path, name)) if isinstance(command, click.Group) else [(*path, name)]
    return found


def is_group(path: tuple[str, ...]) -> bool:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        next_command = command.get_command(click.Context(command), name)
        assert next_command is not None, path
        command = next_command
    return isinstance(command, click.Group)


@pytest.mark.parametrize("path", commands(main), ids=lambda path: " ".join(path) or "pi-workflows")
def test_every_help_has_an_example(path):
    """sqlite-utils' docs test: each command and group says what it does and shows itself in use."""
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    _, _, text = result.output.partition("\n\n")
    assert text.strip() and not text.lstrip().startswith(("Options:", "Commands:")), result.output  # help text
    example = r"Example: .*pi-workflows (?:--[\w-]+ \S+ )*" + re.escape(" ".join(path))  # the command itself
    assert re.search(example, result.output), result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output


README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("path", [path for path in commands(main) if not is_group(path)], ids=" ".join)
def test_every_command_has_a_line_in_the_readme(path):
    """One line each, as `pi-workflows GROUP NAME` (a line may list siblings: `run pause|resume`)."""
    *group, name = path
    prefix = "pi-workflows " + "".join(f"{part} " for part in group)
    assert re.search(re.escape(prefix) + r"(?:[\w-]+\|)*" + re.escape(name) + r"\b", README), " ".join(path)


TREE = """
import json, click
from piworkflows.cli import COMMAND_MODULES, main
def tree(command):
    if not isinstance(command, click.Group):
        return sorted(p.name for p in command.params if isinstance(p.type, click.ParamType) and p.name) + [
            type(p.type).__name__ for p in command.params]
    context = click.Context(command)
    return {name: tree(command.get_command(context, name)) for name in command.list_commands(context)}
"""


def _tree(code: str) -> object:
    done = subprocess.run([sys.executable, "-c", TREE + code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_each_command_loads_whole_from_its_modules_alone():
    """COMMAND_MODULES is complete: a command loaded on its own (a fresh process, nothing else
    loaded) has every subcommand and parameter, completion included, that loading all gives."""
    everything = _tree("print(json.dumps(tree(main)))")
    assert isinstance(everything, dict) and set(everything) == set(COMMAND_MODULES)
    for name in COMMAND_MODULES:
        alone = _tree(f"print(json.dumps(tree(main.get_command(click.Context(main), {name!r}))))")
        assert alone == everything[name], name

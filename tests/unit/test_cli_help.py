"""Every CLI command and group explains itself with an example, within 80 columns."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from piworkflows.cli import main

pytestmark = pytest.mark.timeout(30)


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        found += commands(command, (*path, name)) if isinstance(command, click.Group) else [(*path, name)]
    return found


@pytest.mark.parametrize("path", commands(main), ids=lambda path: " ".join(path) or "pi-workflows")
def test_every_help_has_an_example(path):
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert re.search(r"Example: .*pi-workflows ", result.output), result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output


README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def leaves(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, command in group.commands.items():
        found += leaves(command, (*path, name)) if isinstance(command, click.Group) else [(*path, name)]
    return found


@pytest.mark.parametrize("path", leaves(main), ids=lambda path: " ".join(path))
def test_every_command_has_a_line_in_the_readme(path):
    """One line each, as `pi-workflows GROUP NAME` (a line may list siblings: `run pause|resume`)."""
    *group, name = path
    prefix = "pi-workflows " + "".join(f"{part} " for part in group)
    assert re.search(re.escape(prefix) + r"(?:[\w-]+\|)*" + re.escape(name) + r"\b", README), " ".join(path)

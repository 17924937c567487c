"""The examples of the project's own docs compile, so they cannot rot: every ``python`` block of
docs/authoring.md that sets ``workflow`` is executed as a module and compiled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from piworkflows.workflows import Workflow

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def examples(page: str) -> list[str]:
    return [code for code in BLOCK.findall((DOCS / page).read_text()) if "workflow = define_workflow" in code]


@pytest.mark.parametrize("code", examples("authoring.md"), ids=lambda code: re.search(r'"(\w[\w-]*)"', code)[1])
def test_every_authoring_example_compiles(code: str) -> None:
    namespace: dict[str, object] = {}
    exec(compile(code, "authoring example", "exec"), namespace)  # the docs' own code, in the test only
    workflow = namespace["workflow"]
    assert isinstance(workflow, Workflow)
    workflow.compile()


def test_the_authoring_page_shows_every_node_kind() -> None:
    text = (DOCS / "authoring.md").read_text()
    kinds = ("compute", "notify", "shell", "http", "action", "checkpoint", "include_workflow", "switch")
    for kind in (*kinds, "agent", "decision", "assistant_message", "command"):
        assert f"### {kind}" in text or f"{kind}(" in text, kind
    assert len(examples("authoring.md")) >= 13

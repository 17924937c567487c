"""``pi-workflows completion bash|zsh|fish``: shell completion, with names from the server.

::

    shell ── _PI_WORKFLOWS_COMPLETE=bash_complete COMP_WORDS COMP_CWORD ──> pi-workflows (click)
        a parameter named run_id ── run.list (newest runs) ──────────┐
        a parameter named workflow ─ workflow.list {project} ─────────┼─> the running server,
        a parameter named node ───── run.status {run id}: its waiting  │   completion_timeout_ms
                                     node, else its checkpoint nodes ─┘
        <── one candidate per line; nothing at all when no server answers

``attach`` gives every command's parameter of those names (commands added later
too) a type that completes from the server. Completion never starts a server
and never prints an error: without an answer it completes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem, get_completion_class

from piworkflows.cli.base import main
from piworkflows.client import WorkflowClient

COMPLETE_VAR = "_PI_WORKFLOWS_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


@main.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL. Commands and options complete, and run ids,
    workflow names and checkpoint node names come from the running server (nothing when
    none runs).

    bash: eval "$(pi-workflows completion bash)" in ~/.bashrc; zsh: the same with zsh in
    ~/.zshrc; fish: pi-workflows completion fish > ~/.config/fish/completions/pi-workflows.fish

    Example: eval "$(pi-workflows completion bash)"
    """
    script_class = get_completion_class(shell)
    assert script_class is not None  # one of SHELLS
    click.echo(script_class(main, {}, "pi-workflows", COMPLETE_VAR).source())


def _ask(ctx: click.Context, operation: str, payload: dict[str, Any], run_id: str | None = None) -> Any:
    """The receipt the running server answers within the completion timeout, or None."""
    try:
        from piworkflows.settings import Settings  # pydantic: only where a setting is read

        timeout = Settings.from_env().completion_timeout_ms / 1000
        state_dir = ctx.find_root().params.get("state_dir")
        with WorkflowClient(state_dir, retry_for=0, timeout=timeout) as client:
            response = client.request(operation, payload, run_id=run_id)
    except Exception:  # no server, a slow one, a bad setting: complete nothing, say nothing
        return None
    return response.receipt if response.outcome == "accepted" else None


class _FromServer(click.types.StringParamType):
    """A string whose candidates the server knows."""

    def __init__(self, name: str, candidates: Callable[[click.Context], list[str]]) -> None:
        self.name = name
        self.candidates = candidates

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(value) for value in self.candidates(ctx) if value.startswith(incomplete)]


def _run_ids(ctx: click.Context) -> list[str]:
    """The newest runs."""
    page = _ask(ctx, "run.list", {"limit": 256})
    return [item["runId"] for item in page["items"]] if page else []


def _workflow_names(ctx: click.Context) -> list[str]:
    """Names run start finds (for --project, else the current directory); builtin:NAME for a
    shadowed built-in."""
    listing = _ask(ctx, "workflow.list", {"projectPath": os.path.abspath(ctx.params.get("project") or ".")})
    if not listing:
        return []
    names = [item["name"] for item in listing["items"] if item["shadowedBy"] is None]
    shadowed = [item["name"] for item in listing["items"] if item["shadowedBy"] and item["origin"] == "builtin"]
    return names + [f"builtin:{name}" for name in shadowed]


def _node_names(ctx: click.Context) -> list[str]:
    """The node the run (the command's run_id) waits at; else every checkpoint of its graph."""
    run_id = ctx.params.get("run_id")
    view = _ask(ctx, "run.status", {}, run_id=run_id) if run_id else None
    if not view:
        return []
    waiting = [step["nodeId"] for step in view["state"]["steps"] if step["status"] == "waiting"]
    return waiting or sorted(path for path, node in view["workflow"]["nodes"].items() if node["kind"] == "checkpoint")


COMPLETERS = {
    "run_id": _FromServer("run_id", _run_ids),
    "workflow": _FromServer("workflow", _workflow_names),
    "node": _FromServer("node", _node_names),
}


def attach(group: click.Group) -> None:
    """Every parameter named run_id, workflow or node (a plain string) of every command of
    ``group`` completes from the server."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            attach(command)
        for param in command.params:
            if param.name in COMPLETERS and type(param.type) is click.types.StringParamType:
                param.type = COMPLETERS[param.name]

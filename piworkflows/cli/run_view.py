"""The CLI's reading of a run view (``pi-workflows.run-view.v1``): what it renders, with the
content references it renders read back.

::

    view.run.get ──> the view; in the parts the CLI shows (state's steps, final output and error,
    the current step, the pending request) each reference of at most SHOWN_BYTES is replaced by
    its content (view.content, verified), each {"$escaped": v} by v; a bigger reference stays a
    reference and shows as its size (story.json_text).
    steps(view)  the window's steps, each with its index (stepStart + i)
"""

from __future__ import annotations

from typing import Any

from piworkflows import canonical
from piworkflows.cli.base import accepted
from piworkflows.client import WorkflowClient

SHOWN_BYTES = 64 * 1024


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"$artifact"} and isinstance(value["$artifact"], dict)


class Contents:
    """References resolved through one client, each read once."""

    def __init__(self, client: WorkflowClient, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.read: dict[str, Any] = {}

    def resolve(self, value: Any) -> Any:
        """``value`` as the run stored it: escapes undone, references within SHOWN_BYTES read."""
        if isinstance(value, list):
            return [self.resolve(item) for item in value]
        if not isinstance(value, dict):
            return value
        if set(value) == {"$escaped"} and isinstance(value["$escaped"], dict):
            return {key: self.resolve(item) for key, item in value["$escaped"].items()}
        if is_reference(value):
            artifact = value["$artifact"]
            if artifact["bytes"] > SHOWN_BYTES:
                return value
            if artifact["path"] not in self.read:
                data = self.client.read_content(self.run_id, value)
                json_media = artifact["mediaType"] == "application/json"
                self.read[artifact["path"]] = canonical.loads(data) if json_media else data.decode("utf-8")
            return self.read[artifact["path"]]
        return {key: self.resolve(item) for key, item in value.items()}


def shown(contents: Contents, view: dict[str, Any]) -> dict[str, Any]:
    """The view with the parts the CLI renders resolved."""
    state, ours = view["state"], view["piworkflows"]
    resolved = {key: contents.resolve(state[key]) for key in ("steps", "finalOutput", "error") if key in state}
    pending = contents.resolve(ours["pending"])
    return {**view, "state": {**state, **resolved}, "piworkflows": {**ours, "pending": pending}}


def current_step(view: dict[str, Any]) -> dict[str, Any] | None:
    """The run's running or waiting step: the step of the window whose attempt is the state's
    current attempt (the newest step); None when no step is active."""
    attempt = view["state"].get("currentAttemptId")
    return next((step for step in reversed(view["state"]["steps"]) if step["attemptId"] == attempt), None)


def get(client: WorkflowClient, run_id: str) -> dict[str, Any]:
    """The run's view as the CLI shows it (a refusal: the CLI's failure)."""
    return shown(Contents(client, run_id), accepted(client.request("view.run.get", {}, run_id=run_id)))


def steps(view: dict[str, Any]) -> list[dict[str, Any]]:
    """The window's steps (the newest ones, the current step among them), each with its ``index``."""
    return [{**step, "index": view["stepStart"] + i} for i, step in enumerate(view["state"]["steps"])]

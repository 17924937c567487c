"""The handler registry: each internal command kind maps to exactly one handler.

``tests/unit/test_registry.py`` checks that this registry and
``protocol.internal.COMMAND_MODELS`` (the package's ``__init__``) match one to one.
"""

from __future__ import annotations

from typing import Any

from piworkflows.writer.commands import (
    agents,
    channels,
    content,
    control,
    decisions,
    effects,
    logs,
    nodes,
    runners,
    runs,
    server,
    state,
)
from piworkflows.writer.contract import Handler

HANDLERS: tuple[Handler[Any], ...] = (
    *content.HANDLERS,
    *server.HANDLERS,
    *runs.HANDLERS,
    *control.HANDLERS,
    *runners.HANDLERS,
    *nodes.HANDLERS,
    *decisions.HANDLERS,
    *channels.HANDLERS,
    *effects.HANDLERS,
    *state.HANDLERS,
    *logs.HANDLERS,
    *agents.HANDLERS,
)

REGISTRY: dict[str, Handler[Any]] = {handler.kind: handler for handler in HANDLERS}
assert len(REGISTRY) == len(HANDLERS), "two handlers claim one command kind"

"""The node context ``ctx`` that workflow code receives (docs/workflows.md, Node kinds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeContext:
    input: Any
    outputs: dict[str, Any] = field(default_factory=dict)  # latest accepted output per node (successes)
    results: dict[str, Any] = field(default_factory=dict)  # every node result, failures included
    settings: dict[str, Any] = field(default_factory=dict)

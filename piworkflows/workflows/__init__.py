"""The workflow authoring API (docs/workflows.md): declare nodes and edges, compile.

A workflow module ``<name>.workflow.py`` sets ``workflow = define_workflow(...)``.
Its code runs only in a supervised resolver or runner child.
"""

from piworkflows.workflows.compiler import (
    CompiledWorkflow,
    Workflow,
    WorkflowDefinitionError,
    define_workflow,
)
from piworkflows.workflows.nodes import (
    DEFAULT,
    action,
    agent,
    assistant_message,
    checkpoint,
    choice,
    command,
    compute,
    decision,
    edge,
    http,
    human_decision,
    idempotent_effect,
    include_workflow,
    manual_effect,
    notify,
    pi,
    shell,
    switch,
    text_input,
)

__all__ = [
    "DEFAULT",
    "CompiledWorkflow",
    "Workflow",
    "WorkflowDefinitionError",
    "action",
    "agent",
    "assistant_message",
    "checkpoint",
    "choice",
    "command",
    "compute",
    "decision",
    "define_workflow",
    "edge",
    "http",
    "human_decision",
    "idempotent_effect",
    "include_workflow",
    "manual_effect",
    "notify",
    "pi",
    "shell",
    "switch",
    "text_input",
]

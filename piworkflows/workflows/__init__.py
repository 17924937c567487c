"""The workflow authoring API (WORKFLOWS.md): declare nodes and edges, compile.

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
    action,
    checkpoint,
    compute,
    edge,
    http,
    idempotent_effect,
    include_workflow,
    manual_effect,
    notify,
    shell,
    switch,
)

__all__ = [
    "CompiledWorkflow",
    "Workflow",
    "WorkflowDefinitionError",
    "action",
    "checkpoint",
    "compute",
    "define_workflow",
    "edge",
    "http",
    "idempotent_effect",
    "include_workflow",
    "manual_effect",
    "notify",
    "shell",
    "switch",
]

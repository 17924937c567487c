"""The runner's part of an agent or decision step (docs/agents.md, flow step 1).

::

    AgentNode + ctx ── prompt(ctx), the node's fields, the workflow's agent_model
        ──> AgentContract (request id from the attempt) ── step_contract.initial ──> step text
    runner ── node.request_agent NodeRequestAgentFrame (contract JSON, step, budget) ──> supervisor
           (a budget left to the server gets PI_WORKFLOWS_AGENT_TIMEOUT_MS) ──> writer (C2)

The run then waits with no runner; an accepted submission completes the attempt
and requeues the run, and the next runner finds the step among its completed
steps. The server's agent model (``PI_WORKFLOWS_AGENT_MODEL``) is applied later,
by the supervisor, to a contract that names none.
"""

from __future__ import annotations

from typing import Any

from piworkflows.protocol import step_contract
from piworkflows.protocol.internal.agents import (
    AgentContract,
    Executor,
    ExpectedOutput,
    NodeRequestAgentFrame,
    initial_step_key,
    message_id_of,
    request_id_of,
)
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.workflows.compiler import CompiledWorkflow
from piworkflows.workflows.context import NodeContext
from piworkflows.workflows.nodes import DEFAULT, AgentNode

MAX_PROMPT_BYTES = 256 * 1024  # the prompt travels twice (contract and step) in one frame


def expected_output(node: AgentNode) -> ExpectedOutput:
    """The contract's expected output: the snapshot's ``expectedOutput`` as the protocol model."""
    static = node.expected_static()
    return ExpectedOutput(
        kind=static["kind"],
        description=static.get("description"),
        json_schema=static.get("schema"),
        max_chars=static.get("maxChars"),
    )


def timeout_of(node: AgentNode) -> int | None:
    """The frame's budget: None the server's default, 0 unlimited, else the node's."""
    timeout = node.timeout_ms
    if isinstance(timeout, int):
        return timeout
    return None if timeout is DEFAULT else 0


def prompt_of(node: AgentNode, ctx: NodeContext) -> str:
    """The step's prompt: the node's text, or what its function returns (text, of bounded size)."""
    prompt: Any = node.prompt(ctx) if callable(node.prompt) else node.prompt
    if not isinstance(prompt, str):
        raise TypeError(f"the prompt function returned {type(prompt).__name__}, not text")
    if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise ValueError(f"the prompt is larger than {MAX_PROMPT_BYTES // 1024} KiB")
    return prompt


def contract_of(
    node: AgentNode,
    compiled: CompiledWorkflow,
    node_path: str,
    attempt_id: str,
    visit_number: int,
    attempt_number: int,
    prompt: str,
) -> AgentContract:
    executor = node.executor
    return AgentContract(
        workflow_name=compiled.workflow.name,
        node_path=node_path,
        attempt_id=attempt_id,
        request_id=request_id_of(attempt_id),
        visit_number=visit_number,
        attempt_number=attempt_number,
        prompt=prompt,
        expected_output=expected_output(node),
        validates=node.validates,
        choices=list(node.choices) if node.choices is not None else None,
        model=node.model or compiled.workflow.agent_model,
        allowed_tools=list(node.allowed_tools) if node.allowed_tools is not None else None,
        session=node.session,
        executor=Executor(kind=executor.kind, argv=list(executor.argv) if executor.argv is not None else None),
    )


def request_frame(
    node: AgentNode,
    ctx: NodeContext,
    compiled: CompiledWorkflow,
    node_path: str,
    attempt_id: str,
    visit_number: int,
    attempt_number: int,
) -> NodeRequestAgentFrame:
    """node.request_agent for this attempt; raises when the node's own code (its prompt) fails."""
    contract = contract_of(node, compiled, node_path, attempt_id, visit_number, attempt_number, prompt_of(node, ctx))
    step = step_contract.initial(contract, message_id_of(initial_step_key(contract.request_id)))
    return NodeRequestAgentFrame(
        attempt_id=attempt_id,
        contract=BlobValue.of_json(contract.model_dump(mode="json")),
        step=BlobValue.of_text(step),
        timeout_ms=timeout_of(node),
    )

"""The step contract: the text of every step message Pi gets (a command step's command reads it on
its stdin), and how a Pi entry names its message.

Every step message ends with the line ``pi-workflows-message: <id>``: the
agent host finds the step's entry on the session's active branch by it
(``message_of``). The header keeps a step from starting with ``/`` (a Pi command).
"""

from __future__ import annotations

import json
import re

from piworkflows.protocol.internal.agents import AgentContract

MARKER = "pi-workflows-message: "
MAX_REMINDERS = 2
_MARKER_LINE = re.compile(r"pi-workflows-message: (wm-[0-9a-f]{32})\s*$")


def _header(contract: AgentContract) -> str:
    return (
        f"Workflow step: {contract.workflow_name} / {contract.node_path} "
        f"(visit {contract.visit_number}, attempt {contract.attempt_number})"
    )


def _expected(contract: AgentContract) -> str:
    expected = contract.expected_output
    if contract.choices is not None:
        return "Expected output: " + json.dumps({"route": " | ".join(contract.choices)}) + " (exactly one choice)"
    if expected.kind == "schema":
        return "Expected output (JSON Schema): " + json.dumps(expected.json_schema, sort_keys=True)
    return f"Expected output: {expected.description}"


def _command_instructions(contract: AgentContract) -> list[str]:
    """A command step (``executor=command(argv)``): the output is what the command prints."""
    expected = contract.expected_output
    if expected.kind == "assistant-message":
        limit = f" of at most {expected.max_chars} characters" if expected.max_chars is not None else ""
        first = [f"Complete this step by printing your reply{limit} on standard output: it is the step's output."]
    elif expected.kind == "schema":
        first = [
            "Complete this step by printing its output on standard output as one JSON value, and nothing else.",
            _expected(contract),
        ]
    else:
        first = [
            "Complete this step by printing its output on standard output: the text is the output.",
            _expected(contract),
        ]
    return [*first, "Exit with status 0 once it is printed; any other status fails the step."]


def _instructions(contract: AgentContract) -> list[str]:
    expected = contract.expected_output
    if contract.executor.kind == "command":
        return _command_instructions(contract)
    if expected.kind == "assistant-message":
        limit = f" of at most {expected.max_chars} characters" if expected.max_chars is not None else ""
        return [
            f"Complete this step with a normal reply{limit}: your final message is the step's output.",
            "Do not call the workflow tool for this step.",
        ]
    submit = json.dumps({"action": "submit", "requestId": contract.request_id, "output": "<your result>"})
    return [
        "Complete this step by calling the `workflow` tool with:",
        submit.replace('"<your result>"', "<your result>"),
        _expected(contract),
        "The step is complete only after the workflow tool accepts the output.",
        "If the tool reports a validation error, correct the output and call it again.",
    ]


def _contract_block(contract: AgentContract, message_id: str) -> str:
    lines = [
        "---",
        f"Workflow step contract (workflow: {contract.workflow_name}, step: {contract.node_path}, "
        f"attempt: {contract.attempt_id})",
        *_instructions(contract),
        MARKER + message_id,
    ]
    return "\n".join(lines)


def initial(contract: AgentContract, message_id: str) -> str:
    """The first step message of a request."""
    return f"{_header(contract)}\n\n{contract.prompt}\n\n{_contract_block(contract, message_id)}"


def reminder(contract: AgentContract, message_id: str, number: int) -> str:
    """After a turn that ended without a result (``number`` of MAX_REMINDERS)."""
    expected = contract.expected_output
    if expected.kind == "assistant-message":
        what = "Your last turn ended without a usable reply. Reply with the step's result as a normal message."
    else:
        what = "Your last turn ended without an accepted submission. Call the `workflow` tool to submit the result."
    return (
        f"Reminder ({number} of {MAX_REMINDERS}) for {_header(contract)}\n\n{what}\n\n"
        f"{_contract_block(contract, message_id)}"
    )


def resumed(contract: AgentContract, message_id: str, last_rejection: str | None) -> str:
    """After an interruption (host or Pi lost mid-step): the prompt again, and the last rejection."""
    rejection = f"\n\nYour last submission was rejected: {last_rejection}" if last_rejection else ""
    return (
        f"Resumed: {_header(contract)}\n\nThe step was interrupted and continues here.\n\n"
        f"{contract.prompt}{rejection}\n\n{_contract_block(contract, message_id)}"
    )


def message_of(text: str) -> str | None:
    """The workflow message a user entry's text carries on its last line, if any."""
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    match = _MARKER_LINE.fullmatch(last)
    return match.group(1) if match else None

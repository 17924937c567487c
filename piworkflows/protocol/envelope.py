"""The client protocol's envelope as plain data: what a client needs without pydantic.

``client_v1`` (pydantic) stays the definition of every shape and the schema export; this module
owns the envelope's constants and the two things a client does with envelopes, kept free of
pydantic so that a CLI command starts fast:

- ``request_line``: a request, checked as ``client_v1.Request`` checks it, as its canonical line;
- ``response_of``: a received message checked as ``client_v1.Response`` checks it.

tests/unit/test_envelope.py holds both to ``client_v1``'s models (Hypothesis: the same values
accepted, the same text written).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from piworkflows import canonical
from piworkflows.errors import OUTCOMES

SCHEMA: Final = "pi-workflows.client.v1"
MAX_MESSAGE_BYTES = 1_048_576  # including the newline
OPERATIONS = (
    # run control
    "run.start",
    "run.pause",
    "run.resume",
    "run.cancel",
    "run.restart",
    "run.changeSettings",
    "run.status",
    "run.list",
    # answers and agent work
    "checkpoint.answer",
    "decision.answer",
    "interaction.submit",
    "interaction.assistant",
    "interaction.update",
    # origin-session reports
    "workflowMessage.reportBranch",
    "workflowTurn.report",
    "sessionView.clearTerminal",
    "followUp.queue",
    "followUp.remove",
    "session.record",
    # channels
    "channel.status",
    "channel.reload",
    "channel.recover",
    # resource managers
    "resourceManager.list",
    "resourceManager.get",
    "resourceManager.apply",
    "resourceManager.reconcile",
    "resourceManager.delete",
    # server
    "server.status",
    "server.stop",
    # views
    "view.runs.watch",
    "view.runs.page",
    "view.run.get",
    "view.run.watch",
    "view.run.unwatch",
    "view.page",
    "view.content",
    "view.session.watch",
    # maintenance
    "state.status",
    "state.verify",
    "state.backup",
    "state.prune",
    # piworkflows additions
    "effect.list",
    "effect.confirm",
    "effect.retry",
    "protocol.schema",
    "run.delete",
    "workflow.list",
    "workflow.show",
    "run.logs",
    "run.transcript",
)

# Operations of upstream Pi Workflows' older and newer lists that this server does not serve: a
# request naming one parses, is answered ``rejected`` ``notAvailable`` (nothing stored) and the
# connection stays open. Any other unknown name is a malformed frame.
UPSTREAM_UNSERVED = (
    "host.status",
    "host.stop",
    "notification.claim",
    "notification.deliver",
    "turn.claim",
    "turn.resolve",
    "controller.list",
    "controller.get",
    "controller.apply",
    "controller.reconcile",
    "controller.delete",
    "activity.report",
    "view.session.window",
)
assert not set(UPSTREAM_UNSERVED) & set(OPERATIONS)
_KNOWN_OPERATIONS = frozenset(OPERATIONS + UPSTREAM_UNSERVED)


def check_id(value: str) -> str:
    """An id: a non-empty string of at most 256 bytes in UTF-8 (ValueError otherwise)."""
    if not isinstance(value, str) or not value or len(value.encode("utf-8", "surrogatepass")) > 256:
        raise ValueError("an id is a non-empty string of at most 256 bytes")
    return value


def _revision(value: Any, name: str) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"{name} is an integer >= 0")
    return value


def request_line(
    *,
    request_id: str,
    client_id: str,
    operation: str,
    idempotency_key: str,
    payload: Any,
    run_id: str | None = None,
    expected_revision: int | None = None,
) -> bytes:
    """The fully canonical line of a request (optional members absent, never null); ValueError if
    ``client_v1.Request`` would refuse it or it exceeds 1 MiB."""
    if operation not in _KNOWN_OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}")
    envelope: dict[str, Any] = {
        "clientId": check_id(client_id),
        "idempotencyKey": check_id(idempotency_key),
        "operation": operation,
        "payload": payload,
        "requestId": check_id(request_id),
        "schema": SCHEMA,
        "type": "request",
    }
    if run_id is not None:
        envelope["runId"] = check_id(run_id)
    if _revision(expected_revision, "expectedRevision") is not None:
        envelope["expectedRevision"] = expected_revision
    line = canonical.dumps_bytes(envelope) + b"\n"
    if len(line) > MAX_MESSAGE_BYTES:
        raise ValueError("an outgoing message exceeds 1 MiB")
    return line


@dataclass(frozen=True, slots=True)
class Response:
    """A response envelope as received (``client_v1.Response``'s fields)."""

    requestId: str  # noqa: N815 (the protocol's names)
    outcome: str
    revision: int | None = None
    receipt: Any = None
    error: str | None = None


_RESPONSE_MEMBERS = frozenset({"schema", "type", "requestId", "outcome", "revision", "receipt", "error"})


def response_of(message: dict[str, Any]) -> Response:
    """A received message as a response; ValueError where ``client_v1.Response`` would refuse it."""
    if message.get("schema", SCHEMA) != SCHEMA or message.get("type", "response") != "response":
        raise ValueError("not a pi-workflows.client.v1 response")
    if not message.keys() <= _RESPONSE_MEMBERS:
        raise ValueError("a response has an unexpected member")
    outcome, error = message.get("outcome"), message.get("error")
    if outcome not in OUTCOMES:
        raise ValueError("a response's outcome is not one of the protocol's outcomes")
    if error is not None and (not isinstance(error, str) or not error):
        raise ValueError("a response's error is a non-empty string")
    return Response(
        requestId=check_id(message.get("requestId")),  # type: ignore[arg-type]
        outcome=outcome,
        revision=_revision(message.get("revision"), "revision"),
        receipt=message.get("receipt"),
        error=error,
    )

"""Submissions for agent steps: client.v1 ``interaction.submit`` and ``interaction.update``.

::

    workflow tool (in Pi) ── interaction.submit ──> writer interaction.submit (C10: the submission
        recorded, the request validating; the same key adopts) ── a resolver child validates it
        with the run's own workflow code (schema, pydantic model, validate) ── writer
        interaction.settle (C11: accepted, the attempt completes and the run is queued; or
        rejected with the error the model can act on) ── the answer to the tool

The verdict is committed before the tool hears it. A validator that times out or breaks, or a
run whose workflow code changed, rejects the submission ``validatorFailed``; the model may submit
again. A submission left validating by a crash is validated again when the server starts
(``revalidate``).

An operator's submission (``pi-workflows submit``: ``operator: true``, no coordinator epoch) takes
the same path with actor ``operator`` and needs no live host; once it is accepted, a host still
recording the step is ended as a pause ends it (its turn may never end by itself), so the run's
next agent step can have its own.
"""

from __future__ import annotations

import logging
from typing import Any

from piworkflows import faults
from piworkflows.errors import CommandError
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.resolver import Validation
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.protocol.internal.writer import Reply
from piworkflows.supervisor.registry import ChildNotRecorded
from piworkflows.supervisor.resolver import Unanswered
from piworkflows.supervisor.seams import RunControl, WorkflowResolvers, WriterRequests

log = logging.getLogger("piworkflows.supervisor")

SERVER = {"actor_class": "server"}


def _refuse(request: client_v1.Request, error: CommandError) -> client_v1.Response:
    return client_v1.Response(
        requestId=request.requestId, outcome=error.outcome, receipt=error.receipt(), error=error.message
    )


def _answer(request: client_v1.Request, reply: Reply) -> client_v1.Response:
    """A settled submission as the tool hears it: accepted (adopted on a repeat), or refused with
    the validator's error and code."""
    receipt = reply.receipt or {}
    if reply.outcome in ("accepted", "adopted") and receipt.get("status") == "accepted":
        shown = client_v1.InteractionSubmitReceipt(
            submissionId=receipt["submissionId"], requestId=receipt["requestId"], status="accepted"
        )
        return client_v1.Response(
            requestId=request.requestId, outcome=reply.outcome, revision=reply.revision, receipt=shown.model_dump()
        )
    if reply.outcome in ("accepted", "adopted") and receipt.get("status") == "rejected":
        code = receipt.get("errorCode") or "validationFailed"
        error = receipt.get("error") or "the output was rejected"
        if receipt.get("requestStatus") == "failed":
            error += f" (rejection {receipt.get('rejections')}: the most an attempt takes; the step failed)"
        return _refuse(request, CommandError(code, error))
    return client_v1.Response(
        requestId=request.requestId,
        outcome=reply.outcome,
        revision=reply.revision,
        receipt=reply.receipt,
        error=reply.error,
    )


async def submit(
    writer: WriterRequests,
    resolvers: WorkflowResolvers,
    runs: RunControl,
    request: client_v1.Request,
    payload: client_v1.InteractionSubmitPayload,
    max_rejections: int,
) -> client_v1.Response:
    output = BlobValue.of_client_json("value.output", payload.value.output)
    body = {
        # an operator's submission (operator: true, no epoch) is recorded as the operator's
        "actor": {"actor_class": "operator" if payload.operator else "model", "actor_id": request.clientId},
        "request_id": payload.requestId,
        "target_session_id": payload.targetSessionId,
        "coordinator_epoch": payload.coordinatorEpoch,
        "idempotency_key": payload.submissionId,
        "output": output.model_dump(),
    }
    recorded = await writer.request("interaction.submit", body)
    receipt = recorded.receipt or {}
    if recorded.outcome not in ("accepted", "adopted") or receipt.get("status") != "validating":
        return _answer(request, recorded)  # refused, or a repeat of a settled submission
    faults.hit(faults.SUPERVISOR_AFTER_SUBMISSION_RECORDED)
    settled = await settle(writer, resolvers, runs, receipt, payload.value.output, max_rejections)
    if payload.operator and settled.outcome == "accepted" and (settled.receipt or {}).get("status") == "accepted":
        runs.stop_agent_host(receipt["runId"])  # a host still on the step (a turn may hang) ends
    return _answer(request, settled)


async def settle(
    writer: WriterRequests,
    resolvers: WorkflowResolvers,
    runs: RunControl,
    submitted: dict[str, Any],
    output: Any,
    max_rejections: int,
) -> Reply:
    """Validate a recorded submission (``submitted``: interaction.submit's receipt) and commit the
    verdict (C11); the writer's reply. The ``max_rejections``-th rejection fails the attempt."""
    verdict = await _validate(writer, resolvers, submitted, output)
    body: dict[str, Any] = {"actor": SERVER, "submission_id": submitted["submissionId"]}
    if verdict.ok:
        body.update(verdict="accepted", output=BlobValue.of_json(verdict.output).model_dump())
    else:
        code = verdict.code if verdict.code == "validationFailed" else "validatorFailed"
        error = verdict.error or "the output was rejected"
        body.update(
            verdict="rejected",
            error=BlobValue.of_text(error).model_dump(),
            error_code=code,
            max_rejections=max_rejections,
        )
    settled = await writer.request("interaction.settle", body)
    if settled.outcome in ("accepted", "adopted") and verdict.ok:
        runs.wake_scheduler()  # the run is queued: a runner continues after the step
    elif settled.outcome == "accepted" and (settled.receipt or {}).get("requestStatus") == "failed":
        runs.wake_scheduler()  # too many rejections failed the attempt: the run goes on
        runs.stop_agent_host(submitted["runId"])  # its model may go on submitting
    return settled


async def _validate(
    writer: WriterRequests, resolvers: WorkflowResolvers, submitted: dict[str, Any], output: Any
) -> Validation:
    return await judge(writer, resolvers, submitted["runId"], submitted["nodePath"], output)


async def judge(
    writer: WriterRequests, resolvers: WorkflowResolvers, run_id: str, node_path: str, output: Any, answer: bool = False
) -> Validation:
    """The run's own workflow code on a submitted output (``answer``: on a checkpoint's answer,
    whose route only is checked) in a resolver child; refused ``validatorFailed`` when it could not
    judge."""
    state = await writer.request("run.resume_state", {"actor": SERVER, "run_id": run_id})
    if state.outcome != "accepted" or state.receipt is None:
        return Validation(ok=False, error="the run's workflow could not be read to judge the output")
    run = state.receipt
    try:
        source = RunSource.of_view(run["source"])
        return await resolvers.validate(run["projectPath"], source, run["definitionDigest"], node_path, output, answer)
    except (Unanswered, ChildNotRecorded) as exc:
        log.warning("the validator of %s did not answer: %s", run_id, exc)
        return Validation(ok=False, error=f"the output could not be validated ({exc}); submit it again")


async def update(
    writer: WriterRequests,
    request: client_v1.Request,
    payload: client_v1.InteractionUpdatePayload,
    client_receipt: dict[str, Any],
) -> client_v1.Response:
    """A progress update, stored under the request's key (a retry adopts it, no second row)."""
    body: dict[str, Any] = {
        "actor": {"actor_class": "model", "actor_id": request.clientId},
        "client_receipt": client_receipt,
        "request_id": payload.requestId,
        "target_session_id": payload.targetSessionId,
        "coordinator_epoch": payload.coordinatorEpoch,
        "message": payload.update.message,
        "progress": payload.update.progress,
    }
    reply = await writer.request("interaction.update", body)
    if reply.outcome in ("accepted", "adopted") and reply.receipt is not None:
        shown = client_v1.InteractionUpdateReceipt(requestId=reply.receipt["requestId"], status="recorded")
        return client_v1.Response(
            requestId=request.requestId, outcome=reply.outcome, revision=reply.revision, receipt=shown.model_dump()
        )
    return _answer(request, reply)

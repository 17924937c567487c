"""Client operations to writer commands: the supervisor's half of the write path.

::

    Request ─ payload model (pydantic) ─ fingerprint (outside any transaction)
            ─ writer command with actor + client receipt key ─> Reply ─> Response

A stored operation carries a ``client_receipt`` (client id, idempotency key,
fingerprint), so the writer answers a repeat from ``host_commands``: the
same request is ``adopted``, another request under the key is ``conflict``.
Listed operations that this build does not serve yet are ``rejected`` with
code ``notAvailable`` and store nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from piworkflows.errors import CommandError, describe_invalid_fields
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal import Reply

log = logging.getLogger("piworkflows.supervisor")

WriterRequest = Callable[[str, dict[str, Any]], Awaitable[Reply]]


class Router:
    def __init__(self, supervisor: Any) -> None:
        self.supervisor = supervisor  # the facts the server answers from (epoch, state, writer)
        self.routes: dict[str, Callable[[client_v1.Request, Any], Awaitable[client_v1.Response]]] = {
            "server.status": self.server_status,
            "server.stop": self.server_stop,
            "protocol.schema": self.protocol_schema,
        }
        assert set(self.routes) == set(client_v1.OPERATION_SHAPES)

    async def handle(self, request: client_v1.Request) -> client_v1.Response:
        route = self.routes.get(request.operation)
        if route is None:
            return refuse(request, CommandError("notAvailable", f"{request.operation} is not available in this build"))
        payload_model = client_v1.OPERATION_SHAPES[request.operation][0]
        try:
            payload = payload_model.model_validate(request.payload)
        except ValidationError as exc:
            refusal = CommandError("validationFailed", "payload has " + describe_invalid_fields(exc.errors()))
            return refuse(request, refusal)
        return await route(request, payload)

    async def server_status(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        reply = await self.supervisor.writer.request("server.counts", {"actor": {"actor_class": "server"}})
        if reply.outcome != "accepted":
            return from_reply(request, reply)
        receipt = client_v1.ServerStatusReceipt(
            state=self.supervisor.state,
            socketAvailable=True,
            epoch=self.supervisor.epoch,
            activeRunners=0,
            **reply.receipt,
        )
        return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=receipt.model_dump())

    async def server_stop(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        reply = await self.supervisor.writer.request(
            "server.record_stop",
            {"actor": client_actor(request), "client_receipt": receipt_key(request),
             "server_epoch": self.supervisor.epoch},
        )  # fmt: skip
        # adopted: the stop was recorded but its first answer was lost (the
        # writer died after COMMIT); it is still this epoch's stop to carry out.
        if reply.outcome == "accepted" or (
            reply.outcome == "adopted" and (reply.receipt or {}).get("serverEpoch") == self.supervisor.epoch
        ):
            self.supervisor.request_stop("server.stop from a client")
        return from_reply(request, reply)

    async def protocol_schema(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=client_v1.schema_document())


def client_actor(request: client_v1.Request) -> dict[str, Any]:
    return {"actor_class": "client", "actor_id": request.clientId}


def receipt_key(request: client_v1.Request, run_id: str | None = None) -> dict[str, Any]:
    """The host_commands key; ``run_id`` only for operations on an existing run."""
    return {
        "client_id": request.clientId,
        "idempotency_key": request.idempotencyKey,
        "fingerprint": client_v1.fingerprint(request),
        "operation": request.operation,
        "run_id": run_id,
    }


def refuse(request: client_v1.Request, refusal: CommandError) -> client_v1.Response:
    return client_v1.Response(
        requestId=request.requestId, outcome=refusal.outcome, receipt=refusal.receipt(), error=refusal.message
    )


def from_reply(request: client_v1.Request, reply: Reply) -> client_v1.Response:
    return client_v1.Response(
        requestId=request.requestId,
        outcome=reply.outcome,
        revision=reply.revision,
        receipt=reply.receipt,
        error=reply.error,
    )

"""Client operations to writer commands: the supervisor's half of the write path.

::

    Request ─ payload model (pydantic) ─ fingerprint (outside any transaction)
            ─ writer command with actor + client receipt key ─> Reply ─> Response

A stored operation carries a ``client_receipt`` (client id, idempotency key,
fingerprint), so the writer answers a repeat from ``host_commands``: the
same request is ``adopted``, another request under the key is ``conflict``.
Listed operations that this build does not serve yet, and upstream's operations that
it never serves (``client_v1.UPSTREAM_UNSERVED``), are ``rejected`` with code
``notAvailable`` and store nothing. Each served operation has one route in
``ROUTES`` (its keys are ``client_v1.OPERATION_SHAPES``'s, ``tests/unit/test_registry.py``).

The router depends on narrow seams (supervisor/seams.py): the writer's requests
and health, the resolver children, the server's facts (state, epoch, load,
stop, maintenance) and what a committed command sets going (RunControl); it
waits on its Clock. Tests drive it with fakes of each.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from piworkflows import canonical
from piworkflows.clock import Clock
from piworkflows.errors import CommandError, Outcome, describe_invalid_fields
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal.base import Actor, BlobValue, ClientReceiptKey
from piworkflows.protocol.internal.logs import RunContentRead, RunLogs, RunTranscript, ViewContent
from piworkflows.protocol.internal.resolver import Resolution
from piworkflows.protocol.internal.runs import RunCreate, RunSource, ViewPage
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.states import MEDIA_JSON
from piworkflows.supervisor import interactions
from piworkflows.supervisor.registry import ChildNotRecorded
from piworkflows.supervisor.resolver import Unanswered
from piworkflows.supervisor.seams import (
    ChannelControl,
    RunControl,
    ServerHost,
    WorkflowResolvers,
    WriterStatus,
    ask_while_unavailable,
)
from piworkflows.supervisor.views import Views

log = logging.getLogger("piworkflows.supervisor")

WriterRequest = Callable[[str, dict[str, Any]], Awaitable[Reply]]


class Router:
    def __init__(
        self,
        writer: WriterStatus,
        resolvers: WorkflowResolvers,
        host: ServerHost,
        runs: RunControl,
        settings: Settings,
        clock: Clock,
        views: Views | None = None,
        channels: ChannelControl | None = None,
    ) -> None:
        self.writer = writer
        self.channels = channels  # the Telegram channels (supervisor/channels.py)
        self.views = views or Views(writer)  # the live views' watches (supervisor/views.py)
        self.resolvers = resolvers
        self.host = host  # the facts the server answers from (state, epoch, load)
        self.runs = runs  # what a committed command sets going
        self.settings = settings
        self.clock = clock

    async def handle(self, request: client_v1.Request) -> client_v1.Response:
        route = ROUTES.get(request.operation)
        if route is None:
            why = (
                "is an operation of upstream Pi Workflows that this server does not serve"
                if request.operation in client_v1.UPSTREAM_UNSERVED
                else "is not available in this build"
            )
            return refuse(request, CommandError("notAvailable", f"{request.operation} {why}"))
        payload_model = client_v1.OPERATION_SHAPES[request.operation][0]
        try:
            payload = payload_model.model_validate(request.payload)
        except ValidationError as exc:
            refusal = CommandError("validationFailed", "payload has " + describe_invalid_fields(exc.errors()))
            return refuse(request, refusal)
        try:
            return await route(self, request, payload)
        except CommandError as refusal:  # raised before anything was sent: a value outside the domain
            return refuse(request, refusal)

    async def server_status(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """Always answered: with the writer's counts when it can read them, and why nothing can be
        committed when that is so (a full disk, a damaged database, no writer)."""
        reason = self.writer.unavailable_reason()
        state = self.host.state
        if state != "stopping" and reason is not None:
            state = "refusing" if reason["code"] == "databaseCorrupt" else "unavailable"
        reply = await self.writer.request("server.counts", {"actor": {"actor_class": "server"}})
        counts = reply.receipt if reply.outcome == "accepted" and reply.receipt else {}
        load = self.host.load()
        receipt = client_v1.ServerStatusReceipt(
            state=state,
            reason=client_v1.UnavailableReason.model_validate(reason) if reason is not None else None,
            socketAvailable=True,
            epoch=self.host.epoch,
            activeRunners=load.active_runners,
            connections=load.connections,
            maxConnections=load.max_connections,
            fdLimit=load.fd_limit,
            **counts,
        )
        return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=receipt.model_dump())

    async def server_stop(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """Recorded on the server resource, then carried out. While nothing can be committed (a
        writer restarting, a full disk) it is asked again with the same key for up to
        stop_grace_ms; then, or with a damaged database, the stop is carried out all the same,
        answered unconfirmed."""
        epoch = self.host.epoch
        body = {"actor": client_actor(request), "client_receipt": receipt_key(request), "server_epoch": epoch}
        reply = await ask_while_unavailable(
            self.writer, "server.record_stop", body, self.settings, self.clock, within_ms=self.settings.stop_grace_ms
        )
        # adopted: the stop was recorded but its first answer was lost (the
        # writer died after COMMIT); it is still this epoch's stop to carry out.
        if reply.outcome == "accepted" or (
            reply.outcome == "adopted" and (reply.receipt or {}).get("serverEpoch") == epoch
        ):
            self.host.request_stop("server.stop from a client")
        elif reply.outcome == "unavailable" or _code(reply) == "databaseCorrupt":
            self.host.request_stop(f"server.stop from a client (not confirmed as recorded: {_code(reply)})")
            receipt = client_v1.ServerStopReceipt(stopping=True, serverEpoch=epoch, recorded=False)
            return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=receipt.model_dump())
        return from_reply(request, reply)

    async def stored_answer(self, request: client_v1.Request) -> client_v1.Response | None:
        """The answer stored for this exact request (adopted), a key conflict, or None."""
        reply = await self.writer.request(
            "receipt.find", {"actor": {"actor_class": "server"}, "key": receipt_key(request)}
        )
        if reply.outcome != "accepted":
            return from_reply(request, reply)
        if not reply.receipt or not reply.receipt["found"]:
            return None
        answer = reply.receipt["answer"]
        outcome: Outcome = "adopted" if answer["outcome"] == "accepted" else answer["outcome"]
        return client_v1.Response(
            requestId=request.requestId,
            outcome=outcome,
            revision=answer["revision"],
            receipt=answer["receipt"],
            error=answer["error"],
        )

    async def run_start(self, request: client_v1.Request, payload: client_v1.RunStartPayload) -> client_v1.Response:
        """Resolve and compile in a resolver child, then commit the run queued with its receipt.

        One writer round trip: ``run.create`` carries the receipt key, so a retry of a
        committed start is adopted there. Only a start that cannot be resolved (now) looks
        for a stored answer first: a retry of a committed start is adopted even if its
        workflow changed or vanished since.
        """
        project_path = os.path.realpath(payload.projectPath)
        run_input = BlobValue.of_client_json("input", payload.input)  # before any child sees it
        try:
            resolution = await self.resolvers.resolve(project_path, payload.workflowName, payload.input)
        except ChildNotRecorded:
            return refuse(request, _no_resolver())
        refusal = None
        if not resolution.ok:
            code = "workflowNotFound" if resolution.code == "workflowNotFound" else "invalidDefinition"
            refusal = CommandError(code, resolution.message or "the workflow cannot be used")
        elif mismatch := _source_mismatch(payload, resolution):
            refusal = CommandError("workflowSourceChanged", mismatch)
        if refusal is not None:
            stored = await self.stored_answer(request)
            return stored if stored is not None else refuse(request, refusal)
        assert resolution.snapshot is not None and resolution.source is not None and resolution.max_steps is not None
        create = RunCreate(
            actor=Actor(actor_class="client", actor_id=request.clientId),
            client_receipt=ClientReceiptKey(**receipt_key(request)),
            run_id=request.runId or "run-" + uuid.uuid4().hex,
            project_path=project_path,
            workflow_name=resolution.workflow_name or payload.workflowName,
            definition=BlobValue.of_bytes(resolution.snapshot, MEDIA_JSON),  # checked where the writer decodes it
            source=resolution.source,
            input=run_input,
            launch_options=(
                BlobValue.of_client_json("launchOptions", payload.launchOptions)
                if payload.launchOptions is not None
                else None
            ),
            title=resolution.title,
            max_steps=resolution.max_steps,
            execution_mode=payload.executionMode,
            origin_session_id=payload.originSessionId,
        )
        reply = await self.writer.request("run.create", create.model_dump())
        if reply.outcome == "accepted":
            self.runs.wake_scheduler()
        return from_reply(request, reply)

    async def workflow_list(
        self, request: client_v1.Request, payload: client_v1.WorkflowListPayload
    ) -> client_v1.Response:
        """Discovered, loaded and compiled in a resolver child; a module that fails to load is an
        item with its error."""
        try:
            listing = await self.resolvers.list_workflows(os.path.realpath(payload.projectPath))
        except ChildNotRecorded:
            return refuse(request, _no_resolver())
        except Unanswered as exc:
            return refuse(request, CommandError("invalidDefinition", str(exc)))
        items = [
            client_v1.WorkflowListItem(
                name=item.name,
                origin=item.origin,
                source=item.source,
                description=item.description,
                shadowedBy=item.shadowed_by,
                error=client_v1.LoadError.model_validate(item.error.model_dump()) if item.error else None,
            )
            for item in listing.items
        ]
        receipt = client_v1.WorkflowListReceipt(
            projectDirectory=listing.project_directory,
            userDirectory=listing.user_directory,
            items=items,
            truncated=listing.truncated,
        )
        return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=receipt.model_dump())

    async def workflow_show(
        self, request: client_v1.Request, payload: client_v1.WorkflowShowPayload
    ) -> client_v1.Response:
        """Resolved and compiled like run.start's workflow, in a resolver child; nothing is stored."""
        try:
            shown = await self.resolvers.show(os.path.realpath(payload.projectPath), payload.workflowName)
        except ChildNotRecorded:
            return refuse(request, _no_resolver())
        if not shown.ok:
            code = "workflowNotFound" if shown.code == "workflowNotFound" else "invalidDefinition"
            return refuse(request, CommandError(code, shown.message or "the workflow cannot be used"))
        assert shown.workflow_name and shown.origin and shown.source and shown.digest and shown.snapshot is not None
        receipt = client_v1.WorkflowShowReceipt(
            workflowName=shown.workflow_name,
            origin=shown.origin,
            source=shown.source,
            description=shown.description,
            definitionDigest=shown.digest,
            snapshot=shown.snapshot,
        )
        return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=receipt.model_dump())

    async def run_status(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """run.status and view.run.get: the run view."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", f"{request.operation} names the run in runId"))
        reply = await self.writer.request("run.get", {"actor": client_actor(request), "run_id": request.runId})
        return from_reply(request, reply)

    async def view_run_watch(
        self, request: client_v1.Request, payload: client_v1.ViewRunWatchPayload
    ) -> client_v1.Response:
        """The run's snapshots on this connection: now and after each change (supervisor/views.py)."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "view.run.watch names the run in runId"))
        return await _watching(request, self.views.watch_run(request, payload))

    async def view_runs_watch(
        self, request: client_v1.Request, payload: client_v1.ViewRunsWatchPayload
    ) -> client_v1.Response:
        """The run list's first page on this connection: now and after changes."""
        return await _watching(request, self.views.watch_runs(request, payload, _list_body(request, payload)))

    async def view_session_watch(
        self, request: client_v1.Request, payload: client_v1.ViewSessionWatchPayload
    ) -> client_v1.Response:
        """The run of a Pi session on this connection: now and after each change."""
        if payload.coordinator:
            why = "a coordinator's session watch needs interactive runs in a person's Pi, not served yet"
            return refuse(request, CommandError("notAvailable", why))
        return await _watching(request, self.views.watch_session(request, payload))

    async def view_run_unwatch(
        self, request: client_v1.Request, payload: client_v1.ViewUnwatchPayload
    ) -> client_v1.Response:
        return await _watching(request, self.views.unwatch(request, payload.subscriptionId))

    async def view_page(self, request: client_v1.Request, payload: client_v1.ViewPagePayload) -> client_v1.Response:
        """A page of one of the run's histories; at another presentation revision than the client's
        expectedRevision (when given): conflict, the current page in the receipt's ``page``."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "view.page names the run in runId"))
        body = {"actor": client_actor(request), "run_id": request.runId, "page_kind": payload.kind}
        body |= {"start": payload.cursor, "limit": payload.limit}
        response = from_reply(request, await self.writer.request(ViewPage.kind, body))
        page = response.receipt or {}
        expected = request.expectedRevision
        if response.outcome == "accepted" and expected is not None and page["revision"] != expected:
            stale = f"the run's view is at revision {page['revision']}, not {expected}: the page is in the receipt"
            return refuse(request, CommandError("staleRevision", stale, page=page))
        return response

    async def view_content(
        self, request: client_v1.Request, payload: client_v1.ViewContentPayload
    ) -> client_v1.Response:
        """A chunk of a run view's content reference, its bytes in base64."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "view.content names the run in runId"))
        body = {"actor": client_actor(request), "run_id": request.runId, "path": payload.path, "offset": payload.offset}
        return from_reply(request, _base64_data(await self.writer.request(ViewContent.kind, body)))

    async def run_list(self, request: client_v1.Request, payload: client_v1.RunListPayload) -> client_v1.Response:
        return from_reply(request, await self.writer.request("run.list", _list_body(request, payload)))

    async def view_runs_page(
        self, request: client_v1.Request, payload: client_v1.ViewRunsPagePayload
    ) -> client_v1.Response:
        """A run-list page at an offset or keyset cursor; the first page only at the client's
        revision (else conflict with the current first page, so the client starts over)."""
        response = from_reply(request, await self.writer.request("run.list", _list_body(request, payload)))
        page = response.receipt or {}
        if response.outcome == "accepted" and payload.cursor == 0 and page["revision"] != payload.revision:
            stale = CommandError(
                "staleRevision",
                f"the run list is at revision {page['revision']}, not {payload.revision}: the current first page "
                "is in the receipt's page",
                page=page,
            )
            return refuse(request, stale)
        return response

    async def run_logs(self, request: client_v1.Request, payload: client_v1.RunLogsPayload) -> client_v1.Response:
        """A page of the run's steps, or (``content``) a part of a value linked to the run, its bytes
        in base64."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "run.logs names the run in runId"))
        body: dict[str, Any] = {"actor": client_actor(request), "run_id": request.runId}
        content = payload.content
        if content is None:
            body.update(node_path=payload.nodePath, after=payload.after, limit=payload.limit)
            return from_reply(request, await self.writer.request(RunLogs.kind, body))
        body.update(
            digest=bytes.fromhex(content.digest.removeprefix("sha256:")),
            media_type=content.mediaType,
            offset=content.offset,
        )
        return from_reply(request, _base64_data(await self.writer.request(RunContentRead.kind, body)))

    async def run_transcript(
        self, request: client_v1.Request, payload: client_v1.RunTranscriptPayload
    ) -> client_v1.Response:
        """A page of the run's captured Pi conversation (its settled session entries)."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "run.transcript names the run in runId"))
        body: dict[str, Any] = {
            "actor": client_actor(request),
            "run_id": request.runId,
            "node_path": payload.nodePath,
            "after": payload.after,
            "limit": payload.limit,
        }
        return from_reply(request, await self.writer.request(RunTranscript.kind, body))

    async def checkpoint_answer(
        self, request: client_v1.Request, payload: client_v1.CheckpointAnswerPayload
    ) -> client_v1.Response:
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "checkpoint.answer names the run in runId"))
        answer = BlobValue.of_client_json("answer", payload.answer)
        stored = await self.stored_answer(request)  # a retry of a committed answer is not judged again
        if stored is not None:
            return stored
        # An answer no route takes would complete the node and then fail the run (routingError):
        # refused here, the run unchanged. When the code cannot judge (it changed, it broke) the
        # answer goes on, and the runner reports what it finds.
        verdict = await interactions.judge(
            self.writer, self.resolvers, request.runId, payload.nodePath, payload.answer, answer=True
        )
        if not verdict.ok and verdict.code == "validationFailed":
            return refuse(request, CommandError("validationFailed", f"the answer was refused: {verdict.error}"))
        body: dict[str, Any] = {
            "actor": client_actor(request),
            "client_receipt": receipt_key(request),
            "run_id": request.runId,
            "node_path": payload.nodePath,
            "answer": answer.model_dump(),
        }
        if request.expectedRevision is not None:
            body["expected_revision"] = request.expectedRevision
        reply = await self.writer.request("checkpoint.answer", body)
        if reply.outcome == "accepted":
            self.runs.wake_scheduler()
        return from_reply(request, reply)

    async def decision_answer(
        self, request: client_v1.Request, payload: client_v1.DecisionAnswerPayload
    ) -> client_v1.Response:
        """A protected decision's answer; the declared source is the actor class the writer judges
        (operator and human may answer, a model never; no source: an undeclared client)."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "decision.answer names the run in runId"))
        actor = {"actor_class": payload.source or "client", "actor_id": request.clientId}
        body: dict[str, Any] = {
            "actor": actor,
            "client_receipt": receipt_key(request),
            "run_id": request.runId,
            "node_path": payload.nodePath,
            "choice": payload.choice,
        }
        for field, value in (("decision_id", payload.decisionId), ("input", payload.input)):
            if value is not None:
                body[field] = value
        if request.expectedRevision is not None:
            body["expected_revision"] = request.expectedRevision
        reply = await self.writer.request("decision.answer", body)
        if reply.outcome == "accepted":
            self.runs.wake_scheduler()
        return from_reply(request, reply)

    async def interaction_submit(
        self, request: client_v1.Request, payload: client_v1.InteractionSubmitPayload
    ) -> client_v1.Response:
        """An agent step's output from the workflow tool: recorded, validated, settled, answered."""
        return await interactions.submit(
            self.writer, self.resolvers, self.runs, request, payload, self.settings.agent_max_rejections
        )

    async def interaction_update(
        self, request: client_v1.Request, payload: client_v1.InteractionUpdatePayload
    ) -> client_v1.Response:
        return await interactions.update(self.writer, request, payload, receipt_key(request))

    async def run_control(self, request: client_v1.Request, extra: dict[str, Any] | None = None) -> Reply | None:
        """A control command on the envelope's run, stored with its receipt; None if the request is incomplete."""
        if request.runId is None:
            return None
        body: dict[str, Any] = {
            "actor": client_actor(request),
            "client_receipt": receipt_key(request),
            "run_id": request.runId,
            **(extra or {}),
        }
        if request.expectedRevision is not None:
            body["expected_revision"] = request.expectedRevision
        reply: Reply = await self.writer.request(request.operation, body)
        return reply

    async def run_cancel(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """The terminal state and receipt commit first; then the runner's group is stopped."""
        reply = await self.run_control(request)
        if reply is None:
            return refuse(request, CommandError("validationFailed", "run.cancel names the run in runId"))
        if reply.outcome in ("accepted", "adopted") and request.runId is not None:
            self.runs.stop_run(request.runId)
            self.runs.cancel_effects(request.runId)
        return from_reply(request, reply)

    async def run_pause(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """Parked and claim released with the receipt; then the runner stops (an applying effect settles first)."""
        reply = await self.run_control(request)
        if reply is None:
            return refuse(request, CommandError("validationFailed", "run.pause names the run in runId"))
        # Only now: a replayed pause must not stop a runner that a later resume started. (A first
        # answer lost in a crash leaves the old runner fenced: its next write fails and it exits.)
        if reply.outcome == "accepted" and request.runId is not None:
            self.runs.stop_run(request.runId, let_effect_settle=True)
        return from_reply(request, reply)

    async def run_resume(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        reply = await self.run_control(request)
        if reply is None:
            return refuse(request, CommandError("validationFailed", "run.resume names the run in runId"))
        if reply.outcome == "accepted":
            self.runs.wake_scheduler()
        return from_reply(request, reply)

    async def run_delete(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """One terminal root-run tree, deleted at the writer with prune's blockers; stored with its receipt."""
        if request.runId is None:
            return refuse(request, CommandError("validationFailed", "run.delete names the root run in runId"))
        body = {"actor": client_actor(request), "client_receipt": receipt_key(request), "run_id": request.runId}
        return from_reply(request, await self.writer.request("run.delete", body))

    async def run_restart(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """A child run of a finished run; the expected revision is the parent's runRevision."""
        if request.runId is None or request.expectedRevision is None:
            message = "run.restart names the run in runId and its runRevision in expectedRevision"
            return refuse(request, CommandError("validationFailed", message))
        reply = await self.run_control(request, {"child_run_id": "run-" + uuid.uuid4().hex})
        assert reply is not None
        if reply.outcome == "accepted":
            self.runs.wake_scheduler()
        return from_reply(request, reply)

    async def state_read(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """state.status / state.verify: reads on the writer's connection, between write groups."""
        return from_reply(request, await self.writer.request(request.operation, {"actor": client_actor(request)}))

    async def state_backup(
        self, request: client_v1.Request, payload: client_v1.StateBackupPayload
    ) -> client_v1.Response:
        """Made by the writer between its write groups; answered after the copy verified."""
        body = {
            "actor": client_actor(request),
            "client_receipt": receipt_key(request),
            "destination": payload.destination,
        }
        return from_reply(request, await self._maintenance("state.backup", body))

    async def _maintenance(self, kind: str, body: dict[str, Any]) -> Reply:
        """A maintenance command in flight keeps automatic retention away."""
        with self.host.maintenance():
            reply: Reply = await self.writer.request(kind, body)
        return reply

    async def state_prune(self, request: client_v1.Request, payload: client_v1.StatePrunePayload) -> client_v1.Response:
        """A dry run is a read (not stored); an apply is stored with its key, answered after the
        backup, the deletion, the WAL truncation and VACUUM."""
        try:
            before_ms = client_v1.prune_before_ms(payload.before)
        except ValueError as exc:
            return refuse(request, CommandError("validationFailed", str(exc)))
        body: dict[str, Any] = {
            "actor": client_actor(request),
            "before_ms": before_ms,
            "apply": payload.apply,
            "backup_path": payload.backupPath,
        }
        if payload.apply:
            body["client_receipt"] = receipt_key(request)
        return from_reply(request, await self._maintenance("state.prune", body))

    async def effect_list(self, request: client_v1.Request, payload: client_v1.EffectListPayload) -> client_v1.Response:
        body = {
            "actor": client_actor(request),
            "effect_id": payload.effectId,
            "run_id": request.runId,
            "statuses": payload.statuses,
            "limit": payload.limit,
        }
        return from_reply(request, await self.writer.request("effect.list", body))

    async def effect_recovery(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """effect.confirm / effect.retry, stored with the receipt; the parked run continues (a
        retried effect is due for the pool at once)."""
        body: dict[str, Any] = {
            "actor": client_actor(request),
            "client_receipt": receipt_key(request),
            "effect_id": payload.effectId,
        }
        if isinstance(payload, client_v1.EffectConfirmPayload):
            output = BlobValue.of_client_json("output", payload.output) if payload.output is not None else None
            body["note"] = payload.note
            if output is not None:
                body["output"] = output.model_dump()
        reply = await self.writer.request(request.operation, body)
        if reply.outcome == "accepted":
            self.runs.wake_outbox()
            self.runs.wake_scheduler()
        return from_reply(request, reply)

    async def channel_status(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """Each channel's state, cursor and messages, with its manager's state (no ids or texts)."""
        if self.channels is None:
            return refuse(request, CommandError("notAvailable", "this server runs no channels"))
        return from_reply(request, await self.channels.status())

    async def channel_reload(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        """channels.json and credentials.json read again; refused as a whole (the configuration in
        force stays) when invalid, unsafe, or a profile's bot changed."""
        if self.channels is None:
            return refuse(request, CommandError("notAvailable", "this server runs no channels"))
        try:
            receipt = await self.channels.reload()
        except CommandError as exc:
            return refuse(request, exc)
        return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=receipt)

    async def channel_recover(
        self, request: client_v1.Request, payload: client_v1.ChannelRecoverPayload
    ) -> client_v1.Response:
        """An ambiguous channel message confirmed or retried, stored with the receipt."""
        body: dict[str, Any] = {
            "actor": client_actor(request),
            "client_receipt": receipt_key(request),
            "effect_id": payload.messageId,
            "action": payload.action,
        }
        if payload.telegramMessageId is not None:
            body["telegram_message_id"] = payload.telegramMessageId
        reply = await self.writer.request("channel.recover", body)
        if reply.outcome == "accepted" and self.channels is not None:
            self.channels.wake()
        return from_reply(request, reply)

    async def protocol_schema(self, request: client_v1.Request, payload: Any) -> client_v1.Response:
        return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=client_v1.schema_document())


Route = Callable[[Router, client_v1.Request, Any], Awaitable[client_v1.Response]]

# The route of each operation this build serves (client_v1.OPERATION_SHAPES, one to one).
ROUTES: dict[str, Route] = {
    "checkpoint.answer": Router.checkpoint_answer,
    "decision.answer": Router.decision_answer,
    "interaction.submit": Router.interaction_submit,
    "interaction.update": Router.interaction_update,
    "run.cancel": Router.run_cancel,
    "run.delete": Router.run_delete,
    "run.pause": Router.run_pause,
    "run.resume": Router.run_resume,
    "run.restart": Router.run_restart,
    "run.start": Router.run_start,
    "run.status": Router.run_status,
    "run.list": Router.run_list,
    "server.status": Router.server_status,
    "server.stop": Router.server_stop,
    "protocol.schema": Router.protocol_schema,
    "state.status": Router.state_read,
    "state.verify": Router.state_read,
    "state.backup": Router.state_backup,
    "state.prune": Router.state_prune,
    "effect.list": Router.effect_list,
    "effect.confirm": Router.effect_recovery,
    "effect.retry": Router.effect_recovery,
    "channel.status": Router.channel_status,
    "channel.reload": Router.channel_reload,
    "channel.recover": Router.channel_recover,
    "workflow.list": Router.workflow_list,
    "workflow.show": Router.workflow_show,
    "run.logs": Router.run_logs,
    "run.transcript": Router.run_transcript,
    "view.runs.page": Router.view_runs_page,
    "view.run.get": Router.run_status,
    "view.run.watch": Router.view_run_watch,
    "view.runs.watch": Router.view_runs_watch,
    "view.run.unwatch": Router.view_run_unwatch,
    "view.session.watch": Router.view_session_watch,
    "view.page": Router.view_page,
    "view.content": Router.view_content,
}


def _source_mismatch(payload: client_v1.RunStartPayload, resolution: Resolution) -> str | None:
    """What an upstream client sent that differs from what the server resolved."""
    assert resolution.snapshot is not None and resolution.source is not None
    if payload.definitionDigest is not None and payload.definitionDigest != resolution.digest:
        return "definitionDigest differs from the definition the server resolved"
    if payload.definitionSnapshot is not None:
        try:
            sent = canonical.dumps_bytes(payload.definitionSnapshot)
        except (TypeError, ValueError):
            sent = b""
        if sent != resolution.snapshot:
            return "definitionSnapshot differs from the definition the server resolved"
    source, sent_source = resolution.source, payload.workflowSource
    if isinstance(sent_source, str) and (
        source.source_sha256 is None or hashlib.sha256(sent_source.encode()).digest() != source.source_sha256
    ):
        return "workflowSource differs from the source the server resolved"
    if isinstance(sent_source, client_v1.UpstreamSourceSet) and not _same_root(sent_source.root, source, payload):
        return "workflowSource.root differs from the source the server resolved"
    return None


def _same_root(root: client_v1.UpstreamSourceRoot, source: RunSource, payload: client_v1.RunStartPayload) -> bool:
    """An upstream source-set root names the resolved source: the same built-in id and revision, or
    the same file (its path, relative to the project or absolute) with the same SHA-256."""
    if root.kind != source.source_kind:
        return False
    if root.kind == "builtin":  # upstream names a built-in "demo", we "builtin:demo"
        assert root.id is not None and source.builtin_id is not None
        same_id = root.id.removeprefix("builtin:") == source.builtin_id.removeprefix("builtin:")
        return same_id and root.revision == source.builtin_revision
    assert root.path is not None and root.hash is not None and source.source_sha256 is not None
    path = os.path.realpath(os.path.join(payload.projectPath, root.path))
    return path == source.source_path and root.hash.removeprefix("sha256:") == source.source_sha256.hex()


def _no_resolver() -> CommandError:
    return CommandError(
        "unavailable", "the server cannot start a resolver now (host.json cannot be written); retry with the same key"
    )


def _code(reply: Reply) -> str | None:
    code: str | None = (reply.receipt or {}).get("code")
    return code


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


def _list_body(request: client_v1.Request, payload: client_v1.RunListPayload) -> dict[str, Any]:
    """The writer's run.list of run.list, view.runs.page and view.runs.watch: the filters and the
    cursor (a keyset object, or view.runs.page's offset)."""
    body: dict[str, Any] = {
        "actor": client_actor(request),
        "limit": payload.limit,
        "statuses": payload.status,
        "workflow_name": payload.workflowName,
        "since": payload.since,
    }
    if payload.projectPath is not None:
        body["project_path"] = os.path.realpath(payload.projectPath)
    if isinstance(payload.cursor, int):
        body["offset"] = payload.cursor
    elif payload.cursor is not None:
        body["before"] = {"created_at": payload.cursor.get("createdAt"), "run_id": payload.cursor.get("runId")}
    return body


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


async def _watching(request: client_v1.Request, answer: Awaitable[Reply]) -> client_v1.Response:
    """A watch operation's answer; what the live views refuse (supervisor/views.py) as refused."""
    try:
        return from_reply(request, await answer)
    except CommandError as exc:
        return refuse(request, exc)


def _base64_data(reply: Reply) -> Reply:
    """A content read's reply with its ``data`` bytes as base64 text (JSON carries no bytes)."""
    if reply.outcome != "accepted" or reply.receipt is None:
        return reply
    data = base64.b64encode(reply.receipt["data"]).decode("ascii")
    return reply.model_copy(update={"receipt": {**reply.receipt, "data": data}})

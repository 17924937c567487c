"""C10 and C11: a submission from the `workflow` tool and its verdict; progress updates.

::

    interaction.submit   (model)  request found in the session (notFound); the same key adopts;
                                  accepted -> winnerDecided, failed/cancelled -> notWaiting;
                                  assistant-message -> wrongRequestKind; epoch = the live
                                  recording segment's lease generation (claimLost); run paused
                                  (runPaused); another submission validating (validationInProgress)
                                  -> submission (outcome NULL), request validating
                         (operator) the same, with no epoch and no live segment needed
    interaction.settle   (server) accepted -> submission, request and attempt complete, interval
                                  ends settlement, pending steps cancelled, run queued;
                                  rejected -> submission rejected {errorCode, error}, request pending;
                                  the max_rejections-th judged rejection of the request fails
                                  the attempt tooManyRejections naming it, run queued
    interaction.update   (model)  a ``progress`` update {message, progress?} (JSON)

Each targets the run and is ``fenced_by_transition``: a waiting run has no
claim; the coordinator epoch and the request's revision fence these.
"""

from __future__ import annotations

from typing import TypeVar

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.agents import (
    InteractionSettle,
    InteractionSubmit,
    InteractionsValidating,
    InteractionUpdate,
    submission_id_of,
)
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.states import MEDIA_JSON
from piworkflows.writer import agent_steps, records
from piworkflows.writer.agent_steps import Request
from piworkflows.writer.commands.agents.base import (
    MODELS,
    OPERATORS,
    SERVER_ONLY,
    find_request,
    paused,
    require_open,
)
from piworkflows.writer.commands.runs import run_target
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx, adoption
from piworkflows.writer.views import touched

ToRequest = TypeVar("ToRequest", InteractionSubmit, InteractionUpdate)


def _session_request(tx: Tx, cmd: InteractionSubmit | InteractionUpdate) -> Request:
    request = agent_steps.get_request(tx.conn, cmd.request_id)
    if request is None or request.target_session_id != cmd.target_session_id:
        raise CommandError("resourceNotFound", "no such request in this session", requestId=cmd.request_id)
    return request


def _check_epoch(tx: Tx, request: Request, epoch: int) -> None:
    """The coordinator epoch is the lease generation of the run's live recording segment."""
    live = agent_steps.recording_segments(tx.conn, request.run_id, tx.now, live=True)
    if not live:
        raise CommandError("notClaimed", "no host records this request now", requestId=request.request_id)
    lease = records.get_lease(tx.conn, live[0].segment_id)
    if lease is None or lease.lease_generation != epoch:
        raise CommandError("staleGeneration", "the coordinator epoch is not current", requestId=request.request_id)


class FromTheModel(ResourceHandler[ToRequest]):
    actors = MODELS
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: ToRequest) -> Target:
        return run_target(tx, _session_request(tx, cmd).run_id)


class SubmitInteraction(FromTheModel[InteractionSubmit]):
    """The workflow tool's submission under the live segment's epoch, or an operator's without one."""

    model = InteractionSubmit
    actors = MODELS | OPERATORS

    def transition(self, tx: Tx, cmd: InteractionSubmit, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        operator = tx.actor.actor_class in OPERATORS
        if operator != (cmd.coordinator_epoch is None):
            raise CommandError("validationFailed", "a model's submission carries its epoch; an operator's none")
        request = _session_request(tx, cmd)
        submission_id = submission_id_of(request.request_id, cmd.idempotency_key)
        (node_path,) = conn.execute(
            "SELECT node_path FROM node_attempts WHERE attempt_id = ?", (request.attempt_id,)
        ).fetchone()
        receipt: dict[str, object] = {
            "submissionId": submission_id,
            "requestId": request.request_id,
            "runId": request.run_id,
            "attemptId": request.attempt_id,
            "nodePath": node_path,  # the validator judges the output with this node's declaration
        }
        saved = conn.execute(
            "SELECT payload_digest, outcome, receipt_digest FROM interactive_submissions WHERE submission_id = ?",
            (submission_id,),
        ).fetchone()
        if saved is not None:
            if saved[0] != cmd.output.digest:
                raise CommandError("idempotencyKeyReused", "this submission key carried another output")
            verdict = records.read_json(conn, saved[2]) if saved[2] is not None else {}
            return adoption({**receipt, "status": saved[1] or "validating", **verdict})
        if cmd.output.media_type != MEDIA_JSON:
            raise CommandError("validationFailed", "a submitted output is JSON")
        require_open(request)
        if agent_steps.contract_of(conn, request).expected_output.kind == "assistant-message":
            raise CommandError("wrongRequestKind", "this step takes the agent's reply, not a workflow submission")
        if cmd.coordinator_epoch is not None:
            _check_epoch(tx, request, cmd.coordinator_epoch)
        if paused(tx, request.run_id):
            raise CommandError("runPaused", "the run is paused", runId=request.run_id)
        if request.status == "validating":
            raise CommandError("validationInProgress", "another submission is being validated")

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "INSERT INTO interactive_submissions (submission_id, request_id, idempotency_key, payload_digest, "
                "created_at) VALUES (?, ?, ?, ?, ?)",
                (submission_id, request.request_id, cmd.idempotency_key, cmd.output.digest, now),
            )
            agent_steps.set_request(conn, request, "validating", now)
            touched.touch(conn, request.run_id)

        receipt["status"] = "validating"
        return Change(
            event_type="interaction.submitted",
            apply=apply,
            blobs=[cmd.output],
            receipt=receipt,
            attempt_id=request.attempt_id,
        )


class SettleInteraction(ResourceHandler[InteractionSettle]):
    """One verdict per submission; the request's revision makes acceptance one winner."""

    model = InteractionSettle
    actors = SERVER_ONLY
    fenced_by_transition = True

    def _submission(self, tx: Tx, submission_id: str) -> tuple[str, str | None, bytes | None]:
        row = tx.conn.execute(
            "SELECT request_id, outcome, receipt_digest FROM interactive_submissions WHERE submission_id = ?",
            (submission_id,),
        ).fetchone()
        if row is None:
            raise CommandError("resourceNotFound", "no such submission", submissionId=submission_id)
        return row[0], row[1], row[2]

    def target(self, tx: Tx, cmd: InteractionSettle) -> Target:
        return run_target(tx, find_request(tx.conn, self._submission(tx, cmd.submission_id)[0]).run_id)

    def transition(self, tx: Tx, cmd: InteractionSettle, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        request_id, outcome, saved_receipt = self._submission(tx, cmd.submission_id)
        request = find_request(conn, request_id)
        receipt: dict[str, object] = {"submissionId": cmd.submission_id, "requestId": request_id}
        if outcome is not None:
            if outcome == cmd.verdict:
                verdict = records.read_json(conn, saved_receipt) if saved_receipt is not None else {}
                return adoption({**receipt, "status": outcome, **verdict})
            raise CommandError("winnerDecided", f"the submission was already {outcome}", status=outcome)
        if request.status != "validating":
            raise CommandError("winnerDecided", f"the request is {request.status}", requestId=request_id)
        if cmd.verdict == "accepted":
            output = cmd.output
            assert output is not None  # the model's shape
            if output.media_type != MEDIA_JSON:
                raise CommandError("validationFailed", "an accepted output is JSON")
            accepted = BlobValue.of_json({"submissionId": cmd.submission_id, "outputSha256": output.digest.hex()})

            def accept(stamp: Stamp) -> None:
                digests = (output.digest, accepted.digest)
                agent_steps.accept(conn, request, cmd.submission_id, *digests, tx.actor, now)

            receipt["status"] = "accepted"
            return Change(
                event_type="interaction.accepted",
                apply=accept,
                blobs=[output, accepted],
                event_payload=accepted.digest,
                receipt=receipt,
                attempt_id=request.attempt_id,
            )
        assert cmd.error is not None
        code = cmd.error_code or "validationFailed"
        verdict = {"errorCode": code, "error": cmd.error.data.decode("utf-8")}
        rejected = BlobValue.of_json(verdict)
        count = agent_steps.rejections(conn, request_id) + 1
        verdict["rejections"] = count
        last: BlobValue | None = None
        if count >= cmd.max_rejections:
            last = BlobValue.of_text(
                f"{count} submissions were rejected (at most {cmd.max_rejections} per attempt); "
                f"the last, {code}: {verdict['error']}"
            )

        def reject(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE interactive_submissions SET outcome = 'rejected', receipt_digest = ?, settled_at = ? "
                "WHERE submission_id = ?",
                (rejected.digest, now, cmd.submission_id),
            )
            if last is None:
                agent_steps.set_request(conn, request, "pending", now)
                touched.touch(conn, request.run_id)
            else:
                agent_steps.fail(conn, request, "failed", "tooManyRejections", last, None, tx.actor, now)

        return Change(
            event_type="interaction.rejected",
            apply=reject,
            blobs=[rejected],
            event_payload=rejected.digest,
            receipt={**receipt, "status": "rejected", **verdict, "requestStatus": "failed" if last else "pending"},
            attempt_id=request.attempt_id,
        )


class UpdateInteraction(FromTheModel[InteractionUpdate]):
    model = InteractionUpdate

    def transition(self, tx: Tx, cmd: InteractionUpdate, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        request = _session_request(tx, cmd)
        require_open(request)
        _check_epoch(tx, request, cmd.coordinator_epoch)
        body = BlobValue.of_json(
            {"message": cmd.message, **({"progress": cmd.progress} if cmd.progress is not None else {})}
        )
        change = Change(event_type="interaction.updated", blobs=[body], attempt_id=request.attempt_id)

        def apply(stamp: Stamp) -> None:
            (seq,) = conn.execute(
                "SELECT coalesce(max(update_seq), 0) + 1 FROM workflow_updates WHERE run_id = ?", (request.run_id,)
            ).fetchone()
            conn.execute(
                "INSERT INTO workflow_updates (run_id, update_seq, attempt_id, update_kind, body_digest, created_at) "
                "VALUES (?, ?, ?, 'progress', ?, ?)",
                (request.run_id, seq, request.attempt_id, body.digest, now),
            )
            touched.touch(conn, request.run_id)
            change.receipt.update(requestId=request.request_id, updateSeq=seq)

        change.apply = apply
        return change


class ListValidating(Handler[InteractionsValidating]):
    """Submissions left validating (no verdict), with what the validator needs to judge them again."""

    model = InteractionsValidating
    actors = SERVER_ONLY
    read_only = True

    def execute(self, tx: Tx, cmd: InteractionsValidating) -> Result:
        rows = tx.conn.execute(
            "SELECT s.submission_id, s.request_id, r.run_id, r.attempt_id, a.node_path, s.payload_digest "
            "FROM interactive_submissions s JOIN interactive_requests r ON r.request_id = s.request_id "
            "JOIN node_attempts a ON a.attempt_id = r.attempt_id "
            "WHERE s.outcome IS NULL AND r.request_status = 'validating' ORDER BY s.created_at LIMIT ?",
            (cmd.limit,),
        ).fetchall()
        items = [
            {
                "submissionId": submission,
                "requestId": request,
                "runId": run,
                "attemptId": attempt,
                "nodePath": node_path,
                "output": records.read_json(tx.conn, payload),
            }
            for submission, request, run, attempt, node_path, payload in rows
        ]
        return Result(receipt={"submissions": items})


HANDLERS = (SubmitInteraction(), SettleInteraction(), UpdateInteraction(), ListValidating())

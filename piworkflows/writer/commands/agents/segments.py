"""A host's reports on its segment (C4, C5, C6, C8, C12) and the supervisor's record of its end.

::

    agent.bind_session   the Pi session file and id: the first, or the same again
    agent.branch         steps on the active branch -> sent; a settled reply adopted;
                         no pending step left -> one ``resumed`` step; receipt: what to send
    agent.message_sent   a pending (or cancelled) step -> sent as its entry
    agent.record         a capture batch (writer/session_capture.py) and a sample; a sample
                         that spends the budget times the attempt out
    agent.close          segment closed, claim released, open interval ends ``disconnect``,
                         open turn ``lost``
    agent.exited         the same from the supervisor, the interval at its last observation;
                         a host that committed nothing after C3, or one the supervisor gave up
                         on (no_progress), parks the run agentNoProgress

The same step on the branch as the same entry adopts; as another entry it is
``entryMismatch``.
"""

from __future__ import annotations

from piworkflows.errors import CommandError
from piworkflows.protocol import step_contract
from piworkflows.protocol.internal.agents import (
    AgentBindSession,
    AgentBranch,
    AgentClose,
    AgentExited,
    AgentMessageSent,
    AgentRecord,
    message_id_of,
    request_id_of,
    resumed_step_key,
)
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.states import MEDIA_JSON, MEDIA_TEXT
from piworkflows.writer import active_time, agent_steps, records, session_capture
from piworkflows.writer.commands.agents.base import (
    HOSTS,
    SERVER_ONLY,
    ReplyAcceptance,
    SegmentCommand,
    find_request,
    outcome_receipt,
    paused,
    recording,
    run_row,
    session_step,
)
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx, adoption
from piworkflows.writer.views import touched

NO_PROGRESS = "The agent host exited before it reported anything; see server.log. Resume the run to try again."


class BindSession(SegmentCommand[AgentBindSession]):
    model = AgentBindSession

    def transition(self, tx: Tx, cmd: AgentBindSession, resource: records.Resource | None) -> Change:
        segment, _ = recording(tx, cmd.segment_id)
        receipt = {"segmentId": segment.segment_id, "piSessionFile": cmd.pi_session_file}
        if segment.pi_session_file is not None:
            if (segment.pi_session_file, segment.pi_session_id) == (cmd.pi_session_file, cmd.pi_session_id):
                return adoption(receipt)
            raise CommandError("invalidTransition", "the session already has another Pi session file")

        def apply(stamp: Stamp) -> None:
            tx.conn.execute(
                "UPDATE session_segments SET pi_session_file = ?, pi_session_id = ? WHERE segment_id = ?",
                (cmd.pi_session_file, cmd.pi_session_id, cmd.segment_id),
            )

        return Change(event_type="agent.session_bound", apply=apply, receipt=receipt)


class ReportBranch(SegmentCommand[AgentBranch]):
    model = AgentBranch

    def transition(self, tx: Tx, cmd: AgentBranch, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        segment, request = recording(tx, cmd.segment_id)
        found = []
        for step in cmd.found:
            _, state, entry = session_step(tx, segment, step.workflow_message_id)
            if state != "sent":
                found.append(step)
            elif entry != step.pi_entry_id:
                raise CommandError("entryMismatch", "the step is on the branch as another entry", piEntryId=entry)
        contract = agent_steps.contract_of(conn, request)
        reply, adopt = cmd.settled_reply, None
        if reply is not None and request.status == "pending":
            if session_step(tx, segment, reply.workflow_message_id)[0] != request.request_id:
                raise CommandError("invalidTransition", "the reply answers another request's step")
            key = f"assistant:{reply.pi_entry_id}"
            adopt = ReplyAcceptance.of(request, contract, key, reply.text, reply.pi_entry_id, adopted=True)
        sent_now = {step.workflow_message_id for step in found}
        pending = agent_steps.pending_steps(conn, request.request_id)
        resumed_key = resumed_step_key(request.request_id, segment.segment_id)
        resumed_id = message_id_of(resumed_key)
        resume = (
            adopt is None
            and request.status == "pending"
            and all(step["workflowMessageId"] in sent_now for step in pending)
            and not paused(tx, request.run_id)
            and records.get_resource(conn, resumed_id) is None
        )
        blobs = [adopt.output, adopt.receipt] if adopt else []
        text = None
        if resume:
            rejection = agent_steps.last_rejection(conn, request.request_id)
            text = BlobValue.of_text(step_contract.resumed(contract, resumed_id, rejection))
            blobs.append(text)
        change = Change(event_type="agent.branch_reported", blobs=blobs)

        def apply(stamp: Stamp) -> None:
            for step in found:
                agent_steps.mark_sent(conn, step.workflow_message_id, step.pi_entry_id, tx.actor, now)
            if adopt is not None:
                adopt.apply(tx)
            if text is not None:
                source = ("interactive_request", request.request_id)
                ids = (request.run_id, request.request_id, request.target_session_id)
                agent_steps.add_step(conn, *ids, resumed_key, text, source, tx.actor, now)
            touched.touch(conn, request.run_id)
            change.receipt.update(outcome_receipt(tx, request))

        change.apply = apply
        return change


class MessageSent(SegmentCommand[AgentMessageSent]):
    model = AgentMessageSent

    def transition(self, tx: Tx, cmd: AgentMessageSent, resource: records.Resource | None) -> Change:
        segment, _ = recording(tx, cmd.segment_id)
        _, state, entry = session_step(tx, segment, cmd.workflow_message_id)
        receipt = {"workflowMessageId": cmd.workflow_message_id, "piEntryId": cmd.pi_entry_id}
        if state == "sent":
            if entry == cmd.pi_entry_id:
                return adoption(receipt)
            raise CommandError("entryMismatch", "the step was sent as another entry", piEntryId=entry)

        def apply(stamp: Stamp) -> None:
            agent_steps.mark_sent(tx.conn, cmd.workflow_message_id, cmd.pi_entry_id, tx.actor, tx.now)
            touched.touch(tx.conn, segment.run_id)

        return Change(event_type="agent.message_sent", apply=apply, receipt=receipt)


class RecordSession(Handler[AgentRecord]):
    """C8, not a ResourceHandler: the batch is journalled by session_events and fenced by the
    segment's event_count, so it writes no revision and no event (see the package docstring)."""

    model = AgentRecord
    actors = HOSTS

    def execute(self, tx: Tx, cmd: AgentRecord) -> Result:
        conn, now = tx.conn, tx.now
        records.verify_and_renew_claim(conn, cmd.segment_id, cmd.claim, now)
        segment, request = recording(tx, cmd.segment_id)
        if cmd.first_event_index != segment.event_count:
            raise CommandError(
                "staleRevision", "the batch does not continue the segment's events", eventCount=segment.event_count
            )
        if cmd.checkpoint is not None and cmd.checkpoint.media_type != MEDIA_JSON:
            raise CommandError("validationFailed", "a checkpoint is JSON")
        first, last = session_capture.write_events(conn, segment, cmd, now)
        written = session_capture.write_entries(conn, segment, cmd, now)
        session_capture.link_entries(conn, segment, cmd.links, written)
        session_capture.write_checkpoints(conn, segment, cmd, first, last, now)
        receipt: dict[str, object] = {"eventCount": segment.event_count + len(cmd.events)}
        if cmd.sample is not None and active_time.sample(conn, segment.attempt_id, cmd.sample.elapsed_ms, now):
            timeout_ms, _, spent = active_time.budget_spent(conn, segment.attempt_id)
            if spent and request.open:
                agent_steps.time_out(conn, request, timeout_ms, tx.actor, now)
                agent_steps.advance(conn, request.run_id, "agent.timed_out", tx.actor, now, None, request.attempt_id)
                receipt["timedOut"] = True
        return Result(receipt=receipt)


class CloseSegment(SegmentCommand[AgentClose]):
    model = AgentClose

    def transition(self, tx: Tx, cmd: AgentClose, resource: records.Resource | None) -> Change:
        segment, _ = recording(tx, cmd.segment_id)

        def apply(stamp: Stamp) -> None:
            agent_steps.close_segment(tx.conn, segment, "disconnect", tx.now, tx.now, cmd.elapsed_ms)
            touched.touch(tx.conn, segment.run_id)

        return Change(
            event_type="agent.closed",
            apply=apply,
            release_claim=True,
            receipt={"segmentId": segment.segment_id, "placement": "closed"},
        )


class SegmentExited(ResourceHandler[AgentExited]):
    """The host is gone (its claim may still be live: the supervisor's record of the exit fences it)."""

    model = AgentExited
    actors = SERVER_ONLY
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: AgentExited) -> Target:
        resource = records.get_resource(tx.conn, cmd.segment_id)
        if resource is None or resource.resource_kind != "session_segment":
            raise CommandError("resourceNotFound", "no such session segment", segmentId=cmd.segment_id)
        return Target(cmd.segment_id, resource.revision)

    def transition(self, tx: Tx, cmd: AgentExited, resource: records.Resource | None) -> Change:
        assert resource is not None
        conn, now = tx.conn, tx.now
        segment = agent_steps.get_segment(conn, cmd.segment_id)
        assert segment is not None
        if segment.status == "closed":  # the host closed it before it exited
            return adoption({"segmentId": segment.segment_id, "placement": "closed"})
        if cmd.detail is not None and cmd.detail.media_type != MEDIA_TEXT:
            raise CommandError("validationFailed", "the detail is text")
        request = find_request(conn, request_id_of(segment.attempt_id))
        status, is_paused, park_reason, _, _ = run_row(tx, segment.run_id)
        # nothing after C3: every report advances the segment's revision, a batch its event count
        silent = resource.revision == 1 and segment.event_count == 0
        waits = request.status == "pending" and status == "waiting" and not is_paused and not park_reason
        park = (silent or cmd.no_progress) and not cmd.stopped_by_server and waits
        detail = (cmd.detail or BlobValue.of_text(NO_PROGRESS)) if park else None
        lease = records.get_lease(conn, segment.segment_id)

        def apply(stamp: Stamp) -> None:
            agent_steps.close_segment(conn, segment, "disconnect", now, None)
            if detail is not None:
                conn.execute(
                    "UPDATE runs SET park_reason = 'agentNoProgress', updated_at = ? WHERE run_id = ?",
                    (now, segment.run_id),
                )
                (seq,) = conn.execute(
                    "SELECT coalesce(max(update_seq), 0) + 1 FROM workflow_updates WHERE run_id = ?", (segment.run_id,)
                ).fetchone()
                conn.execute(
                    "INSERT INTO workflow_updates (run_id, update_seq, attempt_id, update_kind, body_digest, "
                    "created_at) VALUES (?, ?, ?, 'notification', ?, ?)",
                    (segment.run_id, seq, segment.attempt_id, detail.digest, now),
                )
                agent_steps.advance(conn, segment.run_id, "run.parked", tx.actor, now, detail.digest)
            touched.touch(conn, segment.run_id)

        placement = {"placement": "parked", "parkReason": "agentNoProgress"} if park else {"placement": "closed"}
        return Change(
            event_type="agent.exited",
            apply=apply,
            blobs=[detail] if detail else [],
            release_generation=lease.lease_generation if lease and lease.owner_id else None,
            receipt={"segmentId": segment.segment_id, **placement},
        )


HANDLERS = (BindSession(), ReportBranch(), MessageSent(), RecordSession(), CloseSegment(), SegmentExited())

"""C7 and C9: a Pi model turn of a step starts and ends (docs/agents.md, steps 7 and 9).

::

    started  request open, run not paused (runPaused), no other open turn of the run
             (turnOpen) -> workflow_turns open, an active interval opens
    ended    turn ended (stop_reason, response entry, active time), interval ends turn_end; then
             request accepted/validating/closed, run paused, aborted by the server -> nothing
             aborted by the person       -> the run pauses (pending steps cancelled interruption)
             assistant-message reply ok  -> accepted (submission assistant:<turn>)
             otherwise, the budget spent -> timed out (the turn's end is its last sample)
             a command step's run        -> attempt failed with the run's error_code (a command
                                            is not reminded), run queued
             Pi ended it ``error``       -> attempt failed providerError with Pi's message (Pi
                                            retried what it retries), run queued
             otherwise, under 2 reminders -> a reminder step (source workflow_turn)
             otherwise                   -> attempt failed missingSubmission, run queued

A report of a saved turn (the same turn id, message, run and session) adopts
the saved result: a late ``aborted`` neither pauses nor reminds. Another
identity under the same turn id is a conflict.
"""

from __future__ import annotations

from piworkflows.errors import CommandError
from piworkflows.protocol import step_contract
from piworkflows.protocol.internal.agents import AgentTurn, message_id_of, reminder_step_key
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import active_time, agent_steps, records
from piworkflows.writer.agent_steps import Request, Segment
from piworkflows.writer.commands.agents.base import (
    ReplyAcceptance,
    SegmentCommand,
    outcome_receipt,
    paused,
    recording,
    reply_problem,
    require_open,
    session_step,
)
from piworkflows.writer.contract import Change, Stamp, Tx, adoption
from piworkflows.writer.views import touched


class ReportTurn(SegmentCommand[AgentTurn]):
    model = AgentTurn

    def transition(self, tx: Tx, cmd: AgentTurn, resource: records.Resource | None) -> Change:
        segment, request = recording(tx, cmd.segment_id)
        saved = tx.conn.execute(
            "SELECT workflow_message_id, run_id, target_session_id, turn_state, stop_reason, response_entry_id "
            "FROM workflow_turns WHERE workflow_turn_id = ?",
            (cmd.workflow_turn_id,),
        ).fetchone()
        if saved is not None and saved[:3] != (cmd.workflow_message_id, segment.run_id, segment.session_id):
            raise CommandError("idempotencyKeyReused", "the turn id names another turn", turnId=cmd.workflow_turn_id)
        if cmd.phase == "started":
            if saved is not None:
                return adoption({"workflowTurnId": cmd.workflow_turn_id, "turnState": saved[3]})
            return _start(tx, cmd, segment, request)
        if saved is None:
            raise CommandError("invalidTransition", "the turn never started", turnId=cmd.workflow_turn_id)
        if saved[3] == "ended" and saved[4:] != (cmd.stop_reason, cmd.response_entry_id):
            raise CommandError("idempotencyKeyReused", "the turn ended otherwise", turnId=cmd.workflow_turn_id)
        if saved[3] != "open":  # ended as reported, or lost to a recovery or a run's end
            saved_turn = {"workflowTurnId": cmd.workflow_turn_id, "turnState": saved[3]}
            return adoption({**saved_turn, **outcome_receipt(tx, request)})
        return _end(tx, cmd, segment, request)


def _start(tx: Tx, cmd: AgentTurn, segment: Segment, request: Request) -> Change:
    require_open(request)
    if paused(tx, request.run_id):
        raise CommandError("runPaused", "the run is paused", runId=request.run_id)
    if session_step(tx, segment, cmd.workflow_message_id)[0] != request.request_id:
        raise CommandError("invalidTransition", "a turn belongs to a step of the segment's request")
    other = tx.conn.execute(
        "SELECT workflow_turn_id FROM workflow_turns WHERE run_id = ? AND turn_state = 'open'", (segment.run_id,)
    ).fetchone()
    if other is not None:
        raise CommandError("turnOpen", "another turn of the run is open", turnId=other[0])
    change = Change(event_type="agent.turn_started")

    def apply(stamp: Stamp) -> None:
        tx.conn.execute(
            "INSERT INTO workflow_turns (workflow_turn_id, workflow_message_id, run_id, target_session_id, "
            "turn_state, started_at) VALUES (?, ?, ?, ?, 'open', ?)",
            (cmd.workflow_turn_id, cmd.workflow_message_id, segment.run_id, segment.session_id, tx.now),
        )
        number = active_time.open_interval(tx.conn, segment.attempt_id, tx.now)
        touched.touch(tx.conn, segment.run_id)
        change.receipt.update(workflowTurnId=cmd.workflow_turn_id, turnState="open", intervalNumber=number)

    change.apply = apply
    return change


def _end(tx: Tx, cmd: AgentTurn, segment: Segment, request: Request) -> Change:
    conn, now = tx.conn, tx.now
    contract = agent_steps.contract_of(conn, request)
    command = contract.executor.kind == "command"
    if cmd.error_code is not None and not command:
        raise CommandError("invalidTransition", "only a command step's run ends with an error")
    quiet = request.status != "pending" or paused(tx, request.run_id) or cmd.aborted_by_server
    interrupted = not quiet and cmd.stop_reason == "aborted"
    key = f"assistant:{cmd.workflow_turn_id}"
    accepted = None
    if not quiet and not interrupted and cmd.error_code is None:
        accepted = ReplyAcceptance.of(request, contract, key, cmd.reply, cmd.response_entry_id, adopted=False)
    unproductive = not quiet and not interrupted and accepted is None
    timeout_ms, _, spent = active_time.budget_spent(conn, segment.attempt_id, cmd.elapsed_ms)
    timed_out = unproductive and spent  # the turn's end is its last sample
    blobs = [accepted.output, accepted.receipt] if accepted else []
    reminder: tuple[str, BlobValue] | None = None
    missing: BlobValue | None = None
    failure: tuple[str, BlobValue] | None = None
    if unproductive and not timed_out and command:  # a command's run is not reminded: the attempt fails
        if cmd.error_code is not None and cmd.error is not None:
            failure = (cmd.error_code, cmd.error)
        else:
            problem = reply_problem(contract, cmd.reply)
            failure = ("validationFailed", BlobValue.of_text(f"the command's output was not accepted: {problem}"))
    elif unproductive and not timed_out and cmd.stop_reason == "error":  # a reminder would fail alike
        said = cmd.provider_error.data.decode("utf-8", "replace") if cmd.provider_error else "no message"
        failure = ("providerError", BlobValue.of_text(f"the model's turn failed: {said}"))
    elif unproductive and not timed_out and not agent_steps.pending_steps(conn, request.request_id):
        # (a pending step left: the host still has it to send)
        count = agent_steps.reminders(conn, request.request_id)
        if count < step_contract.MAX_REMINDERS:
            reminder_key = reminder_step_key(request.request_id, cmd.workflow_turn_id)
            text = step_contract.reminder(contract, message_id_of(reminder_key), count + 1)
            reminder = (reminder_key, BlobValue.of_text(text))
            blobs.append(reminder[1])
        else:
            turns = count + 1
            missing = BlobValue.of_text(f"the agent ended {turns} turns without submitting the step's result")
    change = Change(event_type="agent.turn_ended", blobs=blobs)

    def apply(stamp: Stamp) -> None:
        conn.execute(
            "UPDATE workflow_turns SET turn_state = 'ended', stop_reason = ?, response_entry_id = ?, "
            "active_elapsed_ms = ?, ended_at = ? WHERE workflow_turn_id = ?",
            (cmd.stop_reason, cmd.response_entry_id, cmd.elapsed_ms, now, cmd.workflow_turn_id),
        )
        active_time.close_intervals(conn, "attempt_id", segment.attempt_id, "turn_end", now, cmd.elapsed_ms)
        if interrupted:  # the person aborted Pi: exactly what run.pause does to a waiting run
            conn.execute("UPDATE runs SET paused = 1, updated_at = ? WHERE run_id = ?", (now, request.run_id))
            agent_steps.stop_for_pause(conn, request.run_id, tx.actor, now)
            agent_steps.advance(conn, request.run_id, "run.paused", tx.actor, now)
        elif accepted is not None:
            accepted.apply(tx)
        elif reminder is not None:
            source = ("workflow_turn", cmd.workflow_turn_id)
            ids = (request.run_id, request.request_id, request.target_session_id)
            agent_steps.add_step(conn, *ids, *reminder, source, tx.actor, now)
        elif timed_out:
            agent_steps.time_out(conn, request, timeout_ms, tx.actor, now)
            agent_steps.advance(conn, request.run_id, "agent.timed_out", tx.actor, now, None, request.attempt_id)
            change.receipt["timedOut"] = True
        elif missing is not None:
            agent_steps.fail(conn, request, "failed", "missingSubmission", missing, None, tx.actor, now)
            agent_steps.advance(conn, request.run_id, "agent.failed", tx.actor, now, missing.digest, request.attempt_id)
        elif failure is not None:
            agent_steps.fail(conn, request, "failed", *failure, None, tx.actor, now)
            agent_steps.advance(
                conn, request.run_id, "agent.failed", tx.actor, now, failure[1].digest, request.attempt_id
            )
        touched.touch(conn, request.run_id)
        change.receipt.update(workflowTurnId=cmd.workflow_turn_id, turnState="ended", **outcome_receipt(tx, request))

    change.apply = apply
    return change


HANDLERS = (ReportTurn(),)

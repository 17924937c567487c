"""Node transitions a runner proposes; the writer verifies and commits them.

All are fenced by the run's claim (epoch, token, generation, expiry) and
its expected execution revision, and deduplicated through worker_messages
when the supervisor attaches the message key. A terminal node result (or a
``run.finish`` where no node is active) ends the run, settles its queue row,
ends the runner record and releases the claim in one transaction
(``ending``; the lifecycle table of docs/workflows.md holds after every commit;
the runner process exits right after).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.agents import NodeRequestAgent
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.effects import EffectRequest
from piworkflows.protocol.internal.nodes import (
    CheckpointAnswer,
    NodeEffectReserve,
    NodeFinish,
    NodeStart,
    NodeWait,
    RunFinish,
    attempt_id_of,
)
from piworkflows.writer import agent_steps, channel_effects, decisions, local_effects, records
from piworkflows.writer.commands.runs import run_target
from piworkflows.writer.contract import Change, ResourceHandler, Stamp, Target, Tx
from piworkflows.writer.views import touched

RUNNER = frozenset({"runner", "server"})
ATTEMPT_STATUS = {"ok": "completed", "failed": "failed", "timed_out": "timed_out", "cancelled": "cancelled"}
QUEUE_AFTER = {"completed": "done", "failed": "failed", "timed_out": "failed", "cancelled": "cancelled"}


RunnerCommand = TypeVar(
    "RunnerCommand", NodeStart, NodeFinish, NodeWait, NodeEffectReserve, RunFinish, NodeRequestAgent
)


class RunnerTransition(ResourceHandler[RunnerCommand]):
    """A runner's proposal: on its run, at its expected revision, under its live claim."""

    actors = RUNNER
    claim_required = True

    def target(self, tx: Tx, cmd: RunnerCommand) -> Target:
        return Target(cmd.run_id, cmd.expected_revision, claim=cmd.claim)


@dataclass(frozen=True)
class PlannedAttempt:
    """A node attempt that passed its checks; ``insert`` writes it (inside ``Change.apply``)."""

    run_id: str
    attempt_id: str
    node_path: str
    node_kind: str
    visit_number: int
    attempt_number: int
    step_index: int
    steps_left: bool

    def insert(self, conn: sqlite3.Connection, generation: int | None, now: int) -> None:
        conn.execute(
            "INSERT INTO node_attempts (attempt_id, run_id, node_path, node_kind, visit_number, attempt_number, "
            "attempt_status, lease_generation, started_at) VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?)",
            (
                self.attempt_id,
                self.run_id,
                self.node_path,
                self.node_kind,
                self.visit_number,
                self.attempt_number,
                generation,
                now,
            ),
        )
        conn.execute(
            "INSERT INTO run_steps (run_id, step_index, attempt_id) VALUES (?, ?, ?)",
            (self.run_id, self.step_index, self.attempt_id),
        )
        conn.execute(  # once per claim: a queue row already running is left as it is (not rewritten each node)
            "UPDATE run_queue SET queue_status = 'running', updated_at = ? "
            "WHERE run_id = ? AND queue_status != 'running'",
            (now, self.run_id),
        )


def plan_attempt(
    conn: sqlite3.Connection,
    run_id: str,
    node_path: str,
    node_kind: str,
    visit: int,
    attempt: int,
    finishing: str | None = None,
) -> PlannedAttempt:
    """Check that the run may start this attempt now (``finishing``: the attempt the same commit ends)."""
    status, max_steps, queue = conn.execute(
        "SELECT r.status, r.max_steps, q.queue_status FROM runs r JOIN run_queue q ON q.run_id = r.run_id "
        "WHERE r.run_id = ?",
        (run_id,),
    ).fetchone()
    if status != "running" or queue not in ("starting", "running"):
        raise CommandError("invalidTransition", f"a {status} run with a {queue} queue starts no node")
    active = conn.execute(
        "SELECT attempt_id FROM node_attempts WHERE run_id = ? AND attempt_status IN ('running', 'waiting')", (run_id,)
    ).fetchone()
    if active is not None and active[0] != finishing:
        raise CommandError("invalidTransition", "another node of the run is still active")
    attempt_id = attempt_id_of(run_id, node_path, visit, attempt)
    if conn.execute("SELECT 1 FROM node_attempts WHERE attempt_id = ?", (attempt_id,)).fetchone():
        raise CommandError("invalidTransition", "this node visit already has this attempt", attemptId=attempt_id)
    (steps,) = conn.execute("SELECT count(*) FROM run_steps WHERE run_id = ?", (run_id,)).fetchone()
    # Interrupted attempts count: a run that keeps losing its runner runs out of steps.
    return PlannedAttempt(run_id, attempt_id, node_path, node_kind, visit, attempt, steps, steps < max_steps)


def max_steps_error(conn: sqlite3.Connection, run_id: str, node_path: str) -> BlobValue:
    """Why a run with no step left for ``node_path`` fails (code maxStepsExceeded)."""
    (max_steps,) = conn.execute("SELECT max_steps FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return BlobValue.of_text(f"the run reached max_steps={max_steps} before {node_path}")


def end_run(tx: Tx, run_id: str, status: str, output: bytes | None, error: bytes | None, code: str | None) -> None:
    """A terminal run: no live runner beside it, its unstarted effects cancelled (settlement: a local
    effect), nothing of its agent steps left live (agent_steps.stop_for_end)."""
    conn, now = tx.conn, tx.now
    conn.execute(
        "UPDATE runs SET status = ?, finished_at = ?, output_digest = ?, error_digest = ?, error_code = ?, "
        "updated_at = ? WHERE run_id = ?",
        (status, now, output, error, code, now, run_id),
    )
    records.end_live_runner(conn, run_id, now)
    records.cancel_pending_effects(conn, run_id, tx.actor, now)
    agent_steps.stop_for_end(conn, run_id, tx.actor, now)


def ending(
    tx: Tx,
    run_id: str,
    status: str,
    output: bytes | None,
    error: bytes | None,
    code: str | None,
    blobs: list[BlobValue],
    receipt: dict[str, object],
    before: Callable[[Stamp], None] = lambda stamp: None,
    attempt_id: str | None = None,
) -> Change:
    """The change that ends a run under the runner's claim (``before`` writes the node rows first):
    run.finished, the claim released, the queue settled by its local effect."""

    def apply(stamp: Stamp) -> None:
        before(stamp)
        end_run(tx, run_id, status, output, error, code)
        touched.touch(tx.conn, run_id)

    return Change(
        event_type="run.finished",
        apply=apply,
        blobs=blobs,
        release_claim=True,
        effects=[local_effects.settle_queue(run_id, QUEUE_AFTER[status])],
        receipt={**receipt, "runStatus": status},
        attempt_id=attempt_id,
    )


class StartNode(RunnerTransition[NodeStart]):
    model = NodeStart

    def transition(self, tx: Tx, cmd: NodeStart, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        planned = plan_attempt(conn, cmd.run_id, cmd.node_path, cmd.node_kind, cmd.visit_number, cmd.attempt_number)
        if not planned.steps_left:
            error = max_steps_error(conn, cmd.run_id, cmd.node_path)
            return ending(
                tx,
                cmd.run_id,
                "failed",
                None,
                error.digest,
                "maxStepsExceeded",
                [error],
                {"errorCode": "maxStepsExceeded"},
            )

        def apply(stamp: Stamp) -> None:
            planned.insert(conn, stamp.lease_generation, now)
            conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (now, cmd.run_id))
            touched.touch(conn, cmd.run_id)

        return Change(
            event_type="node.started",
            apply=apply,
            receipt={"attemptId": planned.attempt_id, "stepIndex": planned.step_index},
            attempt_id=planned.attempt_id,
        )


class FinishNode(RunnerTransition[NodeFinish]):
    model = NodeFinish

    def transition(self, tx: Tx, cmd: NodeFinish, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        row = conn.execute(
            "SELECT attempt_status FROM node_attempts WHERE attempt_id = ? AND run_id = ?", (cmd.attempt_id, cmd.run_id)
        ).fetchone()
        if row is None or row[0] != "running":
            raise CommandError("invalidTransition", "the attempt is not running", attemptId=cmd.attempt_id)
        output = cmd.output.digest if cmd.output else None
        node_error = cmd.error.digest if cmd.error else None
        error = cmd.run_error.digest if cmd.run_error else node_error  # the run's, if it fails here
        end, code = cmd.end_status, cmd.error_code
        node_error_code = cmd.error_code if cmd.outcome != "ok" else None
        blobs = [b for b in (cmd.output, cmd.error, cmd.run_error) if b is not None]
        planned = None
        if cmd.start_next is not None:
            assert cmd.next_node is not None
            nxt = cmd.start_next
            planned = plan_attempt(
                conn,
                cmd.run_id,
                cmd.next_node,
                nxt.node_kind,
                nxt.visit_number,
                nxt.attempt_number,
                finishing=cmd.attempt_id,
            )
            if not planned.steps_left:  # the writer counts steps; the run ends here instead
                exceeded = max_steps_error(conn, cmd.run_id, cmd.next_node)
                end, code, error, planned = "failed", "maxStepsExceeded", exceeded.digest, None
                blobs.append(exceeded)

        def finish_attempt(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE node_attempts SET attempt_status = ?, outcome = ?, output_digest = ?, error_digest = ?, "
                "error_code = ?, finished_at = ? WHERE attempt_id = ?",
                (ATTEMPT_STATUS[cmd.outcome], cmd.outcome, output, node_error, node_error_code, now, cmd.attempt_id),
            )
            if cmd.routes and cmd.outcome == "ok" and cmd.output is not None:  # a notify node's audience
                routes = [(route.channel_id, route.chat_id) for route in cmd.routes]
                channel_effects.notify(conn, cmd.run_id, cmd.attempt_id, routes, cmd.output, tx.actor, now)

        receipt: dict[str, object] = {"attemptId": cmd.attempt_id}
        if end is not None:
            if code == "maxStepsExceeded":
                receipt["errorCode"] = code
            return ending(
                tx,
                cmd.run_id,
                end,
                output if end == "completed" else None,
                error,
                code,
                blobs,
                receipt,
                before=finish_attempt,
                attempt_id=cmd.attempt_id,
            )

        def apply(stamp: Stamp) -> None:
            finish_attempt(stamp)
            if planned is not None:
                planned.insert(conn, stamp.lease_generation, now)
            conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (now, cmd.run_id))
            touched.touch(conn, cmd.run_id)

        receipt["nextNode"] = cmd.next_node
        if planned is not None:
            receipt.update(nextAttemptId=planned.attempt_id, stepIndex=planned.step_index)
        return Change(event_type="node.finished", apply=apply, blobs=blobs, receipt=receipt, attempt_id=cmd.attempt_id)


class FinishRun(RunnerTransition[RunFinish]):
    """The run ends where no node is active (after an answered checkpoint or a settled agent step, or a
    module that failed to load)."""

    model = RunFinish

    def transition(self, tx: Tx, cmd: RunFinish, resource: records.Resource | None) -> Change:
        conn = tx.conn
        status, queue = conn.execute(
            "SELECT r.status, q.queue_status FROM runs r JOIN run_queue q USING (run_id) WHERE r.run_id = ?",
            (cmd.run_id,),
        ).fetchone()
        if status != "running" or queue not in ("starting", "running"):
            raise CommandError("invalidTransition", f"a {status} run with a {queue} queue is not the runner's to end")
        if conn.execute(
            "SELECT 1 FROM node_attempts WHERE run_id = ? AND attempt_status IN ('running', 'waiting')", (cmd.run_id,)
        ).fetchone():
            raise CommandError("invalidTransition", "a node of the run is still active: node.finish ends it")
        value = cmd.output or cmd.error
        assert value is not None  # the model requires one of them
        output, error = (value.digest, None) if cmd.end_status == "completed" else (None, value.digest)
        receipt: dict[str, object] = {"errorCode": cmd.error_code} if cmd.error_code else {}
        return ending(tx, cmd.run_id, cmd.end_status, output, error, cmd.error_code, [value], receipt)


class WaitNode(RunnerTransition[NodeWait]):
    """waiting | parked | no claim | no runner: the runner exits after this commit."""

    model = NodeWait

    def transition(self, tx: Tx, cmd: NodeWait, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        row = conn.execute(
            "SELECT attempt_status, node_kind FROM node_attempts WHERE attempt_id = ? AND run_id = ?",
            (cmd.attempt_id, cmd.run_id),
        ).fetchone()
        kind = "human_decision" if cmd.decision is not None else "checkpoint"
        if row is None or row != ("running", kind):
            raise CommandError(
                "invalidTransition", f"only a running {kind.replace('_', ' ')} waits so", attemptId=cmd.attempt_id
            )
        ask = cmd.decision
        blobs = [cmd.request]
        if ask is not None and ask.default_response is not None:
            blobs.append(ask.default_response)

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE node_attempts SET attempt_status = 'waiting', receipt_digest = ? WHERE attempt_id = ?",
                (cmd.request.digest, cmd.attempt_id),
            )
            if ask is not None:
                decision_id = decisions.open_decision(
                    conn, cmd.run_id, cmd.attempt_id, ask.audience, cmd.request, ask.after_ms, ask.default_response, now
                )
                routes = [(route.channel_id, route.chat_id) for route in cmd.routes]
                channel_effects.deliver(conn, decision_id, routes, tx.actor, now)
            conn.execute("UPDATE runs SET status = 'waiting', updated_at = ? WHERE run_id = ?", (now, cmd.run_id))
            conn.execute(
                "UPDATE run_queue SET queue_status = 'parked', updated_at = ? WHERE run_id = ?", (now, cmd.run_id)
            )
            records.end_live_runner(conn, cmd.run_id, now)
            touched.touch(conn, cmd.run_id)

        return Change(
            event_type="node.waiting",
            apply=apply,
            blobs=blobs,
            release_claim=True,
            receipt={"attemptId": cmd.attempt_id, "runStatus": "waiting"},
            attempt_id=cmd.attempt_id,
        )


class ReserveNodeEffect(RunnerTransition[NodeEffectReserve]):
    """Before an action or shell node acts: its effect, reserved once per node visit.

    A repeat (the next attempt of an interrupted visit) adopts the effect and
    learns how it stands: settled (the node adopts the result, no new attempt),
    pending (the supervisor claims it: a new numbered attempt), or ambiguous
    (the run parks ``effectAmbiguous``). An attempt left applying under a dead
    claim is ended here first; the run's live claim proves its performer is gone.
    """

    model = NodeEffectReserve

    def transition(self, tx: Tx, cmd: NodeEffectReserve, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        row = conn.execute(
            "SELECT node_path, visit_number, node_kind, attempt_status FROM node_attempts "
            "WHERE attempt_id = ? AND run_id = ?",
            (cmd.attempt_id, cmd.run_id),
        ).fetchone()
        if row is None or row[3] != "running" or row[2] not in ("action", "shell", "http"):
            raise CommandError(
                "invalidTransition", "only a running effect node reserves an effect", attemptId=cmd.attempt_id
            )
        node_path, visit = row[0], row[1]
        request = EffectRequest(
            effect_type=cmd.effect_type,
            idempotency_key=records.node_effect_key(cmd.run_id, cmd.effect_type, node_path, visit),
            payload=cmd.payload,
            effect_class="external",
            performer=cmd.performer,
            recovery_policy=cmd.recovery_policy,
            owner_scope="run",
            run_id=cmd.run_id,
            max_attempts=cmd.max_attempts,
        )
        existing = conn.execute(
            "SELECT effect_id, effect_status, request_fingerprint, result_digest, error_digest, error_code "
            "FROM effects WHERE effect_type = ? AND idempotency_key = ?",
            (request.effect_type, request.idempotency_key),
        ).fetchone()
        if existing is None:
            return Change(
                event_type="effect.reserved",
                effects=[request],
                receipt={"effectId": request.effect_id(cmd.run_id), "effectStatus": "pending"},
                attempt_id=cmd.attempt_id,
            )
        effect_id, status, fingerprint, result, error, error_code = existing
        if fingerprint != request.fingerprint(cmd.run_id):
            raise CommandError("effectKeyConflict", "another effect request already holds this key", effectId=effect_id)
        stale = status == "applying" and effect_id in records.stale_applying_effects(conn, cmd.run_id, now)
        if stale:
            status, error_code = records.uncertain_effect_status(conn, effect_id, cancelled=False)
        receipt: dict[str, object] = {"effectId": effect_id, "effectStatus": status}
        if status in ("applied", "rejected") and result is not None:  # a rejected one may hold output too
            receipt["result"] = records.read_json(conn, result)
        if status == "rejected":
            receipt["error"] = records.read_text(conn, error) if error is not None else "the effect was rejected"
            receipt["errorCode"] = error_code

        def apply(stamp: Stamp) -> None:
            if stale:
                records.abandon_effect(conn, effect_id, tx.actor, now)

        return Change(event_type="effect.adopted", apply=apply, receipt=receipt, attempt_id=cmd.attempt_id)


class AnswerCheckpoint(ResourceHandler[CheckpointAnswer]):
    """One winner: the first answer completes the node; a later one is a conflict naming it."""

    model = CheckpointAnswer
    actors = frozenset({"client", "operator", "human"})
    # A waiting checkpoint means no runner holds the run; a later answer meets the
    # winner (or the runner that continues after it) and must say so, not leaseHeld.
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: CheckpointAnswer) -> Target:
        return run_target(tx, cmd.run_id, cmd.expected_revision)

    def transition(self, tx: Tx, cmd: CheckpointAnswer, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        waiting = conn.execute(
            "SELECT attempt_id FROM node_attempts WHERE run_id = ? AND node_path = ? AND node_kind = 'checkpoint' "
            "AND attempt_status = 'waiting'",
            (cmd.run_id, cmd.node_path),
        ).fetchone()
        if waiting is None:
            if decisions.waiting(conn, cmd.run_id, cmd.node_path) is not None:
                raise CommandError(
                    "humanDecisionProtected",
                    f"node '{cmd.node_path}' is a protected human decision: answer it with decision.answer "
                    "(pi-workflows decide)",
                    nodePath=cmd.node_path,
                )
            _refuse_answer(conn, cmd)
        attempt_id = waiting[0]

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE node_attempts SET attempt_status = 'completed', outcome = 'ok', output_digest = ?, "
                "finished_at = ? WHERE attempt_id = ?",
                (cmd.answer.digest, now, attempt_id),
            )
            conn.execute("UPDATE runs SET status = 'queued', updated_at = ? WHERE run_id = ?", (now, cmd.run_id))
            conn.execute(
                "UPDATE run_queue SET queue_status = 'queued', updated_at = ? WHERE run_id = ?", (now, cmd.run_id)
            )
            touched.touch(conn, cmd.run_id)

        return Change(
            event_type="checkpoint.answered",
            apply=apply,
            blobs=[cmd.answer],
            receipt={"runId": cmd.run_id, "attemptId": attempt_id, "status": "queued"},
            attempt_id=attempt_id,
        )


def _refuse_answer(conn: sqlite3.Connection, cmd: CheckpointAnswer) -> NoReturn:
    """Why no checkpoint NODE waits: it was answered, or the run waits elsewhere (named in the
    details ``waitingNode`` and the sentence) or nowhere."""
    row = conn.execute(
        "SELECT node_path, node_kind FROM node_attempts WHERE run_id = ? AND attempt_status = 'waiting'",
        (cmd.run_id,),
    ).fetchone()
    waiting = {"waitingNode": row[0]} if row is not None else {}
    answered = conn.execute(
        "SELECT attempt_id FROM node_attempts WHERE run_id = ? AND node_path = ? AND node_kind = 'checkpoint' "
        "AND attempt_status = 'completed' ORDER BY finished_at DESC LIMIT 1",
        (cmd.run_id, cmd.node_path),
    ).fetchone()
    if answered is not None:
        now_waits = f"; run {cmd.run_id} now waits at node '{row[0]}'" if row is not None else ""
        raise CommandError(
            "winnerDecided", "the checkpoint was already answered" + now_waits, attemptId=answered[0], **waiting
        )
    if row is None:
        raise CommandError("notWaiting", f"run {cmd.run_id} does not wait at any checkpoint", nodePath=cmd.node_path)
    if row[0] == cmd.node_path:  # it waits there, at another kind of node
        said = f"node '{row[0]}' ({row[1]}) waits for an agent's output, not an answer: submit it (interaction.submit)"
    else:
        said = f"run {cmd.run_id} waits at node '{row[0]}' ({row[1]}), not at '{cmd.node_path}'"
    raise CommandError("notWaiting", said, nodePath=cmd.node_path, **waiting)


HANDLERS = (StartNode(), FinishNode(), FinishRun(), WaitNode(), ReserveNodeEffect(), AnswerCheckpoint())

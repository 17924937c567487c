"""decision.answer and decision.expire (writer/decisions.py holds the one-winner rules)."""

from __future__ import annotations

import hashlib

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.decisions import DecisionAnswer, DecisionExpire, DecisionNext
from piworkflows.writer import decisions, records
from piworkflows.writer.commands.runs import run_target
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx, adoption

HUMANS = frozenset({"operator", "human"})  # the actor classes whose answer resolves a decision


class AnswerDecision(ResourceHandler[DecisionAnswer]):
    """One winner: a verified human's answer completes the node while its deadline has not passed;
    the same answer again adopts it; a later other answer is a conflict naming the winner. A
    model's answer is refused and never competes; an undeclared client is told to declare its
    human."""

    model = DecisionAnswer
    actors = frozenset({"client", "model", "operator", "human"})
    fenced_by_transition = True  # a waiting decision has no runner; its state fences the answer

    def target(self, tx: Tx, cmd: DecisionAnswer) -> Target:
        return run_target(tx, cmd.run_id, cmd.expected_revision)

    def transition(self, tx: Tx, cmd: DecisionAnswer, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        if tx.actor.actor_class == "model":
            raise CommandError("modelAnswerRefused", "a model never answers a protected human decision")
        if tx.actor.actor_class not in HUMANS:
            raise CommandError(
                "humanAnswerRequired", "only a verified human answers a protected decision: declare source operator"
            )
        decision = decisions.waiting(conn, cmd.run_id, cmd.node_path)
        if decision is None or (cmd.decision_id is not None and cmd.decision_id != decision.decision_id):
            repeat = decisions.answered_so(conn, cmd.run_id, cmd.node_path, cmd.choice, cmd.input)
            if repeat is not None and cmd.decision_id in (None, repeat["decisionId"]):
                return adoption({"runId": cmd.run_id, **repeat})  # this answer won already
            _refuse(tx, cmd)
        assert decision is not None
        response = decisions.check_response(decision, cmd.choice, cmd.input)
        if decisions.due(decision, now):  # the deadline came first: it wins (the sweep commits it)
            named = decisions.deadline_winner(conn, decision)
            raise CommandError("winnerDecided", f"the decision's deadline passed: {_name(named)} won", **named)
        key = cmd.client_receipt.idempotency_key if cmd.client_receipt is not None else f"{cmd.choice}:{now}"
        submission_id = "submission-" + hashlib.sha256(f"{decision.decision_id}\0{key}".encode()).hexdigest()[:32]

        def apply(stamp: Stamp) -> None:
            value = BlobValue.of_json(response)
            records.put_blob(conn, value, now)
            conn.execute(
                "INSERT INTO human_decision_submissions (submission_id, decision_id, idempotency_key, actor_class, "
                "actor_id, response_digest, submission_outcome, created_at) VALUES (?, ?, ?, ?, ?, ?, 'accepted', ?)",
                (submission_id, decision.decision_id, key, tx.actor.actor_class, tx.actor.actor_id, value.digest, now),
            )
            decisions.resolve(conn, decision, "human", tx.actor, now, response, submission_id)

        named = {"decisionId": decision.decision_id, "resolution": "human", "choice": cmd.choice}
        receipt = _receipt(cmd.run_id, decision, named)
        return Change(event_type="decision.resolved", apply=apply, receipt=receipt, attempt_id=decision.attempt_id)


def _receipt(run_id: str, decision: decisions.Decision, named: dict[str, object]) -> dict[str, object]:
    return {"runId": run_id, "attemptId": decision.attempt_id, "status": "queued", **named}


def _refuse(tx: Tx, cmd: DecisionAnswer) -> None:
    """No open decision at the node: the winner's name, or why none waits there."""
    named = decisions.winner(tx.conn, cmd.run_id, cmd.node_path)
    if named is not None and (cmd.decision_id is None or cmd.decision_id == named["decisionId"]):
        raise CommandError("winnerDecided", f"the decision was already resolved: {_name(named)} won", **named)
    if cmd.decision_id is not None:
        raise CommandError("decisionNotFound", "no such decision at this node", decisionId=cmd.decision_id)
    raise CommandError("notWaiting", f"run {cmd.run_id} has no human decision waiting at '{cmd.node_path}'")


def _name(named: dict[str, object]) -> str:
    """A winner as a sentence names it: "human (replan)", "timeoutPolicy (ship)", "expiry"."""
    return f"{named['resolution']} ({named['choice']})" if "choice" in named else str(named["resolution"])


class ExpireDecisions(Handler[DecisionExpire]):
    """The server's sweep: each run with a due deadline gets its decisions resolved (timeout policy
    or expiry), one revision and event of the run each. Receipt: the runs, and the next deadline."""

    model = DecisionExpire
    actors = frozenset({"server"})
    stores_refusals = False

    def execute(self, tx: Tx, cmd: DecisionExpire) -> Result:
        conn, now = tx.conn, tx.now
        resolved = []
        for run_id in decisions.due_runs(conn, now):
            run = records.get_resource(conn, run_id)
            assert run is not None
            attempt_id = None  # of the last decision its deadline resolved
            while (decision := decisions.waiting(conn, run_id)) is not None and decisions.apply_deadline(
                conn, decision, tx.actor, now
            ):
                attempt_id = decision.attempt_id
            revision = records.increment_revision(conn, run_id, run.revision, now)
            records.write_event(conn, run_id, revision, "decision.resolved", tx.actor, now, None, None, attempt_id)
            resolved.append(run_id)
        return Result(receipt={"runIds": resolved, "nextDeadline": decisions.next_deadline(conn)})


class NextDeadline(Handler[DecisionNext]):
    """The earliest deadline of a decision still open (null: none)."""

    model = DecisionNext
    actors = frozenset({"server"})
    read_only = True

    def execute(self, tx: Tx, cmd: DecisionNext) -> Result:
        return Result(receipt={"nextDeadline": decisions.next_deadline(tx.conn)})


HANDLERS = (AnswerDecision(), ExpireDecisions(), NextDeadline())

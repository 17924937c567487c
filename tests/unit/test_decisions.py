"""Protected human decisions in the real writer, in-process with a fake clock (writer/decisions.py):
one immutable winner among a human's answer, the timeout policy, expiry and cancellation; a
model's or an undeclared client's answer never competes; checkpoint.answer is refused."""

from __future__ import annotations

from typing import Any

import pytest

from piworkflows.isotime import iso
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import decisions
from tests.support import claim_run, run_create, run_group, run_state, submitted, take_epoch, token_hash

pytestmark = pytest.mark.timeout(60)

RUNNER = {"actor_class": "runner"}
OPERATOR = {"actor_class": "operator", "actor_id": "pi-workflows-cli-operator"}
CHOICES = {
    "ship": {"label": "Ship it", "input": None},
    "replan": {"label": "Replan", "input": {"name": "instructions", "prompt": "What should change?"}},
}


def claim() -> dict[str, Any]:
    return {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": token_hash("tok"),
        "lease_generation": 1,
        "ttl_ms": 10_000,
    }


def revision(executor) -> int:
    return executor.conn.execute("SELECT revision FROM resources WHERE resource_id = 'run-1'").fetchone()[0]


def waiting(
    executor, after_ms: int | None = None, default: dict[str, Any] | None = None, routes: list | None = None
) -> str:
    """run-1 created, claimed, its node 'approve' asking (delivered on ``routes``): the decision's id."""
    run_group(executor, take_epoch(), run_create("run-1"))
    run_group(executor, claim_run())
    start = {"actor": RUNNER, "run_id": "run-1", "claim": claim(), "expected_revision": revision(executor)}
    start |= {"node_path": "approve", "node_kind": "human_decision", "visit_number": 1}
    (started,) = run_group(executor, submitted("node.start", start))
    assert started.outcome == "accepted", started
    attempt = started.receipt["attemptId"]
    ask: dict[str, Any] = {"audience": "operator"}
    if after_ms is not None:
        ask["after_ms"] = after_ms
    if default is not None:
        ask["default_response"] = BlobValue.of_json(default).model_dump()
    request = BlobValue.of_json({"request": {"title": "Ship?"}, "choices": CHOICES}).model_dump()
    wait = {"actor": RUNNER, "run_id": "run-1", "claim": claim(), "expected_revision": revision(executor)}
    wait |= {"attempt_id": attempt, "request": request, "decision": ask, "routes": routes or []}
    (waited,) = run_group(executor, submitted("node.wait", wait))
    assert waited.outcome == "accepted", waited
    assert run_state(executor)[0] == ("waiting", "parked", False, False)  # no runner, no claim
    return decisions.decision_id_of(attempt)


def answer(executor, choice: str, actor: dict[str, Any] = OPERATOR, text: str | None = None, key: str = "k1"):
    body: dict[str, Any] = {"actor": actor, "run_id": "run-1", "node_path": "approve", "choice": choice}
    body["client_receipt"] = {
        "client_id": "cli",
        "idempotency_key": key,
        "fingerprint": f"{choice}:{text}".encode().ljust(32, b"\0")[:32],
        "operation": "decision.answer",
    }
    if text is not None:
        body["input"] = text
    (reply,) = run_group(executor, submitted("decision.answer", body))
    return reply


def node(executor) -> tuple[str, str | None, Any]:
    status, code, output = executor.conn.execute(
        "SELECT a.attempt_status, a.error_code, b.bytes FROM node_attempts a LEFT JOIN blobs b "
        "ON b.digest = a.output_digest WHERE a.node_path = 'approve'"
    ).fetchone()
    import json

    return status, code, json.loads(output) if output is not None else None


def resolution(executor) -> tuple[str, ...]:
    return executor.conn.execute("SELECT resolution_kind FROM human_decision_resolutions").fetchall()


def test_a_human_answer_wins_once_and_a_later_one_names_it(executor):
    decision_id = waiting(executor)
    first = answer(executor, "replan", text="Split the change")
    assert first.outcome == "accepted", first
    assert first.receipt == {
        "runId": "run-1",
        "attemptId": first.receipt["attemptId"],
        "status": "queued",
        "decisionId": decision_id,
        "resolution": "human",
        "choice": "replan",
    }
    assert node(executor) == (
        "completed",
        None,
        {"choice": "replan", "input": "Split the change", "resolution": "human"},
    )
    assert run_state(executor)[0][:2] == ("queued", "queued")
    again = answer(executor, "replan", text="Split the change")  # the same request: adopted
    assert again.outcome == "adopted" and again.receipt == first.receipt
    other = answer(executor, "ship", key="k2")
    assert other.outcome == "conflict" and other.receipt["code"] == "winnerDecided"
    assert (other.receipt["resolution"], other.receipt["choice"]) == ("human", "replan")
    assert resolution(executor) == [("human",)]
    (count,) = executor.conn.execute("SELECT count(*) FROM human_decision_submissions").fetchone()
    assert count == 1


@pytest.mark.parametrize(
    ("actor", "code"),
    [
        ({"actor_class": "model", "actor_id": "agent"}, "modelAnswerRefused"),
        ({"actor_class": "client", "actor_id": "some-client"}, "humanAnswerRequired"),
    ],
)
def test_a_model_or_an_undeclared_client_never_answers(executor, actor, code):
    waiting(executor)
    refused = answer(executor, "ship", actor=actor)
    assert (refused.outcome, refused.receipt["code"]) == ("rejected", code)
    assert resolution(executor) == [] and node(executor)[0] == "waiting"
    assert answer(executor, "ship", key="k2").outcome == "accepted"  # a human still can


def test_an_answer_must_be_one_of_the_choices_with_its_input(executor):
    waiting(executor)
    for choice, text in (("nope", None), ("replan", None), ("ship", "extra")):
        refused = answer(executor, choice, text=text, key=f"{choice}-{text}")
        assert (refused.outcome, refused.receipt["code"]) == ("rejected", "validationFailed"), choice
    assert resolution(executor) == []


def test_checkpoint_answer_is_refused_on_a_protected_decision(executor):
    waiting(executor)
    body = {"actor": OPERATOR, "run_id": "run-1", "node_path": "approve"}
    body["answer"] = BlobValue.of_json({"choice": "ship"}).model_dump()
    (refused,) = run_group(executor, submitted("checkpoint.answer", body))
    assert (refused.outcome, refused.receipt["code"]) == ("rejected", "humanDecisionProtected")
    assert resolution(executor) == []


def test_the_timeout_policy_wins_at_its_deadline_and_a_late_human_is_told(executor, clock):
    waiting(executor, after_ms=60_000, default={"choice": "ship"})
    clock.advance(59_999)
    (expire,) = run_group(executor, submitted("decision.expire", {"actor": {"actor_class": "server"}}))
    assert expire.receipt["runIds"] == [] and expire.receipt["nextDeadline"] is not None  # not yet
    clock.advance(1)  # at the deadline's millisecond the deadline wins
    late = answer(executor, "replan", text="too late")
    assert (late.outcome, late.receipt["code"], late.receipt["resolution"]) == (
        "conflict",
        "winnerDecided",
        "timeoutPolicy",
    )
    (expire,) = run_group(executor, submitted("decision.expire", {"actor": {"actor_class": "server"}}))
    assert expire.receipt == {"runIds": ["run-1"], "nextDeadline": None}
    assert node(executor) == ("completed", None, {"choice": "ship", "resolution": "timeoutPolicy"})
    assert resolution(executor) == [("timeoutPolicy",)]
    assert run_state(executor)[0][:2] == ("queued", "queued")


def test_a_decision_with_no_default_expires_and_its_node_times_out(executor, clock):
    waiting(executor, after_ms=1_000)
    clock.advance(1_000)
    run_group(executor, submitted("decision.expire", {"actor": {"actor_class": "server"}}))
    assert node(executor) == ("timed_out", "decisionExpired", None)
    assert resolution(executor) == [("expiry",)]


def test_cancel_resolves_an_open_decision_but_a_due_deadline_first(executor, clock):
    waiting(executor, after_ms=5_000, default={"choice": "ship"})
    clock.advance(5_000)  # due, not yet swept: the cancel applies it first, then cancels the run
    (cancelled,) = run_group(executor, submitted("run.cancel", {"actor": OPERATOR, "run_id": "run-1"}))
    assert cancelled.outcome == "accepted", cancelled
    assert resolution(executor) == [("timeoutPolicy",)]
    assert executor.conn.execute("SELECT status FROM runs").fetchone() == ("cancelled",)


def test_cancel_before_any_answer_is_the_winner(executor):
    waiting(executor, after_ms=5_000)
    (cancelled,) = run_group(executor, submitted("run.cancel", {"actor": OPERATOR, "run_id": "run-1"}))
    assert cancelled.outcome == "accepted", cancelled
    assert resolution(executor) == [("cancellation",)]
    late = answer(executor, "ship")
    assert (late.outcome, late.receipt["code"], late.receipt["resolution"]) == (
        "conflict",
        "winnerDecided",
        "cancellation",
    )


def test_the_view_shows_the_waiting_decision_and_its_deadline(executor, clock):
    created = clock.now_ms()  # the fake clock stands still: node.wait commits now
    decision_id = waiting(executor, after_ms=60_000, default={"choice": "ship"})
    (reply,) = run_group(executor, submitted("run.get", {"actor": {"actor_class": "client"}, "run_id": "run-1"}))
    view = reply.receipt
    assert view["display"] == {
        "status": "waiting",
        "activity": None,
        "controls": ["pause", "cancel", "human-answer"],
        "reason": "The workflow needs a protected human decision.",
    }
    pending = view["piworkflows"]["pending"]
    assert (pending["kind"], pending["nodePath"]) == ("human_decision", "approve")
    shown = pending["decision"]
    assert (shown["decisionId"], shown["audience"], shown["request"]) == (decision_id, "operator", {"title": "Ship?"})
    assert shown["choices"] == CHOICES and shown["onDeadline"] == "ship"
    assert shown["deadline"] == iso(created + 60_000)
    answer(executor, "ship")
    (reply,) = run_group(executor, submitted("run.get", {"actor": {"actor_class": "client"}, "run_id": "run-1"}))
    assert reply.receipt["piworkflows"]["pending"] is None


def test_state_counts_pending_decisions_and_verify_finds_none_violated(executor, clock):
    from piworkflows.writer import invariants
    from piworkflows.writer.commands.state import count

    waiting(executor, after_ms=1_000)
    assert count(executor.conn, "pendingDecisions", clock.now_ms()) == 1
    answer(executor, "ship")
    assert count(executor.conn, "pendingDecisions", clock.now_ms()) == 0
    assert invariants.violations(executor.conn, clock.now_ms()) == {}
    executor.conn.execute(
        "UPDATE node_attempts SET attempt_status = 'waiting', outcome = NULL, finished_at = NULL "
        "WHERE node_path = 'approve'"
    )
    assert invariants.violations(executor.conn, clock.now_ms())["decisionWaitMismatch"] == ["run-1"]
    executor.conn.execute("DELETE FROM human_decision_resolutions")
    found = invariants.violations(executor.conn, clock.now_ms())
    assert found["acceptedSubmissionWithoutResolution"] == ["run-1"] and "decisionWaitMismatch" not in found

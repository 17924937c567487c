"""What views and reads show of an agent step, and an operator's submission, against the real writer
in-process: the run view's display and ``piworkflows.pending``, the run list's equal display,
run.transcript pages, and interaction.submit from an operator (no coordinator epoch, no host)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from piworkflows.protocol.internal.agents import submission_id_of
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer.views.pending import TRANSCRIPT_ROWS
from piworkflows.writer.views.transcript import PAGE_BYTES
from piworkflows.writer.views.values import INLINE_VALUE_BYTES
from tests.support import run_group, run_state, submitted
from tests.support_agents import SERVER, AgentStep, assistant_message, consistent

pytestmark = pytest.mark.timeout(60)

CLIENT = {"actor_class": "client"}
OPERATOR = {"actor_class": "operator", "actor_id": "pi-workflows-cli-operator"}
PI_IDS = [f"{n:08x}" for n in range(1, 400)]


def read(executor, kind: str, body: dict[str, Any]) -> Any:
    (reply,) = run_group(executor, submitted(kind, {"actor": CLIENT, **body}))
    return reply


def view(executor, run_id: str = "run-1") -> dict[str, Any]:
    reply = read(executor, "run.get", {"run_id": run_id})
    assert reply.outcome == "accepted", reply
    listed = read(executor, "run.list", {"limit": 10}).receipt["items"]
    (item,) = [i for i in listed if i["runId"] == run_id]
    assert item["display"] == reply.receipt["display"]  # one reducer, the same facts
    return dict(reply.receipt)


def line(entry_id: str, role: str, text: str) -> str:
    content: Any = text if role == "user" else [{"type": "text", "text": text}]
    return json.dumps(
        {"type": "message", "id": entry_id, "parentId": None, "message": {"role": role, "content": content}}
    )


def entry(entry_id: str, role: str = "assistant", text: str = "hi") -> dict[str, Any]:
    return {
        "pi_entry_id": entry_id,
        "entry_role": role,
        "content": BlobValue.of_text(line(entry_id, role, text)).model_dump(),
    }


def record(step: AgentStep, index: int, entries: list[dict[str, Any]], **more: Any) -> int:
    reply = step.host("agent.record", first_event_index=index, entries=entries, **more)
    assert reply.outcome == "accepted", reply
    return int(reply.receipt["eventCount"])


@pytest.fixture
def step(executor) -> AgentStep:
    """A run waiting at its agent step (C2), with a budget of 1000 ms of active time."""
    step = AgentStep(executor)
    assert step.start(timeout_ms=1000).outcome == "accepted"
    return step


def test_the_view_shows_the_waiting_step_then_its_turn_its_conversation_and_its_submissions(step, executor):
    shown = view(executor)
    assert shown["display"] == {
        "status": "waiting",
        "activity": None,
        "controls": ["pause", "cancel", "update", "submit"],
        "reason": "The workflow needs its assigned agent result.",
    }
    pending = shown["piworkflows"]["pending"]
    assert pending["kind"] == "agent" and pending["nodePath"] == "fix"
    request = pending["request"]
    assert request["requestId"] == step.request_id and request["attemptId"] == step.attempt_id
    assert request["targetSessionId"] == step.session_id and request["status"] == "pending"
    assert request["prompt"] == "Fix the failing test." and request["promptBytes"] == len("Fix the failing test.")
    assert request["expectedOutput"]["kind"] == "description"
    assert request["submissions"] == {"items": [], "start": 0, "total": 0}
    assert request["activeTime"] == {"usedMs": 0, "timeoutMs": 1000, "leftMs": 1000}
    assert request["transcript"] == {"items": [], "start": 0, "total": 0}
    (message,) = shown["workflowMessages"]  # what the run adds to the agent's Pi session
    assert (shown["workflowMessageStart"], shown["workflowMessageTotal"]) == (0, 1)
    assert (message["workflowMessageId"], message["kind"], message["sourceKind"]) == (
        step.initial_id,
        "step",
        "interactive_request",
    )
    assert (message["targetSessionId"], message["sessionOrder"]) == (step.session_id, 1)
    assert (message["state"], message["piEntryId"]) == ("pending", None)
    path = message["content"]["$artifact"]["path"]  # above an item's inline bytes: read by reference
    chunk = read(executor, "view.content", {"run_id": "run-1", "path": path, "offset": 0})
    assert chunk.outcome == "accepted" and b"Fix the failing test." in chunk.receipt["data"]

    step.open()
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id=PI_IDS[0])
    (sent,) = view(executor)["workflowMessages"]
    assert (sent["state"], sent["piEntryId"]) == ("sent", PI_IDS[0])
    page = read(executor, "view.page", {"run_id": "run-1", "page_kind": "workflow_messages", "start": 0, "limit": 10})
    assert page.receipt["items"] == [sent] and page.receipt["total"] == 1
    step.turn("started", "turn-segment-1-1")
    record(step, 0, [entry(PI_IDS[0], "user", "the step"), entry(PI_IDS[1])], sample={"elapsed_ms": 400})
    working = view(executor)
    assert working["display"]["activity"] == "origin_turn"
    assert working["display"]["reason"] == "The agent is working on the workflow step."
    request = working["piworkflows"]["pending"]["request"]
    assert request["activeTime"] == {"usedMs": 400, "timeoutMs": 1000, "leftMs": 600}
    items = request["transcript"]["items"]
    assert [(i["runSeq"], i["piEntryId"], i["role"], i["attemptId"], i["nodePath"]) for i in items] == [
        (1, PI_IDS[0], "user", step.attempt_id, "fix"),
        (2, PI_IDS[1], "assistant", step.attempt_id, "fix"),
    ]
    assert json.loads(items[0]["entry"])["message"]["content"] == "the step"

    first = step.submit({"summary": 1})
    assert view(executor)["piworkflows"]["pending"]["request"]["status"] == "validating"
    step.settle(first.receipt["submissionId"], error="summary: 1 is not of type 'string'")
    second = step.submit({"summary": "fixed"}, key="submit-2")
    (rejected, validating) = view(executor)["piworkflows"]["pending"]["request"]["submissions"]["items"]
    assert rejected["status"] == "rejected" and rejected["errorCode"] == "validationFailed"
    assert rejected["error"] == "summary: 1 is not of type 'string'" and rejected["output"] == {"summary": 1}
    assert validating["status"] == "validating" and validating["error"] is None and validating["settledAt"] is None
    step.settle(second.receipt["submissionId"], output={"summary": "fixed"})
    accepted = view(executor)
    assert accepted["piworkflows"]["pending"] is None
    assert accepted["display"]["status"] == "running"  # its model turn has not ended yet
    step.turn("ended", "turn-segment-1-1", stop_reason="stop", elapsed_ms=450)
    assert view(executor)["display"]["status"] == "queued"
    consistent(executor)


def test_a_step_pending_delivery_during_an_open_turn_and_an_unlimited_budget(executor):
    step = AgentStep(executor)
    step.start(timeout_ms=0)
    step.open()
    step.turn("started", "turn-segment-1-1")  # C7 before C6: Pi writes a new file at its first reply
    assert view(executor)["display"]["reason"] == "The agent is working on the workflow step."
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id=PI_IDS[0])
    assert view(executor)["piworkflows"]["pending"]["request"]["activeTime"] == {
        "usedMs": 0,
        "timeoutMs": None,
        "leftMs": None,
    }
    ended = step.turn("ended", "turn-segment-1-1", stop_reason="stop", elapsed_ms=5)  # no submission: a reminder
    reminder = ended.receipt["pending"][0]["workflowMessageId"]
    assert view(executor)["display"]["activity"] is None  # the reminder waits, no turn is open
    step.host("agent.message_sent", workflow_message_id=reminder, pi_entry_id=PI_IDS[1])
    step.turn("started", "turn-segment-1-2", message_id=reminder)
    assert view(executor)["display"]["reason"] == "The agent is working on the workflow step."
    executor.conn.execute(  # another step waits while this turn runs (as an origin session's may)
        "UPDATE workflow_messages SET message_state = 'pending', pi_entry_id = NULL WHERE workflow_message_id = ?",
        (step.initial_id,),
    )
    shown = view(executor)["display"]
    assert shown["activity"] == "origin_turn"
    assert shown["reason"] == "A step is pending delivery. It starts a new model turn after this turn ends."


def test_an_assistant_message_step_needs_its_visible_response(executor):
    step = AgentStep(executor)
    step.start(expected=assistant_message(max_chars=200))
    shown = view(executor)
    assert shown["display"]["reason"] == "The workflow needs its assigned visible response."
    expected = shown["piworkflows"]["pending"]["request"]["expectedOutput"]
    assert expected == {
        "kind": "assistant-message",
        "description": None,
        "schema": None,
        "maxChars": 200,
        "choices": None,
    }


def test_a_run_whose_agent_could_not_start_is_queued_with_the_recorded_cause(step, executor):
    step.open()
    cause = "Pi (the coding agent that runs agent steps) was not found: run 'pi-workflows setup pi'"
    parked = step.send(
        "agent.exited", {"actor": SERVER, "segment_id": "segment-1", "detail": BlobValue.of_text(cause).model_dump()}
    )
    assert parked.receipt["placement"] == "parked"
    shown = view(executor)
    assert shown["display"] == {
        "status": "queued",
        "activity": None,
        "controls": ["resume", "cancel"],
        "reason": "The agent made no progress: " + cause,
    }
    assert shown["piworkflows"]["parkReason"] == "agentNoProgress"
    consistent(executor)


def test_the_view_keeps_the_tail_of_a_long_conversation_and_large_entries_as_references(step, executor):
    step.open()
    big = "x" * (INLINE_VALUE_BYTES + 10)
    index = 0
    for first in range(0, 48, 16):
        index = record(step, index, [entry(PI_IDS[n]) for n in range(first, first + 16)])
    index = record(step, index, [entry(PI_IDS[48], text=big)])
    transcript = view(executor)["piworkflows"]["pending"]["request"]["transcript"]
    assert transcript["total"] == 49 and transcript["start"] == 49 - TRANSCRIPT_ROWS
    assert [i["runSeq"] for i in transcript["items"]] == list(range(49 - TRANSCRIPT_ROWS + 1, 50))
    last = transcript["items"][-1]["entry"]
    assert last["omitted"]["byteLength"] > INLINE_VALUE_BYTES and last["omitted"]["digest"].startswith("sha256:")
    assert all(isinstance(i["entry"], str) for i in transcript["items"][:-1])


def test_run_transcript_pages_the_entries_of_the_run_or_of_one_node(step, executor):
    step.open()
    index = record(step, 0, [entry(PI_IDS[n]) for n in range(5)])
    everything = read(executor, "run.transcript", {"run_id": "run-1", "limit": 2})
    assert [i["runSeq"] for i in everything.receipt["items"]] == [1, 2] and everything.receipt["cursor"] == 2
    rest = read(executor, "run.transcript", {"run_id": "run-1", "after": 2, "limit": 10}).receipt
    assert [i["runSeq"] for i in rest["items"]] == [3, 4, 5] and rest["cursor"] is None
    assert rest["items"][0]["attemptId"] == step.attempt_id and rest["items"][0]["nodePath"] == "fix"
    of_node = read(executor, "run.transcript", {"run_id": "run-1", "node_path": "fix", "after": 3}).receipt
    assert [i["runSeq"] for i in of_node["items"]] == [4, 5]
    other = read(executor, "run.transcript", {"run_id": "run-1", "node_path": "other"}).receipt
    assert other == {"runId": "run-1", "items": [], "cursor": None}
    missing = read(executor, "run.transcript", {"run_id": "run-missing"})
    assert (missing.outcome, missing.receipt["code"]) == ("notFound", "runNotFound")
    assert index == 0  # entries only: no events


def test_run_transcript_gives_large_entries_as_references_readable_in_parts(step, executor):
    step.open()
    big = "y" * (INLINE_VALUE_BYTES + 1)
    record(step, 0, [entry(PI_IDS[0], text=big)] + [entry(PI_IDS[n], text="z" * 60_000) for n in range(1, 12)])
    page = read(executor, "run.transcript", {"run_id": "run-1", "limit": 256}).receipt
    first = page["items"][0]["entry"]["omitted"]
    assert page["cursor"] is not None and len(page["items"]) < 12  # the page's byte budget
    assert sum(len(i["entry"]) for i in page["items"][1:]) <= PAGE_BYTES
    digest = bytes.fromhex(first["digest"].removeprefix("sha256:"))
    part = read(
        executor,
        "run.content",
        {"run_id": "run-1", "digest": digest, "media_type": "text/plain;charset=utf-8", "offset": 0, "limit": 100},
    )
    assert part.outcome == "accepted" and part.receipt["byteLength"] == first["byteLength"]
    assert part.receipt["data"] == line(PI_IDS[0], "assistant", big).encode()[:100]
    other_run = read(
        executor,
        "run.content",
        {"run_id": "run-2", "digest": digest, "media_type": "text/plain;charset=utf-8", "offset": 0},
    )
    assert other_run.outcome == "notFound"


def operator_submit(step: AgentStep, output: Any, key: str = "operator-1", **more: Any) -> Any:
    body = {
        "actor": OPERATOR,
        "request_id": step.request_id,
        "target_session_id": step.session_id,
        "idempotency_key": key,
        "output": BlobValue.of_json(output).model_dump(),
        **more,
    }
    return step.send("interaction.submit", body)


def refused(reply, outcome, code):
    assert (reply.outcome, reply.receipt["code"]) == (outcome, code), reply


def test_an_operator_submits_without_a_host_or_an_epoch(step, executor):
    refused(operator_submit(step, {"summary": "x"}, coordinator_epoch=1), "rejected", "validationFailed")
    without_epoch = {**OPERATOR, "actor_class": "model"}
    refused(
        step.send(
            "interaction.submit",
            {
                "actor": without_epoch,
                "request_id": step.request_id,
                "target_session_id": step.session_id,
                "idempotency_key": "k",
                "output": BlobValue.of_json({}).model_dump(),
            },
        ),
        "rejected",
        "validationFailed",
    )
    reply = operator_submit(step, {"summary": "by hand"})  # no segment was ever opened
    assert reply.outcome == "accepted" and reply.receipt["status"] == "validating"
    submission_id = submission_id_of(step.request_id, "operator-1")
    assert step.row("SELECT actor_class FROM events WHERE event_type = 'interaction.submitted'") == ("operator",)
    step.settle(submission_id, output={"summary": "by hand"})
    assert step.request_status() == "accepted" and step.attempt() == ("completed", "ok", None)
    assert run_state(executor) == (("queued", "queued", False, False), None)
    consistent(executor)


def test_an_operator_submission_to_a_parked_run_or_a_paused_one(step, executor):
    step.send("run.pause", {"actor": CLIENT, "run_id": "run-1"})
    refused(operator_submit(step, {"summary": "x"}), "conflict", "runPaused")  # resume it first
    step.send("run.resume", {"actor": CLIENT, "run_id": "run-1"})
    step.open()
    cause = BlobValue.of_text("no pi").model_dump()
    step.send("agent.exited", {"actor": SERVER, "segment_id": "segment-1", "detail": cause})
    assert run_state(executor)[1] == "agentNoProgress"
    reply = operator_submit(step, {"summary": "by hand"})  # the parked run's step takes it
    assert reply.outcome == "accepted", reply
    step.settle(reply.receipt["submissionId"], output={"summary": "by hand"})
    assert run_state(executor) == (("queued", "queued", False, False), None)  # no longer parked
    consistent(executor)

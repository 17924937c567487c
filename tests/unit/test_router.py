"""The router in-process: client operations relayed to a fake writer, refusals, and what a committed
command sets going (supervisor/router.py over the seams of supervisor/seams.py, on a fake clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from piworkflows.clock import FakeClock
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal.writer import Reply
from piworkflows.settings import Settings
from piworkflows.supervisor.router import Router
from piworkflows.supervisor.seams import Load

pytestmark = pytest.mark.timeout(30)

ACCEPTED = Reply(outcome="accepted", revision=3, receipt={"runId": "run-1"})


class FakeWriter:
    """Answers each command with the next scripted reply for its kind (default: ACCEPTED)."""

    def __init__(self, scripts: dict[str, list[Reply]] | None = None) -> None:
        self.scripts = {kind: list(replies) for kind, replies in (scripts or {}).items()}
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.reason: dict[str, Any] | None = None
        self.during: Any = None  # called as each command is sent

    async def request(self, kind: str, body: dict[str, Any]) -> Reply:
        self.sent.append((kind, body))
        if self.during is not None:
            self.during()
        script = self.scripts.get(kind)
        return script.pop(0) if script else ACCEPTED

    def unavailable_reason(self) -> dict[str, Any] | None:
        return self.reason

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.sent]


class FakeServer:
    """The server host and run control the router acts on; records what it was asked to do."""

    def __init__(self) -> None:
        self.state = "running"
        self.epoch = 7
        self.stops: list[str] = []
        self.did: list[tuple[str, ...]] = []
        self.in_maintenance = 0

    def request_stop(self, reason: str) -> None:
        self.stops.append(reason)

    def load(self) -> Load:
        return Load(active_runners=2, connections=1, max_connections=64, fd_limit=1024)

    @contextmanager
    def maintenance(self) -> Iterator[None]:
        self.in_maintenance += 1
        try:
            yield
        finally:
            self.in_maintenance -= 1

    def wake_scheduler(self) -> None:
        self.did.append(("wake_scheduler",))

    def wake_outbox(self) -> None:
        self.did.append(("wake_outbox",))

    def stop_run(self, run_id: str, let_effect_settle: bool = False) -> None:
        self.did.append(("stop_run", run_id, "settle" if let_effect_settle else "now"))

    def stop_agent_host(self, run_id: str) -> None:
        self.did.append(("stop_agent_host", run_id))

    def cancel_effects(self, run_id: str) -> None:
        self.did.append(("cancel_effects", run_id))


class NoResolvers:
    """run.start and the workflow reads are not under test here."""

    async def resolve(self, project_path: str, workflow_name: str, input_value: Any) -> Any:
        raise AssertionError("no resolver expected")

    async def show(self, project_path: str, workflow_name: str) -> Any:
        raise AssertionError("no resolver expected")

    async def list_workflows(self, project_path: str) -> Any:
        raise AssertionError("no resolver expected")


def router(writer: FakeWriter, settings: Settings | None = None) -> tuple[Router, FakeServer, FakeClock]:
    server, clock = FakeServer(), FakeClock()
    return Router(writer, NoResolvers(), server, server, settings or Settings(), clock), server, clock


def request(operation: str, payload: Any = None, **envelope: Any) -> client_v1.Request:
    return client_v1.Request(
        requestId="req-1",
        clientId="client-1",
        operation=operation,
        idempotencyKey="key-1",
        payload={} if payload is None else payload,
        **envelope,
    )


def handle(route: Router, req: client_v1.Request, clock: FakeClock | None = None) -> client_v1.Response:
    async def answer() -> client_v1.Response:
        return await (clock.drive(route.handle(req)) if clock is not None else route.handle(req))

    return asyncio.run(answer())


def test_run_status_is_relayed_to_the_writer_and_its_reply_returned():
    writer = FakeWriter(
        {"run.get": [Reply(outcome="accepted", revision=5, receipt={"runId": "run-9", "status": "queued"})]}
    )
    route, _, _ = router(writer)
    response = handle(route, request("run.status", runId="run-9"))
    assert writer.sent == [("run.get", {"actor": {"actor_class": "client", "actor_id": "client-1"}, "run_id": "run-9"})]
    assert (response.requestId, response.outcome, response.revision) == ("req-1", "accepted", 5)
    assert response.receipt == {"runId": "run-9", "status": "queued"}


def test_a_refusal_of_the_writer_is_relayed_with_its_code():
    refused = Reply(outcome="notFound", receipt={"code": "runNotFound"}, error="no such run")
    writer = FakeWriter({"run.get": [refused]})
    route, _, _ = router(writer)
    response = handle(route, request("run.status", runId="run-9"))
    assert (response.outcome, response.receipt, response.error) == ("notFound", {"code": "runNotFound"}, "no such run")


def test_a_request_without_its_run_is_refused_before_the_writer_is_asked():
    writer = FakeWriter()
    route, server, _ = router(writer)
    for operation in (
        "run.status",
        "run.cancel",
        "run.pause",
        "run.resume",
        "run.delete",
        "run.logs",
        "run.transcript",
    ):
        response = handle(route, request(operation))
        assert response.outcome == "rejected" and response.receipt == {"code": "validationFailed"}, operation
        assert "runId" in (response.error or "")
    assert writer.sent == [] and server.did == []


def test_run_transcript_is_relayed_as_the_writers_read():
    writer = FakeWriter()
    route, server, _ = router(writer)
    response = handle(route, request("run.transcript", {"nodePath": "fix", "after": 7}, runId="run-9"))
    assert response.outcome == "accepted"
    actor = {"actor_class": "client", "actor_id": "client-1"}
    body = {"actor": actor, "run_id": "run-9", "node_path": "fix", "after": 7, "limit": 64}
    assert writer.sent == [("run.transcript", body)] and server.did == []


def test_a_payload_that_does_not_fit_is_refused_without_echoing_it():
    writer = FakeWriter()
    route, _, _ = router(writer)
    response = handle(route, request("run.status", {"secret-token-123": 1}, runId="run-9"))
    assert response.outcome == "rejected" and response.receipt == {"code": "validationFailed"}
    assert response.error == "payload has invalid fields: (unexpected member)"
    assert writer.sent == []


def test_a_committed_cancel_stops_the_runner_and_the_effects_of_its_run():
    writer = FakeWriter()
    route, server, _ = router(writer)
    response = handle(route, request("run.cancel", runId="run-9"))
    assert response.outcome == "accepted"
    ((kind, body),) = writer.sent
    assert kind == "run.cancel" and body["run_id"] == "run-9"
    assert body["client_receipt"]["idempotency_key"] == "key-1" and body["client_receipt"]["operation"] == "run.cancel"
    assert server.did == [("stop_run", "run-9", "now"), ("cancel_effects", "run-9")]


def test_a_refused_cancel_stops_nothing():
    writer = FakeWriter({"run.cancel": [Reply(outcome="conflict", receipt={"code": "runFinished"}, error="finished")]})
    route, server, _ = router(writer)
    assert handle(route, request("run.cancel", runId="run-9")).outcome == "conflict"
    assert server.did == []


def test_a_pause_stops_its_runner_only_when_it_commits_now_and_lets_an_effect_settle():
    writer = FakeWriter({"run.pause": [ACCEPTED, Reply(outcome="adopted", revision=3, receipt={"runId": "run-9"})]})
    route, server, _ = router(writer)
    assert handle(route, request("run.pause", runId="run-9")).outcome == "accepted"
    assert server.did == [("stop_run", "run-9", "settle")]
    # a replayed pause (adopted) must not stop a runner that a later resume started
    assert handle(route, request("run.pause", runId="run-9")).outcome == "adopted"
    assert server.did == [("stop_run", "run-9", "settle")]


def test_a_resume_and_a_retried_effect_wake_who_acts_next():
    writer = FakeWriter()
    route, server, _ = router(writer)
    handle(route, request("run.resume", runId="run-9"))
    assert server.did == [("wake_scheduler",)]
    server.did.clear()
    handle(route, request("effect.retry", {"effectId": "effect-1"}))
    assert writer.sent[-1][0] == "effect.retry" and writer.sent[-1][1]["effect_id"] == "effect-1"
    assert server.did == [("wake_outbox",), ("wake_scheduler",)]


def test_a_prune_holds_retention_away_while_the_writer_works():
    writer = FakeWriter()
    route, server, _ = router(writer)
    seen: list[int] = []
    writer.during = lambda: seen.append(server.in_maintenance)
    handle(route, request("state.prune", {"before": "2026-01-01T00:00:00Z"}))
    assert writer.kinds() == ["state.prune"] and seen == [1] and server.in_maintenance == 0


def test_server_status_answers_from_the_host_and_says_why_nothing_commits():
    writer = FakeWriter({"server.counts": [Reply(outcome="unavailable", receipt={"code": "diskFull"}, error="full")]})
    writer.reason = {"code": "diskFull", "message": "the disk is full", "freeBytes": 0}
    route, _, _ = router(writer)
    receipt = handle(route, request("server.status")).receipt
    assert receipt["state"] == "unavailable" and receipt["reason"]["code"] == "diskFull"
    assert (receipt["epoch"], receipt["activeRunners"], receipt["connections"]) == (7, 2, 1)
    assert (receipt["maxConnections"], receipt["fdLimit"]) == (64, 1024)


def test_server_stop_asks_a_restarting_writer_again_with_the_same_key():
    restarting = Reply(outcome="unavailable", receipt={"code": "writerRestarting"}, error="restarting")
    writer = FakeWriter({"server.record_stop": [restarting, restarting, ACCEPTED]})
    route, server, clock = router(writer)
    response = handle(route, request("server.stop"), clock)
    assert response.outcome == "accepted"
    bodies = [body for kind, body in writer.sent if kind == "server.record_stop"]
    assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2] and bodies[0]["server_epoch"] == 7
    # asked again after writer_restart_min_ms, then twice that
    assert clock.monotonic_ms() == 3 * Settings().writer_restart_min_ms
    assert server.stops == ["server.stop from a client"]


def test_server_stop_is_carried_out_unconfirmed_when_nothing_commits_within_the_grace():
    full = Reply(outcome="unavailable", receipt={"code": "diskFull"}, error="the disk is full")
    settings = Settings(stop_grace_ms=1000)
    writer = FakeWriter({"server.record_stop": [full] * 100})
    route, server, clock = router(writer, settings)
    response = handle(route, request("server.stop"), clock)
    assert response.outcome == "accepted" and response.receipt == {
        "stopping": True,
        "serverEpoch": 7,
        "recorded": False,
    }
    assert clock.monotonic_ms() == settings.stop_grace_ms  # asked again until the grace ended, not longer
    assert server.stops == ["server.stop from a client (not confirmed as recorded: diskFull)"]


def test_an_adopted_stop_of_an_older_epoch_is_not_carried_out():
    older = Reply(outcome="adopted", revision=2, receipt={"serverEpoch": 6, "stopping": True})
    writer = FakeWriter({"server.record_stop": [older]})
    route, server, _ = router(writer)
    assert handle(route, request("server.stop")).outcome == "adopted"
    assert server.stops == []


class Judge(NoResolvers):
    """A validator that accepts an output whose summary is a string (else it is refused)."""

    async def validate(
        self, project_path: str, source: Any, digest: str, node_path: str, output: Any, answer: bool = False
    ) -> Any:
        from piworkflows.protocol.internal.resolver import Validation

        if isinstance(output.get("summary"), str):
            return Validation(ok=True, output=output)
        return Validation(ok=False, error="summary is not a string", code="validationFailed")


def submission_writer(verdict: str) -> FakeWriter:
    recorded = {"submissionId": "submission-1", "requestId": "request-1", "runId": "run-1", "nodePath": "fix"}
    state = {"projectPath": "/p", "source": {"kind": "builtin", "id": "builtin:demo", "revision": "2"}}
    settled: dict[str, Any] = {"submissionId": "submission-1", "requestId": "request-1", "status": verdict}
    if verdict == "rejected":
        settled.update(errorCode="validationFailed", error="summary is not a string")
    return FakeWriter(
        {
            "interaction.submit": [Reply(outcome="accepted", revision=4, receipt={**recorded, "status": "validating"})],
            "run.resume_state": [Reply(outcome="accepted", receipt={**state, "definitionDigest": "sha256:00"})],
            "interaction.settle": [Reply(outcome="accepted", revision=5, receipt=settled)],
        }
    )


def submit_payload(operator: bool, summary: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "targetSessionId": "pis-1",
        "requestId": "request-1",
        "submissionId": "operator-1" if operator else "submit-1",
        "value": {"output": {"summary": summary}},
    }
    return {**payload, "operator": True} if operator else {**payload, "coordinatorEpoch": 2}


@pytest.mark.parametrize("operator", [True, False])
def test_an_operators_accepted_submission_ends_the_host_still_on_the_step(operator):
    writer = submission_writer("accepted")
    server, clock = FakeServer(), FakeClock()
    route = Router(writer, Judge(), server, server, Settings(), clock)
    response = handle(route, request("interaction.submit", submit_payload(operator, "done")))
    assert response.outcome == "accepted" and response.receipt["status"] == "accepted"
    ((kind, body), *_) = writer.sent
    assert kind == "interaction.submit" and body["actor"]["actor_class"] == ("operator" if operator else "model")
    assert body["coordinator_epoch"] == (None if operator else 2)
    stopped = [("stop_agent_host", "run-1")] if operator else []  # the tool's host ends by itself
    assert server.did == [("wake_scheduler",), *stopped]


def test_an_operators_rejected_submission_is_answered_with_the_validators_error():
    writer = submission_writer("rejected")
    server, clock = FakeServer(), FakeClock()
    route = Router(writer, Judge(), server, server, Settings(), clock)
    response = handle(route, request("interaction.submit", submit_payload(True, 1)))
    assert (response.outcome, response.receipt, response.error) == (
        "rejected",
        {"code": "validationFailed"},
        "summary is not a string",
    )
    assert server.did == []


@pytest.mark.parametrize("payload", [{"operator": True, "coordinatorEpoch": 2}, {"operator": False}, {}])
def test_a_submission_is_the_tools_with_an_epoch_or_an_operators_without_one(payload):
    writer = FakeWriter()
    route, _, _ = router(writer)
    base = {k: v for k, v in submit_payload(True, "x").items() if k != "operator"}
    response = handle(route, request("interaction.submit", {**base, **payload}))
    assert response.outcome == "rejected" and response.receipt == {"code": "validationFailed"} and writer.sent == []

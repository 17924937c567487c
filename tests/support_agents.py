"""Builders for the agent-step writer commands (AGENTS.md C2 to C12), for unit tests of the writer.

``AgentStep`` drives one run through the real writer in-process: a claimed run,
an agent node started and its request committed, then segments opened and the
host's reports sent under each segment's claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from piworkflows.protocol import step_contract
from piworkflows.protocol.internal.agents import (
    AgentContract,
    Executor,
    ExpectedOutput,
    initial_step_key,
    message_id_of,
    request_id_of,
)
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.writer import invariants
from piworkflows.writer.db import GroupExecutor
from tests.support import claim_run, run_create, run_group, submitted, take_epoch, token_hash

SERVER = {"actor_class": "server"}
RUNNER = {"actor_class": "runner"}
MODEL = {"actor_class": "model"}
TTL_MS = 10_000


def run_claim(generation: int = 1, token: str = "tok") -> dict[str, Any]:
    return {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": token_hash(token),
        "lease_generation": generation,
        "ttl_ms": TTL_MS,
    }


def contract_of(
    attempt_id: str, expected: ExpectedOutput | None = None, session: str = "run", executor: Executor | None = None
) -> AgentContract:
    return AgentContract(
        workflow_name="demo",
        node_path="fix",
        attempt_id=attempt_id,
        request_id=request_id_of(attempt_id),
        visit_number=1,
        attempt_number=1,
        prompt="Fix the failing test.",
        expected_output=expected or ExpectedOutput(kind="description", description='{"summary": "what changed"}'),
        session=session,
        executor=executor or Executor(),
    )


def assistant_message(max_chars: int | None = None) -> ExpectedOutput:
    return ExpectedOutput(kind="assistant-message", max_chars=max_chars)


def consistent(executor: GroupExecutor) -> None:
    """state verify: SQLite's checks and every invariant hold."""
    report, _ = invariants.verify(executor.conn, executor.clock.now_ms())
    assert report == {"ok": True, "integrity": [], "violations": {}}, report


@dataclass
class AgentStep:
    """One run at one agent node: ``start()`` commits C1 and C2; then segments and reports."""

    executor: GroupExecutor
    run_id: str = "run-1"
    revision: int = 2  # the run's, after run.create and run.claim
    attempt_id: str = ""
    request_id: str = ""
    contract: AgentContract | None = None
    segments: dict[str, int] = field(default_factory=dict)  # segment id -> lease generation

    def send(self, kind: str, body: dict[str, Any]) -> Any:
        (reply,) = run_group(self.executor, submitted(kind, body))
        return reply

    def start(
        self,
        expected: ExpectedOutput | None = None,
        session: str = "run",
        timeout_ms: int = 0,
        epoch: bool = True,
        executor: Executor | None = None,
    ) -> Any:
        """C1 and C2: the run created and claimed, its agent node started, its request committed."""
        self.begin(expected, session, epoch=epoch, executor=executor)
        reply = self.request_agent(timeout_ms)
        if reply.outcome == "accepted":
            self.revision = reply.revision
        return reply

    def begin(
        self,
        expected: ExpectedOutput | None = None,
        session: str = "run",
        kind: str = "agent",
        epoch: bool = True,
        executor: Executor | None = None,
    ) -> None:
        """The run created (with the server's epoch unless another step took it) and claimed, a node started."""
        run_group(self.executor, *([take_epoch()] if epoch else []), run_create(self.run_id))
        run_group(self.executor, claim_run(run_id=self.run_id))
        started = self.send(
            "node.start",
            {
                "actor": RUNNER,
                "run_id": self.run_id,
                "claim": run_claim(),
                "expected_revision": self.revision,
                "node_path": "fix",
                "node_kind": kind,
                "visit_number": 1,
            },
        )
        assert started.outcome == "accepted", started
        self.revision = started.revision
        self.attempt_id = started.receipt["attemptId"]
        self.request_id = request_id_of(self.attempt_id)
        self.contract = contract_of(self.attempt_id, expected, session, executor)

    def request_agent(self, timeout_ms: int = 0, **changes: Any) -> Any:
        assert self.contract is not None
        step = step_contract.initial(self.contract, message_id_of(initial_step_key(self.request_id)))
        body = {
            "actor": RUNNER,
            "run_id": self.run_id,
            "claim": run_claim(),
            "expected_revision": self.revision,
            "attempt_id": self.attempt_id,
            "contract": BlobValue.of_json(self.contract.model_dump(mode="json")).model_dump(),
            "step": BlobValue.of_text(step).model_dump(),
            "timeout_ms": timeout_ms,
            **changes,
        }
        return self.send("node.request_agent", body)

    @property
    def initial_id(self) -> str:
        return message_id_of(initial_step_key(self.request_id))

    def claimable(self, limit: int = 8, exclude: list[str] | None = None) -> list[dict[str, str]]:
        reply = self.send("agent.claimable", {"actor": SERVER, "limit": limit, "exclude_request_ids": exclude or []})
        assert reply.outcome == "accepted", reply
        requests: list[dict[str, str]] = reply.receipt["requests"]
        return requests

    def open(self, segment_id: str = "segment-1", token: str | None = None, epoch: int = 1) -> Any:
        reply = self.send(
            "agent.open",
            {
                "actor": SERVER,
                "request_id": self.request_id,
                "segment_id": segment_id,
                "server_epoch": epoch,
                "owner_id": f"server-{epoch}",
                "claim_token_hash": token_hash(token or segment_id),
                "ttl_ms": TTL_MS,
            },
        )
        if reply.outcome == "accepted" and "leaseGeneration" in reply.receipt:
            self.segments[segment_id] = reply.receipt["leaseGeneration"]
        return reply

    def claim(self, segment_id: str, token: str | None = None) -> dict[str, Any]:
        return {**run_claim(self.segments.get(segment_id, 1), token or segment_id)}

    def host(self, kind: str, segment_id: str = "segment-1", **body: Any) -> Any:
        """A host's frame as the supervisor forwards it: the segment and its claim attached."""
        actor = {"actor_class": "runner", "actor_id": f"agent:{segment_id}"}
        return self.send(kind, {"actor": actor, "segment_id": segment_id, "claim": self.claim(segment_id), **body})

    def turn(
        self, phase: str, turn_id: str, message_id: str | None = None, segment_id: str = "segment-1", **more: Any
    ) -> Any:
        message = message_id or self.initial_id
        return self.host(
            "agent.turn", segment_id, phase=phase, workflow_turn_id=turn_id, workflow_message_id=message, **more
        )

    def submit(self, output: Any, key: str = "submit-1", epoch: int | None = None, session: str | None = None) -> Any:
        return self.send(
            "interaction.submit",
            {
                "actor": MODEL,
                "request_id": self.request_id,
                "target_session_id": session or self.session_id,
                "coordinator_epoch": epoch if epoch is not None else max(self.segments.values(), default=1),
                "idempotency_key": key,
                "output": BlobValue.of_json(output).model_dump(),
            },
        )

    def settle(self, submission_id: str, output: Any = None, error: str | None = None) -> Any:
        body: dict[str, Any] = {"actor": SERVER, "submission_id": submission_id}
        if error is None:
            body.update(verdict="accepted", output=BlobValue.of_json(output).model_dump())
        else:
            body.update(verdict="rejected", error=BlobValue.of_text(error).model_dump(), error_code="validationFailed")
        return self.send("interaction.settle", body)

    @property
    def session_id(self) -> str:
        row = self.executor.conn.execute(
            "SELECT target_session_id FROM interactive_requests WHERE request_id = ?", (self.request_id,)
        ).fetchone()
        return str(row[0])

    def row(self, sql: str, *params: Any) -> Any:
        return self.executor.conn.execute(sql, params).fetchone()

    def rows(self, sql: str, *params: Any) -> list[Any]:
        return self.executor.conn.execute(sql, params).fetchall()

    def request_status(self) -> str:
        return str(self.row("SELECT request_status FROM interactive_requests WHERE request_id = ?", self.request_id)[0])

    def attempt(self) -> tuple[Any, ...]:
        return tuple(
            self.row(
                "SELECT attempt_status, outcome, error_code FROM node_attempts WHERE attempt_id = ?", self.attempt_id
            )
        )

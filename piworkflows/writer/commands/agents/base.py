"""What the agent handlers share: the segment claim, the checks that refuse, the receipts."""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from typing import TypeVar

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.agents import AgentContract, UnderSegmentClaim, request_id_of, submission_id_of
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.states import MEDIA_TEXT
from piworkflows.writer import agent_steps, records
from piworkflows.writer.agent_steps import Request, Segment
from piworkflows.writer.contract import ResourceHandler, Target, Tx

SERVER_ONLY = frozenset({"server"})
HOSTS = frozenset({"runner", "server"})  # a host's frame arrives as the runner actor agent:<segment>
MODELS = frozenset({"model", "client"})  # the workflow tool (and a person's control) through client.v1
OPERATORS = frozenset({"operator"})  # a person providing a step's output (pi-workflows submit)

S = TypeVar("S", bound=UnderSegmentClaim)


def find_request(conn: sqlite3.Connection, request_id: str) -> Request:
    request = agent_steps.get_request(conn, request_id)
    if request is None:
        raise CommandError("resourceNotFound", "no such interactive request", requestId=request_id)
    return request


def run_row(tx: Tx, run_id: str) -> tuple[str, int, str | None, str, str | None]:
    """(status, paused, park_reason, execution_mode, origin_session_id) of a run."""
    row = tx.conn.execute(
        "SELECT status, paused, park_reason, execution_mode, origin_session_id FROM runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    return row[0], row[1], row[2], row[3], row[4]


def paused(tx: Tx, run_id: str) -> bool:
    return bool(run_row(tx, run_id)[1])


def require_open(request: Request) -> None:
    """Competing outcomes: a request that accepted a result refuses with ``winnerDecided``; one
    that failed or was cancelled no longer waits."""
    if request.status == "accepted":
        raise CommandError("winnerDecided", "the request already accepted a result", requestId=request.request_id)
    if not request.open:
        raise CommandError("notWaiting", f"the request is {request.status}", requestId=request.request_id)


def outcome_receipt(tx: Tx, request: Request) -> dict[str, object]:
    """What a host does next: the request's status, whether the run is paused, the steps to send now."""
    (status,) = tx.conn.execute(
        "SELECT request_status FROM interactive_requests WHERE request_id = ?", (request.request_id,)
    ).fetchone()
    return {
        "requestStatus": status,
        "paused": paused(tx, request.run_id),
        "pending": agent_steps.pending_steps(tx.conn, request.request_id),
    }


class SegmentCommand(ResourceHandler[S]):
    """A host's report: on its segment, under the segment's claim (verified and renewed by the contract)."""

    actors = HOSTS
    claim_required = True

    def target(self, tx: Tx, cmd: S) -> Target:
        resource = records.get_resource(tx.conn, cmd.segment_id)
        if resource is None or resource.resource_kind != "session_segment":
            raise CommandError("resourceNotFound", "no such session segment", segmentId=cmd.segment_id)
        return Target(cmd.segment_id, resource.revision, claim=cmd.claim)


def recording(tx: Tx, segment_id: str) -> tuple[Segment, Request]:
    """The recording segment and its attempt's request (a closed segment takes no report)."""
    segment = agent_steps.get_segment(tx.conn, segment_id)
    if segment is None or segment.status != "recording":
        raise CommandError("invalidTransition", "the segment is not recording", segmentId=segment_id)
    return segment, find_request(tx.conn, request_id_of(segment.attempt_id))


def session_step(tx: Tx, segment: Segment, message_id: str) -> tuple[str | None, str, str | None]:
    """(request_id, message_state, pi_entry_id) of a step message of the segment's session."""
    row = agent_steps.step_message(tx.conn, message_id)
    if row is None or row[1] != segment.session_id:
        raise CommandError("invalidTransition", "not a step message of this session", workflowMessageId=message_id)
    return row[0], row[2], row[3]


def reply_problem(contract: AgentContract, reply: BlobValue | None) -> str | None:
    """Why a reply is not the output of the step (None: it is): an assistant-message step takes
    non-empty text within its limit."""
    expected = contract.expected_output
    if expected.kind != "assistant-message":
        return "the step's output is submitted, not replied"
    if reply is None or reply.media_type != MEDIA_TEXT:
        return "there is no reply"
    text = reply.data.decode("utf-8")
    if not text.strip():
        return "the reply is empty"
    if expected.max_chars is not None and len(text) > expected.max_chars:
        return f"the reply has {len(text)} characters, more than the step's {expected.max_chars}"
    return None


@dataclass(frozen=True)
class ReplyAcceptance:
    """An assistant-message step accepted with the model's visible reply (C9; adopted at C5)."""

    request: Request
    key: str  # the submission's idempotency key: assistant:<turn> (C9), assistant:<entry> (C5)
    output: BlobValue  # JSON: the reply text, the attempt's output
    receipt: BlobValue  # JSON: {textSha256, piEntryId, maxChars, adopted}

    @classmethod
    def of(
        cls,
        request: Request,
        contract: AgentContract,
        key: str,
        reply: BlobValue | None,
        entry: str | None,
        adopted: bool,
    ) -> ReplyAcceptance | None:
        """The acceptance, when the reply is one: non-empty text within the step's limit."""
        if reply is None or reply_problem(contract, reply) is not None:
            return None
        text, limit = reply.data.decode("utf-8"), contract.expected_output.max_chars
        receipt = {
            "textSha256": hashlib.sha256(reply.data).hexdigest(),
            "piEntryId": entry,
            "maxChars": limit,
            "adopted": adopted,
        }
        return cls(request, key, BlobValue.of_json(text), BlobValue.of_json(receipt))

    def apply(self, tx: Tx) -> None:
        """The submission (accepted at once), then the request's acceptance; the run's own event."""
        submission_id = submission_id_of(self.request.request_id, self.key)
        tx.conn.execute(
            "INSERT INTO interactive_submissions (submission_id, request_id, idempotency_key, payload_digest, "
            "created_at) VALUES (?, ?, ?, ?, ?)",
            (submission_id, self.request.request_id, self.key, self.output.digest, tx.now),
        )
        digests = (self.output.digest, self.receipt.digest)
        agent_steps.accept(tx.conn, self.request, submission_id, *digests, tx.actor, tx.now)
        run_id, attempt_id = self.request.run_id, self.request.attempt_id
        agent_steps.advance(tx.conn, run_id, "agent.accepted", tx.actor, tx.now, self.receipt.digest, attempt_id)

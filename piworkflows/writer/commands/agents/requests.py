"""C2 and C3: a runner's request for an agent step, and the segments that give it a host.

::

    runner      node.request_agent (run claim)  attempt waiting (timeout_ms), run waiting, queue
                                                parked, claim released, runner record ended,
                                                request pending, initial step message pending
    supervisor  agent.claimable                 pending requests of waiting, unpaused, unparked
                                                headless runs with no live recording segment
    supervisor  agent.open (on the run)         dead segments close (recovery); a spent budget
                                                times the attempt out; else a recording segment
                                                leased to the supervisor (the same id adopts)
"""

from __future__ import annotations

from pydantic import ValidationError

from piworkflows.errors import CommandError, describe_invalid_fields
from piworkflows.protocol import step_contract
from piworkflows.protocol.internal.agents import (
    AgentClaimable,
    AgentContract,
    AgentOpen,
    NodeRequestAgent,
    initial_step_key,
    message_id_of,
    request_id_of,
    session_id_of,
)
from piworkflows.writer import active_time, agent_steps, records
from piworkflows.writer.commands.agents.base import SERVER_ONLY, find_request, run_row
from piworkflows.writer.commands.nodes import RunnerTransition
from piworkflows.writer.commands.runs import run_target
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx, adoption
from piworkflows.writer.views import touched


class RequestAgent(RunnerTransition[NodeRequestAgent]):
    """C2, like a checkpoint's wait: the runner exits after this commit."""

    model = NodeRequestAgent

    def transition(self, tx: Tx, cmd: NodeRequestAgent, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        row = conn.execute(
            "SELECT attempt_status, node_kind FROM node_attempts WHERE attempt_id = ? AND run_id = ?",
            (cmd.attempt_id, cmd.run_id),
        ).fetchone()
        if row is None or row[0] != "running" or row[1] not in ("agent", "decision"):
            raise CommandError("invalidTransition", "only a running agent node asks for one", attemptId=cmd.attempt_id)
        try:
            contract = AgentContract.model_validate_json(cmd.contract.data)
        except ValidationError as exc:
            fields = describe_invalid_fields(exc.errors())
            raise CommandError("validationFailed", "the contract has " + fields) from None
        request_id = request_id_of(cmd.attempt_id)
        if contract.attempt_id != cmd.attempt_id or contract.request_id != request_id:
            raise CommandError("validationFailed", "the contract names another attempt or request")
        key = initial_step_key(request_id)
        if step_contract.message_of(cmd.step.data.decode("utf-8")) != message_id_of(key):
            raise CommandError("validationFailed", "the step message does not end with its own marker")
        shared = contract.session == "run"
        origin = run_row(tx, cmd.run_id)[4]
        session = (origin or session_id_of(cmd.run_id)) if shared else session_id_of(cmd.attempt_id)

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE node_attempts SET attempt_status = 'waiting', timeout_ms = ? WHERE attempt_id = ?",
                (cmd.timeout_ms, cmd.attempt_id),
            )
            conn.execute(  # a headless run's first shared request names the run's Pi session
                "UPDATE runs SET status = 'waiting', origin_session_id = coalesce(origin_session_id, ?), "
                "updated_at = ? WHERE run_id = ?",
                (session if shared else None, now, cmd.run_id),
            )
            conn.execute(
                "UPDATE run_queue SET queue_status = 'parked', updated_at = ? WHERE run_id = ?", (now, cmd.run_id)
            )
            records.end_live_runner(conn, cmd.run_id, now)
            conn.execute(
                "INSERT INTO interactive_requests (request_id, run_id, attempt_id, target_session_id, contract_digest, "
                "request_status, revision, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'pending', 1, ?, ?)",
                (request_id, cmd.run_id, cmd.attempt_id, session, cmd.contract.digest, now, now),
            )
            source = ("interactive_request", request_id)
            agent_steps.add_step(conn, cmd.run_id, request_id, session, key, cmd.step, source, tx.actor, now)
            touched.touch(conn, cmd.run_id)

        return Change(
            event_type="agent.requested",
            apply=apply,
            blobs=[cmd.contract, cmd.step],
            release_claim=True,
            receipt={"attemptId": cmd.attempt_id, "requestId": request_id, "runStatus": "waiting"},
            attempt_id=cmd.attempt_id,
        )


class ListClaimableAgents(Handler[AgentClaimable]):
    """The question before C3, oldest request first (the supervisor opens one segment for each)."""

    model = AgentClaimable
    actors = SERVER_ONLY
    read_only = True

    def execute(self, tx: Tx, cmd: AgentClaimable) -> Result:
        excluded = ", ".join(f":x{index}" for index in range(len(cmd.exclude_request_ids)))  # SQLite takes ()
        # repeats the condition of interactive_requests_one_open_per_attempt, so SQLite may walk that index
        rows = tx.conn.execute(
            "SELECT i.request_id, i.run_id FROM interactive_requests i JOIN runs r ON r.run_id = i.run_id "
            "WHERE i.request_status IN ('pending', 'validating') AND i.request_status = 'pending' "
            "AND r.status = 'waiting' AND r.paused = 0 AND r.park_reason IS NULL AND r.execution_mode = 'headless' "
            f"AND i.request_id NOT IN ({excluded}) AND NOT EXISTS (SELECT 1 FROM session_segments s "
            f"WHERE s.run_id = i.run_id AND s.segment_status = 'recording' AND {agent_steps.LIVE_SEGMENT}) "
            "ORDER BY i.created_at, i.request_id LIMIT :limit",
            {
                **{f"x{index}": request_id for index, request_id in enumerate(cmd.exclude_request_ids)},
                "owner": agent_steps.segment_owner(tx.conn),
                "now": tx.now,
                "limit": cmd.limit,
            },
        ).fetchall()
        return Result(receipt={"requests": [{"requestId": request_id, "runId": run_id} for request_id, run_id in rows]})


class OpenSegment(ResourceHandler[AgentOpen]):
    """C3, on the run (a timed-out attempt creates no segment, so the segment is not the target)."""

    model = AgentOpen
    actors = SERVER_ONLY

    def target(self, tx: Tx, cmd: AgentOpen) -> Target:
        return run_target(tx, find_request(tx.conn, cmd.request_id).run_id)

    def transition(self, tx: Tx, cmd: AgentOpen, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        records.verify_server_epoch(conn, cmd.server_epoch)
        request = find_request(conn, cmd.request_id)
        existing = agent_steps.get_segment(conn, cmd.segment_id)
        if existing is not None:  # a repeat (its reply was lost): the same segment under the same claim
            lease = records.get_lease(conn, cmd.segment_id)
            ours = lease is not None and lease.claim_token_hash == cmd.claim_token_hash
            if existing.attempt_id != request.attempt_id or existing.status != "recording" or not ours:
                raise CommandError("resourceExists", "the segment id is taken", segmentId=cmd.segment_id)
            return adoption(agent_steps.launch_receipt(conn, cmd.segment_id, request))
        if records.get_resource(conn, cmd.segment_id) is not None:
            raise CommandError("resourceExists", "the segment id is taken", segmentId=cmd.segment_id)
        status, paused, park_reason, mode, _ = run_row(tx, request.run_id)
        if request.status != "pending":
            raise CommandError("notWaiting", f"the request is {request.status}", requestId=request.request_id)
        if paused:
            raise CommandError("runPaused", "the run is paused", runId=request.run_id)
        if status != "waiting" or park_reason is not None or mode != "headless":
            raise CommandError("invalidTransition", "the run does not wait for a headless agent", runId=request.run_id)
        if agent_steps.recording_segments(conn, request.run_id, now, live=True):
            raise CommandError("leaseHeld", "a live host already records this run", runId=request.run_id)
        dead = agent_steps.recording_segments(conn, request.run_id, now, live=False)
        timeout_ms, _, spent = active_time.budget_spent(conn, request.attempt_id)

        def close_dead() -> None:
            for segment in dead:  # recovery: the gap since the last sample is not charged
                agent_steps.close_segment_from(conn, segment, "recovery", tx.actor, now, None)

        if spent:

            def time_out(stamp: Stamp) -> None:
                close_dead()
                agent_steps.time_out(conn, request, timeout_ms, tx.actor, now)

            receipt = {"timedOut": True, "requestId": request.request_id, "runId": request.run_id}
            return Change(event_type="agent.timed_out", apply=time_out, receipt=receipt, attempt_id=request.attempt_id)
        change = Change(event_type="agent.opened", attempt_id=request.attempt_id)

        def apply(stamp: Stamp) -> None:
            close_dead()
            generation = _new_segment(tx, cmd, request)
            records.write_event(conn, cmd.segment_id, 1, "agent.opened", tx.actor, now, generation)
            touched.touch(conn, request.run_id)
            change.receipt.update(agent_steps.launch_receipt(conn, cmd.segment_id, request))

        change.apply = apply
        return change


def _new_segment(tx: Tx, cmd: AgentOpen, request: agent_steps.Request) -> int:
    """The segment resource, its row (the session's last known Pi file) and its lease, whose
    generation exceeds every earlier segment's of the run (the epoch a stale tool is refused by)."""
    conn, now = tx.conn, tx.now
    (after,) = conn.execute(
        "SELECT coalesce(max(l.lease_generation), 0) FROM session_segments s "
        "JOIN leases l ON l.resource_id = s.segment_id WHERE s.run_id = ?",
        (request.run_id,),
    ).fetchone()
    previous = conn.execute(
        "SELECT pi_session_file, pi_session_id FROM session_segments WHERE run_id = ? AND session_id = ? "
        "AND pi_session_file IS NOT NULL ORDER BY started_at DESC, rowid DESC LIMIT 1",
        (request.run_id, request.target_session_id),
    ).fetchone() or (None, None)
    records.create_resource(conn, cmd.segment_id, "session_segment", now)
    conn.execute(
        "INSERT INTO session_segments (segment_id, run_id, attempt_id, session_id, segment_status, "
        "pi_session_file, pi_session_id, started_at) VALUES (?, ?, ?, ?, 'recording', ?, ?, ?)",
        (cmd.segment_id, request.run_id, request.attempt_id, request.target_session_id, *previous, now),
    )
    return records.acquire_lease(conn, cmd.segment_id, cmd.owner_id, cmd.claim_token_hash, cmd.ttl_ms, now, after)


HANDLERS = (RequestAgent(), ListClaimableAgents(), OpenSegment())

"""Runner lifecycle: admission, the runner's identity, and where a run goes when its runner ends.

::

    queued/queued ── run.claim ──> running/starting (new lease generation,
                                   run_workers row with start_revision, before spawn)
    runner.spawned: pid + create time recorded (claim-fenced)
    runner.exited:  stopped by the server (pause, cancel, shutdown, supervisor crash)
                        -> running/parked (shutdown) or paused, never "no progress"
                    exited or died after the run advanced -> queued/queued
                    exited or died before it advanced     -> running/parked (runnerNoProgress;
                                   a dead runner's last stderr line is the event's payload)
                    (a terminal run keeps its state)

Every transition releases or takes the lease in the same transaction and
advances the run's presentation revision.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.runners import (
    ClaimableRuns,
    ClaimRenew,
    OrphanedRunners,
    ResumeState,
    RunClaim,
    RunnerExited,
    RunnerSpawned,
)
from piworkflows.states import DETAILED_PARKS, TERMINAL_RUN_STATUSES
from piworkflows.writer import records
from piworkflows.writer.commands.runs import run_target
from piworkflows.writer.contract import Change, Handler, NewClaim, ResourceHandler, Result, Stamp, Target, Tx
from piworkflows.writer.views import touched
from piworkflows.writer.views.runs import source_view

SERVER_ONLY = frozenset({"server"})
MAX_STEP_ERROR = 1000  # characters of a failed step's error in run.resume_state
MAX_DETAIL = 300  # characters of a park detail that counts the deaths

_CLAIMABLE = """
    FROM runs r JOIN run_queue q ON q.run_id = r.run_id LEFT JOIN leases l ON l.resource_id = r.run_id
    WHERE r.paused = 0 AND r.status IN ('queued', 'running') AND q.available_at <= :now
      AND (q.queue_status = 'queued' OR (q.queue_status = 'parked' AND r.park_reason = 'shutdown'))
      AND (l.owner_id IS NULL OR l.expires_at <= :now)
      AND NOT EXISTS (SELECT 1 FROM effects e JOIN leases el ON el.resource_id = e.effect_id
                      WHERE e.run_id = r.run_id AND e.channel_id IS NULL AND e.effect_status = 'applying'
                        AND el.owner_id IS NOT NULL AND el.expires_at > :now)
      AND NOT EXISTS (SELECT 1 FROM session_segments s JOIN leases sl ON sl.resource_id = s.segment_id
                      WHERE s.run_id = r.run_id AND s.segment_status = 'recording'
                        AND sl.owner_id IS NOT NULL AND sl.expires_at > :now)
"""
# (an effect still applying under a live claim, e.g. one a paused run let settle, is awaited; so is
# the agent host of a settled step: its turn ends and its segment closes before a runner goes on)


class ClaimRun(ResourceHandler[RunClaim]):
    model = RunClaim
    actors = SERVER_ONLY

    def target(self, tx: Tx, cmd: RunClaim) -> Target:
        return run_target(tx, cmd.run_id)

    def transition(self, tx: Tx, cmd: RunClaim, resource: records.Resource | None) -> Change:
        records.verify_server_epoch(tx.conn, cmd.server_epoch)
        claimable = tx.conn.execute(
            "SELECT 1 " + _CLAIMABLE + " AND r.run_id = :run_id", {"now": tx.now, "run_id": cmd.run_id}
        ).fetchone()
        if claimable is None:
            raise CommandError("invalidTransition", "the run is not waiting for a runner", runId=cmd.run_id)
        conn, now = tx.conn, tx.now
        (started_at,) = conn.execute("SELECT started_at FROM runs WHERE run_id = ?", (cmd.run_id,)).fetchone()
        # A run that ran before continues from its last durable boundary.
        launch_command = "resume" if started_at is not None and cmd.launch_command == "start" else cmd.launch_command
        change = Change(
            event_type="run.claimed",
            acquire_claim=NewClaim(cmd.owner_id, cmd.claim_token_hash, cmd.ttl_ms),
            receipt={"runId": cmd.run_id},
        )

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE run_queue SET queue_status = 'starting', updated_at = ? WHERE run_id = ?", (now, cmd.run_id)
            )
            conn.execute(
                "UPDATE runs SET status = 'running', park_reason = NULL, started_at = coalesce(started_at, ?), "
                "updated_at = ? WHERE run_id = ?",
                (now, now, cmd.run_id),
            )
            runner_epoch = conn.execute(
                "INSERT INTO run_workers (run_id, server_epoch, lease_generation, launch_command, start_revision, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (cmd.run_id, cmd.server_epoch, stamp.lease_generation, launch_command, stamp.revision, now),
            ).lastrowid
            touched.touch(conn, cmd.run_id)
            change.receipt.update(runnerEpoch=runner_epoch, leaseGeneration=stamp.lease_generation)

        change.apply = apply
        return change


class RecordRunnerSpawned(Handler[RunnerSpawned]):
    """Identity only: no run state changes, so no revision; fenced by the live claim."""

    model = RunnerSpawned
    actors = SERVER_ONLY

    def execute(self, tx: Tx, cmd: RunnerSpawned) -> Result:
        records.verify_and_renew_claim(tx.conn, cmd.run_id, cmd.claim, tx.now)
        updated = tx.conn.execute(
            "UPDATE run_workers SET pid = ?, process_started_at = ?, spawned_at = ? "
            "WHERE runner_epoch = ? AND run_id = ? AND lease_generation = ? AND ended_at IS NULL AND pid IS NULL",
            (cmd.pid, cmd.process_started_at, tx.now, cmd.runner_epoch, cmd.run_id, cmd.claim.lease_generation),
        ).rowcount
        if updated != 1:
            raise CommandError("invalidTransition", "no such live runner record", runnerEpoch=cmd.runner_epoch)
        return Result(receipt={"runnerEpoch": cmd.runner_epoch})


class RecordRunnerExited(ResourceHandler[RunnerExited]):
    model = RunnerExited
    actors = SERVER_ONLY
    fenced_by_transition = True  # the runner is gone and its claim may have expired: its runner epoch fences

    def target(self, tx: Tx, cmd: RunnerExited) -> Target:
        return run_target(tx, cmd.run_id)

    def _worker(self, tx: Tx, cmd: RunnerExited) -> tuple[int, int]:
        row = tx.conn.execute(
            "SELECT lease_generation, start_revision FROM run_workers "
            "WHERE runner_epoch = ? AND run_id = ? AND ended_at IS NULL",
            (cmd.runner_epoch, cmd.run_id),
        ).fetchone()
        if row is None:
            raise CommandError("invalidTransition", "no such live runner record", runnerEpoch=cmd.runner_epoch)
        return int(row[0]), int(row[1])

    def transition(self, tx: Tx, cmd: RunnerExited, resource: records.Resource | None) -> Change:
        assert resource is not None
        generation, start_revision = self._worker(tx, cmd)
        conn, now = tx.conn, tx.now
        status, paused = conn.execute("SELECT status, paused FROM runs WHERE run_id = ?", (cmd.run_id,)).fetchone()
        # The runner performed the run's effects: one it left applying under a dead claim
        # (its server epoch crashed) may or may not have acted.
        stale = records.stale_applying_effects(conn, cmd.run_id, now) if cmd.outcome == "orphaned" else []
        ambiguous = any(records.uncertain_effect_status(conn, e, False)[0] == "ambiguous" for e in stale) or bool(
            conn.execute(
                "SELECT 1 FROM effects WHERE run_id = ? AND channel_id IS NULL AND effect_status = 'ambiguous'",
                (cmd.run_id,),
            ).fetchone()
        )
        # Whether an effect is still ambiguous is the database's to say: an operator may have
        # reviewed it after the runner saw it and before this exit; then the run goes on.
        reviewed = cmd.park_reason == "effectAmbiguous" and not ambiguous
        if status in TERMINAL_RUN_STATUSES:
            queue, run_status, park = None, status, None
            placement = "finished"
        elif ambiguous and not paused:
            queue, run_status, park = "parked", "running", "effectAmbiguous"
            placement = "parked"
        elif cmd.park_reason is not None and not reviewed:
            queue, run_status, park = "parked", "running", cmd.park_reason
            placement = "parked"
        elif cmd.stopped_by_server:
            queue, run_status, park = "parked", "running", ("paused" if paused else "shutdown")
            placement = "parked"
        elif resource.revision > start_revision or reviewed:
            queue, run_status, park = "queued", "queued", None
            placement = "requeued"
        else:
            queue, run_status, park = "parked", "running", "runnerNoProgress"
            placement = "parked"
        detail = cmd.park_detail
        available_at, deaths = None, 0  # a requeue after a death waits out its backoff
        if placement == "requeued" and cmd.outcome == "crashed" and not reviewed:
            deaths, node_path = _deaths_in_a_row(conn, cmd.run_id)
            if deaths >= cmd.crash_limit:
                queue, run_status, park, placement = "parked", "running", "runnerNoProgress", "parked"
                died = cmd.park_detail.data.decode("utf-8") if cmd.park_detail else "the runner died"
                detail = BlobValue.of_text(f"{died} ({deaths} times in a row at node '{node_path}')"[:MAX_DETAIL])
            elif deaths:
                available_at = now + cmd.crash_backoff_ms * 2 ** (deaths - 1)

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE run_workers SET outcome = ?, ended_at = ? WHERE runner_epoch = ?",
                (cmd.outcome, now, cmd.runner_epoch),
            )
            for effect_id in stale:
                records.abandon_effect(conn, effect_id, tx.actor, now)
            # A node the runner was executing did not finish: the next runner starts a new attempt.
            conn.execute(
                "UPDATE node_attempts SET attempt_status = 'interrupted', outcome = 'cancelled', "
                "error_code = 'runnerExited', finished_at = ? WHERE run_id = ? AND attempt_status = 'running'",
                (now, cmd.run_id),
            )
            if queue is not None:
                conn.execute(
                    "UPDATE run_queue SET queue_status = ?, available_at = coalesce(?, available_at), updated_at = ? "
                    "WHERE run_id = ?",
                    (queue, available_at, now, cmd.run_id),
                )
                conn.execute(
                    "UPDATE runs SET status = ?, park_reason = ?, updated_at = ? WHERE run_id = ?",
                    (run_status, park, now, cmd.run_id),
                )
            touched.touch(conn, cmd.run_id)

        receipt: dict[str, Any] = {
            "runId": cmd.run_id,
            "placement": placement,
            **({"parkReason": park} if park else {}),
        }
        if available_at is not None:
            receipt.update(availableAt=available_at, deaths=deaths)
        # Why it parked, for the run view (piworkflows.parkDetail): a runner that made no progress, or
        # what changed in the run's source.
        detail = detail if park in DETAILED_PARKS else None
        return Change(
            event_type="runner.exited",
            apply=apply,
            release_generation=generation,
            receipt=receipt,
            blobs=[detail] if detail else [],
            event_payload=detail.digest if detail else None,
        )


def _deaths_in_a_row(conn: sqlite3.Connection, run_id: str) -> tuple[int, str | None]:
    """How many runners died (outcome crashed) at the node visit the dying runner was executing,
    this one included, and that node's path; (0, None) when it executed none."""
    active = conn.execute(
        "SELECT node_path, visit_number FROM node_attempts WHERE run_id = ? AND attempt_status = 'running'", (run_id,)
    ).fetchone()
    if active is None:
        return 0, None
    (before,) = conn.execute(
        "SELECT count(*) FROM node_attempts a JOIN run_workers w "
        "ON w.run_id = a.run_id AND w.lease_generation = a.lease_generation "
        "WHERE a.run_id = ? AND a.node_path = ? AND a.visit_number = ? AND a.attempt_status = 'interrupted' "
        "AND a.error_code = 'runnerExited' AND w.outcome = 'crashed'",
        (run_id, active[0], active[1]),
    ).fetchone()
    return int(before) + 1, str(active[0])


class ListClaimable(Handler[ClaimableRuns]):
    model = ClaimableRuns
    actors = SERVER_ONLY
    read_only = True

    def execute(self, tx: Tx, cmd: ClaimableRuns) -> Result:
        rows = tx.conn.execute(
            "SELECT r.run_id " + _CLAIMABLE + " ORDER BY q.priority DESC, q.available_at, q.enqueued_at LIMIT :limit",
            {"now": tx.now, "limit": cmd.limit},
        ).fetchall()
        return Result(receipt={"runIds": [row[0] for row in rows]})


class ListOrphans(Handler[OrphanedRunners]):
    model = OrphanedRunners
    actors = SERVER_ONLY
    read_only = True

    def execute(self, tx: Tx, cmd: OrphanedRunners) -> Result:
        rows = tx.conn.execute(
            "SELECT run_id, runner_epoch, server_epoch FROM run_workers WHERE ended_at IS NULL AND server_epoch <= ? "
            "ORDER BY runner_epoch",
            (cmd.server_epoch,),
        ).fetchall()
        active = set(cmd.active_runner_epochs)
        orphans = [
            {"runId": r, "runnerEpoch": e} for r, e, epoch in rows if epoch < cmd.server_epoch or e not in active
        ]
        return Result(receipt={"runners": orphans})


class RenewClaim(Handler[ClaimRenew]):
    """Renew the exact live claim (no revision: nothing changed but its expiry)."""

    model = ClaimRenew
    actors = SERVER_ONLY

    def execute(self, tx: Tx, cmd: ClaimRenew) -> Result:
        records.verify_and_renew_claim(tx.conn, cmd.resource_id, cmd.claim, tx.now)
        return Result(receipt={"expiresAt": tx.now + cmd.claim.ttl_ms})


class ReadResumeState(Handler[ResumeState]):
    """The run's input and completed attempts (outputs through their media type), in step order."""

    model = ResumeState
    actors = SERVER_ONLY
    read_only = True

    def execute(self, tx: Tx, cmd: ResumeState) -> Result:
        conn = tx.conn
        row = conn.execute(
            "SELECT r.input_digest, r.definition_digest, r.max_steps, p.canonical_path, s.source_kind, "
            "s.source_path, s.source_sha256, s.builtin_id, s.builtin_revision FROM runs r "
            "JOIN projects p ON p.project_id = r.project_id JOIN run_sources s ON s.run_id = r.run_id "
            "WHERE r.run_id = ?",
            (cmd.run_id,),
        ).fetchone()
        if row is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        input_digest, definition_digest, max_steps, project_path = row[:4]
        rows = conn.execute(
            "SELECT a.node_path, a.visit_number, a.attempt_number, a.attempt_status, a.outcome, a.output_digest, "
            "a.error_digest, a.error_code "
            "FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id "
            "WHERE s.run_id = ? AND a.finished_at IS NOT NULL ORDER BY s.step_index",
            (cmd.run_id,),
        ).fetchall()
        steps = [
            {
                "nodePath": path,
                "visit": visit,
                "attempt": attempt,
                "outcome": outcome,
                "output": records.read_json(conn, output) if output else None,
                "interrupted": status == "interrupted",
                # a failure the writer settled (an agent step's) ends the run from the next runner
                "error": records.read_text(conn, error)[:MAX_STEP_ERROR] if error and outcome != "ok" else None,
                "errorCode": code,
            }
            for path, visit, attempt, status, outcome, output, error, code in rows
        ]
        return Result(
            receipt={
                "input": records.read_json(conn, input_digest),
                "definitionDigest": "sha256:" + definition_digest.hex(),
                "projectPath": project_path,
                "source": source_view(*row[4:]),
                "maxSteps": max_steps,
                "steps": steps,
            }
        )


HANDLERS = (
    ClaimRun(),
    RecordRunnerSpawned(),
    RecordRunnerExited(),
    RenewClaim(),
    ReadResumeState(),
    ListClaimable(),
    ListOrphans(),
)

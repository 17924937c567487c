"""Run control: pause, resume, cancel, restart (docs/workflows.md, Run lifecycle).

Each commits its state change together with its receipt, fenced by the
run's state rather than by the runner's claim (control wins over a running
runner, which the supervisor stops after the commit). A finished run keeps
its outcome: a later pause or cancel is a conflict naming it.

::

    pause   running -> running/parked (paused), claim released, active attempt
            interrupted, runner record ended; queued or waiting runs keep
            their status and only take the flag; an agent step's active
            interval ends (pause), its pending steps are cancelled
            (interruption), its request keeps waiting
    resume  paused (or parked runnerNoProgress/workflowSourceChanged)
            -> queued/queued, or waiting again for a paused waiting run or
            one parked agentNoProgress (the agent manager tries again)
    cancel  -> cancelled/cancelled, an open human decision resolved (its due deadline first, else
            cancellation), attempts cancelled, pending effects
            cancelled, applying effects ambiguous, claim released; agent
            rows stop (agent_steps.stop_for_end)
    restart finished run -> a new child run (lineage restart, restartNumber + 1;
            a headless child gets its own Pi session at its first agent step)
"""

from __future__ import annotations

from typing import TypeVar

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.control import RunCancel, RunControl, RunPause, RunRestart, RunResume
from piworkflows.states import TERMINAL_RUN_STATUSES
from piworkflows.writer import agent_steps, decisions, local_effects, records
from piworkflows.writer.commands.runs import check_session_free, enqueue_new_run, run_target
from piworkflows.writer.contract import Change, ResourceHandler, Stamp, Target, Tx
from piworkflows.writer.views import touched

R = TypeVar("R", bound=RunControl)

CONTROLLERS = frozenset({"client", "operator", "server"})
# Parked for these, a run is resumed by an operator (an ambiguous effect needs its own review).
RESUMABLE_PARK_REASONS = frozenset(
    {"paused", "shutdown", "runnerNoProgress", "workflowSourceChanged", "agentNoProgress"}
)


def _unfinished(tx: Tx, run_id: str) -> tuple[str, int, str | None, str]:
    status, paused, park_reason, queue = tx.conn.execute(
        "SELECT r.status, r.paused, r.park_reason, q.queue_status FROM runs r "
        "JOIN run_queue q ON q.run_id = r.run_id WHERE r.run_id = ?",
        (run_id,),
    ).fetchone()
    if status in TERMINAL_RUN_STATUSES:
        raise CommandError("winnerDecided", f"the run already ended {status}", runId=run_id, status=status)
    return status, paused, park_reason, queue


def _live_generation(tx: Tx, run_id: str) -> int | None:
    lease = records.get_lease(tx.conn, run_id)
    return lease.lease_generation if lease is not None and lease.owner_id else None


class ControlHandler(ResourceHandler[R]):
    actors = CONTROLLERS
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: RunControl) -> Target:
        return run_target(tx, cmd.run_id, cmd.expected_revision)


class PauseRun(ControlHandler[RunPause]):
    model = RunPause

    def transition(self, tx: Tx, cmd: RunPause, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        status, paused, _, queue = _unfinished(tx, cmd.run_id)
        if paused:
            raise CommandError("invalidTransition", "the run is already paused", runId=cmd.run_id)
        live = queue in ("starting", "running")

        def apply(stamp: Stamp) -> None:
            conn.execute("UPDATE runs SET paused = 1, updated_at = ? WHERE run_id = ?", (now, cmd.run_id))
            if live:  # stop at the last durable boundary; the next runner starts the node anew
                conn.execute(
                    "UPDATE node_attempts SET attempt_status = 'interrupted', outcome = 'cancelled', "
                    "error_code = 'paused', finished_at = ? WHERE run_id = ? AND attempt_status = 'running'",
                    (now, cmd.run_id),
                )
                conn.execute("UPDATE runs SET park_reason = 'paused' WHERE run_id = ?", (cmd.run_id,))
                conn.execute(
                    "UPDATE run_queue SET queue_status = 'parked', updated_at = ? WHERE run_id = ?", (now, cmd.run_id)
                )
                conn.execute(
                    "UPDATE run_workers SET outcome = 'cancelled', ended_at = ? WHERE run_id = ? AND ended_at IS NULL",
                    (now, cmd.run_id),
                )
            agent_steps.stop_for_pause(conn, cmd.run_id, tx.actor, now)
            touched.touch(conn, cmd.run_id)

        return Change(
            event_type="run.paused",
            apply=apply,
            release_generation=_live_generation(tx, cmd.run_id),
            receipt={"runId": cmd.run_id, "status": status, "paused": True},
        )


class ResumeRun(ControlHandler[RunResume]):
    model = RunResume

    def transition(self, tx: Tx, cmd: RunResume, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        status, paused, park_reason, queue = _unfinished(tx, cmd.run_id)
        parked = queue == "parked" and status == "running"
        if parked and park_reason == "effectAmbiguous":
            raise CommandError(
                "invalidTransition", "an ambiguous effect needs an operator's review first", runId=cmd.run_id
            )
        agent_parked = status == "waiting" and park_reason == "agentNoProgress"  # it waits for its agent again
        if not paused and not (parked and park_reason in RESUMABLE_PARK_REASONS) and not agent_parked:
            raise CommandError("invalidTransition", "the run is neither paused nor parked", runId=cmd.run_id)
        new_status = "queued" if parked else status

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE runs SET paused = 0, status = ?, park_reason = CASE WHEN ? THEN NULL "
                "ELSE park_reason END, updated_at = ? WHERE run_id = ?",
                (new_status, parked or agent_parked, now, cmd.run_id),
            )
            if parked:  # a new claim generation and a new runner, from the last durable boundary
                conn.execute(
                    "UPDATE run_queue SET queue_status = 'queued', updated_at = ? WHERE run_id = ?", (now, cmd.run_id)
                )
            touched.touch(conn, cmd.run_id)

        return Change(
            event_type="run.resumed", apply=apply, receipt={"runId": cmd.run_id, "status": new_status, "paused": False}
        )


class CancelRun(ControlHandler[RunCancel]):
    """One transaction: run cancelled, active attempts cancelled, pending effects cancelled,
    applying effects ambiguous, queue cancelled, claim released, runner record ended.

    Fenced by the run's state, not the runner's claim: cancellation wins over a running
    runner, which the supervisor stops after this commit. A finished run keeps its
    outcome (a later cancel is a conflict naming it).
    """

    model = RunCancel

    def transition(self, tx: Tx, cmd: RunCancel, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        _unfinished(tx, cmd.run_id)
        applying = [
            row[0]
            for row in conn.execute(
                "SELECT effect_id FROM effects WHERE run_id = ? AND channel_id IS NULL AND effect_status = 'applying'",
                (cmd.run_id,),
            )
        ]

        def apply(stamp: Stamp) -> None:
            decision = decisions.waiting(conn, cmd.run_id)  # a due deadline first, else the cancellation wins
            if decision is not None and not decisions.apply_deadline(conn, decision, tx.actor, now):
                decisions.resolve(conn, decision, "cancellation", tx.actor, now)
            conn.execute(
                "UPDATE node_attempts SET attempt_status = 'cancelled', outcome = 'cancelled', finished_at = ? "
                "WHERE run_id = ? AND attempt_status IN ('running', 'waiting')",
                (now, cmd.run_id),
            )
            records.cancel_pending_effects(conn, cmd.run_id, tx.actor, now)
            agent_steps.stop_for_end(conn, cmd.run_id, tx.actor, now)
            for effect_id in applying:  # the command may have acted: only an operator decides
                records.abandon_effect(conn, effect_id, tx.actor, now, cancelled=True)
            conn.execute(
                "UPDATE runs SET status = 'cancelled', paused = 0, finished_at = ?, updated_at = ? WHERE run_id = ?",
                (now, now, cmd.run_id),
            )
            records.end_live_runner(conn, cmd.run_id, now)
            touched.touch(conn, cmd.run_id)

        return Change(
            event_type="run.cancelled",
            apply=apply,
            effects=[local_effects.settle_queue(cmd.run_id, "cancelled")],
            release_generation=_live_generation(tx, cmd.run_id),
            receipt={"runId": cmd.run_id, "status": "cancelled"},
        )


class RestartRun(ControlHandler[RunRestart]):
    """One child run per restart: the parent's revision advances, so a competing
    restart at the same expected revision is a conflict and a retry adopts."""

    model = RunRestart

    def transition(self, tx: Tx, cmd: RunRestart, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        parent = conn.execute(
            "SELECT status, execution_mode, origin_session_id, root_run_id, restart_number, project_id "
            "FROM runs WHERE run_id = ?",
            (cmd.run_id,),
        ).fetchone()
        status, mode, session, root, number, project_id = parent
        if status not in TERMINAL_RUN_STATUSES:
            raise CommandError("invalidTransition", "only a finished run restarts (cancel it first)", runId=cmd.run_id)
        if records.get_resource(conn, cmd.child_run_id) is not None:
            raise CommandError("resourceExists", "the child run id is taken", runId=cmd.child_run_id)
        if mode == "interactive":
            check_session_free(tx, session)

        def apply(stamp: Stamp) -> None:
            records.create_resource(conn, cmd.child_run_id, "run", now, project_id)
            records.write_event(conn, cmd.child_run_id, 1, "run.queued", tx.actor, now)
            conn.execute(
                "INSERT INTO runs (run_id, project_id, workflow_name, definition_digest, status, paused, "
                "execution_mode, origin_session_id, title, input_digest, launch_options_digest, max_steps, lineage, "
                "root_run_id, parent_run_id, restart_number, created_at, updated_at) "
                "SELECT ?, project_id, workflow_name, definition_digest, 'queued', 0, execution_mode, "
                "CASE WHEN execution_mode = 'headless' THEN NULL ELSE origin_session_id END, title, input_digest, "
                "launch_options_digest, max_steps, 'restart', root_run_id, run_id, restart_number + 1, ?, ? "
                "FROM runs WHERE run_id = ?",
                (cmd.child_run_id, now, now, cmd.run_id),
            )
            conn.execute(
                "INSERT INTO run_sources (run_id, source_kind, source_path, source_sha256, builtin_id, "
                "builtin_revision) SELECT ?, source_kind, source_path, source_sha256, builtin_id, builtin_revision "
                "FROM run_sources WHERE run_id = ?",
                (cmd.child_run_id, cmd.run_id),
            )
            enqueue_new_run(conn, cmd.child_run_id, project_id, now)

        return Change(
            event_type="run.restarted",
            apply=apply,
            receipt={
                "runId": cmd.child_run_id,
                "parentRunId": cmd.run_id,
                "rootRunId": root,
                "restartNumber": number + 1,
                "status": "queued",
            },
        )


HANDLERS = (PauseRun(), ResumeRun(), CancelRun(), RestartRun())

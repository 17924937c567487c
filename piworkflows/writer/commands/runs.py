"""Runs: creation (run.start). The run lifecycle of WORKFLOWS.md starts here:
a new run is committed ``queued`` with its queue row ``queued``, no claim and
no runner, together with its receipt.
"""

from __future__ import annotations

from piworkflows.errors import CommandError
from piworkflows.protocol.internal import RunCancel, RunCreate, RunGet, RunList
from piworkflows.states import TERMINAL_RUN_STATUSES
from piworkflows.writer import records
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx
from piworkflows.writer.views import runs as views


def run_target(tx: Tx, run_id: str, expected_revision: int | None = None) -> Target:
    """A command on an existing run, at the client's expected revision or (server commands) the current one."""
    run = records.get_resource(tx.conn, run_id)
    if run is None or run.resource_kind != "run":
        raise CommandError("runNotFound", "no such run", runId=run_id)
    return Target(run_id, expected_revision if expected_revision is not None else run.revision)


class CreateRun(ResourceHandler[RunCreate]):
    kind = RunCreate.kind
    model = RunCreate
    actors = frozenset({"client", "server", "operator"})

    def target(self, tx: Tx, cmd: RunCreate) -> Target:
        return Target(cmd.run_id, None, create_kind="run", project_path=cmd.project_path)

    def transition(self, tx: Tx, cmd: RunCreate, resource: records.Resource | None) -> Change:
        if cmd.execution_mode == "interactive":
            holder = tx.conn.execute(
                "SELECT run_id FROM runs WHERE origin_session_id = ? AND execution_mode = 'interactive' "
                "AND status IN ('queued', 'running', 'waiting')",
                (cmd.origin_session_id,),
            ).fetchone()
            if holder is not None:
                raise CommandError(
                    "sessionReserved", "the origin session already has an unfinished run", runId=holder[0]
                )
        conn, now = tx.conn, tx.now
        source = cmd.source

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "INSERT INTO workflow_definitions (definition_digest, workflow_name, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (definition_digest) DO NOTHING",
                (cmd.definition.digest, cmd.workflow_name, now),
            )
            conn.execute(
                "INSERT INTO runs (run_id, project_id, workflow_name, definition_digest, status, paused, "
                "execution_mode, origin_session_id, title, input_digest, launch_options_digest, max_steps, lineage, "
                "root_run_id, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?, ?, 'root', ?, ?, ?)",
                (
                    cmd.run_id, stamp.project_id, cmd.workflow_name, cmd.definition.digest, cmd.execution_mode,
                    cmd.origin_session_id, cmd.title, cmd.input.digest,
                    cmd.launch_options.digest if cmd.launch_options else None, cmd.max_steps, cmd.run_id, now, now,
                ),
            )  # fmt: skip
            conn.execute(
                "INSERT INTO run_sources (run_id, source_kind, source_path, source_sha256, builtin_id, "
                "builtin_revision) VALUES (?, ?, ?, ?, ?, ?)",
                (cmd.run_id, source.source_kind, source.source_path, source.source_sha256, source.builtin_id,
                 source.builtin_revision),
            )  # fmt: skip
            conn.execute(
                "INSERT INTO run_queue (run_id, project_id, queue_status, priority, available_at, enqueued_at, "
                "updated_at) VALUES (?, ?, 'queued', 0, ?, ?, ?)",
                (cmd.run_id, stamp.project_id, now, now, now),
            )
            conn.execute(
                "INSERT INTO viewer_runs (run_id, presentation_revision, retained_revision_floor, updated_at) "
                "VALUES (?, 1, 1, ?)",
                (cmd.run_id, now),
            )

        return Change(
            event_type="run.queued",
            apply=apply,
            blobs=[b for b in (cmd.definition, cmd.input, cmd.launch_options) if b is not None],
            receipt={
                "runId": cmd.run_id,
                "status": "queued",
                "definitionDigest": "sha256:" + cmd.definition.digest.hex(),
            },
        )


READERS = frozenset({"server", "client", "operator"})


class ListRuns(Handler[RunList]):
    kind = RunList.kind
    model = RunList
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: RunList) -> Result:
        before = (cmd.before.created_at, cmd.before.run_id) if cmd.before else None
        return Result(receipt=views.list_runs(tx.conn, tx.now, cmd.project_path, cmd.limit, before))


class GetRun(Handler[RunGet]):
    kind = RunGet.kind
    model = RunGet
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: RunGet) -> Result:
        view = views.run_view(tx.conn, tx.now, cmd.run_id)
        if view is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        return Result(revision=view["revision"], receipt=view)


class CancelRun(ResourceHandler[RunCancel]):
    """One transaction: run cancelled, active attempts cancelled, pending effects cancelled,
    applying effects ambiguous, queue cancelled, claim released, runner record ended.

    Fenced by the run's state, not the runner's claim: cancellation wins over a running
    runner, which the supervisor stops after this commit. A finished run keeps its
    outcome (a later cancel is a conflict naming it).
    """

    kind = RunCancel.kind
    model = RunCancel
    actors = frozenset({"client", "operator", "server"})
    fenced_by_transition = True

    def target(self, tx: Tx, cmd: RunCancel) -> Target:
        return run_target(tx, cmd.run_id, cmd.expected_revision)

    def transition(self, tx: Tx, cmd: RunCancel, resource: records.Resource | None) -> Change:
        conn, now = tx.conn, tx.now
        (status,) = conn.execute("SELECT status FROM runs WHERE run_id = ?", (cmd.run_id,)).fetchone()
        if status in TERMINAL_RUN_STATUSES:
            raise CommandError("winnerDecided", f"the run already ended {status}", runId=cmd.run_id, status=status)
        lease = records.get_lease(conn, cmd.run_id)

        def apply(stamp: Stamp) -> None:
            conn.execute(
                "UPDATE node_attempts SET attempt_status = 'cancelled', outcome = 'cancelled', finished_at = ? "
                "WHERE run_id = ? AND attempt_status IN ('running', 'waiting')",
                (now, cmd.run_id),
            )
            conn.execute("UPDATE effects SET effect_status = 'cancelled', settled_at = ?, updated_at = ? "
                         "WHERE run_id = ? AND effect_status = 'pending'", (now, now, cmd.run_id))  # fmt: skip
            conn.execute("UPDATE effects SET effect_status = 'ambiguous', updated_at = ? "
                         "WHERE run_id = ? AND effect_status = 'applying'", (now, cmd.run_id))  # fmt: skip
            conn.execute("UPDATE runs SET status = 'cancelled', finished_at = ?, updated_at = ? WHERE run_id = ?",
                         (now, now, cmd.run_id))  # fmt: skip
            conn.execute("UPDATE run_queue SET queue_status = 'cancelled', updated_at = ? WHERE run_id = ?",
                         (now, cmd.run_id))  # fmt: skip
            records.end_live_runner(conn, cmd.run_id, now)
            records.advance_presentation(conn, cmd.run_id, now)

        return Change(
            event_type="run.cancelled",
            apply=apply,
            release_generation=lease.lease_generation if lease is not None and lease.owner_id else None,
            receipt={"runId": cmd.run_id, "status": "cancelled"},
        )


HANDLERS = (CreateRun(), ListRuns(), GetRun(), CancelRun())

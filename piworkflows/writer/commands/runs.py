"""Runs: creation (run.start). The run lifecycle of docs/workflows.md starts here:
a new run is committed ``queued`` with its queue row ``queued``, no claim and
no runner, together with its receipt.
"""

from __future__ import annotations

import sqlite3

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.runs import RunCreate, RunGet, RunList, ViewPage, ViewPatches, ViewSession
from piworkflows.writer import records
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx
from piworkflows.writer.views import projection, run_view
from piworkflows.writer.views import runs as views


def run_target(tx: Tx, run_id: str, expected_revision: int | None = None) -> Target:
    """A command on an existing run, at the client's expected revision or (server commands) the current one."""
    run = records.get_resource(tx.conn, run_id)
    if run is None or run.resource_kind != "run":
        raise CommandError("runNotFound", "no such run", runId=run_id)
    return Target(run_id, expected_revision if expected_revision is not None else run.revision)


class CreateRun(ResourceHandler[RunCreate]):
    model = RunCreate
    actors = frozenset({"client", "server", "operator"})

    def target(self, tx: Tx, cmd: RunCreate) -> Target:
        return Target(cmd.run_id, None, create_kind="run", project_path=cmd.project_path)

    def transition(self, tx: Tx, cmd: RunCreate, resource: records.Resource | None) -> Change:
        if cmd.execution_mode == "interactive":
            check_session_free(tx, cmd.origin_session_id)
        conn, now = tx.conn, tx.now

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
                    cmd.run_id,
                    stamp.project_id,
                    cmd.workflow_name,
                    cmd.definition.digest,
                    cmd.execution_mode,
                    cmd.origin_session_id,
                    cmd.title,
                    cmd.input.digest,
                    cmd.launch_options.digest if cmd.launch_options else None,
                    cmd.max_steps,
                    cmd.run_id,
                    now,
                    now,
                ),
            )
            source = cmd.source
            conn.execute(
                "INSERT INTO run_sources (run_id, source_kind, source_path, source_sha256, builtin_id, "
                "builtin_revision) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    cmd.run_id,
                    source.source_kind,
                    source.source_path,
                    source.source_sha256,
                    source.builtin_id,
                    source.builtin_revision,
                ),
            )
            enqueue_new_run(conn, cmd.run_id, stamp.project_id, now)

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


def check_session_free(tx: Tx, origin_session_id: str | None) -> None:
    """One unfinished interactive run per origin session."""
    holder = tx.conn.execute(
        "SELECT run_id FROM runs WHERE origin_session_id = ? AND execution_mode = 'interactive' "
        "AND status IN ('queued', 'running', 'waiting')",
        (origin_session_id,),
    ).fetchone()
    if holder is not None:
        raise CommandError("sessionReserved", "the origin session already has an unfinished run", runId=holder[0])


def enqueue_new_run(conn: sqlite3.Connection, run_id: str, project_id: str | None, now: int) -> None:
    """A new run's queue row (queued) and viewer projection, beside its runs row."""
    conn.execute(
        "INSERT INTO run_queue (run_id, project_id, queue_status, priority, available_at, enqueued_at, "
        "updated_at) VALUES (?, ?, 'queued', 0, ?, ?, ?)",
        (run_id, project_id, now, now, now),
    )
    conn.execute(
        "INSERT INTO viewer_runs (run_id, presentation_revision, retained_revision_floor, updated_at) "
        "VALUES (?, 1, 1, ?)",
        (run_id, now),
    )


READERS = frozenset({"server", "client", "operator"})


class ListRuns(Handler[RunList]):
    model = RunList
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: RunList) -> Result:
        before = (cmd.before.created_at, cmd.before.run_id) if cmd.before else None
        page = views.list_runs(
            tx.conn,
            tx.now,
            cmd.limit,
            before,
            project_path=cmd.project_path,
            statuses=cmd.statuses,
            workflow_name=cmd.workflow_name,
            since=cmd.since,
            offset=cmd.offset,
        )
        return Result(receipt=page)


class GetRun(Handler[RunGet]):
    model = RunGet
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: RunGet) -> Result:
        view = run_view.run_view(tx.conn, cmd.run_id)
        if view is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        return Result(revision=view["revision"], receipt=view)


class ReadViewPage(Handler[ViewPage]):
    model = ViewPage
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: ViewPage) -> Result:
        page = run_view.page(tx.conn, cmd.run_id, cmd.page_kind, cmd.start, cmd.limit)
        if page is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        return Result(revision=page["revision"], receipt=page)


class ReadViewPatches(Handler[ViewPatches]):
    model = ViewPatches
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: ViewPatches) -> Result:
        """``{"patch": {revision, runRevision, patches}}``, or ``{"snapshot": view}`` when the
        revisions after ``after`` are not all retained."""
        found = projection.patches(tx.conn, cmd.run_id, cmd.after)
        if found is not None:
            return Result(revision=found["revision"], receipt={"patch": found})
        view = run_view.run_view(tx.conn, cmd.run_id)
        if view is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        return Result(revision=view["revision"], receipt={"snapshot": view})


class ReadViewSession(Handler[ViewSession]):
    model = ViewSession
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: ViewSession) -> Result:
        """``{"sessionId", "runId", "revision", "run"}``: the session's run view, or nulls when the
        session started no run."""
        found = tx.conn.execute(
            "SELECT run_id FROM runs WHERE origin_session_id = :session AND execution_mode = 'interactive' "
            "AND status IN ('queued', 'running', 'waiting') UNION ALL "
            "SELECT * FROM (SELECT run_id FROM runs WHERE origin_session_id = :session "
            "ORDER BY created_at DESC, run_id DESC LIMIT 1) LIMIT 1",
            {"session": cmd.session_id},
        ).fetchone()
        view = run_view.run_view(tx.conn, found[0]) if found else None
        receipt = {
            "sessionId": cmd.session_id,
            "runId": view["runId"] if view else None,
            "revision": view["revision"] if view else 0,
            "run": view,
        }
        return Result(receipt=receipt)


HANDLERS = (CreateRun(), ListRuns(), GetRun(), ReadViewPage(), ReadViewPatches(), ReadViewSession())

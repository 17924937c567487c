"""Run logs (``run.logs``): a run's steps page by page, and the values linked to the run, in parts;
its captured Pi conversation (``run.transcript``), entry by entry; a run view's content references
(``view.content``), chunk by chunk."""

from __future__ import annotations

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.logs import RunContentRead, RunLogs, RunTranscript, ViewContent
from piworkflows.writer.contract import Handler, Result, Tx
from piworkflows.writer.views import content, transcript
from piworkflows.writer.views import logs as views

READERS = frozenset({"server", "client", "operator"})


class ReadRunLogs(Handler[RunLogs]):
    model = RunLogs
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: RunLogs) -> Result:
        page = views.run_logs(tx.conn, cmd.run_id, cmd.node_path, cmd.after, cmd.limit)
        if page is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        return Result(receipt=page)


class ReadRunTranscript(Handler[RunTranscript]):
    model = RunTranscript
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: RunTranscript) -> Result:
        page = transcript.run_transcript(tx.conn, cmd.run_id, cmd.node_path, cmd.after, cmd.limit)
        if page is None:
            raise CommandError("runNotFound", "no such run", runId=cmd.run_id)
        return Result(receipt=page)


class ReadRunContent(Handler[RunContentRead]):
    """A part of a value linked to the run (run id, digest and media type all match the link)."""

    model = RunContentRead
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: RunContentRead) -> Result:
        return Result(
            receipt=views.read_content(tx.conn, cmd.run_id, cmd.digest, cmd.media_type, cmd.offset, cmd.limit)
        )


class ReadViewContent(Handler[ViewContent]):
    """A chunk of the content at a reference's path, when the run owns it."""

    model = ViewContent
    actors = READERS
    read_only = True

    def execute(self, tx: Tx, cmd: ViewContent) -> Result:
        return Result(receipt=content.chunk(tx.conn, cmd.run_id, cmd.path, cmd.offset))


HANDLERS = (ReadRunLogs(), ReadRunTranscript(), ReadRunContent(), ReadViewContent())

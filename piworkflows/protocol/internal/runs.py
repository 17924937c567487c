"""Creating and reading runs (writer/commands/runs.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from piworkflows.protocol.internal.base import BlobValue, Command, Digest, Id, Model, ReadCommand
from piworkflows.protocol.internal.values import ExecutionMode, RunStatus, SourceKind
from piworkflows.states import MEDIA_JSON, PAGE_KINDS


class RunSource(Model):
    """Source identity without source text: a file path + SHA-256, or a built-in id + revision."""

    source_kind: SourceKind
    source_path: str | None = None
    source_sha256: Digest | None = None
    builtin_id: str | None = None
    builtin_revision: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> RunSource:
        file_fields = self.source_path is not None and self.source_sha256 is not None
        builtin_fields = self.builtin_id is not None and self.builtin_revision is not None
        if (self.source_kind == "file") != file_fields or (self.source_kind == "builtin") != builtin_fields:
            raise ValueError("a file source has path and sha256; a built-in has id and revision")
        return self

    @classmethod
    def of_identity(cls, identity: Any) -> RunSource:
        """A discovered source's identity (workflows/discovery.py ``SourceIdentity``)."""
        return cls(
            source_kind=identity.source_kind,
            source_path=identity.source_path,
            source_sha256=identity.source_sha256,
            builtin_id=identity.builtin_id,
            builtin_revision=identity.builtin_revision,
        )

    @classmethod
    def of_view(cls, view: dict[str, Any]) -> RunSource:
        """The identity a run view shows (``{kind, path, sha256}`` or ``{kind, id, revision}``)."""
        if view["kind"] == "file":
            return cls(source_kind="file", source_path=view["path"], source_sha256=bytes.fromhex(view["sha256"]))
        return cls(source_kind="builtin", builtin_id=view["id"], builtin_revision=view["revision"])


class RunCreate(Command):
    """A new run, committed as queued with its final id (run.start)."""

    kind: ClassVar[str] = "run.create"
    run_id: Id
    project_path: str = Field(min_length=1, max_length=4096, pattern=r"^/")
    workflow_name: str = Field(min_length=1, max_length=256)
    definition: BlobValue  # the canonical snapshot; its digest is the definition digest
    source: RunSource
    input: BlobValue
    launch_options: BlobValue | None = None
    title: str | None = Field(default=None, max_length=1000)
    max_steps: int = Field(ge=1)
    execution_mode: ExecutionMode = "headless"
    origin_session_id: Id | None = None

    @model_validator(mode="after")
    def _shape(self) -> RunCreate:
        for value in (self.definition, self.input, self.launch_options):
            if value is not None and value.media_type != MEDIA_JSON:
                raise ValueError("definition, input and launch options are JSON")
        if self.execution_mode == "interactive" and self.origin_session_id is None:
            raise ValueError("an interactive run names its origin session")
        return self


class RunListCursor(Model):
    created_at: int
    run_id: Id


class RunList(ReadCommand):
    """Run metadata, newest first, optionally only runs of one project, with one of ``statuses``
    (durable run statuses), of one workflow name, created at or after ``since``; never payload bodies."""

    kind: ClassVar[str] = "run.list"
    project_path: str | None = None
    statuses: list[RunStatus] | None = Field(default=None, min_length=1)
    workflow_name: str | None = None
    since: int | None = Field(default=None, ge=0)
    limit: int = Field(default=50, ge=1, le=256)
    before: RunListCursor | None = None
    offset: int | None = Field(default=None, ge=0)  # instead of ``before``: this many runs into the list

    @model_validator(mode="after")
    def _one_cursor(self) -> RunList:
        if self.before is not None and self.offset is not None:
            raise ValueError("a page follows either a keyset cursor or an offset")
        return self


class RunGet(ReadCommand):
    """One consistent run view (pi-workflows.run-view.v1)."""

    kind: ClassVar[str] = "run.get"
    run_id: Id


class ViewPatches(ReadCommand):
    """A run view's revisions after ``after`` as ops (writer/views/projection.py), or its snapshot
    when they are no longer all retained."""

    kind: ClassVar[str] = "view.patches"
    run_id: Id
    after: int = Field(ge=0)


class ViewSession(ReadCommand):
    """The run view of the run a Pi session runs (its unfinished interactive run, else the newest
    run it started), if any."""

    kind: ClassVar[str] = "view.session.get"
    session_id: Id


class ViewPage(ReadCommand):
    """A page of one of the run's histories (pi-workflows.run-page.v1, writer/views/pages.py)."""

    kind: ClassVar[str] = "view.page"
    run_id: Id
    page_kind: Literal[PAGE_KINDS]  # type: ignore[valid-type]
    start: int = Field(default=0, ge=0)
    limit: int = Field(default=256, ge=1, le=256)

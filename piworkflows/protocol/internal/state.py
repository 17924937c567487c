"""The state file: status, verify, backup, prune, retention, compaction, run deletion (writer/commands/state.py)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import Command, Id, Model, ReadCommand


class StateStatus(ReadCommand):
    """state.status: sizes, safe counts and invariant violations (no ids but run ids, no payloads)."""

    kind: ClassVar[str] = "state.status"


class StateVerify(ReadCommand):
    """state.verify: SQLite integrity and foreign keys, then the spec's invariants; repairs nothing."""

    kind: ClassVar[str] = "state.verify"


class BackupDone(Model):
    """What the writer loop made before the receipt commits (writer/backup.py)."""

    destination: str
    bytes: int = Field(ge=0)
    pages: int = Field(ge=0)


class StateBackup(Command):
    """state.backup: the online backup API on the writer's connection, verified, then the receipt.
    ``performed`` is set by the writer loop itself once the copy exists and verified."""

    kind: ClassVar[str] = "state.backup"
    destination: str = Field(min_length=1, max_length=4096)
    performed: BackupDone | None = None


class StatePrune(Command):
    """state.prune: complete terminal root-run trees that finished before ``before_ms``. A dry run
    only selects; ``apply`` needs a new ``backup_path``, which the writer loop makes and verifies
    first (``performed_backup``), then the same selection is rechecked and deleted in one
    transaction."""

    kind: ClassVar[str] = "state.prune"
    before_ms: int = Field(ge=0)
    apply: bool = False
    backup_path: str | None = Field(default=None, min_length=1, max_length=4096)
    performed_backup: BackupDone | None = None


class StateRetain(Command):
    """Automatic retention, one step: recheck the selection and delete one eligible tree (and the
    blobs no longer referenced) in one transaction. No backup."""

    kind: ClassVar[str] = "state.retain"
    cutoff_ms: int = Field(ge=0)
    after: tuple[int, str] | None = None  # the sweep's cursor: (finished_at, root run id) last taken


class StateCompact(Command):
    """After a retention sweep, while idle: truncate the WAL, measure, and VACUUM only when at
    least 64 MiB and 20 percent of the pages are free (the writer loop does it, outside groups)."""

    kind: ClassVar[str] = "state.compact"


class RunDelete(Command):
    """run.delete: one terminal root-run tree, by its root, with prune's blockers and deletion."""

    kind: ClassVar[str] = "run.delete"
    run_id: Id

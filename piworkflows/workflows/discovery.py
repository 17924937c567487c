"""Find and load a workflow's source; its identity is the path and file SHA-256.

Discovery order, first hit wins: ``<project>/.pi/workflows/<name>.workflow.py``,
then the user workflows dir (``~/.pi/agent/workflows``, or
``PI_WORKFLOWS_USER_DIR``), then the built-ins shipped in this package
(``builtin:<name>``, each with an explicit ``REVISION``). ``every_source``
lists every file of the three in that order (a later one of a name is shadowed). Loading executes
workflow code: only a supervised resolver or runner child calls ``load``.
The module is executed from exactly the bytes that were hashed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import types
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from piworkflows.states import WORKFLOW_ORIGINS
from piworkflows.workflows.compiler import NAME, CompiledWorkflow, Workflow, WorkflowDefinitionError

USER_DIR_ENV = "PI_WORKFLOWS_USER_DIR"
BUILTIN_DIR = Path(__file__).with_name("builtin")
SUFFIX = ".workflow.py"


class WorkflowNotFound(LookupError):
    pass


@dataclass(frozen=True)
class SourceIdentity:
    source_kind: str  # "file" | "builtin"
    source_path: str | None = None
    source_sha256: bytes | None = None
    builtin_id: str | None = None
    builtin_revision: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.source_kind == "file":
            assert self.source_sha256 is not None
            return {"kind": "file", "path": self.source_path, "sha256": self.source_sha256.hex()}
        return {"kind": "builtin", "id": self.builtin_id, "revision": self.builtin_revision}


@dataclass(frozen=True)
class ResolvedSource:
    identity: SourceIdentity
    command: str  # the name that was looked up: the file stem, even through a symlink
    path: Path
    data: bytes
    origin: str | None = None  # where it was found (states.WORKFLOW_ORIGINS; None: handed over by a launch)


def user_dir() -> Path:
    return Path(os.environ.get(USER_DIR_ENV) or Path.home() / ".pi" / "agent" / "workflows")


def directories(project_path: Path, user_workflows: Path | None = None) -> dict[str, Path]:
    """Where workflows are found, by origin, in resolve order (the first hit wins)."""
    places = (project_path / ".pi" / "workflows", user_workflows or user_dir(), BUILTIN_DIR)
    return dict(zip(WORKFLOW_ORIGINS, places, strict=True))


def resolve(name: str, project_path: Path, user_workflows: Path | None = None) -> ResolvedSource:
    """The first source for ``name`` (or ``builtin:name``), read once."""
    builtin_only = name.startswith("builtin:")
    stem = name.removeprefix("builtin:")
    if not NAME.match(stem):
        raise WorkflowNotFound(f"{name!r} is not a workflow name")
    searched = []
    for origin, directory in directories(project_path, user_workflows).items():
        if builtin_only and origin != "builtin":
            continue
        searched.append("built-ins" if origin == "builtin" else str(directory))
        candidate = directory / (stem + SUFFIX)
        if candidate.is_file():
            return read(origin, stem, candidate)
    raise WorkflowNotFound(f"no workflow {name!r} (looked in {', '.join(searched)})")


def every_source(project_path: Path, user_workflows: Path | None = None) -> list[tuple[str, str, Path]]:
    """``(origin, name, path)`` of every ``*.workflow.py`` file, in resolve order (origin, then name)."""
    found = []
    for origin, directory in directories(project_path, user_workflows).items():
        if directory.is_dir():
            # a link that leads nowhere (a loop, a missing target) is listed too: its load error says why
            files = sorted(path for path in directory.glob("*" + SUFFIX) if path.is_file() or path.is_symlink())
            found += [(origin, path.name.removesuffix(SUFFIX), path) for path in files]
    return found


def read(origin: str, stem: str, path: Path) -> ResolvedSource:
    """One source file of ``origin`` with its identity: a file's resolved path and SHA-256, or a
    built-in's id and declared revision."""
    data = path.read_bytes()
    if origin != "builtin":
        identity = SourceIdentity("file", str(path.resolve()), hashlib.sha256(data).digest())
        return ResolvedSource(identity, stem, path.resolve(), data, origin)
    revision = _declared_revision(data)
    if revision is None:
        raise WorkflowDefinitionError(f'built-in {stem!r} declares no REVISION = "..."')
    identity = SourceIdentity("builtin", builtin_id=f"builtin:{stem}", builtin_revision=revision)
    return ResolvedSource(identity, stem, path, data, origin)


# Compiled workflows of this process, by path and the SHA-256 of the exact bytes executed.
# Executing and compiling a module is most of a short run's (and a run start's) CPU; the
# resolver and runner children serve many requests, so a module runs once per process and
# source, not once per request. Module-level state is therefore shared by the requests and
# runs one child serves (docs/workflows.md).
_COMPILED: OrderedDict[tuple[str, bytes], CompiledWorkflow] = OrderedDict()
COMPILED_KEEP = 16


def compiled(source: ResolvedSource) -> CompiledWorkflow:
    """``load(source).compile()``, kept for the exact bytes (a failure is never kept)."""
    key = (str(source.path), source.identity.source_sha256 or hashlib.sha256(source.data).digest())
    found = _COMPILED.get(key)
    if found is None:
        found = _COMPILED[key] = load(source).compile()
        if len(_COMPILED) > COMPILED_KEEP:
            _COMPILED.popitem(last=False)
    return found


def load(source: ResolvedSource) -> Workflow:
    """Execute the source and return its ``workflow`` (named like the file stem)."""
    module = _execute(source.command, source.path, source.data)
    file_name = source.command + SUFFIX
    workflow = getattr(module, "workflow", None)
    if not isinstance(workflow, Workflow):
        raise WorkflowDefinitionError(f"{file_name}: the module defines no workflow = define_workflow(...)")
    if workflow.name != source.command:
        raise WorkflowDefinitionError(f"{file_name}: the workflow is named {workflow.name!r}, not {source.command!r}")
    return workflow


@functools.lru_cache(maxsize=32)
def _declared_revision(data: bytes) -> str | None:
    """A built-in's ``REVISION = "..."``, read without executing the module."""
    for statement in ast.parse(data).body:
        if (
            isinstance(statement, ast.Assign)
            and [getattr(t, "id", None) for t in statement.targets] == ["REVISION"]
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str)
        ):
            return statement.value.value
    return None


def _execute(command: str, path: Path, data: bytes) -> types.ModuleType:
    module = types.ModuleType(f"piworkflows_source_{command.replace('-', '_')}")
    module.__file__ = str(path)
    exec(compile(data, str(path), "exec"), module.__dict__)  # noqa: S102 - workflow code, in a child only
    return module

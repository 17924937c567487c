"""run.start of a source already resolved skips the resolver child (supervisor/resolver.py,
``_kept``): only for the same discovered source and identity, only without a title function;
shadowing and changed bytes go to a child as before. The child here is the resolver's own code
run in-process, counted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from piworkflows.protocol.internal.resolver import ResolveRequest
from piworkflows.runner import resolve as resolver_child
from piworkflows.settings import Settings
from piworkflows.supervisor.resolver import KEPT, Resolvers
from piworkflows.workflows import discovery

pytestmark = pytest.mark.timeout(60)

WORKFLOW = (
    "from piworkflows.workflows import *\n"
    'workflow = define_workflow("{name}", "a", {{"a": compute(lambda c: {value})}}{extra})\n'
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "project" / ".pi" / "workflows").mkdir(parents=True)
    return tmp_path / "project"


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "user-workflows"
    path.mkdir()
    monkeypatch.setenv(discovery.USER_DIR_ENV, str(path))
    return path


def write(directory: Path, name: str, value: int = 1, extra: str = "") -> None:
    (directory / f"{name}{discovery.SUFFIX}").write_text(WORKFLOW.format(name=name, value=value, extra=extra))


class Counted(Resolvers):
    """Resolvers whose child is the resolver's code in this process; ``asked`` counts requests."""

    def __init__(self) -> None:
        super().__init__(recorder=None, settings=Settings())  # type: ignore[arg-type]  (no child is spawned)
        self.asked = 0

    async def _ask(self, request: Any, timeout_ms: int | None = None, doing: str = "") -> Any:
        assert isinstance(request, ResolveRequest)
        self.asked += 1
        return resolver_child.resolve(request)


def start(resolvers: Counted, project: Path, name: str, value: Any = None) -> Any:
    return asyncio.run(resolvers.resolve(str(project), name, value))


def test_a_source_resolved_once_is_not_sent_to_a_child_again(project: Path, user: Path) -> None:
    resolvers = Counted()
    write(user, "hello")
    first = start(resolvers, project, "hello", {"n": 1})
    again = start(resolvers, project, "hello", {"n": 2})
    assert first.ok and again == first and resolvers.asked == 1
    builtin = [start(resolvers, project, "builtin:shell-check") for _ in range(3)]
    assert builtin[0].source.builtin_id == "builtin:shell-check" and resolvers.asked == 2


def test_a_project_workflow_of_the_same_name_shadows_a_kept_one(project: Path, user: Path) -> None:
    resolvers = Counted()
    write(user, "hello")
    kept = start(resolvers, project, "hello")
    write(project / ".pi" / "workflows", "hello", value=2)
    shadowing = start(resolvers, project, "hello")
    assert resolvers.asked == 2 and shadowing.source.source_path != kept.source.source_path
    assert shadowing.source.source_path == str((project / ".pi" / "workflows" / "hello.workflow.py").resolve())


def test_changed_bytes_are_resolved_again_and_a_broken_file_is_never_kept(project: Path, user: Path) -> None:
    resolvers = Counted()
    write(user, "hello")
    before = start(resolvers, project, "hello")
    write(user, "hello", value=2)
    after = start(resolvers, project, "hello")
    assert resolvers.asked == 2 and after.source.source_sha256 != before.source.source_sha256
    (user / "hello.workflow.py").write_text("raise SystemExit(3)\n")
    broken = [start(resolvers, project, "hello") for _ in range(2)]
    assert not broken[0].ok and broken[0].code == "invalidDefinition" and resolvers.asked == 4
    assert not start(resolvers, project, "nowhere").ok and resolvers.asked == 5  # the child says why


def test_a_workflow_with_a_title_function_goes_to_a_child_each_time(project: Path, user: Path) -> None:
    resolvers = Counted()
    write(user, "titled", extra=', title=lambda ctx: f"for {ctx.input}"')
    titles = [start(resolvers, project, "titled", value).title for value in ("a", "b")]
    assert titles == ["for a", "for b"] and resolvers.asked == 2


def test_at_most_kept_sources_are_kept(project: Path, user: Path) -> None:
    resolvers = Counted()
    for n in range(KEPT + 1):
        write(user, f"w{n}")
        start(resolvers, project, f"w{n}")
    assert len(resolvers._kept) == KEPT
    start(resolvers, project, "w0")  # the oldest went first
    assert resolvers.asked == KEPT + 2

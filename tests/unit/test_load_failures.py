"""Load errors a user can act on (workflows/failures.py) and what the resolver child answers for
workflow.list, workflow.show and run.start (runner/resolve.py), in-process on files under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from piworkflows.protocol.internal.resolver import ResolveRequest, WorkflowListRequest, WorkflowShowRequest
from piworkflows.runner import resolve as resolver
from piworkflows.workflows import discovery, failures

pytestmark = pytest.mark.timeout(60)

GOOD = (
    "from piworkflows.workflows import *\n"
    + 'workflow = define_workflow("{name}", "a", {{"a": compute(lambda c: 1)}}{extra})\n'
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


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}{discovery.SUFFIX}"
    path.write_text(text)
    return path


def failure(project: Path, name: str, text: str) -> failures.LoadFailure:
    path = write(project / ".pi" / "workflows", name, text)
    source = discovery.resolve(name, project)
    with pytest.raises(BaseException) as raised:
        discovery.compiled(source)
    assert source.path == path.resolve()
    return failures.describe(raised.value, source)


def test_a_syntax_error_shows_file_line_the_offending_line_and_a_caret(project: Path, user: Path) -> None:
    found = failure(project, "syntax", "x = 1\nif x\n    y = 2\n")
    path = project.resolve() / ".pi" / "workflows" / "syntax.workflow.py"
    assert (found.file, found.line, found.message) == (str(path), 2, "SyntaxError: expected ':'")
    assert found.text.splitlines() == [f"{path}, line 2: SyntaxError: expected ':'", "    if x", "        ^"]


def test_an_import_error_names_the_missing_module_and_the_import_line(project: Path, user: Path) -> None:
    found = failure(project, "imports", "import os\n\nfrom no_such_package_piw import thing\n")
    assert found.line == 3 and found.message == "ModuleNotFoundError: No module named 'no_such_package_piw'"
    lines = found.text.splitlines()
    assert lines[0].endswith("imports.workflow.py, line 3: ModuleNotFoundError: No module named 'no_such_package_piw'")
    assert "  the missing module: no_such_package_piw" in lines
    assert "      from no_such_package_piw import thing" in lines


def test_an_exception_in_module_code_shows_only_the_workflow_files_last_frames(project: Path, user: Path) -> None:
    text = "import json\n" + "".join(f"def f{n}():\n    return f{n + 1}()\n" for n in range(8))
    text += "def f8():\n    return json.loads('{')\n\nf0()\n"
    found = failure(project, "deep", text)
    assert found.line == 19 and found.message.startswith("JSONDecodeError: Expecting property name")
    frames = [line for line in found.text.splitlines() if line.startswith("    File ")]
    assert len(frames) == failures.FRAMES  # the last ones: the innermost first to go is the module line
    assert all("deep.workflow.py" in line for line in frames)  # none of json's or piworkflows'
    assert frames[-1].endswith("line 19, in f8") and "      return json.loads('{')" in found.text


def test_a_definition_error_keeps_naming_the_edge_and_gives_the_define_workflow_line(project: Path, user: Path) -> None:
    found = failure(project, "edges", GOOD.format(name="edges", extra=', [edge("a", "missing")]'))
    assert found.line == 2 and found.message == "edge a -> missing in 'edges': 'missing' is not a node or a mount"
    assert found.text.splitlines()[0].endswith(f"edges.workflow.py, line 2: {found.message}")


def test_a_module_without_a_workflow_is_reported_by_its_file(project: Path, user: Path) -> None:
    found = failure(project, "empty", "x = 1\n")
    assert found.line is None and "empty.workflow.py" in found.message and found.text == found.message


def test_source_lines_are_the_bytes_that_ran_not_the_file_as_it_is_now(project: Path, user: Path) -> None:
    path = write(project / ".pi" / "workflows", "changed", "raise RuntimeError('first')\n")
    source = discovery.resolve("changed", project)
    path.write_text("# edited since\n")
    with pytest.raises(RuntimeError) as raised:
        discovery.compiled(source)
    assert "      raise RuntimeError('first')" in failures.describe(raised.value, source).text


def test_reports_are_bounded_one_line_messages(project: Path, user: Path) -> None:
    found = failure(project, "long", "raise ValueError('x' * 100_000 + '\\nsecond line')\n")
    assert len(found.message) <= failures.MAX_MESSAGE and "\n" not in found.message
    assert len(found.text) <= failures.MAX_TEXT
    unprintable = failure(
        project, "unprintable", "class E(Exception):\n    def __str__(self):\n        raise TypeError\n\nraise E()\n"
    )
    assert unprintable.message == "E: (its message cannot be printed)" and unprintable.line == 5


# --- the resolver child -------------------------------------------------------------------------


def test_the_listing_marks_shadowed_names_and_lists_broken_modules_with_their_error(project: Path, user: Path) -> None:
    workflows = project / ".pi" / "workflows"
    write(workflows, "hello", GOOD.format(name="hello", extra=', description="From the project."'))
    write(user, "hello", GOOD.format(name="hello", extra=""))
    write(user, "demo", GOOD.format(name="demo", extra=""))
    write(user, "exits", "import sys\nsys.exit(3)\n")  # must not end the child, nor the listing
    write(workflows, "not a name", GOOD.format(name="x", extra=""))
    listing = resolver.list_workflows(WorkflowListRequest(project_path=str(project)))
    assert (listing.project_directory, listing.user_directory) == (str(workflows), str(user))
    rows = [
        (item.name, item.origin, item.shadowed_by, item.error.line if item.error else "ok") for item in listing.items
    ]
    assert rows == [
        ("agent-demo", "builtin", None, "ok"),
        ("demo", "user", None, "ok"),
        ("demo", "builtin", "user", "ok"),
        ("exits", "user", None, 2),
        ("hello", "project", None, "ok"),
        ("hello", "user", "project", "ok"),
        ("not a name", "project", None, None),
        ("shell-check", "builtin", None, "ok"),
        ("telegram-demo", "builtin", None, "ok"),
    ]
    assert listing.items[4].description == "From the project." and listing.items[5].description is None
    assert listing.items[3].error.message == "SystemExit: 3"
    assert listing.items[6].source is None and "is not a workflow name" in listing.items[6].error.text
    assert listing.truncated is False


def test_a_long_listing_is_truncated_and_says_so(project: Path, user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolver, "MAX_LISTED_WORKFLOWS", 4)
    listing = resolver.list_workflows(WorkflowListRequest(project_path=str(project)))
    assert listing.truncated is False and len(listing.items) == 4  # the four built-ins
    for name in ("a", "b"):
        write(user, name, GOOD.format(name=name, extra=""))
    listing = resolver.list_workflows(WorkflowListRequest(project_path=str(project)))
    assert listing.truncated is True and [item.name for item in listing.items] == ["a", "agent-demo", "b", "demo"]
    monkeypatch.setattr(resolver, "LISTING_BYTES", 1)  # the answer must fit one message: bytes bound it too
    listing = resolver.list_workflows(WorkflowListRequest(project_path=str(project)))
    assert listing.truncated is True and [item.name for item in listing.items] == ["a"]


def test_show_answers_the_workflow_run_start_would_find(project: Path, user: Path) -> None:
    write(user, "demo", GOOD.format(name="demo", extra=', description="Mine."'))
    mine = resolver.show(WorkflowShowRequest(project_path=str(project), workflow_name="demo"))
    assert (mine.ok, mine.origin, mine.description, mine.snapshot["startAt"]) == (True, "user", "Mine.", "a")
    assert mine.source == {"kind": "file", "path": str(user / "demo.workflow.py"), "sha256": mine.source["sha256"]}
    builtin = resolver.show(WorkflowShowRequest(project_path=str(project), workflow_name="builtin:demo"))
    assert (
        builtin.origin == "builtin"
        and builtin.source["id"] == "builtin:demo"
        and builtin.snapshot["startAt"] == "greet"
    )
    missing = resolver.show(WorkflowShowRequest(project_path=str(project), workflow_name="nope"))
    assert (missing.ok, missing.code) == (False, "workflowNotFound")


def test_run_start_gets_the_report_for_a_module_and_for_a_title_that_fail(project: Path, user: Path) -> None:
    write(project / ".pi" / "workflows", "broken", "x = (\n")
    broken = resolver.resolve(ResolveRequest(project_path=str(project), workflow_name="broken"))
    assert (broken.ok, broken.code) == (False, "invalidDefinition")
    assert broken.message.startswith("the workflow module failed to load: ") and "broken.workflow.py, line 1: " in (
        broken.message
    )
    title = 'title=lambda ctx: ctx.input["who"]'
    write(project / ".pi" / "workflows", "titled", GOOD.format(name="titled", extra=", " + title))
    failed = resolver.resolve(ResolveRequest(project_path=str(project), workflow_name="titled", input={}))
    assert (failed.ok, failed.code) == (False, "titleFailed")
    assert "titled.workflow.py, line 2: KeyError: 'who'" in failed.message and "lambda" in failed.message

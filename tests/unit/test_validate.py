"""An agent step's submitted output, judged by the run's own workflow code in a resolver child
(runner/validate.py through the child's HANDLERS; supervisor/resolver.py Resolvers.validate):
decisions, JSON Schemas, pydantic models, validate functions, and a changed source refused."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from piworkflows.protocol.internal.resolver import ValidateRequest, Validation
from piworkflows.protocol.internal.runs import RunSource
from piworkflows.runner import resolve
from piworkflows.settings import Settings
from piworkflows.supervisor.resolver import Resolvers, Unanswered
from piworkflows.workflows import discovery
from tests.seam_fakes import Recorder

pytestmark = pytest.mark.timeout(60)

WORKFLOW = """
import time
import pydantic
from piworkflows.workflows import agent, assistant_message, decision, define_workflow

class Summary(pydantic.BaseModel):
    summary: str
    files: list[str] = []
    count: int = 0

def mentions_tests(output):
    if "tests" not in output["summary"]:
        return "say what happened to the tests"

def strict(output):
    if output.get("boom"):
        raise ValueError("boom is not allowed")
    if output.get("no"):
        return False
    if output.get("weird"):
        return 42
    return True

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 1}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["n"],
    "additionalProperties": False,
}

workflow = define_workflow("checks", "described", {
    "described": agent("p", "anything at all"),
    "schema": agent("p", SCHEMA),
    "model": agent("p", Summary, validate=mentions_tests),
    "code": agent("p", "a dict", validate=strict),
    "pick": decision("q", ["ship", "hold"]),
    "reply": agent("p", assistant_message()),
    "sleepy": agent("p", "seconds", validate=lambda seconds: time.sleep(seconds)),
})
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / ".pi" / "workflows"
    directory.mkdir(parents=True)
    (directory / "checks.workflow.py").write_text(textwrap.dedent(WORKFLOW))
    return tmp_path


def request(project: Path, node: str, output: Any, digest: str | None = None) -> ValidateRequest:
    resolved = discovery.resolve("checks", project)
    return ValidateRequest(
        project_path=str(project),
        source=RunSource(
            source_kind="file", source_path=str(resolved.path), source_sha256=resolved.identity.source_sha256
        ),
        definition_digest=digest or discovery.compiled(resolved).digest,
        node_path=node,
        output=output,
    )


def verdict(project: Path, node: str, output: Any) -> Validation:
    """The child's answer, through its one table (the frame body as it crosses the pipe)."""
    answer = resolve.answer("validate", request(project, node, output).model_dump())
    assert isinstance(answer, Validation)
    if not answer.ok:
        assert answer.error and "Traceback" not in answer.error
    return answer


def rejected(answer: Validation, code: str = "validationFailed") -> str:
    assert (answer.ok, answer.code) == (False, code), answer
    assert answer.error is not None
    return answer.error


@pytest.mark.parametrize("output", [{"anything": 1}, ["a", 2], "text", 3.5, None])
def test_a_described_output_accepts_any_json_value(project: Path, output: Any) -> None:
    assert verdict(project, "described", output) == Validation(ok=True, output=output)


def test_a_json_schema_output_is_enforced_naming_where_and_what(project: Path) -> None:
    assert verdict(project, "schema", {"n": 2, "tags": ["a"]}) == Validation(ok=True, output={"n": 2, "tags": ["a"]})
    error = rejected(verdict(project, "schema", {"n": 0, "tags": [1]}))
    assert "$.n: 0 is less than the minimum of 1" in error
    assert "$.tags[0]: 1 is not of type 'string'" in error
    assert "does not match the expected JSON Schema" in error


def test_a_json_schema_rejection_names_the_first_few_errors_and_counts_the_rest(project: Path) -> None:
    error = rejected(verdict(project, "schema", {"n": "x", "tags": [1, 2, 3, 4], "extra": True}))
    assert error.count("$") == 3 and "(and 3 more)" in error


def test_a_pydantic_model_validates_and_its_dump_is_the_output(project: Path) -> None:
    answer = verdict(project, "model", {"summary": "fixed the tests", "count": "3"})
    assert answer == Validation(ok=True, output={"summary": "fixed the tests", "files": [], "count": 3})


def test_a_pydantic_rejection_names_the_fields(project: Path) -> None:
    error = rejected(verdict(project, "model", {"files": "one", "count": "many"}))
    assert "not a valid Summary" in error
    assert "$.summary: Field required" in error
    assert "$.files: Input should be a valid list" in error


def test_validate_runs_on_the_models_output_after_the_schema(project: Path) -> None:
    assert rejected(verdict(project, "model", {"summary": "done"})) == "say what happened to the tests"


@pytest.mark.parametrize(
    ("output", "error", "code"),
    [
        ({"boom": True}, "ValueError: boom is not allowed", "validationFailed"),
        ({"no": True}, "the step's validate function rejected the output", "validationFailed"),
        ({"weird": True}, "validate function returned int", "validatorFailed"),
    ],
    ids=["raises", "false", "other-value"],
)
def test_validate_rejects_by_raising_false_or_text(project: Path, output: Any, error: str, code: str) -> None:
    assert error in rejected(verdict(project, "code", output), code)


def test_validate_accepts_with_true_or_none(project: Path) -> None:
    assert verdict(project, "code", {"fine": 1}) == Validation(ok=True, output={"fine": 1})
    assert verdict(project, "model", {"summary": "tests pass"}).ok


@pytest.mark.parametrize("route", ["ship", "hold"])
def test_a_decision_accepts_one_of_its_choices(project: Path, route: str) -> None:
    assert verdict(project, "pick", {"route": route}) == Validation(ok=True, output={"route": route})


@pytest.mark.parametrize(
    ("output", "error"),
    [
        ({"route": "maybe"}, 'route "maybe" is not one of "ship", "hold"'),
        ("ship", 'the output must be {"route": <one of "ship", "hold">}'),
        ({"route": "ship", "why": "because"}, "and nothing else"),
        ({}, "and nothing else"),
    ],
)
def test_a_decision_refuses_anything_but_one_route(project: Path, output: Any, error: str) -> None:
    assert error in rejected(verdict(project, "pick", output))


def test_an_assistant_message_step_or_an_unknown_node_cannot_be_judged(project: Path) -> None:
    assert "takes its reply" in rejected(verdict(project, "reply", "hi"), "validatorFailed")
    assert "'nowhere' is not an agent step" in rejected(verdict(project, "nowhere", 1), "validatorFailed")


def test_a_changed_definition_or_digest_is_refused_and_a_same_definition_judges(project: Path) -> None:
    before = request(project, "code", {"boom": True})
    path = project / ".pi" / "workflows" / "checks.workflow.py"
    path.write_text(path.read_text() + "\n# a comment: the definition is the same\n")
    same = resolve.answer("validate", before.model_dump())
    assert isinstance(same, Validation) and same.code != "workflowSourceChanged", same
    extended = textwrap.dedent(WORKFLOW).replace('"reply":', '"added": agent("More.", "anything"), "reply":', 1)
    path.write_text(extended)
    changed = resolve.answer("validate", before.model_dump())
    assert changed == Validation(
        ok=False, error="the workflow's definition changed since the run started", code="workflowSourceChanged"
    )
    path.write_text(textwrap.dedent(WORKFLOW))
    other = resolve.answer("validate", request(project, "code", {}, digest="sha256:" + "0" * 64).model_dump())
    assert isinstance(other, Validation) and other.code == "workflowSourceChanged"


def test_resolvers_validate_in_a_child_and_a_validator_past_its_time_is_unanswered(project: Path) -> None:
    good = request(project, "pick", {"route": "ship"})
    slow = request(project, "sleepy", 30)

    async def ask(resolvers: Resolvers, asked: ValidateRequest) -> Validation:
        return await resolvers.validate(
            asked.project_path, asked.source, asked.definition_digest, asked.node_path, asked.output
        )

    async def scenario() -> tuple[Validation, str, Validation, int]:
        recorder = Recorder()
        patient = Settings(resolvers=1, validate_timeout_ms=60_000)  # a cold child's start counts too
        resolvers = Resolvers(recorder, patient)
        try:
            first = await ask(resolvers, good)  # the child is warm now: the workflow loaded
            resolvers.settings = patient.model_copy(update={"validate_timeout_ms": 1000})
            with pytest.raises(Unanswered) as unanswered:
                await ask(resolvers, slow)
            resolvers.settings = patient
            again = await ask(resolvers, good)  # a new child answers
        finally:
            await resolvers.close()
        return first, str(unanswered.value), again, len(recorder.recorded)

    first, unanswered, again, children = asyncio.run(scenario())
    assert first == again == Validation(ok=True, output={"route": "ship"})
    assert unanswered == "validating the output took too long (more than 1000 ms)"
    assert children == 0  # every child forgotten: the slow one ended, the idle one closed

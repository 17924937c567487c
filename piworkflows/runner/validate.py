"""The resolver child's ``validate`` request: an agent step's submitted output, judged by the run's
own workflow code (docs/agents.md, flow step 8).

::

    supervisor ── validate ValidateRequest (project, source, digest, node path, output) ──> child
        load the run's workflow as a runner does (runner/run.py source_of, load_checked):
            its definition changed since the run started ─> refused, workflowSourceChanged (a
            changed file with the same definition is judged by the file as it is now)
        decision          {"route": <one of its choices>}, nothing else
        JSON Schema       jsonschema, the schema's $schema (else Draft 2020-12)
        pydantic model    model_validate; the accepted output is its model_dump(mode="json")
        validate(output)  when declared, on the accepted output
        the route         a switch on the output must have a case for it (the run would fail)
    (``checkpoint_answer``: a checkpoint's answer; only its route is checked, and a node that is no
     checkpoint is left to the writer, which says where the run waits)
    <── validation Validation (ok + output, or the error text the model can act on)

An error names where the output is wrong and what is wrong (the first few
schema errors), never a traceback. A description output accepts any JSON value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
import pydantic

from piworkflows.protocol.internal.resolver import ValidateRequest, Validation
from piworkflows.runner.run import load_checked, source_of
from piworkflows.workflows import failures
from piworkflows.workflows.compiler import CompiledWorkflow
from piworkflows.workflows.nodes import AgentNode, AssistantMessage, CheckpointNode, is_pydantic_model
from piworkflows.workflows.routing import route

MAX_ERRORS = 3  # schema errors named in a rejection
MAX_ERROR_TEXT = 2000
MAX_ITEM_TEXT = 300
# What workflow code may raise: anything, a sys.exit() too (the child answers on).
CODE_FAILURES = (Exception, SystemExit)


def _refused(error: str, code: str = "validationFailed") -> Validation:
    return Validation(ok=False, error=error[:MAX_ERROR_TEXT], code=code)


def validate(request: ValidateRequest) -> Validation:
    """The verdict on one submitted output."""
    resolved = None
    try:
        resolved = source_of(request.source, request.project_path)
        compiled = load_checked(resolved, request.definition_digest)
    except CODE_FAILURES as exc:
        said = failures.describe(exc, resolved).text if resolved else f"{type(exc).__name__}: {exc}"
        return _refused(f"the workflow module failed to load: {said}", "validatorFailed")
    if compiled is None:
        return _refused("the workflow's definition changed since the run started", "workflowSourceChanged")
    node = compiled.nodes.get(request.node_path)
    if request.checkpoint_answer:
        if not isinstance(node, CheckpointNode):
            return Validation(ok=True, output=request.output)
        verdict = Validation(ok=True, output=request.output)
    elif not isinstance(node, AgentNode):
        return _refused(f"node '{request.node_path}' is not an agent step of the run's workflow", "validatorFailed")
    else:
        verdict = check_output(node, request.output)
    return _routed(compiled, request.node_path, verdict) if verdict.ok else verdict


def _routed(compiled: CompiledWorkflow, node_path: str, verdict: Validation) -> Validation:
    """An accepted output that no case of the node's switch takes is refused: accepted, it would
    fail the run with routingError after the node completed."""
    routing_error = route(compiled, node_path, "ok", verdict.output).routing_error
    if routing_error is None:
        return verdict
    return _refused(f"no route takes this value: {routing_error.partition(': ')[2]}")


def check_output(node: AgentNode, output: Any) -> Validation:
    """The node's checks, in order: a decision's route, a schema or pydantic model, ``validate``."""
    expected = node.expected_output
    if isinstance(expected, AssistantMessage):
        return _refused("an assistant-message step takes its reply, not a submission", "validatorFailed")
    if node.choices is not None:
        refusal = _route_error(list(node.choices), output)
        if refusal is not None:
            return _refused(refusal)
    elif is_pydantic_model(expected):
        try:
            output = expected.model_validate(output).model_dump(mode="json")
        except pydantic.ValidationError as exc:
            return _refused(_pydantic_errors(exc))
        except CODE_FAILURES as exc:  # the model's own validator code broke
            return _refused(_exception_text(exc))
    elif isinstance(expected, Mapping):
        refusal = _schema_errors(dict(expected), output)
        if refusal is not None:
            return _refused(refusal)
    if node.validate is not None:
        return _validate(node, output)
    return Validation(ok=True, output=output)


def _route_error(choices: list[str], output: Any) -> str | None:
    named = ", ".join(f'"{choice}"' for choice in choices)
    if not isinstance(output, dict) or set(output) != {"route"}:
        return f'the output must be {{"route": <one of {named}>}} and nothing else'
    if output["route"] not in choices:
        return f"route {_short(output['route'])} is not one of {named}"
    return None


def _schema_errors(schema: dict[str, Any], output: Any) -> str | None:
    """The first few errors of ``output`` against the schema (where, then what), or None."""
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(validator_class(schema).iter_errors(output), key=lambda error: list(map(str, error.path)))
    if not errors:
        return None
    named = [f"{error.json_path}: {error.message[:MAX_ITEM_TEXT]}" for error in errors[:MAX_ERRORS]]
    more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
    return "the output does not match the expected JSON Schema: " + "; ".join(named) + more


def _pydantic_errors(exc: pydantic.ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    named = [f"{_loc(error['loc'])}: {str(error['msg'])[:MAX_ITEM_TEXT]}" for error in errors[:MAX_ERRORS]]
    more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
    return f"the output is not a valid {exc.title}: " + "; ".join(named) + more


def _loc(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a JSON path: ("files", 0) -> $.files[0]."""
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _validate(node: AgentNode, output: Any) -> Validation:
    """``validate(output)``: None or True accepts; False or an error text rejects; raising rejects
    with the exception's text; any other value is the workflow code's mistake."""
    assert node.validate is not None
    try:
        verdict = node.validate(output)
    except CODE_FAILURES as exc:
        return _refused(_exception_text(exc))
    if verdict is None or verdict is True:
        return Validation(ok=True, output=output)
    if verdict is False:
        return _refused("the step's validate function rejected the output")
    if isinstance(verdict, str):
        return _refused(verdict or "the step's validate function rejected the output")
    return _refused(
        f"the step's validate function returned {type(verdict).__name__}; it returns None or True to accept, "
        "False or an error text to reject",
        "validatorFailed",
    )


def _exception_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _short(value: Any) -> str:
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

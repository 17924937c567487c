"""Every closed value set a message field accepts is the set that ``states.py`` (or
``errors.OUTCOMES``) defines: the internal protocol restates none of them.

Each ``Literal`` found in a field of an internal protocol model must be listed
in ``FIELD_SETS`` with the set it stands for, and accept exactly that set; a
new ``Literal`` field fails here until it names its owner.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
import typing
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from piworkflows import errors, performers, states
from piworkflows.protocol import internal

pytestmark = pytest.mark.timeout(60)

# (module, model, field) -> the set its Literal accepts
FIELD_SETS: dict[tuple[str, str, str], typing.Collection[str]] = {
    ("base", "Actor", "actor_class"): states.ACTOR_CLASSES,
    ("base", "BlobValue", "media_type"): states.MEDIA_TYPES,
    ("channels", "TelegramUpdate", "update_kind"): states.TELEGRAM_UPDATE_KINDS,
    ("channels", "Perform", "method"): states.TELEGRAM_METHODS,
    ("channels", "Performed", "outcome"): states.TELEGRAM_CALL_OUTCOMES,
    ("channels", "Fault", "fault"): states.CHANNEL_FAULTS,
    ("channels", "ChannelRecover", "action"): states.CHANNEL_RECOVER_ACTIONS,
    ("content", "BlobPart", "media_type"): states.MEDIA_TYPES,
    ("logs", "RunContentRead", "media_type"): states.MEDIA_TYPES,
    ("runs", "RunSource", "source_kind"): states.SOURCE_KINDS,
    ("runs", "RunCreate", "execution_mode"): states.EXECUTION_MODES,
    ("runs", "RunList", "statuses"): states.RUN_STATUSES,
    ("runs", "ViewPage", "page_kind"): states.PAGE_KINDS,
    ("runners", "RunClaim", "launch_command"): states.RUNNER_COMMANDS,
    ("runners", "RunnerExited", "outcome"): states.RUNNER_OUTCOMES,
    ("runners", "RunnerExited", "park_reason"): states.RUNNER_PARK_REASONS,
    ("nodes", "NextAttempt", "node_kind"): states.NODE_KINDS,
    ("nodes", "NodeStartFrame", "node_kind"): states.NODE_KINDS,
    ("nodes", "NodeFinishFrame", "outcome"): states.NODE_OUTCOMES,
    ("nodes", "NodeFinishFrame", "end_status"): states.TERMINAL_RUN_STATUSES,
    ("nodes", "RunFinishFrame", "end_status"): states.RUN_FINISH_STATUSES,
    ("nodes", "NodeEffectReserveFrame", "recovery_policy"): states.RECOVERY_POLICIES,
    ("nodes", "NodeEffectReserveFrame", "performer"): states.NODE_EFFECT_PERFORMERS,
    ("effects", "EffectRequest", "effect_class"): states.EFFECT_CLASSES,
    ("effects", "EffectRequest", "performer"): states.EFFECT_PERFORMERS,
    ("effects", "EffectRequest", "recovery_policy"): states.RECOVERY_POLICIES,
    ("effects", "EffectRequest", "owner_scope"): states.EFFECT_OWNER_SCOPES,
    ("effects", "EffectClaim", "performers"): states.POOL_PERFORMERS,
    ("effects", "EffectDue", "performers"): states.POOL_PERFORMERS,
    ("effects", "EffectSettleFrame", "settlement"): states.EFFECT_SETTLEMENTS,
    ("effects", "EffectList", "statuses"): states.EFFECT_STATUSES,
    ("outbox", "PerformEffect", "performer"): states.POOL_PERFORMERS,
    ("outbox", "PerformEffect", "recovery_policy"): states.RECOVERY_POLICIES,
    ("runner", "CompletedStep", "outcome"): states.NODE_OUTCOMES,
    ("runner", "RunnerExiting", "park_reason"): states.RUNNER_PARK_REASONS,
    ("resolver", "WorkflowShown", "origin"): states.WORKFLOW_ORIGINS,
    ("resolver", "ListedWorkflow", "origin"): states.WORKFLOW_ORIGINS,
    ("resolver", "ListedWorkflow", "shadowed_by"): states.WORKFLOW_ORIGINS,
    ("writer", "Reply", "outcome"): errors.OUTCOMES,
    ("writer", "Fatal", "code"): states.WRITER_START_FAILURES,
    ("writer", "WriterHealth", "code"): states.WRITER_HEALTH_CODES,
    ("agents", "ExpectedOutput", "kind"): states.EXPECTED_OUTPUT_KINDS,
    ("agents", "Executor", "kind"): states.AGENT_EXECUTORS,
    ("agents", "AgentContract", "session"): states.AGENT_SESSIONS,
    ("agents", "AgentTurnFrame", "phase"): states.TURN_PHASES,
    ("agents", "AgentTurnFrame", "error_code"): states.COMMAND_STEP_FAILURES,
    ("agents", "InteractionSettle", "verdict"): states.SUBMISSION_VERDICTS,
    ("agents", "InteractionSettle", "error_code"): states.SUBMISSION_REJECTIONS,
}


def _literals(annotation: object) -> Iterator[tuple[object, ...]]:
    """The argument tuples of every Literal inside an annotation (through unions, lists, ...)."""
    if typing.get_origin(annotation) is typing.Literal:
        yield typing.get_args(annotation)
        return
    for arg in typing.get_args(annotation):
        yield from _literals(arg)


def _modules() -> Iterator[types.ModuleType]:
    for info in pkgutil.iter_modules(internal.__path__):
        yield importlib.import_module(f"{internal.__name__}.{info.name}")


def _literal_fields() -> dict[tuple[str, str, str], tuple[type[BaseModel], str, list[tuple[object, ...]]]]:
    """Every field a model of the internal protocol declares itself (an inherited one is its base's)
    whose annotation holds a Literal."""
    found = {}
    for module in _modules():
        short = module.__name__.rsplit(".", 1)[1]
        for name, model in vars(module).items():
            if not (isinstance(model, type) and issubclass(model, BaseModel) and model.__module__ == module.__name__):
                continue
            for field_name, field in model.model_fields.items():
                literals = list(_literals(field.annotation))
                if literals and field_name in vars(model).get("__annotations__", {}):
                    found[(short, name, field_name)] = (model, field_name, literals)
    return found


def test_every_literal_field_names_its_value_set():
    found = _literal_fields()
    assert set(found) == set(FIELD_SETS), "a Literal field without its states.py set, or a listed field gone"


@pytest.mark.parametrize("where", sorted(FIELD_SETS), ids=".".join)
def test_a_field_accepts_exactly_its_set(where):
    model, field_name, literals = _literal_fields()[where]
    expected = set(FIELD_SETS[where])
    assert [set(args) for args in literals] == [expected]
    annotation = model.model_fields[field_name].annotation
    adapter = TypeAdapter(annotation)
    is_list = typing.get_origin(annotation) is list or any(
        typing.get_origin(arg) is list for arg in typing.get_args(annotation)
    )
    for value in expected:
        adapter.validate_python([value] if is_list else value)
    with pytest.raises(ValidationError):
        adapter.validate_python(["notInTheSet"] if is_list else "notInTheSet")


def test_the_performers_settlement_type_is_the_protocol_set():
    """performers.Settlement is a static type for mypy; its values are the set's."""
    assert set(typing.get_args(performers.Settlement)) == states.EFFECT_SETTLEMENTS

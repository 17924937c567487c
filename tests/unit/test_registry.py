"""Every dispatch table matches the message models it serves, one to one.

A message kind is named once, by its model's ``kind``; each receiver
dispatches through one dict keyed by those kinds. These tests fail when a
model has no handler, a handler serves no model, or a handler's model is not
its kind's.
"""

from __future__ import annotations

import typing

import pytest

from piworkflows.outbox.worker import HANDLERS as WORKER_HANDLERS
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal import COMMAND_MODELS
from piworkflows.protocol.internal.base import Frame
from piworkflows.protocol.internal.outbox import POOL_FRAMES, WORKER_FRAMES
from piworkflows.protocol.internal.resolver import RESOLVER_FRAMES
from piworkflows.protocol.internal.runner import RUNNER_FRAMES
from piworkflows.runner.resolve import HANDLERS as RESOLVER_HANDLERS
from piworkflows.supervisor.outbox import HANDLERS as POOL_HANDLERS
from piworkflows.supervisor.router import ROUTES
from piworkflows.supervisor.scheduler import RELAYS
from piworkflows.writer.commands import HANDLERS, REGISTRY

pytestmark = pytest.mark.timeout(60)


def test_writer_registry_and_command_models_match_one_to_one():
    assert set(REGISTRY) == set(COMMAND_MODELS)
    assert len(HANDLERS) == len(REGISTRY)  # no kind has two handlers


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_each_writer_handler_serves_its_kinds_model(kind):
    handler = REGISTRY[kind]
    assert handler.model is COMMAND_MODELS[kind]
    assert handler.kind == handler.model.kind == kind


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_a_handler_lives_in_the_writer_module_of_its_models_domain(kind):
    """writer/commands/<domain>.py (or the package writer/commands/<domain>/) handles the commands of
    protocol/internal/<domain>.py."""
    handler = REGISTRY[kind]
    domain = type(handler).__module__.removeprefix("piworkflows.writer.commands.").split(".")[0]
    assert domain == handler.model.__module__.rsplit(".", 1)[1]


def _relayed_commands_extend_their_frames(frame_models: dict[str, type[Frame]]) -> None:
    """A child's frame that becomes a writer command keeps its name: the command of that kind is
    the frame's model plus what the supervisor attaches."""
    for kind, model in frame_models.items():
        assert model.kind == kind
        command = COMMAND_MODELS.get(kind)
        if command is not None:
            assert issubclass(command, model), f"{command.__name__} does not extend {model.__name__}"


def test_scheduler_relays_every_runner_frame_and_nothing_else():
    assert set(RELAYS) == set(RUNNER_FRAMES)
    _relayed_commands_extend_their_frames(RUNNER_FRAMES)


def test_the_outbox_pool_handles_every_worker_frame_and_nothing_else():
    assert set(POOL_HANDLERS) == set(WORKER_FRAMES)
    _relayed_commands_extend_their_frames(WORKER_FRAMES)


def test_an_outbox_worker_handles_every_pool_frame_and_nothing_else():
    assert set(WORKER_HANDLERS) == set(POOL_FRAMES)


def test_a_resolver_child_answers_every_request_and_nothing_else():
    assert set(RESOLVER_HANDLERS) == set(RESOLVER_FRAMES)
    for kind, request in RESOLVER_FRAMES.items():
        assert request.kind == kind and request.answer.kind not in RESOLVER_FRAMES


def test_the_router_routes_every_served_operation_and_nothing_else():
    assert set(ROUTES) == set(client_v1.OPERATION_SHAPES)


@pytest.mark.parametrize("operation", sorted(ROUTES))
def test_a_route_takes_its_operations_payload_model(operation):
    """A route that names its payload's type names the model its operation's payload is checked with."""
    payload_type = typing.get_type_hints(ROUTES[operation])["payload"]
    assert payload_type is typing.Any or payload_type is client_v1.OPERATION_SHAPES[operation][0]

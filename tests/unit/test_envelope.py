"""The client's envelope without pydantic (protocol/envelope.py) held to client_v1's models: the
same requests accepted and the same line written, the same responses accepted with the same
fields."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from piworkflows.errors import OUTCOMES
from piworkflows.protocol import client_v1, envelope

pytestmark = pytest.mark.timeout(120)

ids = st.one_of(
    st.text(min_size=1, max_size=12),
    st.just(""),
    st.just("x" * 257),
    st.just("é" * 129),  # 258 bytes in 129 characters
    st.integers(),
    st.none(),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
revisions = st.one_of(st.none(), st.integers(-2, 10**12), st.booleans(), st.just(1.5), st.just("3"))
operations = st.one_of(st.sampled_from(client_v1.OPERATIONS + client_v1.UPSTREAM_UNSERVED), st.just("run.nope"))


@settings(max_examples=400, deadline=None)
@given(
    request_id=ids,
    client_id=ids,
    operation=operations,
    key=ids,
    payload=json_values,
    run_id=st.one_of(st.none(), ids),
    revision=revisions,
)
def test_a_request_line_is_what_client_v1_encodes_and_refused_where_its_model_refuses(
    request_id: Any, client_id: Any, operation: str, key: Any, payload: Any, run_id: Any, revision: Any
) -> None:
    try:
        model = client_v1.Request(
            requestId=request_id,
            clientId=client_id,
            operation=operation,
            idempotencyKey=key,
            payload=payload,
            runId=run_id,
            expectedRevision=revision,
        )
        expected: bytes | None = client_v1.encode(model)
    except ValidationError:
        expected = None
    try:
        line: bytes | None = envelope.request_line(
            request_id=request_id,
            client_id=client_id,
            operation=operation,
            idempotency_key=key,
            payload=payload,
            run_id=run_id,
            expected_revision=revision,
        )
    except ValueError:
        line = None
    assert line == expected


responses = st.fixed_dictionaries(
    {},
    optional={
        "schema": st.sampled_from([client_v1.SCHEMA, "pi-workflows.client.v2"]),
        "type": st.sampled_from(["response", "event"]),
        "requestId": ids,
        "outcome": st.sampled_from([*OUTCOMES, "maybe", 1]),
        "revision": revisions,
        "receipt": json_values,
        "error": st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=5), st.integers()),
        "extra": st.just(1),
    },
)


@settings(max_examples=600, deadline=None)
@given(message=responses)
def test_a_response_is_accepted_exactly_where_client_v1_accepts_it_with_the_same_fields(
    message: dict[str, Any],
) -> None:
    try:
        model = client_v1.Response.model_validate(message)
    except ValidationError:
        model = None
    try:
        light = envelope.response_of(message)
    except ValueError:
        light = None
    if model is None:
        assert light is None
    else:
        assert light is not None
        fields = ("requestId", "outcome", "revision", "receipt", "error")
        assert [getattr(light, f) for f in fields] == [getattr(model, f) for f in fields]


def test_the_cli_starts_without_pydantic_the_protocol_models_or_psutil() -> None:
    """The client path imports only what it uses: a read command's start is mostly imports."""
    code = (
        "import sys, piworkflows.cli\n"
        "heavy = sorted(m for m in ('pydantic', 'piworkflows.protocol.client_v1', 'psutil', 'msgpack',"
        " 'piworkflows.settings', 'piworkflows.writer') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == ""

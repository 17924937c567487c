"""The client protocol module: parse_request, encode, fingerprint, operation sets, schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piworkflows import canonical
from piworkflows.errors import CODES
from piworkflows.protocol import client_v1
from piworkflows.protocol.client_v1 import (
    MAX_MESSAGE_BYTES,
    MAX_NESTING,
    OPERATIONS,
    READ_ONLY_OPERATIONS,
    SCHEMA,
    SESSION_ANSWER_OPERATIONS,
    Event,
    Hello,
    MalformedFrame,
    Request,
    Response,
    encode,
    fingerprint,
    nesting_depth,
    parse_request,
    schema_document,
)

pytestmark = pytest.mark.timeout(60)

# The oracle: the operation list of ../shared/PROTOCOL.md ("## Operations"), copied verbatim.
PROTOCOL_OPERATIONS = [
    # Run control
    "run.start",
    "run.pause",
    "run.resume",
    "run.cancel",
    "run.restart",
    "run.changeSettings",
    "run.status",
    "run.list",
    # Answers and agent work
    "checkpoint.answer",
    "decision.answer",
    "interaction.submit",
    "interaction.assistant",
    "interaction.update",
    # Origin-session reports
    "workflowMessage.reportBranch",
    "workflowTurn.report",
    "sessionView.clearTerminal",
    "followUp.queue",
    "followUp.remove",
    "session.record",
    # Channels
    "channel.status",
    "channel.reload",
    "channel.recover",
    # Resource managers
    "resourceManager.list",
    "resourceManager.get",
    "resourceManager.apply",
    "resourceManager.reconcile",
    "resourceManager.delete",
    # Server
    "server.status",
    "server.stop",
    # Views
    "view.runs.watch",
    "view.runs.page",
    "view.run.get",
    "view.run.watch",
    "view.run.unwatch",
    "view.page",
    "view.content",
    "view.session.watch",
    # Maintenance
    "state.status",
    "state.verify",
    "state.backup",
    "state.prune",
    # piworkflows additions
    "effect.list",
    "effect.confirm",
    "effect.retry",
    "protocol.schema",
    "run.delete",
    "workflow.list",
    "workflow.show",
    "run.logs",
    "run.transcript",
]

PROTOCOL_SESSION_ANSWER_OPERATIONS = {
    "interaction.submit",
    "interaction.assistant",
    "interaction.update",
    "checkpoint.answer",
    "decision.answer",
    "run.restart",
}


def request(**overrides: Any) -> Request:
    fields: dict[str, Any] = {
        "requestId": "req-1",
        "clientId": "client-1",
        "operation": "run.start",
        "idempotencyKey": "key-1",
        "payload": {"a": 1},
    }
    fields.update(overrides)
    return Request(**fields)


def envelope(**overrides: Any) -> dict[str, Any]:
    """A valid request envelope as a plain dict (keys in canonical order)."""
    data: dict[str, Any] = {
        "clientId": "client-1",
        "idempotencyKey": "key-1",
        "operation": "run.start",
        "payload": {},
        "requestId": "req-1",
        "schema": SCHEMA,
        "type": "request",
    }
    for key, value in overrides.items():
        if value is _ABSENT:
            data.pop(key, None)
        else:
            data[key] = value
    return data


_ABSENT = object()


def line_of(data: Any) -> bytes:
    """Fully canonical text of ``data`` plus the newline."""
    return canonical.dumps_bytes(data) + b"\n"


def with_payload_text(payload_text: str, **overrides: Any) -> bytes:
    """A canonical envelope whose payload is exactly ``payload_text`` (sender's order)."""
    marker = "\x00PAYLOAD\x00"
    text = canonical.dumps(envelope(payload=marker, **overrides))
    return text.replace(canonical.dumps(marker), payload_text).encode("utf-8") + b"\n"


# --- parse_request: accepted frames ---------------------------------------------


def test_parse_accepts_an_encoded_request() -> None:
    req = request(runId="run-1", expectedRevision=3, payload={"z": [1, 2.5, None, True], "a": {"y": "é"}})
    assert parse_request(encode(req)) == req


def test_parse_accepts_every_listed_operation() -> None:
    for op in OPERATIONS:
        assert parse_request(encode(request(operation=op))).operation == op


@pytest.mark.parametrize("payload", [None, [], {}, "text", 0, -1.5, True, [{"b": 1, "a": 2}]])
def test_parse_accepts_any_json_payload(payload: Any) -> None:
    req = request(payload=payload)
    assert parse_request(encode(req)).payload == payload


@pytest.mark.parametrize(
    "payload_text",
    [
        '{"b":1,"a":2}',
        '{"1":2,"a":1}',
        '{"1":1,"2":2,"10":3,"b":1,"a":2}',
        '{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}',
        '{"a":1,"4294967295":2}',  # 2^32 - 1 is not an array index: it stays where the sender put it
        '{"a":1,"01":2}',  # "01" is not a canonical index
        '{"x":"\\ud800"}',  # a lone surrogate, as JSON.stringify prints it
        '{"x":"\\udc00\\ud800"}',
        '{"x":"a/b\\u001f\\n"}',
    ],
)
def test_parse_keeps_the_senders_payload_key_order(payload_text: str) -> None:
    req = parse_request(with_payload_text(payload_text))
    assert list(req.payload) == list(json.loads(payload_text))
    assert canonical.dumps(req.payload, sort_keys=False) == payload_text


@pytest.mark.parametrize(
    "payload_text",
    [
        '{"a":1,"1":2}',
        '{"2":1,"1":2}',
        '{"10":1,"2":2}',
        '{"a":1,"4294967294":2}',  # 2^32 - 2 is the largest index key
        '{"z":{"a":1,"0":2}}',  # nested objects too
        '{"z":[{"a":1,"0":2}]}',
    ],
)
def test_parse_rejects_index_keys_that_do_not_stand_first(payload_text: str) -> None:
    with pytest.raises(MalformedFrame):
        parse_request(with_payload_text(payload_text))


def test_parse_accepts_a_lone_surrogate_in_a_payload_string() -> None:
    req = parse_request(with_payload_text('{"x":"\\ud800"}'))
    assert req.payload == {"x": "\ud800"}
    # An upper-case escape is not what JavaScript prints.
    with pytest.raises(MalformedFrame):
        parse_request(with_payload_text('{"x":"\\uD800"}'))
    # A surrogate pair is written raw by JavaScript, never escaped.
    with pytest.raises(MalformedFrame):
        parse_request(with_payload_text('{"x":"\\ud83d\\ude00"}'))
    assert parse_request(with_payload_text('{"x":"\U0001f600"}')).payload == {"x": "\U0001f600"}


def test_parse_accepts_optional_members() -> None:
    req = parse_request(line_of(envelope(runId="r", expectedRevision=0)))
    assert req.runId == "r" and req.expectedRevision == 0
    req = parse_request(line_of(envelope()))
    assert req.runId is None and req.expectedRevision is None


def test_id_limit_counts_utf8_bytes() -> None:
    assert parse_request(line_of(envelope(requestId="a" * 256))).requestId == "a" * 256
    assert parse_request(line_of(envelope(runId="é" * 128))).runId == "é" * 128  # 256 bytes
    for field in ("requestId", "clientId", "idempotencyKey", "runId"):
        with pytest.raises(MalformedFrame):
            parse_request(line_of(envelope(**{field: "é" * 129})))  # 129 characters, 258 bytes
        with pytest.raises(MalformedFrame):
            parse_request(line_of(envelope(**{field: "a" * 257})))
        with pytest.raises(MalformedFrame):
            parse_request(line_of(envelope(**{field: ""})))


# --- parse_request: malformed frames -------------------------------------------

VALID = line_of(envelope())


def _malformed_cases() -> list[tuple[str, bytes]]:
    reordered = {"type": "request", **{k: v for k, v in envelope().items() if k != "type"}}
    cases = [
        ("envelope keys not sorted", json.dumps(reordered, separators=(",", ":")).encode() + b"\n"),
        ("space after colon", VALID.replace(b'"type":', b'"type": ')),
        ("space between members", VALID.replace(b",", b", ", 1)),
        ("leading space", b" " + VALID),
        ("trailing space", VALID[:-1] + b" \n"),
        ("carriage return", VALID[:-1] + b"\r\n"),
        ("pretty printed", json.dumps(envelope(), indent=1, sort_keys=True).encode() + b"\n"),
        ("1e+20 in payload", with_payload_text('{"n":1e+20}')),
        ("1.0 in payload", with_payload_text('{"n":1.0}')),
        ("1E21 in payload", with_payload_text('{"n":1E21}')),
        ("-0 in payload", with_payload_text('{"n":-0}')),
        ("2^53+1 in payload", with_payload_text('{"n":9007199254740993}')),
        ("expectedRevision 1.0", VALID.replace(b'"operation"', b'"expectedRevision":1.0,"operation"')),
        ("expectedRevision 1e+20", VALID.replace(b'"operation"', b'"expectedRevision":1e+20,"operation"')),
        ("expectedRevision negative", line_of(envelope(expectedRevision=-1))),
        ("expectedRevision fractional", line_of(envelope(expectedRevision=1.5))),
        ("unknown envelope field", line_of(envelope(zzz=1))),
        ("receipt in a request", line_of(envelope(receipt={}))),
        ("unknown operation", line_of(envelope(operation="run.explode"))),
        ("operation in wrong case", line_of(envelope(operation="Server.status"))),
        ("wrong schema string", line_of(envelope(schema="pi-workflows.client.v2"))),
        ("type response", line_of(envelope(type="response"))),
        ("type absent", line_of(envelope(type=_ABSENT))),
        ("requestId not a string", line_of(envelope(requestId=5))),
        ("runId empty", line_of(envelope(runId=""))),
        ("runId 258 bytes", line_of(envelope(runId="é" * 129))),
        ("invalid UTF-8", VALID.replace(b'"req-1"', b'"req-\xff"')),
        ("overlong UTF-8", VALID.replace(b'"req-1"', b'"req-\xc0\xaf"')),
        ("UTF-8 encoded surrogate", VALID.replace(b'"req-1"', b'"req-\xed\xa0\x80"')),
        ("no trailing newline", VALID[:-1]),
        ("empty line", b"\n"),
        ("nothing", b""),
        ("duplicate envelope key", VALID.replace(b'"clientId":"client-1",', b'"clientId":"client-1","clientId":"c",')),
        ("duplicate payload key", with_payload_text('{"a":1,"a":2}')),
        ("duplicate key by escape", with_payload_text('{"a":1,"\\u0061":2}')),
        ("NaN", with_payload_text('{"n":NaN}')),
        ("Infinity", with_payload_text('{"n":Infinity}')),
        ("-Infinity", with_payload_text('{"n":-Infinity}')),
        ("JSON array", b"[]\n"),
        ("JSON array of a request", b"[" + VALID[:-1] + b"]\n"),
        ("JSON string", b'"request"\n'),
        ("JSON null", b"null\n"),
        ("JSON number", b"1\n"),
        ("two messages on one line", VALID[:-1] + VALID),
        ("not JSON", b"hello\n"),
        ("truncated", VALID[:-5] + b"\n"),
        ("escaped slash", with_payload_text('{"p":"a\\/b"}')),
        ("unnecessary escape", with_payload_text('{"p":"\\u0041"}')),
        ("upper-case control escape", with_payload_text('{"p":"\\u001F"}')),
        ("json.dumps style ascii escape", with_payload_text('{"p":"\\u00e9"}')),
    ]
    return cases


@pytest.mark.parametrize(("label", "line"), _malformed_cases(), ids=[c[0] for c in _malformed_cases()])
def test_parse_rejects_malformed_frames(label: str, line: bytes) -> None:
    with pytest.raises(MalformedFrame):
        parse_request(line)


@pytest.mark.parametrize("missing", ["requestId", "clientId", "operation", "idempotencyKey", "payload"])
def test_parse_rejects_a_missing_required_field(missing: str) -> None:
    with pytest.raises(MalformedFrame):
        parse_request(line_of(envelope(**{missing: _ABSENT})))


@pytest.mark.parametrize(
    "other",
    [
        Hello(connectionId="conn-1", packageVersion="0.1.0"),
        Response(requestId="req-1", outcome="accepted", receipt={}),
        Event(subscriptionId="sub-1", event="runs", payload={}),
    ],
    ids=["hello", "response", "event"],
)
def test_parse_rejects_server_envelopes(other: client_v1.Envelope) -> None:
    with pytest.raises(MalformedFrame):
        parse_request(encode(other))


def _padded_line(total: int) -> bytes:
    """A valid request line of exactly ``total`` bytes (newline included)."""
    base = encode(request(payload={"pad": ""}))
    line = base.replace(b'"pad":""', b'"pad":"' + b"x" * (total - len(base)) + b'"')
    assert len(line) == total
    return line


def test_max_message_bytes_includes_the_newline() -> None:
    assert MAX_MESSAGE_BYTES == 1_048_576
    exact = _padded_line(MAX_MESSAGE_BYTES)
    room = MAX_MESSAGE_BYTES - len(encode(request(payload={"pad": ""})))
    assert parse_request(exact).payload == {"pad": "x" * room}
    with pytest.raises(MalformedFrame):
        parse_request(_padded_line(MAX_MESSAGE_BYTES + 1))
    with pytest.raises(MalformedFrame):
        parse_request(_padded_line(2 * MAX_MESSAGE_BYTES))


def test_max_message_counts_bytes_not_characters() -> None:
    base = encode(request(payload={"pad": ""}))
    room = MAX_MESSAGE_BYTES - len(base)
    two_byte = "é" * (room // 2) + "x" * (room % 2)
    line = encode(request(payload={"pad": two_byte}))
    assert len(line) == MAX_MESSAGE_BYTES
    assert parse_request(line).payload["pad"] == two_byte
    bigger = base.replace(b'"pad":""', b'"pad":"' + ("é" * (room // 2 + 1)).encode() + b'"')
    assert len(bigger) > MAX_MESSAGE_BYTES and len(bigger.decode()) <= MAX_MESSAGE_BYTES
    with pytest.raises(MalformedFrame):
        parse_request(bigger)


# --- nesting: a fixed limit, checked before any reader ---------------------------------------


def nested_line(depth: int, leaf: str = "1", kind: str = "array") -> bytes:
    """A canonical request line whose deepest point is ``depth`` levels (the envelope is level 1)."""
    opener, closer = ("[", "]") if kind == "array" else ('{"a":', "}")
    return with_payload_text(opener * (depth - 1) + leaf + closer * (depth - 1), operation="server.status")


@pytest.mark.parametrize(
    ("leaf", "kind"),
    [("1", "array"), ("1.5", "array"), ("1.5", "object"), ('"\\ud800"', "object"), ('{"1":0,"b":2.5}', "array")],
    ids=["plain", "float", "float-in-objects", "lone-surrogate", "index-key"],
)
def test_exactly_max_nesting_levels_are_accepted(leaf: str, kind: str) -> None:
    """Leaves the C encoder cannot print take the exact encoder: it recursed twice per level (RecursionError)."""
    assert MAX_NESTING == 512
    depth = MAX_NESTING - 1 if leaf.startswith("{") else MAX_NESTING  # the leaf object is a level too
    line = nested_line(depth, leaf, kind)
    assert nesting_depth(line[:-1]) == MAX_NESTING
    assert parse_request(line).payload == json.loads(line)["payload"]


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 5_000, 100_000])
@pytest.mark.parametrize("kind", ["array", "object"])
def test_deeper_nesting_is_malformed_without_recursion(depth: int, kind: str) -> None:
    with pytest.raises(MalformedFrame, match="nests deeper than 512 levels"):
        parse_request(nested_line(depth, kind=kind))


def test_a_deep_unclosed_prefix_is_malformed() -> None:
    with pytest.raises(MalformedFrame, match="nests deeper"):
        parse_request(b'{"payload":' + b"[" * 100_000 + b"\n")


def test_brackets_inside_strings_do_not_count() -> None:
    text = '"' + "[{" * 3000 + "\\\\" + '\\"' + "[" * 600 + '"'
    line = with_payload_text("[" + text + "]", operation="server.status")
    assert nesting_depth(line[:-1]) == 2
    assert parse_request(line).payload == [json.loads(text)]


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"", 0),
        (b"1", 0),
        (b"[]", 1),
        (b'[{"k":[]}]', 3),
        (b"[[], [[]], []]", 3),
        (b'["[[[", "\\"[[", "\\\\", [1]]', 2),
        (b'{"a":"\\\\\\"[["}', 1),
        (b'"unterminated [[[', 0),
    ],
)
def test_nesting_depth_examples(text: bytes, depth: int) -> None:
    assert nesting_depth(text) == depth


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(alphabet='[]{}"\\ab\u00e9\n')),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=3), children, max_size=3)
    ),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_property_nesting_depth_is_the_depth_of_the_value(value: Any) -> None:
    assert nesting_depth(json.dumps(value, ensure_ascii=False).encode()) == _depth(value)


# --- lax envelope fields (bugs: see the reasons) ------------------------------------


def test_missing_schema_member_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        parse_request(line_of(envelope(schema=_ABSENT)))


def test_expected_revision_as_a_string_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        parse_request(line_of(envelope(expectedRevision="5")))


def test_expected_revision_as_a_boolean_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        parse_request(line_of(envelope(expectedRevision=True)))


@pytest.mark.parametrize("field", ["runId", "expectedRevision"])
def test_explicit_null_optional_member_counts_as_absent(field: str) -> None:
    """Lenient on purpose: a JavaScript client may serialise an unset member as null.
    It fingerprints like the absent member, so a retry either way adopts."""
    with_null = parse_request(line_of(envelope(**{field: None})))
    assert getattr(with_null, field) is None
    assert fingerprint(with_null) == fingerprint(parse_request(line_of(envelope())))


# --- round trip (property) --------------------------------------------------------

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_ids = st.text(min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    payload=_json,
    operation=st.sampled_from(OPERATIONS),
    request_id=_ids,
    run_id=st.none() | _ids,
    revision=st.none() | st.integers(min_value=0, max_value=2**53),
)
def test_encode_parse_round_trip(
    payload: Any, operation: str, request_id: str, run_id: str | None, revision: int | None
) -> None:
    req = request(payload=payload, operation=operation, requestId=request_id, runId=run_id, expectedRevision=revision)
    line = encode(req)
    parsed = parse_request(line)
    assert parsed == req
    assert encode(parsed) == line
    assert fingerprint(parsed) == fingerprint(req)


# --- encode -----------------------------------------------------------------------


def _is_canonical(line: bytes) -> bool:
    return line.endswith(b"\n") and canonical.dumps_bytes(json.loads(line[:-1])) + b"\n" == line


def test_encode_hello() -> None:
    line = encode(Hello(connectionId="conn-1", packageVersion="0.1.0"))
    expected = b'{"connectionId":"conn-1","packageVersion":"0.1.0","schema":"pi-workflows.client.v1","type":"hello"}'
    assert line == expected + b"\n"
    assert _is_canonical(line)


def test_encode_response_leaves_optional_members_out() -> None:
    line = encode(Response(requestId="r", outcome="accepted"))
    assert line == b'{"outcome":"accepted","requestId":"r","schema":"pi-workflows.client.v1","type":"response"}\n'
    for key in ("revision", "receipt", "error"):
        assert key.encode() not in line
    assert b"null" not in line


def test_encode_response_with_every_member_is_canonical() -> None:
    receipt = {"z": 1, "a": {"y": 2, "b": [3, {"d": 4, "c": 5}]}, "10": 0, "2": 0}
    line = encode(Response(requestId="r", outcome="rejected", revision=0, receipt=receipt, error="no"))
    assert _is_canonical(line)
    data = json.loads(line)
    assert data["revision"] == 0  # zero is present, not dropped as "absent"
    assert list(data) == ["error", "outcome", "receipt", "requestId", "revision", "schema", "type"]
    assert list(data["receipt"]) == ["2", "10", "a", "z"]
    assert list(data["receipt"]["a"]["b"][1]) == ["c", "d"]


def test_encode_request_keeps_payload_null_and_drops_absent_optionals() -> None:
    line = encode(request(payload=None))
    data = json.loads(line)
    assert "payload" in data and data["payload"] is None
    assert "runId" not in data and "expectedRevision" not in data
    assert _is_canonical(line)


def test_encode_event_keeps_payload_null() -> None:
    line = encode(Event(subscriptionId="s", event="runs", payload=None))
    expected = b'{"event":"runs","payload":null,"schema":"pi-workflows.client.v1","subscriptionId":"s","type":"event"}'
    assert line == expected + b"\n"


def test_encode_refused_is_one_canonical_line_and_not_an_outcome() -> None:
    line = encode(client_v1.Refused(code="tooManyConnections", error="busy; retry later"))
    assert line == (
        b'{"code":"tooManyConnections","error":"busy; retry later","schema":"pi-workflows.client.v1",'
        b'"type":"refused"}\n'
    )
    assert "tooManyConnections" not in CODES


def test_encode_is_fully_canonical_even_for_an_unsorted_payload() -> None:
    req = parse_request(with_payload_text('{"b":1,"a":2}'))
    assert b'"payload":{"a":2,"b":1}' in encode(req)


def test_encode_refuses_an_outgoing_message_over_1_mib() -> None:
    base = encode(Response(requestId="r", outcome="accepted", receipt=""))
    room = MAX_MESSAGE_BYTES - len(base)
    assert len(encode(Response(requestId="r", outcome="accepted", receipt="x" * room))) == MAX_MESSAGE_BYTES
    with pytest.raises(ValueError):
        encode(Response(requestId="r", outcome="accepted", receipt="x" * (room + 1)))


def test_response_error_must_be_non_empty() -> None:
    with pytest.raises(ValueError):
        Response(requestId="r", outcome="rejected", error="")


# --- fingerprint --------------------------------------------------------------------


def test_fingerprint_is_sha256_of_the_canonical_request_without_request_id() -> None:
    import hashlib

    req = request(runId="run-1", expectedRevision=2, payload={"b": 1, "a": 2})
    data = {
        "clientId": "client-1",
        "expectedRevision": 2,
        "idempotencyKey": "key-1",
        "operation": "run.start",
        "payload": {"a": 2, "b": 1},
        "runId": "run-1",
        "schema": SCHEMA,
        "type": "request",
    }
    assert fingerprint(req) == hashlib.sha256(canonical.dumps_bytes(data)).digest()
    assert len(fingerprint(req)) == 32


def test_fingerprint_ignores_request_id() -> None:
    assert fingerprint(request(requestId="a")) == fingerprint(request(requestId="b"))


def test_fingerprint_ignores_the_senders_payload_key_order() -> None:
    one = parse_request(with_payload_text('{"b":1,"a":{"d":1,"c":2}}'))
    two = parse_request(with_payload_text('{"a":{"c":2,"d":1},"b":1}'))
    assert list(one.payload) != list(two.payload)
    assert fingerprint(one) == fingerprint(two)


def test_session_answer_operations_match_the_protocol() -> None:
    assert set(SESSION_ANSWER_OPERATIONS) == PROTOCOL_SESSION_ANSWER_OPERATIONS


@pytest.mark.parametrize("operation", PROTOCOL_OPERATIONS)
def test_fingerprint_coordinator_epoch(operation: str) -> None:
    with_1 = request(operation=operation, payload={"x": 1, "coordinatorEpoch": 1})
    with_2 = request(operation=operation, payload={"x": 1, "coordinatorEpoch": 2})
    without = request(operation=operation, payload={"x": 1})
    nested_1 = request(operation=operation, payload={"x": {"coordinatorEpoch": 1}})
    nested_2 = request(operation=operation, payload={"x": {"coordinatorEpoch": 2}})
    if operation in PROTOCOL_SESSION_ANSWER_OPERATIONS:
        assert fingerprint(with_1) == fingerprint(with_2) == fingerprint(without)
    else:
        assert len({fingerprint(with_1), fingerprint(with_2), fingerprint(without)}) == 3
    # only the top-level payload member is left out
    assert fingerprint(nested_1) != fingerprint(nested_2)
    # other payload members still count
    assert fingerprint(request(operation=operation, payload={"x": 1, "coordinatorEpoch": 1})) != fingerprint(
        request(operation=operation, payload={"x": 2, "coordinatorEpoch": 1})
    )


@pytest.mark.parametrize(
    "change",
    [
        {"idempotencyKey": "key-2"},
        {"clientId": "client-2"},
        {"operation": "run.pause"},
        {"runId": "run-1"},
        {"expectedRevision": 0},
        {"payload": {"a": 2}},
        {"payload": {"a": 1, "b": None}},
        {"payload": [{"a": 1}]},
        {"payload": None},
        {"payload": {"a": "1"}},
    ],
)
def test_fingerprint_differs_when_the_request_differs(change: dict[str, Any]) -> None:
    assert fingerprint(request(**change)) != fingerprint(request())


def test_fingerprint_differs_between_runs_and_revisions() -> None:
    assert fingerprint(request(runId="a")) != fingerprint(request(runId="b"))
    assert fingerprint(request(expectedRevision=1)) != fingerprint(request(expectedRevision=2))


def test_fingerprint_treats_equal_numbers_alike() -> None:
    # 1 and 1.0 are the same double and print the same canonical text.
    assert fingerprint(request(payload={"n": 1})) == fingerprint(request(payload={"n": 1.0}))


# --- operation sets ------------------------------------------------------------------


def test_operations_match_the_protocol_exactly() -> None:
    assert len(OPERATIONS) == len(set(OPERATIONS))
    assert len(PROTOCOL_OPERATIONS) == len(set(PROTOCOL_OPERATIONS)) == 50
    assert list(OPERATIONS) == PROTOCOL_OPERATIONS


def test_read_only_operations() -> None:
    expected = {
        op for op in PROTOCOL_OPERATIONS if op.split(".")[-1] in ("status", "list", "get") or op.startswith("view.")
    } | {"protocol.schema", "state.verify", "workflow.show", "run.logs", "run.transcript"}  # reads: repair nothing
    assert set(READ_ONLY_OPERATIONS) == expected
    for op in (
        "server.status",
        "run.status",
        "run.list",
        "channel.status",
        "resourceManager.list",
        "resourceManager.get",
        "view.run.get",
        "view.runs.page",
        "view.content",
        "state.status",
        "state.verify",
        "effect.list",
        "protocol.schema",
        "workflow.list",
        "workflow.show",
        "run.logs",
    ):
        assert op in READ_ONLY_OPERATIONS
    for op in ("server.stop", "run.start", "run.cancel", "checkpoint.answer", "state.backup", "effect.confirm"):
        assert op not in READ_ONLY_OPERATIONS
    assert READ_ONLY_OPERATIONS <= set(OPERATIONS)
    assert not (READ_ONLY_OPERATIONS & SESSION_ANSWER_OPERATIONS)


# --- schema_document --------------------------------------------------------------------


def test_schema_document_is_canonical_json() -> None:
    doc = schema_document()
    text = canonical.dumps_bytes(doc)
    assert canonical.loads(text) == json.loads(text)
    assert canonical.dumps_bytes(canonical.loads(text)) == text
    assert doc["schema"] == SCHEMA
    # it fits in one response
    assert len(encode(Response(requestId="r", outcome="accepted", receipt=doc))) <= MAX_MESSAGE_BYTES


def test_schema_document_names_every_operation_once() -> None:
    doc = schema_document()
    served = list(doc["operations"])
    not_served = list(doc["notYetServed"])
    names = served + not_served
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(PROTOCOL_OPERATIONS)
    assert {"server.status", "server.stop", "protocol.schema"} <= set(served)
    assert set(served) == set(client_v1.OPERATION_SHAPES)
    for op, shape in doc["operations"].items():
        assert shape["stored"] is (op not in READ_ONLY_OPERATIONS)
        assert {"payload", "receipt", "stored"} <= set(shape)


def test_schema_document_describes_the_messages() -> None:
    doc = schema_document()
    assert set(doc["messages"]) == {"Hello", "Request", "Response", "Event", "Refused"}
    request_schema = doc["messages"]["Request"]
    assert "schema" in request_schema["properties"]
    assert set(request_schema["required"]) >= {"requestId", "clientId", "operation", "idempotencyKey", "payload"}
    assert request_schema.get("additionalProperties") is False


def test_prune_before_is_an_iso_8601_time_with_a_zone_after_1970() -> None:
    """One parser for the router's check and the CLI's --before."""
    assert client_v1.prune_before_ms("2026-08-01T00:00:00Z") == 1_785_542_400_000
    assert client_v1.prune_before_ms("2026-08-01T02:00:00+02:00") == 1_785_542_400_000
    for bad in ("yesterday", "2026-08-01T00:00:00", "2026-08-01", "1969-12-31T00:00:00Z", ""):
        with pytest.raises(ValueError, match="ISO 8601 time with a zone"):
            client_v1.prune_before_ms(bad)


_texts = st.one_of(
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(
            st.integers(-(2**53) + 1, 2**53 - 1),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=4),
            st.none(),
        ),
        max_size=4,
    ).map(canonical.dumps),
    st.from_regex(
        r'\{("[a-z0-9]{1,3}":(-?[0-9]{1,17}(\.[0-9]{1,3})?(e[+-]?[0-9]{1,2})?|"[a-z\\\\u0-9]{0,6}"|null|true),?){0,4}\}',
        fullmatch=True,
    ),
    st.dictionaries(
        st.text(max_size=4), st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=4)), max_size=4
    ).map(lambda d: json.dumps(d, ensure_ascii=False, separators=(",", ":"))),
)


@settings(max_examples=500, deadline=None)
@given(_texts)
def test_property_the_fast_reader_accepts_exactly_what_the_exact_reader_accepts(text: str) -> None:
    """_read_canonical returns a value only for text the exact path also finds canonical, and the same value."""
    from piworkflows.protocol.client_v1 import _KEEP_ORDER, _read_canonical

    data = text.encode("utf-8", "surrogatepass")
    fast = _read_canonical(data)
    try:
        exact = canonical.loads(data)
        is_canonical = isinstance(exact, dict) and canonical.dumps_envelope(exact, _KEEP_ORDER).encode() == data
    except (ValueError, TypeError):
        is_canonical = False
    if fast is not None:
        assert is_canonical and fast == exact and [type(v) for v in fast.values()] == [type(v) for v in exact.values()]


def test_the_workflow_tools_payloads_have_their_models() -> None:
    """interaction.submit carries the output under value (required, any JSON); interaction.update a
    note of at most 2000 characters and a progress fraction."""
    submit = {
        "targetSessionId": "pis-1",
        "coordinatorEpoch": 3,
        "requestId": "request-1",
        "submissionId": "submit-1",
        "value": {"output": None},
    }
    assert client_v1.InteractionSubmitPayload.model_validate(submit).value.output is None
    for broken in ({**submit, "value": {}}, {**submit, "coordinatorEpoch": 0}, {**submit, "extra": 1}):
        with pytest.raises(ValueError):
            client_v1.InteractionSubmitPayload.model_validate(broken)
    update = {"targetSessionId": "pis-1", "coordinatorEpoch": 3, "requestId": "request-1", "update": {"message": "m"}}
    assert client_v1.InteractionUpdatePayload.model_validate(update).update.progress is None
    for note in ({"message": "x" * 2001}, {"message": ""}, {"message": "m", "progress": 1.5}):
        with pytest.raises(ValueError):
            client_v1.InteractionUpdatePayload.model_validate({**update, "update": note})
    assert client_v1.InteractionUpdatePayload.model_validate(
        {**update, "update": {"message": "x" * 2000, "progress": 1}}
    )


@pytest.mark.parametrize("operation", client_v1.UPSTREAM_UNSERVED)
def test_an_upstream_operation_this_server_does_not_serve_parses(operation: str) -> None:
    """Its request is answered notAvailable (the router), never closed as malformed."""
    assert client_v1.parse_request(line_of(envelope(operation=operation))).operation == operation
    assert operation not in client_v1.OPERATION_SHAPES

"""The protocol's value domain (protocol/domain.py): what it refuses, where it says, and that every
value it accepts survives canonical JSON and a msgpack frame the way the server sends it."""

from __future__ import annotations

import hashlib
import json
import math

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from piworkflows import canonical
from piworkflows.protocol import domain, frames
from piworkflows.protocol.internal.base import BlobValue, verify_value
from piworkflows.states import MEDIA_JSON

pytestmark = pytest.mark.timeout(60)


def nested(levels: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({"continue": "\ud800"}, "$.continue", "lone surrogate U+D800"),
        ({"a": ["ok", "x\udfff"]}, "$.a[1]", "lone surrogate U+DFFF"),
        ({"k\ud800": 1}, '$["k\\ud800"]', "the key holds the lone surrogate"),
        ({"n": math.nan}, "$.n", "nan is not a JSON number"),
        ({"n": [math.inf]}, "$.n[0]", "inf is not a JSON number"),
        ({"big": 2**64 + 1}, "$.big", "not exactly a double"),
        ({"s": {1, 2}}, "$.s", "a set is not a JSON value"),
        ({1: "x"}, "$", "an object key is a int"),
        ({"deep": nested(domain.MAX_VALUE_NESTING)}, "$", "deeper than 256"),
    ],
)
def test_a_value_outside_the_domain_is_named_by_its_path(value, path, reason):
    found = domain.problem(value)
    assert found is not None and found.path == path and reason in found.reason, found
    with pytest.raises(domain.OutsideDomain) as raised:
        BlobValue.of_json(value)
    assert str(raised.value).startswith(path)


def test_a_surrogate_pair_in_a_python_str_is_one_astral_character():
    assert domain.lone_surrogate("\ud83d\ude00") is None
    assert domain.lone_surrogate("\ude00\ud83d") == 0xDE00  # the wrong order pairs nothing
    assert BlobValue.of_json({"e": "\ud83d\ude00"}).data == '{"e":"😀"}'.encode()


def test_the_deepest_value_allowed_is_stored():
    BlobValue.of_json(nested(domain.MAX_VALUE_NESTING - 1))  # a list of lists ... of 1: that many levels
    assert domain.problem(nested(domain.MAX_VALUE_NESTING)) is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"continue": true, "continue": false}', "duplicate object key 'continue'"),
        ('{"x": NaN}', "NaN is not allowed"),
        ("[Infinity]", "Infinity is not allowed"),
        ("[-Infinity]", "-Infinity is not allowed"),
        ("[1e400]", "overflows a double"),
        ('{"x": "\\ud800"}', "lone surrogate U+D800"),
        ("[" * 10_000 + "]" * 10_000, "deeper than 256 levels"),
        ("{'single': 1}", "not JSON: Expecting property name"),
    ],
)
def test_loads_refuses_what_json_text_can_say_outside_the_domain(text, reason):
    with pytest.raises(domain.OutsideDomain) as raised:
        domain.loads(text)
    assert reason in str(raised.value)


def test_text_for_people_shows_a_lone_surrogate_as_the_replacement_character():
    assert domain.text("a\ud800b\ud83d\ude00") == "a\ufffdb😀"
    assert BlobValue.of_text("boom \udcff").data == "boom \ufffd".encode()
    assert domain.texts({"k\ud800": ["v\udfff", 1]}) == {"k\ufffd": ["v\ufffd", 1]}


def test_a_stored_value_outside_the_domain_is_refused_where_it_is_decoded():
    data = b'{"continue":"\\ud800"}'  # what an older build stored
    with pytest.raises(ValueError):
        BlobValue.model_validate(BlobValue.of_bytes(data, MEDIA_JSON).model_dump())
    with pytest.raises(domain.OutsideDomain):
        verify_value(hashlib.sha256(data).digest(), MEDIA_JSON, data)
    literal = b'{"text":"\\\\ud800 is how JSON escapes it"}'  # a backslash, then "ud800": plain text
    verify_value(hashlib.sha256(literal).digest(), MEDIA_JSON, literal)


def test_a_frame_body_msgpack_cannot_encode_is_refused_before_anything_is_sent():
    with pytest.raises(frames.Unencodable):
        frames.encode("reply", 1, {"text": "\ud800"})
    with pytest.raises(frames.Unencodable):
        frames.encode("reply", 1, {"n": 2**70})
    with pytest.raises(frames.FrameTooLarge):
        frames.encode("reply", 1, {"b": b"x" * (2 << 20)})


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@given(json_values)
def test_property_every_value_in_the_domain_round_trips_and_fits_a_frame(value):
    assert domain.problem(value) is None
    blob = BlobValue.of_json(value)
    assert canonical.dumps_bytes(domain.loads(blob.data)) == blob.data
    frames.encode("reply", 1, {"value": domain.loads(blob.data)})


# every code point, lone surrogates included (Hypothesis leaves them out unless asked)
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()), max_size=20)


@given(any_text)
def test_property_any_text_is_either_in_the_domain_or_named_and_never_breaks_a_frame(text):
    found = domain.problem({"t": text})
    if found is None:
        msgpack.packb(text)
        assert domain.loads(json.dumps({"t": text})) == {"t": text}
    else:
        assert found.path == "$.t"
    frames.encode("log", 0, {"message": domain.text(text)})

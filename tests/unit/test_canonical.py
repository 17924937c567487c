"""Tests for piworkflows.canonical against the JavaScript-made vectors."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piworkflows.canonical import (
    digest_hex,
    dumps,
    dumps_bytes,
    loads,
    sha256_digest,
)

pytestmark = pytest.mark.timeout(60)

# A copy of ../shared/testdata/canonical-json-vectors.json (vectors produced by
# JavaScript itself), so a checkout tests without the shared folder beside it.
VECTORS_PATH = Path(__file__).resolve().parents[1] / "data" / "canonical-json-vectors.json"
SHARED_VECTORS_PATH = Path(__file__).resolve().parents[3] / "shared" / "testdata" / "canonical-json-vectors.json"
VECTORS = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))


@pytest.mark.skipif(not SHARED_VECTORS_PATH.exists(), reason="no shared folder beside this checkout")
def test_vectors_copy_equals_the_shared_vectors():
    assert VECTORS_PATH.read_bytes() == SHARED_VECTORS_PATH.read_bytes()


def _number(vector: dict) -> float:
    return struct.unpack("<d", bytes.fromhex(vector["input_hex64"]))[0]


def _string(vector: dict) -> str:
    return bytes.fromhex(vector["input_utf16_hex"]).decode("utf-16-be", "surrogatepass")


ALL_CANONICAL = [v["canonical"] for kind in ("numbers", "strings", "objects") for v in VECTORS[kind]]


def test_vectors_present() -> None:
    assert VECTORS["numbers"] and VECTORS["strings"] and VECTORS["objects"]


# --- the JavaScript vectors -------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["numbers"], ids=lambda v: v["input_repr"])
def test_number_vectors(vector: dict) -> None:
    assert dumps(_number(vector)) == vector["canonical"]


@pytest.mark.parametrize("vector", VECTORS["strings"], ids=lambda v: v["input_utf16_hex"] or "empty")
def test_string_vectors(vector: dict) -> None:
    assert dumps(_string(vector)) == vector["canonical"]
    assert dumps_bytes(_string(vector)) == vector["canonical"].encode("utf-8")


@pytest.mark.parametrize("vector", VECTORS["objects"], ids=lambda v: v["input_json"])
def test_object_vectors(vector: dict) -> None:
    assert dumps(loads(vector["input_json"])) == vector["canonical"]
    assert dumps(json.loads(vector["input_json"])) == vector["canonical"]


@pytest.mark.parametrize("text", ALL_CANONICAL)
def test_vector_round_trip(text: str) -> None:
    assert dumps(loads(text)) == text
    data = text.encode("utf-8")
    assert dumps_bytes(loads(data)) == data


# --- numbers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (1.5, "1.5"),
        (-2.5e-10, "-2.5e-10"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (123e-20, "1.23e-18"),
        (0.1 + 0.2, "0.30000000000000004"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (0, "0"),
        (-7, "-7"),
        (2**53, "9007199254740992"),
        (-(2**53), "-9007199254740992"),
        (10**21, "1e+21"),
        (2**64, "18446744073709552000"),
    ],
)
def test_scalars(value: object, expected: str) -> None:
    assert dumps(value) == expected


@pytest.mark.parametrize("value", [2**53 + 1, -(2**53) - 1, 10**23 + 1, 10**400])
def test_inexact_ints_raise(value: int) -> None:
    with pytest.raises(ValueError):
        dumps(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_rejected_by_dumps(value: float) -> None:
    with pytest.raises(ValueError):
        dumps(value)
    with pytest.raises(ValueError):
        dumps({"a": [value]})


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "[1,NaN]", '{"a":Infinity}', "1e400"])
def test_non_finite_rejected_by_loads(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


# --- strings ----------------------------------------------------------------


def test_string_escapes() -> None:
    assert dumps('a"b\\c/d') == '"a\\"b\\\\c/d"'
    assert dumps("\x00\x1f\x7f") == '"\\u0000\\u001f\x7f"'
    assert dumps("\u2028\u2029") == '"\u2028\u2029"'
    assert dumps("\U0001f600") == '"\U0001f600"'
    assert dumps("\udc00\ud800") == '"\\udc00\\ud800"'  # low then high: both lone
    # high then low is one UTF-16 pair, written as the astral character (as JavaScript does)
    assert dumps("\ud83d\ude00") == '"\U0001f600"'
    assert dumps_bytes("\ud800\ud800\udc00") == b'"\\ud800\xf0\x90\x80\x80"'
    assert dumps_bytes("x\ud800") == b'"x\\ud800"'


def test_lone_surrogate_from_json_round_trips() -> None:
    value = loads('"\\ud800"')
    assert value == "\ud800"
    assert dumps(value) == '"\\ud800"'


# --- objects and key order --------------------------------------------------


def test_key_order_sorted() -> None:
    value = {"b": 1, "a": 2, "10": 3, "2": 4, "01": 5, "-1": 6, "4294967295": 7, "4294967294": 8}
    assert dumps(value) == ('{"2":4,"10":3,"4294967294":8,"-1":6,"01":5,"4294967295":7,"a":2,"b":1}')


def test_keys_equal_in_utf16_rejected() -> None:
    with pytest.raises(ValueError):
        dumps({"\ud83d\ude00": 1, "\U0001f600": 2})


def test_key_order_utf16() -> None:
    # U+FF61 sorts after U+1F600 in UTF-16 (0xD83D...) though not by code point.
    assert dumps({"\uff61": 1, "\U0001f600": 2, "\ue000": 3}) == '{"\U0001f600":2,"\ue000":3,"\uff61":1}'


def test_sort_keys_false_keeps_order_but_moves_indices_first() -> None:
    value = loads('{"b":1,"10":2,"a":3,"2":4}')
    assert dumps(value, sort_keys=False) == '{"2":4,"10":2,"b":1,"a":3}'
    assert dumps_bytes(value, sort_keys=False) == b'{"2":4,"10":2,"b":1,"a":3}'
    assert dumps(value) == '{"2":4,"10":2,"a":3,"b":1}'


def test_sort_keys_false_applies_recursively() -> None:
    value = {"z": [{"y": 1, "x": 2}], "a": {"1": 0, "c": 1, "0": 2}}
    assert dumps(value, sort_keys=False) == '{"z":[{"y":1,"x":2}],"a":{"0":2,"1":0,"c":1}}'


def test_nested() -> None:
    value = {"list": [1, 2.5, None, True, "s", [], {}, (3, 4)], "obj": {"b": {"d": [{"f": 1, "e": 0}]}, "a": -0.0}}
    expected = '{"list":[1,2.5,null,true,"s",[],{},[3,4]],"obj":{"a":0,"b":{"d":[{"e":0,"f":1}]}}}'
    assert dumps(value) == expected
    assert dumps(loads(expected)) == expected


def test_type_errors() -> None:
    with pytest.raises(TypeError):
        dumps({1: "a"})
    with pytest.raises(TypeError):
        dumps({"a": {1, 2}})
    with pytest.raises(TypeError):
        dumps(b"bytes")
    with pytest.raises(TypeError):
        dumps(object())


# --- loads and non-canonical detection --------------------------------------


@pytest.mark.parametrize(
    "text",
    ["1.0", "1e+20", "9007199254740993", '{"a": 1}', '{"b":1,"a":2}', '"\\u0041"', " 1", "[1, 2]", "-0", "1E21"],
)
def test_non_canonical_detected(text: str) -> None:
    assert dumps(loads(text)) != text


def test_integer_literals_read_as_javascript_does() -> None:
    assert loads("9007199254740993") == 2**53 and isinstance(loads("9007199254740993"), float)
    assert dumps(loads("9007199254740993")) == "9007199254740992"
    assert isinstance(loads("9007199254740992"), int)
    assert isinstance(loads("-12"), int)
    big = loads("123456789012345680000")
    assert isinstance(big, float) and dumps(big) == "123456789012345680000"
    with pytest.raises(ValueError):
        loads("1" + "0" * 400)


@pytest.mark.parametrize("text", ['{"a":1,"a":2}', '[{"x":{"k":1,"k":1}}]'])
def test_duplicate_keys_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


@pytest.mark.parametrize("data", [b'"\xff"', b'"\xc3"', b'"\xed\xa0\x80"'])
def test_invalid_utf8_rejected(data: bytes) -> None:
    with pytest.raises(ValueError):
        loads(data)


def test_bom_rejected() -> None:
    with pytest.raises(ValueError):
        loads(b"\xef\xbb\xbf{}")


def test_loads_keeps_text_order() -> None:
    assert list(loads(b'{"b":1,"a":2}')) == ["b", "a"]


# --- digests ----------------------------------------------------------------


def test_digests() -> None:
    value = {"b": [1, "é"], "a": None}
    data = b'{"a":null,"b":[1,"\xc3\xa9"]}'
    assert dumps_bytes(value) == data
    assert sha256_digest(value) == hashlib.sha256(data).digest()
    assert len(sha256_digest(value)) == 32
    assert digest_hex(value) == "sha256:" + hashlib.sha256(data).hexdigest()


# --- properties -------------------------------------------------------------

_chars = st.one_of(
    st.characters(exclude_categories=()),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
    st.characters(max_codepoint=0x7F, exclude_categories=()),
)
_text = st.text(alphabet=_chars, max_size=12)
# Keys carry lone high surrogates but never a high+low pair, so two keys can
# never stand for the same UTF-16 string (dumps rightly rejects that).
_key_chars = st.one_of(
    st.characters(exclude_categories=("Cs",)),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDBFF, exclude_categories=()),
)
_keys = st.one_of(
    st.text(alphabet=_key_chars, max_size=8),
    st.integers(0, 2**32).map(str),
    st.sampled_from(["01", "-1", "4294967295"]),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_values = st.recursive(
    _scalars,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(_keys, children, max_size=5)),
    max_leaves=25,
)


def _utf16(text: str) -> str:
    return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")


def _normalise(value: object) -> object:
    """Numbers as floats, strings as the UTF-16 sequence they stand for."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return _utf16(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    return {_utf16(key): _normalise(item) for key, item in value.items()}


@settings(max_examples=300, deadline=None)
@given(_values)
def test_property_round_trip(value: object) -> None:
    text = dumps(value)
    assert dumps(loads(text)) == text
    assert dumps(loads(text.encode("utf-8")), sort_keys=False) == text
    # stdlib json reads 51660035803387540 as an int, not a double: compare values.
    assert _normalise(json.loads(text)) == _normalise(value)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_property_float_text_parses_back(value: float) -> None:
    text = dumps(value)
    assert float(text) == value
    assert text == text.strip() and "E" not in text and not text.endswith(".0")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))))
def test_property_strings_match_stdlib_without_surrogates(value: str) -> None:
    assert dumps(value) == json.dumps(value, ensure_ascii=False)


_plain_keys = st.one_of(st.text(max_size=6), st.sampled_from(["0", "1", "2", "10", "01", "-1", "4294967295", "a"]))
_plain_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.floats(allow_nan=False, allow_infinity=False)
    ),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_plain_keys, children, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_plain_values, _values))
def test_property_the_c_encoder_path_prints_exactly_the_exact_encoder(value: object) -> None:
    """dumps takes the C json encoder only where it prints the same text, in both key orders."""
    from piworkflows.canonical import _encode

    for sort_keys in (True, False):
        try:
            expected = _encode(value, sort_keys)
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)):
                dumps(value, sort_keys=sort_keys)
            continue
        assert dumps(value, sort_keys=sort_keys) == expected

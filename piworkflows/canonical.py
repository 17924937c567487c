"""Canonical JSON of the ``pi-workflows.client.v1`` protocol.

The canonical text of a value is exactly what JavaScript's ``JSON.stringify``
prints for it once every object's keys were inserted in sorted order,
recursively:

* no whitespace anywhere;
* object keys that are array indices (``"0"``, ``"1"``, ``"10"`` ... up to
  ``"4294967294"``, canonical decimal form only) come first in numeric order,
  then every other key in UTF-16 code-unit order;
* every number is an IEEE-754 double printed like ``Number.prototype.toString``
  (``1e+21``, ``1e-7``, ``0.000001``, ``-0`` as ``0``); a Python ``int`` that is
  not exactly a double, NaN and the infinities raise ``ValueError``;
* strings escape ``"``, ``\\``, ``\\b \\f \\n \\r \\t``, the other control
  characters and lone surrogates as lowercase ``\\u00xx`` / ``\\udxxx``;
  everything else (``/``, U+2028, U+2029, non-ASCII) is written raw. A high
  surrogate followed by a low one in a Python str is one UTF-16 pair, as in
  JavaScript, and is written as the astral character it stands for.

A received frame is canonical when ``dumps_bytes(loads(frame)) == frame``.
``loads`` reads an integer literal as an ``int`` when a double holds it exactly
and otherwise as the ``float`` JavaScript would read, so a canonical frame such
as ``123456789012345680000`` round-trips and ``9007199254740993`` does not.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

__all__ = [
    "digest_hex",
    "dumps",
    "dumps_bytes",
    "dumps_envelope",
    "loads",
    "parse_int",
    "sha256_digest",
]

_MAX_ARRAY_INDEX = 2**32 - 2
_INDEX_KEY = re.compile(r"(?:0|[1-9][0-9]*)\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\ud800-\udfff]')
_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _utf16_normalise(text: str) -> str:
    """Join high+low surrogate code points into the astral character they encode."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")


def _string(text: str) -> str:
    text = _utf16_normalise(text)
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


def _float(value: float) -> str:
    """Format a finite double like JavaScript's Number.prototype.toString."""
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not allowed in canonical JSON")
    if value == 0:
        return "0"  # also -0
    sign = "-" if value < 0 else ""
    # repr gives the shortest round-trip digits, as JavaScript does.
    mantissa, _, exponent = repr(abs(value)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    all_digits = int_part + frac_part
    digits = all_digits.lstrip("0")
    # n: position of the decimal point relative to the first significant digit.
    n = len(int_part) - (len(all_digits) - len(digits)) + int(exponent or 0)
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        head = digits if k == 1 else digits[0] + "." + digits[1:]
        text = head + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + text


def _int(value: int) -> str:
    try:
        as_float = float(value)
    except OverflowError:
        raise ValueError(f"integer {value} is not representable as a double") from None
    if int(as_float) != value:
        raise ValueError(f"integer {value} is not exactly representable as a double")
    return _float(as_float)


def _is_index_key(key: str) -> bool:
    return bool(_INDEX_KEY.match(key)) and int(key) <= _MAX_ARRAY_INDEX


def _ordered_keys(obj: dict, sort_keys: bool) -> list[str]:
    for key in obj:
        if not isinstance(key, str):
            raise TypeError(f"object keys must be str, not {type(key).__name__}")
    if len({_utf16_normalise(k) for k in obj}) != len(obj):
        raise ValueError("two object keys have the same UTF-16 code units")
    index_keys = sorted((k for k in obj if _is_index_key(k)), key=int)
    others = [k for k in obj if not _is_index_key(k)]
    if sort_keys:
        others.sort(key=lambda k: k.encode("utf-16-be", "surrogatepass"))
    return index_keys + others


_SAFE_INT = 2**53
# Keys the C encoder orders exactly as canonical order does: no surrogates or astral characters
# (code-point order is UTF-16 order below U+D800) and not an array index (those go first).
_PLAIN_KEY_CHARS = re.compile("[\x00-\ud7ff]*\\Z")
_C_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)
_C_ENCODER_KEEP_ORDER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_PLAIN_KEYS: set[str] = set()  # keys _plain_key accepted (a run's view repeats the same few hundred)
_PLAIN_KEYS_KEPT = 4096


def _plain_key(key: Any) -> bool:
    if type(key) is not str or _PLAIN_KEY_CHARS.match(key) is None or _INDEX_KEY.match(key):
        return False
    if len(_PLAIN_KEYS) < _PLAIN_KEYS_KEPT:
        _PLAIN_KEYS.add(key)
    return True


def _plain(value: Any) -> bool:
    """True if the C json encoder prints the canonical text of *value*, provided that text has no
    surrogate (``dumps`` checks the text once instead of every string here).

    That holds for str, int (a safe integer), bool, None, and lists, tuples and dicts of them whose
    keys are str without surrogates or astral characters and not array indices. Floats, large
    ints and everything else take the exact encoder below.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is dict:
            if not _PLAIN_KEYS.issuperset(item) and not all(_plain_key(key) for key in item):
                return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is not int or not -_SAFE_INT < item < _SAFE_INT:
            return False
    return True


def _encode(value: Any, sort_keys: bool) -> str:
    """One Python frame per nesting level (loops, not generators): a received frame may nest 512
    levels (client_v1.MAX_NESTING), well below the interpreter's recursion limit."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return _int(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            items.append(_encode(item, sort_keys))
        return "[" + ",".join(items) + "]"
    if isinstance(value, dict):
        members = []
        for key in _ordered_keys(value, sort_keys):
            members.append(_string(key) + ":" + _encode(value[key], sort_keys))
        return "{" + ",".join(members) + "}"
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dumps(value: Any, *, sort_keys: bool = True) -> str:
    """Return the canonical JSON text of *value*.

    With ``sort_keys=False`` dict insertion order is kept, except that
    array-index keys move first in numeric order, as in JavaScript.
    """
    if _plain(value):
        text = (_C_ENCODER if sort_keys else _C_ENCODER_KEEP_ORDER).encode(value)
        if _SURROGATE.search(text) is None:  # the C encoder writes a surrogate raw, canonical text escapes it
            return text
    return _encode(value, sort_keys)


def dumps_envelope(envelope: dict[str, Any], keep_order: frozenset[str]) -> str:
    """Canonical text of an object whose members named in *keep_order* keep
    their own key order (JavaScript insertion order, index keys first).

    The protocol checks a received envelope this way: envelope keys sorted,
    ``payload`` and ``receipt`` as the sender wrote them.
    """
    members = (
        _string(key) + ":" + dumps(envelope[key], sort_keys=key not in keep_order)
        for key in _ordered_keys(envelope, sort_keys=True)
    )
    return "{" + ",".join(members) + "}"


def dumps_bytes(value: Any, *, sort_keys: bool = True) -> bytes:
    """Return the canonical JSON of *value* as UTF-8 bytes."""
    # Lone surrogates are always escaped by dumps, so strict UTF-8 works.
    return dumps(value, sort_keys=sort_keys).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} overflows a double")
    return value


def parse_int(text: str) -> int | float:
    """An integer literal as JavaScript reads it: an ``int`` when a double holds it exactly, else
    the nearest ``float`` (``26847518767794790`` prints a double whose exact value differs)."""
    value = int(text)
    as_float = _parse_float(text)
    return value if as_float == value else as_float


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate object key {key!r}")
        obj[key] = value
    return obj


def loads(data: bytes | bytearray | str) -> Any:
    """Parse JSON text strictly: UTF-8 only, no duplicate keys, no NaN/Infinity.

    Dict order follows the text. An integer literal gives an ``int`` when a
    double holds it exactly, else the nearest ``float`` (the value JavaScript
    reads). Whether the text was canonical is checked by
    re-serialising the result and comparing.
    """
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"JSON text is not valid UTF-8: {exc}") from None
    return json.loads(
        data,
        object_pairs_hook=_unique_object,
        parse_constant=_reject_constant,
        parse_float=_parse_float,
        parse_int=parse_int,
    )


def sha256_digest(value: Any) -> bytes:
    """Return the 32-byte SHA-256 of the canonical bytes of *value*."""
    return hashlib.sha256(dumps_bytes(value)).digest()


def digest_hex(value: Any) -> str:
    """Return ``"sha256:"`` followed by the hex SHA-256 of the canonical bytes."""
    return "sha256:" + sha256_digest(value).hex()

"""The protocol's value domain: the one definition of what a JSON value may hold, checked at every
boundary where a value enters (the CLI, the client protocol, results of workflow code).

::

    CLI argument ── loads(text) ──────────────────────┐
    client request ── client_v1.outside_domain() ─────┤  OutsideDomain(path, reason): nothing is
    runner, resolver, agent ── BlobValue.of_json() ───┘  sent, stored or committed; it names the path
    text meant for people (errors, titles) ── text(s): lone surrogates become U+FFFD

A value is in the domain when

* every string (and object key) is Unicode scalar values only: no lone surrogate. A high
  surrogate followed by a low one in a Python str is one UTF-16 pair and counts as the astral
  character it encodes, as in canonical JSON;
* every number is a finite double (no NaN, no Infinity, no literal such as ``1e400`` that
  overflows one) and an integer is exactly a double;
* no object has two equal keys (only JSON text can say that, so ``loads`` checks it);
* it nests at most ``MAX_VALUE_NESTING`` levels (a scalar is 0, ``[]`` and ``{}`` are 1).

A received message nests at most ``MAX_NESTING`` levels, the envelope being level 1. A value that
a run keeps (an input, an answer, an output, a title) nests at most ``MAX_VALUE_NESTING``, half
of that: every message, frame and view that carries it (a view puts a value a few levels deep,
an internal frame a few more) then stays within the limits of every reader, and every accepted
value renders (docs/protocol.md, Values).
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

from piworkflows import canonical

MAX_NESTING = 512
MAX_VALUE_NESTING = MAX_NESTING // 2
_SAFE_INT = 2**53

# A UTF-16 code unit that is a surrogate, and one that pairs with its neighbour.
_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
# Canonical JSON writes a lone surrogate as this escape (and a paired one raw): a cheap filter.
_LONE_ESCAPE = b"\\ud"
_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MAX_PATH_KEY = 40


class OutsideDomain(ValueError):
    """A value outside the protocol's value domain; ``path`` names where (``$`` is the value)."""

    def __init__(self, path: str, reason: str, too_deep: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.too_deep = too_deep  # past the nesting limit (the path is then the root's)


def lone_surrogate(text: str) -> int | None:
    """The code point of the first lone surrogate in ``text`` (None when it has none)."""
    if _SURROGATE.search(text) is None:
        return None
    match = _SURROGATE.search(_PAIR.sub("", text))
    return ord(match.group()) if match else None


def text(value: str) -> str:
    """Text for people (an error, a title, a message) with each lone surrogate as U+FFFD."""
    if _SURROGATE.search(value) is None:
        return value
    return value.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "replace")


def _exact_double(value: int) -> bool:
    try:
        return int(float(value)) == value
    except OverflowError:
        return False


def texts(value: Any) -> Any:
    """``value`` with ``text`` applied to every string in it, keys too (a frame body of text for people)."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        return {texts(key): texts(member) for key, member in value.items()}
    if isinstance(value, (list, tuple)):
        return [texts(member) for member in value]
    return value


def path_of(parent: str, key: str | int) -> str:
    """``$.name``, ``$[3]``, ``$["odd key"]``: a path safe to print (long keys cut, escapes visible)."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _KEY_NAME.match(key):
        return f"{parent}.{key}"
    shown = key if len(key) <= _MAX_PATH_KEY else key[:_MAX_PATH_KEY] + "…"
    return f"{parent}[{json.dumps(shown)}]"


def problem(value: Any, root: str = "$", max_depth: int = MAX_VALUE_NESTING) -> OutsideDomain | None:
    """The first place where ``value`` leaves the domain, or None. No recursion: a loop and a stack."""
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        kind = type(item)
        if kind is str:
            point = lone_surrogate(item)
            if point is not None:
                return OutsideDomain(path, f"a string holds the lone surrogate U+{point:04X}")
        elif kind is bool or item is None:
            continue
        elif isinstance(item, int):
            if not -_SAFE_INT <= item <= _SAFE_INT and not _exact_double(item):
                return OutsideDomain(path, "the integer is not exactly a double (JSON numbers are doubles)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                return OutsideDomain(path, f"{item!r} is not a JSON number")
        elif isinstance(item, (list, tuple, dict)):
            if depth + 1 > max_depth:  # named at the root: a path hundreds of levels long says nothing
                return OutsideDomain(root, f"the value nests deeper than {max_depth} levels", too_deep=True)
            if isinstance(item, dict):
                for key, member in item.items():
                    if not isinstance(key, str):
                        return OutsideDomain(path, f"an object key is a {type(key).__name__}, not a string")
                    point = lone_surrogate(key)
                    if point is not None:
                        return OutsideDomain(path_of(path, key), f"the key holds the lone surrogate U+{point:04X}")
                    stack.append((member, path_of(path, key), depth + 1))
            else:
                stack.extend((member, path_of(path, index), depth + 1) for index, member in enumerate(item))
        else:
            return OutsideDomain(path, f"a {kind.__name__} is not a JSON value")
    return None


def check(value: Any, root: str = "$", max_depth: int = MAX_VALUE_NESTING) -> Any:
    """``value`` itself when it is in the domain; else raises OutsideDomain."""
    found = problem(value, root, max_depth)
    if found is not None:
        raise found
    return value


def check_json_bytes(data: bytes, max_depth: int = MAX_VALUE_NESTING) -> None:
    """Canonical JSON bytes (a stored or received value) hold a value in the domain; else raises
    OutsideDomain. Cheap when they do: the exact check runs only when a byte filter trips."""
    if _LONE_ESCAPE in data or data.count(b"[") + data.count(b"{") > max_depth:
        if nesting_depth(data) > max_depth:
            raise OutsideDomain("$", f"the value nests deeper than {max_depth} levels", too_deep=True)
        check(canonical.loads(data), max_depth=max_depth)


def loads(source: str | bytes, max_depth: int = MAX_VALUE_NESTING) -> Any:
    """JSON text as a value of the domain: UTF-8, no duplicate keys, finite numbers, Unicode text,
    at most ``max_depth`` levels (checked before any reader recurses). Raises OutsideDomain
    (a ValueError) with the reason; a parse error says where in the text."""
    data = source.encode("utf-8", "surrogatepass") if isinstance(source, str) else bytes(source)
    if data.count(b"[") + data.count(b"{") > max_depth and nesting_depth(data) > max_depth:
        raise OutsideDomain("$", f"the value nests deeper than {max_depth} levels", too_deep=True)
    try:
        value = canonical.loads(data)
    except json.JSONDecodeError as exc:
        raise OutsideDomain("$", f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:
        raise OutsideDomain("$", str(exc)) from None
    return check(value, max_depth=max_depth)


_BRACKET_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKET_STEP)


def nesting_depth(data: bytes) -> int:
    """The deepest ``[``/``{`` nesting of JSON text outside strings, in linear time without recursion.

    Escaped backslashes, then escaped quotes, are dropped (escapes pair from the left); what is
    left between quotes is string content. On text that is not JSON the count may differ after
    the first error, where every reader stops.
    """
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside_strings = b"".join(unescaped.split(b'"')[::2])
    brackets = outside_strings.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)

"""A run view kept current from ``run_patch`` events: ops applied strictly, revision by revision.

::

    Document(snapshot)                   the run view at its revision
    .apply(patch)                        run-patch.v1: {fromRevision, revision, runRevision,
                                         patches: [{revision, ops}]}, consecutive revisions from
                                         the document's own; ops add / replace / remove / append
                                         on JSON Pointers (RFC 6901)
    Gap                                  a patch that does not start at the document's revision,
                                         or an op whose target is not there: the watcher
                                         subscribes again from its revision (or takes a snapshot)

Strict: ``replace`` and ``remove`` need their target, ``add`` needs its parent, ``append`` needs an
array; nothing is guessed, so a document never silently differs from the server's snapshot.
"""

from __future__ import annotations

import copy
from typing import Any


class Gap(Exception):
    """The patch does not apply to the document: it needs a snapshot or a new watch."""


class Document:
    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.view = snapshot
        self.revision: int = snapshot["revision"]

    def apply(self, patch: dict[str, Any]) -> None:
        """Apply every revision of the patch, or none (a Gap leaves the document as it was)."""
        if patch["fromRevision"] != self.revision:
            raise Gap(f"a patch from revision {patch['fromRevision']} to a document at {self.revision}")
        view = copy.deepcopy(self.view)
        revision = self.revision
        for step in patch["patches"]:
            if step["revision"] != revision + 1:
                raise Gap(f"revision {step['revision']} after {revision}")
            for op in step["ops"]:
                apply_op(view, op)
            revision = step["revision"]
        if revision != patch["revision"]:
            raise Gap(f"the patch ends at {revision}, not at {patch['revision']}")
        view["revision"] = revision
        view["runRevision"] = patch["runRevision"]
        self.view, self.revision = view, revision


def apply_op(document: Any, op: dict[str, Any]) -> None:
    """One op on the document, in place; Gap when its target is not as the op needs."""
    tokens = [token.replace("~1", "/").replace("~0", "~") for token in op["path"].split("/")[1:]]
    if not tokens:
        raise Gap("an op on the whole document")
    parent = document
    for token in tokens[:-1]:
        parent = _child(parent, token)
    last, kind = tokens[-1], op["op"]
    if kind == "append":
        target = _child(parent, last)
        if not isinstance(target, list) or not isinstance(op["value"], list):
            raise Gap(f"append to a non-array at {op['path']}")
        target.extend(op["value"])
    elif isinstance(parent, dict):
        if kind in ("replace", "remove") and last not in parent:
            raise Gap(f"{kind} of a missing member {op['path']}")
        if kind == "remove":
            del parent[last]
        elif kind in ("add", "replace"):
            parent[last] = op["value"]
        else:
            raise Gap(f"an unknown op {kind!r}")
    elif isinstance(parent, list):
        index = _index(parent, last, allow_end=kind == "add")
        if kind == "remove":
            del parent[index]
        elif kind == "replace":
            parent[index] = op["value"]
        elif kind == "add":
            parent.insert(index, op["value"])
        else:
            raise Gap(f"an unknown op {kind!r}")
    else:
        raise Gap(f"{op['path']} is inside a value that is neither an object nor an array")


def _child(node: Any, token: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise Gap(f"no member {token!r}")
        return node[token]
    if isinstance(node, list):
        return node[_index(node, token, allow_end=False)]
    raise Gap(f"{token!r} inside a value that is neither an object nor an array")


def _index(array: list[Any], token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(array)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise Gap(f"{token!r} is not an array index")
    index = int(token)
    if index > len(array) or (index == len(array) and not allow_end):
        raise Gap(f"index {index} outside an array of {len(array)}")
    return index

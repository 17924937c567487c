"""Secrets for effects, read from the private credentials file at apply time.

::

    credentials.json (mode 0600, owned by the user, in the config dir)
      {"secrets": {"NAME": "value"}}
    load_secret("NAME") -> "value"   read on every call, never cached

A payload only names a secret (``{"secret": "NAME"}``); the value exists only
in this file and in the request the performer sends. Error messages never
contain a secret value. A remote may reflect what it was sent, so whatever
comes back from a request that carried secrets is scrubbed before it is kept::

    answer (status, headers, body, error text) ── scrub(value, {NAME: value}) ──> "[secret:NAME]"
    a text cut short of its end ── drop_partial_secret ──> without a secret's start at the cut
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from piworkflows import paths
from piworkflows.errors import StatePathRefused

SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}\Z")


class CredentialsError(ValueError):
    """A secret cannot be read: missing or unsafe file, bad shape, unknown name."""


def valid_name(name: object) -> bool:
    return isinstance(name, str) and SECRET_NAME.match(name) is not None


def load_secret(name: str) -> str:
    """The value of secret ``name`` from ``paths.credentials_file()``."""
    if not valid_name(name):
        raise CredentialsError(f"invalid secret name {name!r}: use letters, digits, '_', '.', '-' (max 128)")
    path = paths.credentials_file()
    secrets = _read(path)
    if name not in secrets:
        raise CredentialsError(f"unknown secret {name!r} (not in {path})")
    if not secrets[name]:
        raise CredentialsError(f"secret {name!r} is empty in {path}")
    return secrets[name]


def _read(path: Path) -> dict[str, str]:
    """Every secret of the file, once it is safe (mode 0600 or stricter, the user's) and of its shape."""
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if info.st_mode & 0o077:
                mode = oct(stat.S_IMODE(info.st_mode))
                raise CredentialsError(f"{path} is readable by others (mode {mode}): chmod 600 {path}")
            if info.st_uid != os.getuid():
                raise CredentialsError(f"{path} is not owned by the current user")
            data = handle.read()
    except FileNotFoundError:
        raise CredentialsError(f"no credentials file at {path}") from None
    except OSError as exc:
        raise CredentialsError(f"{path} cannot be read: {exc.strerror}") from None
    try:
        document = json.loads(data)
    except ValueError:
        raise CredentialsError(f"{path} is not valid JSON") from None  # the message could quote a secret
    secrets = document.get("secrets") if isinstance(document, dict) else None
    if not isinstance(secrets, dict) or not all(isinstance(v, str) for v in secrets.values()):
        raise CredentialsError(f'{path} must hold {{"secrets": {{"NAME": "value"}}}} with string values')
    return secrets


def value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a secret, or None. A secret travels as an HTTP header value or in a
    URL (a bot token), so it is printable ASCII (spaces and tabs inside allowed): then it also has
    one byte form, the one a scrub finds in any answer."""
    if not value:
        return "an empty secret is not stored"
    if not value.isascii() or any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
        return "a secret is printable ASCII (no line break or other control character): no header can carry it"
    return None


def store_secret(name: str, value: str) -> Path:
    """Set secret ``name`` in ``paths.credentials_file()`` (made, with its directory 0700, when
    missing), keeping the others: written whole to a new 0600 file, synced, renamed over the old.
    Refuses an existing file that is unsafe or not of its shape. Returns the file's path."""
    if not valid_name(name):
        raise CredentialsError(f"invalid secret name {name!r}: use letters, digits, '_', '.', '-' (max 128)")
    problem = value_problem(value)
    if problem is not None:
        raise CredentialsError(problem)
    path = paths.credentials_file()
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise CredentialsError(f"{directory} must be a directory of the current user with mode 0700")
    secrets = _read(path) if path.exists() else {}
    secrets[name] = value
    data = json.dumps({"secrets": secrets}, indent=2, sort_keys=True).encode() + b"\n"
    try:
        paths.write_private(path, data)
    except (OSError, StatePathRefused) as exc:
        raise CredentialsError(f"{path} cannot be written: {exc}") from None
    return path


def scrub(value: Any, secrets: Mapping[str, str]) -> Any:
    """``value`` (JSON) with every occurrence of each secret value (``secrets``: name -> value), in
    every string and object key, replaced by ``[secret:NAME]``. One pass, the longest value first
    (one may contain another); a replacement is never scanned again. Empty values are skipped."""
    names: dict[str, str] = {}
    for name, secret in sorted(secrets.items()):
        if secret:
            names.setdefault(secret, name)
    if not names:
        return value
    pattern = re.compile("|".join(re.escape(secret) for secret in sorted(names, key=len, reverse=True)))

    def text(string: str) -> str:
        return pattern.sub(lambda match: f"[secret:{names[match.group()]}]", string)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return text(item)
        if isinstance(item, dict):
            return {text(key) if isinstance(key, str) else key: walk(member) for key, member in item.items()}
        if isinstance(item, list):
            return [walk(member) for member in item]
        return item

    return walk(value)


def drop_partial_secret(text: str, secrets: Mapping[str, str]) -> str:
    """``text`` that was cut short of its end (and scrubbed), without a trailing start of a secret
    value whose rest was cut off: the longest such end goes, even a single character."""
    cut = 0
    for secret in secrets.values():
        for length in range(min(len(secret) - 1, len(text)), cut, -1):
            if text.endswith(secret[:length]):
                cut = length
                break
    return text[: len(text) - cut]

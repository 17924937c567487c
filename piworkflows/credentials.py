"""Secrets for effects, read from the private credentials file at apply time.

::

    credentials.json (mode 0600, owned by the user, in the config dir)
      {"secrets": {"NAME": "value"}}
    load_secret("NAME") -> "value"   read on every call, never cached

A payload only names a secret (``{"secret": "NAME"}``); the value exists only
in this file and in the request the performer sends. Error messages never
contain a secret value.
"""

from __future__ import annotations

import json
import os
import re
import stat

from piworkflows import paths

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
    if name not in secrets:
        raise CredentialsError(f"unknown secret {name!r} (not in {path})")
    return secrets[name]

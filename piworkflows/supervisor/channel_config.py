"""The Telegram channels configuration: ``channels.json`` and its bot tokens, read and checked whole.

::

    config dir (0700, the user's) ── channels.json (0600, not a link; missing: EMPTY, no channels)
      ── credentials.json (0600, not a link) ── digest = sha256(channels, 0, credentials)
      ── pydantic (schema pi-workflows.channels.v1, no unknown keys, ids decimal strings)
      ── cross checks: an audience's channels name profiles, its chatIds/userIds narrow theirs;
         one profile per credential (and per bot); each token a bot token (bot id: its prefix)
      ── ChannelConfig: profiles by channel id ("telegram:<profile>"), audiences, routes, allow

A refusal is ``ChannelConfigError``: ``configUnsafe`` (a mode, owner or link; the fix named) or
``channelConfigInvalid`` (each problem as its JSON path). Messages never hold a value of either
file: no token, id or URL (a credential is named by its name).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from piworkflows import credentials, paths

CHANNELS_FILE = "channels.json"
CREDENTIALS_FILE = "credentials.json"
ID = r"^-?[0-9]{1,20}$"
PROFILE = r"^[a-z0-9][a-z0-9_-]{0,31}$"
AUDIENCE = r"^[A-Za-z0-9_.-]{1,64}$"
BOT_ID = re.compile(r"[0-9]{1,20}")
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_SAFE_KEY = re.compile(AUDIENCE)  # a key shown in a path; any other is shown as <key>
_PATTERNS = {
    ID: "must be a decimal id in a string",
    PROFILE: "must be a profile name (a-z 0-9 _ -, at most 32, starting with a letter or digit)",
    AUDIENCE: "must be an audience name (A-Z a-z 0-9 _ . -, 1 to 64)",
}
_WORDS = {  # pydantic's error types in our words: its msg may quote the input
    "missing": "required",
    "extra_forbidden": "unknown key",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "too_short": "must not be empty",
}

Id = Annotated[str, StringConstraints(pattern=ID)]


class ChannelConfigError(Exception):
    def __init__(self, code: str, message: str, paths: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = code  # "channelConfigInvalid" | "configUnsafe"
        self.message = message
        self.paths = list(paths or [])


@dataclass(frozen=True)
class Profile:
    name: str
    channel_id: str
    base_url: str
    credential: str
    token: str = field(repr=False)
    bot_id: str
    allowed_user_ids: tuple[str, ...]
    allowed_chat_ids: tuple[str, ...]


@dataclass(frozen=True)
class Audience:
    name: str
    channels: tuple[str, ...]
    chat_ids: tuple[str, ...] | None
    user_ids: tuple[str, ...] | None


@dataclass(frozen=True)
class ChannelConfig:
    digest: str
    profiles: dict[str, Profile]
    audiences: dict[str, Audience]

    def routes(self, audience: str) -> list[tuple[str, str]]:
        """(channel id, chat id) pairs the audience is reached at; [] for an unknown one."""
        found = self.audiences.get(audience)
        if found is None:
            return []
        return [
            (channel, chat)
            for channel in found.channels
            for chat in (found.chat_ids if found.chat_ids is not None else self.profiles[channel].allowed_chat_ids)
        ]

    def all_routes(self) -> dict[str, list[tuple[str, str]]]:
        return {name: self.routes(name) for name in self.audiences}

    def allow(self, channel_id: str) -> dict[str, Any]:
        """Who may answer on ``channel_id``: the profile's lists, and each audience's narrowing."""
        profile = self.profiles.get(channel_id)
        return {
            "user_ids": list(profile.allowed_user_ids) if profile else [],
            "chat_ids": list(profile.allowed_chat_ids) if profile else [],
            "audiences": {
                a.name: {
                    "user_ids": list(a.user_ids) if a.user_ids is not None else None,
                    "chat_ids": list(a.chat_ids) if a.chat_ids is not None else None,
                }
                for a in self.audiences.values()
                if channel_id in a.channels
            },
        }


def _digest(channels: bytes, secrets: bytes) -> str:
    return hashlib.sha256(channels + b"\0" + secrets).hexdigest()


EMPTY = ChannelConfig(digest=_digest(b"", b""), profiles={}, audiences={})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Profile(_Model):
    credential: str
    base_url: str = Field(default="https://api.telegram.org", alias="baseUrl")
    allowed_user_ids: list[Id] = Field(alias="allowedUserIds")
    allowed_chat_ids: list[Id] = Field(alias="allowedChatIds")

    @field_validator("credential")
    @classmethod
    def _credential(cls, value: str) -> str:
        if not credentials.valid_name(value):
            raise PydanticCustomError("channel_config", "must be a secret name (letters, digits, _ . -)")
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        refused = PydanticCustomError("channel_config", "must be https, or http to loopback")
        try:
            url = urlsplit(value)
            url.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise refused from None
        host, plain = url.hostname or "", all(c.isprintable() and not c.isspace() for c in value)
        secure = url.scheme == "https" or (url.scheme == "http" and host in LOOPBACK)
        if not (plain and secure and host) or url.query or url.fragment or "@" in url.netloc:
            raise refused
        return value.rstrip("/")


class _Audience(_Model):
    channels: list[str] = Field(min_length=1)
    chat_ids: list[Id] | None = Field(default=None, min_length=1, alias="chatIds")
    user_ids: list[Id] | None = Field(default=None, min_length=1, alias="userIds")
    accept: Literal["first-valid-answer"] | None = None


class _Document(_Model):
    schema_: Literal["pi-workflows.channels.v1"] = Field(alias="schema")
    audiences: dict[Annotated[str, StringConstraints(pattern=AUDIENCE)], _Audience] = {}
    telegram_profiles: dict[Annotated[str, StringConstraints(pattern=PROFILE)], _Profile] = Field(
        default={}, alias="telegramProfiles"
    )


def load(config_dir: Path | None = None) -> ChannelConfig:
    """The configuration in ``config_dir`` (default ``paths.config_dir()``); EMPTY without channels.json."""
    directory = config_dir if config_dir is not None else paths.config_dir()
    channels_path = directory / CHANNELS_FILE
    raw = _read(channels_path)
    if raw is None:
        return EMPTY
    _check(directory, os.stat(directory), directory=True)
    secrets_raw = _read(directory / CREDENTIALS_FILE)
    digest = _digest(raw, secrets_raw or b"")
    invalid = f"{channels_path} is invalid: "
    try:
        document = _Document.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ChannelConfigError("channelConfigInvalid", f"{CHANNELS_FILE} is not valid JSON") from None
        _refuse(invalid, [_problem(e) for e in exc.errors()])
    secrets = None if secrets_raw is None else _secrets(secrets_raw)
    return _build(document, secrets, digest, invalid)


def _build(document: _Document, secrets: dict[str, str] | None, digest: str, invalid: str) -> ChannelConfig:
    problems: list[tuple[str, str]] = []
    if document.telegram_profiles and secrets is None:
        problems.append(("telegramProfiles", f"{CREDENTIALS_FILE} is missing from the config directory"))
    profiles: dict[str, Profile] = {}
    by_credential: dict[str, str] = {}
    by_bot: dict[str, str] = {}
    for name, p in document.telegram_profiles.items():
        where = f"telegramProfiles.{name}.credential"
        if p.credential in by_credential:
            problems.append((where, f"already used by telegramProfiles.{by_credential[p.credential]}"))
            continue
        by_credential[p.credential] = name
        if secrets is None:
            continue
        if p.credential not in secrets:
            problems.append((where, f"no secret {p.credential} in {CREDENTIALS_FILE}"))
            continue
        token = secrets[p.credential]
        bot_id, _, key = token.partition(":")
        if not key or not BOT_ID.fullmatch(bot_id):
            problems.append((where, f"secret {p.credential} is not a bot token (<bot id>:<key>)"))
            continue
        if bot_id in by_bot:
            problems.append((where, f"the same bot as telegramProfiles.{by_bot[bot_id]}"))
            continue
        by_bot[bot_id] = name
        users, chats = _unique(p.allowed_user_ids) or (), _unique(p.allowed_chat_ids) or ()
        profiles[f"telegram:{name}"] = Profile(
            name, f"telegram:{name}", p.base_url, p.credential, token, bot_id, users, chats
        )
    audiences: dict[str, Audience] = {}
    for name, a in document.audiences.items():
        named: list[str] = []
        for index, channel in enumerate(a.channels):
            kind, _, profile = channel.partition(":")
            if kind != "telegram" or profile not in document.telegram_profiles:
                problems.append((f"audiences.{name}.channels.{index}", "must be telegram:<a configured profile>"))
            else:
                named.append(profile)
        for key, ids in (("chatIds", a.chat_ids), ("userIds", a.user_ids)):
            for index, value in enumerate(ids or ()):
                outside = [n for n in named if value not in _allowed(document.telegram_profiles[n], key)]
                if outside:
                    where, listed = f"audiences.{name}.{key}.{index}", f"allowed{key[0].upper()}{key[1:]}"
                    problems.append((where, f"not in telegramProfiles.{outside[0]}.{listed}"))
        channels = tuple(dict.fromkeys(f"telegram:{n}" for n in named))
        audiences[name] = Audience(name, channels, _unique(a.chat_ids), _unique(a.user_ids))
    if problems:
        _refuse(invalid, problems)
    return ChannelConfig(digest=digest, profiles=profiles, audiences=audiences)


def _allowed(profile: _Profile, key: str) -> list[str]:
    return profile.allowed_chat_ids if key == "chatIds" else profile.allowed_user_ids


def _unique(ids: list[str] | None) -> tuple[str, ...] | None:
    return None if ids is None else tuple(dict.fromkeys(ids))


def _refuse(invalid: str, problems: list[tuple[str, str]]) -> NoReturn:
    message = invalid + "; ".join(f"{where}: {what}" for where, what in problems)
    raise ChannelConfigError("channelConfigInvalid", message, [where for where, _ in problems])


def _problem(error: Any) -> tuple[str, str]:
    """A pydantic error as (JSON path, own words): its input and its msg (which may echo it) unused."""
    loc = list(error["loc"])
    key = bool(loc) and loc[-1] == "[key]"
    if key:
        loc = loc[:-2]  # (..., the key itself, "[key]")
    where = ".".join(str(p) if isinstance(p, int) or _SAFE_KEY.fullmatch(p) else "<key>" for p in loc)
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "channel_config":
        what = str(error["msg"])  # our own text (PydanticCustomError above)
    elif kind == "string_pattern_mismatch":
        what = _PATTERNS.get(str(ctx.get("pattern")), "is not of the required form")
    elif kind == "literal_error":
        what = f"must be {ctx.get('expected')}"  # the model's literals, not the input
    else:
        what = _WORDS.get(kind, "is not valid")
    return (where or "(top level)", f"key {what}" if key else what)


def _secrets(data: bytes) -> dict[str, str]:
    """credentials.json's secrets, of the shape ``credentials`` reads (its messages hold no value)."""
    try:
        document = json.loads(data)
    except ValueError:
        raise ChannelConfigError("channelConfigInvalid", f"{CREDENTIALS_FILE} is not valid JSON") from None
    secrets = document.get("secrets") if isinstance(document, dict) else None
    if not isinstance(secrets, dict) or not all(isinstance(v, str) for v in secrets.values()):
        shape = f'{CREDENTIALS_FILE} must hold {{"secrets": {{"NAME": "value"}}}} with string values'
        raise ChannelConfigError("channelConfigInvalid", shape, [CREDENTIALS_FILE])
    return secrets


def _read(path: Path) -> bytes | None:
    """The bytes of a private file (a regular file of this uid, 0600, not a link); None when missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise _unsafe(path, "is a symbolic link: replace it with the file itself") from None
        raise _unsafe(path, f"cannot be read ({exc.strerror}): check it is a file of yours, mode 600") from None
    try:
        _check(path, os.fstat(fd), directory=False)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _check(path: Path, info: os.stat_result, directory: bool) -> None:
    if not (stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)):
        raise _unsafe(path, f"is not a {'directory' if directory else 'regular file'}: move it aside")
    if info.st_uid != os.getuid():
        raise _unsafe(path, f"belongs to uid {info.st_uid}, not to uid {os.getuid()}: chown it, or use your own")
    if info.st_mode & 0o077:
        mode = "700" if directory else "600"
        raise _unsafe(path, f"is open to others (mode {stat.S_IMODE(info.st_mode):o}): chmod {mode} {path}")


def _unsafe(path: Path, what: str) -> ChannelConfigError:
    return ChannelConfigError("configUnsafe", f"{path} {what}", [str(path)])

"""channel_config.load: channels.json and its bot tokens, the checks, the refusals, and no value in a message."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from piworkflows import paths
from piworkflows.supervisor import channel_config
from piworkflows.supervisor.channel_config import EMPTY, ChannelConfigError, load

pytestmark = pytest.mark.timeout(60)

TOKEN = "987654321:AAsecret-token-value-do-not-leak"
OTHER_TOKEN = "123123123:BBanother-secret-value"
EXAMPLE: dict[str, Any] = {
    "schema": "pi-workflows.channels.v1",
    "audiences": {
        "operator": {"channels": ["telegram:ops"], "accept": "first-valid-answer"},
        "release": {"channels": ["telegram:ops"], "chatIds": ["-1001234567890"], "userIds": ["111111"]},
    },
    "telegramProfiles": {
        "ops": {
            "credential": "telegram-ops",
            "baseUrl": "https://api.telegram.org",
            "allowedUserIds": ["111111", "222222"],
            "allowedChatIds": ["111111", "-1001234567890"],
        }
    },
}
# every value of the files that a message must never show
VALUES = [TOKEN, "AAsecret", "987654321", "111111", "222222", "1001234567890", "api.telegram.org", "https://"]


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    os.chmod(directory, 0o700)
    monkeypatch.setenv(paths.CONFIG_DIR_ENV, str(directory))
    return directory


def write(directory: Path, channels: object = None, secrets: object = None, raw: str | None = None) -> None:
    if channels is not None or raw is not None:
        path = directory / "channels.json"
        path.write_text(raw if raw is not None else json.dumps(channels))
        os.chmod(path, 0o600)
    if secrets is not None:
        path = directory / "credentials.json"
        path.write_text(json.dumps({"secrets": secrets}))
        os.chmod(path, 0o600)


def example() -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE)


def invalid(directory: Path, channels: object, secrets: object = None, raw: str | None = None) -> ChannelConfigError:
    write(directory, channels, {"telegram-ops": TOKEN} if secrets is None else secrets, raw)
    with pytest.raises(ChannelConfigError) as caught:
        load()
    error = caught.value
    assert error.code == "channelConfigInvalid", str(error)
    for value in VALUES + ["10.0.0.5", "evil.example", "424242", "-100999"]:
        assert value not in str(error), (value, str(error))
    return error


def test_the_example_loads_with_routes_allow_and_bot_id(config_dir: Path) -> None:
    write(config_dir, EXAMPLE, {"telegram-ops": TOKEN, "unrelated": "x"})
    config = load()
    assert list(config.profiles) == ["telegram:ops"]
    profile = config.profiles["telegram:ops"]
    assert (profile.name, profile.channel_id, profile.credential) == ("ops", "telegram:ops", "telegram-ops")
    assert profile.base_url == "https://api.telegram.org"
    assert profile.bot_id == "987654321" and profile.token == TOKEN
    assert profile.allowed_user_ids == ("111111", "222222")
    assert TOKEN not in repr(profile) and "AAsecret" not in repr(config)
    assert config.audiences["operator"].chat_ids is None and config.audiences["operator"].user_ids is None
    assert config.routes("operator") == [("telegram:ops", "111111"), ("telegram:ops", "-1001234567890")]
    assert config.routes("release") == [("telegram:ops", "-1001234567890")]
    assert config.routes("nobody") == []
    assert config.all_routes() == {"operator": config.routes("operator"), "release": config.routes("release")}
    assert config.allow("telegram:ops") == {
        "user_ids": ["111111", "222222"],
        "chat_ids": ["111111", "-1001234567890"],
        "audiences": {
            "operator": {"user_ids": None, "chat_ids": None},
            "release": {"user_ids": ["111111"], "chat_ids": ["-1001234567890"]},
        },
    }
    assert config.allow("telegram:other") == {"user_ids": [], "chat_ids": [], "audiences": {}}
    assert load(config_dir) == config  # an explicit directory, the same as the environment's


def test_base_url_default_trailing_slash_and_loopback_http(config_dir: Path) -> None:
    document = example()
    del document["telegramProfiles"]["ops"]["baseUrl"]
    document["telegramProfiles"]["dev"] = {
        "credential": "telegram-dev",
        "baseUrl": "http://127.0.0.1:8081/bot-api/",
        "allowedUserIds": [],
        "allowedChatIds": ["5"],
    }
    document["audiences"]["dev"] = {"channels": ["telegram:dev"]}
    write(config_dir, document, {"telegram-ops": TOKEN, "telegram-dev": OTHER_TOKEN})
    config = load()
    assert config.profiles["telegram:ops"].base_url == "https://api.telegram.org"
    assert config.profiles["telegram:dev"].base_url == "http://127.0.0.1:8081/bot-api"
    assert config.routes("dev") == [("telegram:dev", "5")]
    for url in ("http://localhost:1", "http://[::1]:2", "https://proxy.example/tg/"):
        document["telegramProfiles"]["dev"]["baseUrl"] = url
        write(config_dir, document)
        assert load().profiles["telegram:dev"].base_url == url.rstrip("/")


def test_digest_changes_with_either_file(config_dir: Path) -> None:
    write(config_dir, EXAMPLE, {"telegram-ops": TOKEN})
    first = load().digest
    assert load().digest == first and len(first) == 64
    write(config_dir, secrets={"telegram-ops": TOKEN, "other": "x"})
    second = load().digest
    document = example()
    document["audiences"]["extra"] = {"channels": ["telegram:ops"]}
    write(config_dir, document)
    third = load().digest
    assert len({first, second, third}) == 3


def test_missing_channels_json_is_empty_without_credentials(config_dir: Path, tmp_path: Path) -> None:
    assert load() is EMPTY
    assert EMPTY.profiles == {} and EMPTY.audiences == {} and EMPTY.all_routes() == {}
    assert load(tmp_path / "absent") is EMPTY
    os.chmod(config_dir, 0o755)  # no channels.json: nothing is read, nothing refused
    assert load() is EMPTY


def test_no_profiles_needs_no_credentials(config_dir: Path) -> None:
    write(config_dir, {"schema": "pi-workflows.channels.v1"})
    config = load()
    assert config.profiles == {} and config.audiences == {} and config.digest != EMPTY.digest


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d.pop("schema"), "schema"),
        (lambda d: d.update(schema="pi-workflows.channels.v2"), "schema"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d["telegramProfiles"]["ops"].update(token=TOKEN), "telegramProfiles.ops.token"),
        (lambda d: d["audiences"]["release"].update(accept="all"), "audiences.release.accept"),
        (lambda d: d["telegramProfiles"]["ops"].update(baseUrl="http://evil.example"), "telegramProfiles.ops.baseUrl"),
        (lambda d: d["telegramProfiles"]["ops"].update(baseUrl="http://10.0.0.5/"), "telegramProfiles.ops.baseUrl"),
        (lambda d: d["telegramProfiles"]["ops"].update(baseUrl="ftp://evil.example"), "telegramProfiles.ops.baseUrl"),
        (
            lambda d: d["telegramProfiles"]["ops"].update(baseUrl="https://u:424242@evil.example"),
            "telegramProfiles.ops.baseUrl",
        ),
        (
            lambda d: d["telegramProfiles"]["ops"].update(baseUrl="https://evil.example/?q=424242"),
            "telegramProfiles.ops.baseUrl",
        ),
        (
            lambda d: d["telegramProfiles"]["ops"].update(allowedUserIds=[424242]),
            "telegramProfiles.ops.allowedUserIds.0",
        ),
        (
            lambda d: d["telegramProfiles"]["ops"].update(allowedChatIds=["-100999x"]),
            "telegramProfiles.ops.allowedChatIds.0",
        ),
        (
            lambda d: d["telegramProfiles"]["ops"].update(allowedChatIds="-100999"),
            "telegramProfiles.ops.allowedChatIds",
        ),
        (lambda d: d["telegramProfiles"]["ops"].pop("allowedUserIds"), "telegramProfiles.ops.allowedUserIds"),
        (lambda d: d["telegramProfiles"]["ops"].update(credential="1bad name"), "telegramProfiles.ops.credential"),
        (lambda d: d["telegramProfiles"].update(Ops=d["telegramProfiles"].pop("ops")), "telegramProfiles"),
        (lambda d: d["audiences"].update({"bad name": {"channels": ["telegram:ops"]}}), "audiences"),
        (lambda d: d["audiences"].update({"x" * 65: {"channels": ["telegram:ops"]}}), "audiences"),
        (lambda d: d["audiences"]["operator"].update(channels=[]), "audiences.operator.channels"),
        (lambda d: d["audiences"]["operator"].pop("channels"), "audiences.operator.channels"),
        (lambda d: d["audiences"]["operator"].update(channels=["telegram:nope"]), "audiences.operator.channels.0"),
        (lambda d: d["audiences"]["operator"].update(channels=["ops"]), "audiences.operator.channels.0"),
        (lambda d: d["audiences"]["release"].update(chatIds=["-100999"]), "audiences.release.chatIds.0"),
        (lambda d: d["audiences"]["release"].update(userIds=["111111", "424242"]), "audiences.release.userIds.1"),
        (lambda d: d["audiences"]["release"].update(chatIds=[]), "audiences.release.chatIds"),
    ],
)
def test_invalid_documents_name_the_path(config_dir: Path, change: Any, where: str) -> None:
    document = example()
    change(document)
    error = invalid(config_dir, document)
    assert where in error.paths, (where, error.paths, str(error))
    assert f"{where}:" in str(error)


def test_invalid_json_and_not_an_object(config_dir: Path) -> None:
    error = invalid(config_dir, None, raw='{"schema": "111111", ')
    assert str(error) == "channels.json is not valid JSON"
    error = invalid(config_dir, ["111111"])
    assert "must be an object" in str(error)


def test_audience_narrowing_applies_to_every_profile_it_names(config_dir: Path) -> None:
    document = example()
    document["telegramProfiles"]["dev"] = {
        "credential": "telegram-dev",
        "allowedUserIds": ["111111"],
        "allowedChatIds": ["111111"],
    }
    document["audiences"]["release"]["channels"] = ["telegram:ops", "telegram:dev"]
    error = invalid(config_dir, document, {"telegram-ops": TOKEN, "telegram-dev": OTHER_TOKEN})
    assert error.paths == ["audiences.release.chatIds.0"]
    assert "telegramProfiles.dev.allowedChatIds" in str(error)


def test_one_profile_per_credential(config_dir: Path) -> None:
    document = example()
    document["telegramProfiles"]["two"] = dict(document["telegramProfiles"]["ops"])
    error = invalid(config_dir, document)
    assert error.paths == ["telegramProfiles.two.credential"]


def test_one_profile_per_bot(config_dir: Path) -> None:
    document = example()
    document["telegramProfiles"]["two"] = {**document["telegramProfiles"]["ops"], "credential": "copy"}
    error = invalid(config_dir, document, {"telegram-ops": TOKEN, "copy": TOKEN})
    assert error.paths == ["telegramProfiles.two.credential"]


@pytest.mark.parametrize("token", ["no-colon-AAsecret", "abc:AAsecret", "987654321:", ":AAsecret", ""])
def test_a_token_must_be_a_bot_token(config_dir: Path, token: str) -> None:
    error = invalid(config_dir, EXAMPLE, {"telegram-ops": token})
    assert error.paths == ["telegramProfiles.ops.credential"]
    assert "telegram-ops" in str(error)  # the credential by name only
    if token:
        assert token not in str(error)


def test_credentials_missing_unknown_or_misshapen(config_dir: Path) -> None:
    error = invalid(config_dir, EXAMPLE, {"other": TOKEN})
    assert error.paths == ["telegramProfiles.ops.credential"] and "telegram-ops" in str(error)
    (config_dir / "credentials.json").unlink()
    with pytest.raises(ChannelConfigError) as caught:
        load()
    assert caught.value.code == "channelConfigInvalid" and "credentials.json" in str(caught.value)
    path = config_dir / "credentials.json"
    for text in ('{"secrets": {"telegram-ops": 987654321}}', "[1, 2", '{"other": "AAsecret"}'):
        path.write_text(text)
        os.chmod(path, 0o600)
        with pytest.raises(ChannelConfigError) as caught:
            load()
        assert caught.value.code == "channelConfigInvalid"
        assert all(value not in str(caught.value) for value in VALUES)


def test_every_problem_is_listed(config_dir: Path) -> None:
    document = example()
    document["telegramProfiles"]["ops"]["baseUrl"] = "http://evil.example"
    document["audiences"]["operator"]["surprise"] = True
    error = invalid(config_dir, document)
    assert set(error.paths) == {"telegramProfiles.ops.baseUrl", "audiences.operator.surprise"}
    assert "telegramProfiles.ops.baseUrl: must be https, or http to loopback" in str(error)
    assert "audiences.operator.surprise: unknown key" in str(error)


def unsafe(directory: Path) -> ChannelConfigError:
    with pytest.raises(ChannelConfigError) as caught:
        load(directory)
    assert caught.value.code == "configUnsafe", str(caught.value)
    assert TOKEN not in str(caught.value)
    return caught.value


def test_unsafe_modes_and_links_are_refused(config_dir: Path, tmp_path: Path) -> None:
    write(config_dir, EXAMPLE, {"telegram-ops": TOKEN})
    os.chmod(config_dir, 0o755)
    error = unsafe(config_dir)
    assert error.paths == [str(config_dir)] and f"chmod 700 {config_dir}" in str(error)
    os.chmod(config_dir, 0o700)
    for name in ("channels.json", "credentials.json"):
        path = config_dir / name
        os.chmod(path, 0o644)
        error = unsafe(config_dir)
        assert error.paths == [str(path)] and f"chmod 600 {path}" in str(error)
        os.chmod(path, 0o600)
    assert load(config_dir).profiles


@pytest.mark.parametrize("name", ["channels.json", "credentials.json"])
def test_symlinks_are_refused(config_dir: Path, tmp_path: Path, name: str) -> None:
    write(config_dir, EXAMPLE, {"telegram-ops": TOKEN})
    path = config_dir / name
    target = tmp_path / f"real-{name}"
    path.rename(target)
    path.symlink_to(target)
    error = unsafe(config_dir)
    assert error.paths == [str(path)] and "symbolic link" in str(error)
    path.unlink()
    path.symlink_to(tmp_path / "dangling")
    assert unsafe(config_dir).paths == [str(path)]


def test_not_a_regular_file_is_refused(config_dir: Path) -> None:
    (config_dir / "channels.json").mkdir(mode=0o700)
    assert "not a regular file" in str(unsafe(config_dir))
    (config_dir / "channels.json").rmdir()
    os.mkfifo(config_dir / "channels.json", 0o600)
    assert "not a regular file" in str(unsafe(config_dir))  # never blocks on a FIFO


def test_error_shape() -> None:
    error = ChannelConfigError("configUnsafe", "m")
    assert (error.code, error.paths, str(error)) == ("configUnsafe", [], "m")
    assert channel_config.EMPTY.digest == channel_config._digest(b"", b"")

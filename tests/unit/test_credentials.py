"""load_secret: the private credentials file and its refusals; scrub: secret values out of what a remote answered."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from piworkflows import paths
from piworkflows.credentials import CredentialsError, drop_partial_secret, load_secret, scrub, store_secret

pytestmark = pytest.mark.timeout(30)

SECRET = "s3cr3t-value-do-not-leak"


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv(paths.CONFIG_DIR_ENV, str(directory))
    return directory


def write(config_dir: Path, document: object, mode: int = 0o600, raw: str | None = None) -> Path:
    path = config_dir / "credentials.json"
    path.write_text(raw if raw is not None else json.dumps(document))
    os.chmod(path, mode)
    return path


def test_reads_a_secret(config_dir: Path) -> None:
    write(config_dir, {"secrets": {"TOKEN": SECRET, "other.name-2": "x"}})
    assert load_secret("TOKEN") == SECRET
    assert load_secret("other.name-2") == "x"


def test_reads_at_call_time(config_dir: Path) -> None:
    write(config_dir, {"secrets": {"TOKEN": "one"}})
    assert load_secret("TOKEN") == "one"
    write(config_dir, {"secrets": {"TOKEN": "two"}})
    assert load_secret("TOKEN") == "two"


def test_stricter_mode_is_accepted(config_dir: Path) -> None:
    write(config_dir, {"secrets": {"TOKEN": SECRET}}, mode=0o400)
    assert load_secret("TOKEN") == SECRET


def test_default_location_is_under_home(private_home: Path) -> None:
    directory = private_home / ".pi" / "agent" / "workflows-config"
    directory.mkdir(parents=True)
    write(directory, {"secrets": {"TOKEN": SECRET}})
    assert load_secret("TOKEN") == SECRET


def test_missing_file(config_dir: Path) -> None:
    with pytest.raises(CredentialsError, match="no credentials file at"):
        load_secret("TOKEN")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o666])
def test_group_or_other_access_is_refused(config_dir: Path, mode: int) -> None:
    path = write(config_dir, {"secrets": {"TOKEN": SECRET}}, mode=mode)
    with pytest.raises(CredentialsError, match=f"chmod 600 {path}") as info:
        load_secret("TOKEN")
    assert SECRET not in str(info.value)


def test_other_owner_is_refused(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(config_dir, {"secrets": {"TOKEN": SECRET}})
    monkeypatch.setattr(os, "getuid", lambda: os.stat(config_dir).st_uid + 1)
    with pytest.raises(CredentialsError, match="not owned by the current user"):
        load_secret("TOKEN")


@pytest.mark.parametrize(
    "raw",
    [
        '{"secrets": {"TOKEN": "' + SECRET + '"',  # truncated
        "[]",
        '{"secrets": []}',
        '{"other": {}}',
        '{"secrets": {"TOKEN": 12}}',
    ],
)
def test_bad_shape_is_refused(config_dir: Path, raw: str) -> None:
    write(config_dir, None, raw=raw)
    with pytest.raises(CredentialsError) as info:
        load_secret("TOKEN")
    assert SECRET not in str(info.value)


def test_an_empty_value_is_refused(config_dir: Path) -> None:
    """An empty secret would be sent as an empty header, and no scrub could find it in an answer."""
    write(config_dir, {"secrets": {"TOKEN": ""}})
    with pytest.raises(CredentialsError, match="secret 'TOKEN' is empty"):
        load_secret("TOKEN")


def test_unknown_name(config_dir: Path) -> None:
    write(config_dir, {"secrets": {"TOKEN": SECRET}})
    with pytest.raises(CredentialsError, match="unknown secret 'NOPE'") as info:
        load_secret("NOPE")
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("name", ["", "1abc", "has space", "a" * 129, "x/y", ".hidden"])
def test_invalid_names(config_dir: Path, name: str) -> None:
    write(config_dir, {"secrets": {name: SECRET}})
    with pytest.raises(CredentialsError, match="invalid secret name"):
        load_secret(name)


def test_longest_name(config_dir: Path) -> None:
    name = "a" * 128
    write(config_dir, {"secrets": {name: SECRET}})
    assert load_secret(name) == SECRET


def test_is_a_value_error() -> None:
    assert issubclass(CredentialsError, ValueError)


# --- scrub ----------------------------------------------------------------------------------------------------


def test_scrub_replaces_every_occurrence_in_strings_and_keys() -> None:
    secrets = {"TOKEN": SECRET, "OTHER": "pw-42"}
    value = {
        "status": 200,
        "headers": {"x-echo": f"Bearer {SECRET}", SECRET: "as a key", "plain": "kept"},
        "body": [f"{SECRET}{SECRET}", {"nested": ["pw-42!", None, True, 1.5]}],
    }
    assert scrub(value, secrets) == {
        "status": 200,
        "headers": {"x-echo": "Bearer [secret:TOKEN]", "[secret:TOKEN]": "as a key", "plain": "kept"},
        "body": ["[secret:TOKEN][secret:TOKEN]", {"nested": ["[secret:OTHER]!", None, True, 1.5]}],
    }
    assert scrub(f"error: {SECRET}", secrets) == "error: [secret:TOKEN]"
    assert scrub(None, secrets) is None and scrub(7, secrets) == 7
    assert scrub(value, {}) == value


def test_scrub_takes_the_longest_secret_first_in_one_pass() -> None:
    """One secret contains another; a replacement is never scanned again."""
    secrets = {"INNER": "tok-9f", "OUTER": "Bearer tok-9f8e", "COLON": "t:O"}
    assert scrub("Bearer tok-9f8e / tok-9f", secrets) == "[secret:OUTER] / [secret:INNER]"
    assert scrub("abc", {"A": "abc", "S": "secret"}) == "[secret:A]"  # not [[secret:S]:A]
    assert scrub("a t:O b", secrets) == "a [secret:COLON] b"


def test_scrub_skips_empty_values() -> None:
    assert scrub({"a": "text"}, {"EMPTY": "", "T": "x"}) == {"a": "te[secret:T]t"}


def test_drop_partial_secret_at_a_cut() -> None:
    secrets = {"TOKEN": SECRET, "OTHER": "pw-42"}
    assert drop_partial_secret("body ... s3cr3t-va", secrets) == "body ... "
    assert drop_partial_secret("body ... pw-4", secrets) == "body ... "
    assert drop_partial_secret("body ... s", secrets) == "body ... "  # even one character
    assert drop_partial_secret("body ... [secret:TOKEN]", secrets) == "body ... [secret:TOKEN]"
    assert drop_partial_secret("body ... done", secrets) == "body ... done"
    assert drop_partial_secret("s3cr", secrets) == ""
    assert drop_partial_secret("", secrets) == ""
    assert drop_partial_secret("x pw-4", {"EMPTY": ""}) == "x pw-4"


def test_secrets_set_stores_from_stdin_with_mode_0600_and_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from piworkflows.cli import main

    directory = tmp_path / "new-config"  # made by the command, 0700
    monkeypatch.setenv(paths.CONFIG_DIR_ENV, str(directory))
    result = CliRunner().invoke(main, ["secrets", "set", "telegram-ops"], input=SECRET + "\n")
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    path = directory / "credentials.json"
    assert (directory.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
    assert load_secret("telegram-ops") == SECRET  # the trailing newline dropped
    again = CliRunner().invoke(main, ["secrets", "set", "OTHER"], input="two")
    assert again.exit_code == 0, again.output
    assert (load_secret("telegram-ops"), load_secret("OTHER")) == (SECRET, "two")
    assert [p.name for p in directory.iterdir()] == ["credentials.json"]  # no temporary file left


def test_secrets_set_refuses_bad_input_and_an_unsafe_file(config_dir: Path) -> None:
    from click.testing import CliRunner

    from piworkflows.cli import main

    assert CliRunner().invoke(main, ["secrets", "set", "TOKEN"], input="").exit_code == 2
    assert CliRunner().invoke(main, ["secrets", "set", "bad name"], input="x").exit_code == 2
    path = write(config_dir, {"secrets": {"KEEP": "v"}}, mode=0o644)
    refused = CliRunner().invoke(main, ["secrets", "set", "TOKEN"], input=SECRET)
    assert refused.exit_code == 1 and "chmod 600" in refused.output and SECRET not in refused.output
    assert json.loads(path.read_text()) == {"secrets": {"KEEP": "v"}}


@pytest.mark.parametrize("value", ["two\nlines", "carriage\rreturn", "nul\x00byte", "caf\u00e9", "bell\x07"])
def test_secrets_set_refuses_a_value_no_header_can_carry_and_writes_nothing(config_dir: Path, value: str) -> None:
    from click.testing import CliRunner

    from piworkflows.cli import main

    refused = CliRunner().invoke(main, ["secrets", "set", "TOKEN"], input=value + "\n")
    assert refused.exit_code == 2, refused.output
    assert "printable ASCII" in refused.output and value not in refused.output
    assert not (config_dir / "credentials.json").exists()
    with pytest.raises(CredentialsError, match="printable ASCII"):
        store_secret("TOKEN", value)
    tabbed = CliRunner().invoke(main, ["secrets", "set", "TOKEN"], input="Bearer\tabc def")
    assert tabbed.exit_code == 0, tabbed.output  # a tab or a space inside is a valid header value

"""load_secret: the private credentials file and its refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from piworkflows import paths
from piworkflows.credentials import CredentialsError, load_secret

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

"""Shared fixtures: every test gets a private HOME and state dir (never the real ~/.pi)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from piworkflows.agents import pi
from piworkflows.clock import FakeClock
from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.writer.db import GroupExecutor, open_database


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PI_WORKFLOWS_STATE_DIR", raising=False)
    monkeypatch.delenv("PIW_FAULTS", raising=False)
    return home


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    return StatePaths.resolve(tmp_path / "state")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def executor(paths: StatePaths, settings: Settings, clock: FakeClock):
    conn = open_database(paths, settings, clock)
    yield GroupExecutor(conn, settings, clock)
    conn.close()


@pytest.fixture(scope="session")
def pi_command(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The Pi the agent tests run: PI_WORKFLOWS_PI_COMMAND if set, else the copy `pi-workflows setup
    pi` installed, else one installed now (once per test session). Tests point HOME elsewhere, so
    they pass this command explicitly."""
    configured = os.environ.get("PI_WORKFLOWS_PI_COMMAND")
    if configured:
        return [configured]
    installed = pi.installed_command(pi.install_dir())
    if pi.installed_version(pi.install_dir()) == pi.PI_VERSION:
        return [str(installed)]
    command, _ = pi.install(tmp_path_factory.mktemp("pi"), lambda line: None)
    return [str(command)]

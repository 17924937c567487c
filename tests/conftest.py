"""Shared fixtures: every test gets a private HOME and state dir (never the real ~/.pi)."""

from __future__ import annotations

from pathlib import Path

import pytest

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

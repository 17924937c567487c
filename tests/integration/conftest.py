"""Fixtures of the integration modules: a project, a private config dir, the outside world's ledger, a server.

A module whose server needs other settings marks itself (``pytestmark``) or a test with
``server_env(**env)``; the test's own mark wins over its module's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stress.ledger import LedgerServer
from tests.server_util import SCHEDULER_TICK, ServerProcess, marked_env, serving


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory with an empty ``.pi/workflows``."""
    root = tmp_path / "proj"
    (root / ".pi" / "workflows").mkdir(parents=True)
    return root


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """A private config dir (never the user's): where ``credentials.json`` is read."""
    path = tmp_path / "cfg"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def ledger() -> Iterator[LedgerServer]:
    """The outside world: every request recorded, answered as the test scripts it (default 200).
    Requested before ``server``, it stops after the server (a hanging request stays open until then)."""
    with LedgerServer() as ledger:
        yield ledger


@pytest.fixture
def server(tmp_path: Path, config_dir: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A server on a short state dir (the Unix socket path limit) with the private config dir and a
    100 ms scheduler tick, plus the settings of the ``server_env`` marks. It must stop with exit code 0
    and its state is checked after it stopped."""
    env = {**SCHEDULER_TICK, "PI_WORKFLOWS_CONFIG_DIR": str(config_dir), **marked_env(request)}
    with serving(tmp_path / "s", env) as proc:
        yield proc

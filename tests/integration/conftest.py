from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory with an empty ``.pi/workflows``."""
    root = tmp_path / "proj"
    (root / ".pi" / "workflows").mkdir(parents=True)
    return root

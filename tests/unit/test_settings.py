"""Settings cross process boundaries through the environment."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(30)


def test_settings_pass_to_children_without_inventing_values():
    """An unset optional setting stays unset in a child (it once became the string "None")."""
    from piworkflows.settings import Settings

    env = Settings().to_env()
    assert "PI_WORKFLOWS_SQL_TRACE_PATH" not in env
    assert Settings.from_env(env) == Settings()
    assert Settings.from_env(Settings(sql_trace_path="/tmp/t", max_runners=2).to_env()).max_runners == 2

"""``pi-workflows doctor`` with the real Pi against the scripted model (no network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from piworkflows.testing.scripted_model import ScriptedModel

pytestmark = pytest.mark.timeout(120)


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "piworkflows.cli", "doctor", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_doctor_reports_pi_and_the_model_answering_its_probe(tmp_path: Path, pi_command: list[str]) -> None:
    with ScriptedModel({"probe": [{"text": "OK"}]}) as model:
        env = {
            "HOME": str(tmp_path),
            "PI_WORKFLOWS_PI_COMMAND": pi_command[0],
            "PI_CODING_AGENT_DIR": str(model.write_pi_config(tmp_path / "pi")),
            "PI_WORKFLOWS_AGENT_MODEL": "scripted/probe",
        }
        done = doctor(env)
        asked = [request["model"] for request in model.requests]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if not line.startswith(" "))
    assert lines["pi"].strip().startswith(f"0.73.1 ({pi_command[0]}, PI_WORKFLOWS_PI_COMMAND)")
    assert lines["model"].strip() == "scripted/probe"
    assert lines["probe"].strip() == "answered (OK)"
    assert asked == ["probe"]  # one request, to the configured model


def test_doctor_exits_1_naming_the_fix_without_pi(tmp_path: Path) -> None:
    done = doctor({"HOME": str(tmp_path), "PI_WORKFLOWS_PI_COMMAND": str(tmp_path / "missing-pi")}, "--offline")
    assert done.returncode == 1
    assert "pi:         does not run" in done.stdout and "probe:      skipped" in done.stdout


def test_doctor_prints_pis_own_cause_when_the_model_has_no_key(tmp_path: Path, pi_command: list[str]) -> None:
    """Pi says why first and then where its docs are: doctor shows the why and the way on."""
    env = {
        "HOME": str(tmp_path),
        "PI_WORKFLOWS_PI_COMMAND": pi_command[0],
        "PI_CODING_AGENT_DIR": str(tmp_path / "empty-pi"),
        "PI_WORKFLOWS_AGENT_MODEL": "anthropic/claude-sonnet-4-5",
        "ANTHROPIC_API_KEY": "",
    }
    done = doctor(env)
    assert done.returncode == 1, done.stdout + done.stderr
    probe = next(line for line in done.stdout.splitlines() if line.startswith("probe:"))
    assert probe == "probe:      failed: No API key found for anthropic."
    assert "'pi-workflows doctor' again" in done.stdout

"""The short bounded crash run CI makes (docs/STRESS.md): two fixed seeds, every target kind and
every fault point, agent runs on the real Pi against the harness's scripted model and decision runs
answered through the fake Telegram Bot API (the adapter a kill target) among the load, ending with
nothing lost, duplicated, violated or stuck: every press one submission, no decision sent twice to
a chat, every decision run ended. A fixed seed fixes the schedule of kills and operations (not
their timing); random seeds are for developers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(400)


@pytest.mark.parametrize("seed", [11, 12])
def test_a_short_crash_run_loses_and_duplicates_nothing(tmp_path: Path, seed: int, pi_command: list[str]):
    command = [
        sys.executable,
        "-m",
        "stress.crash",
        "--seconds",
        "25",
        "--seed",
        str(seed),
        "--state-dir",
        str(tmp_path / "state"),
        "--json",
    ]  # default targets and fault points: all; two clients keep an agent run going; --telegram
    env = {**os.environ, "PI_WORKFLOWS_PI_COMMAND": pi_command[0]}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=380, env=env)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and report["ok"], json.dumps(report, indent=1) + done.stderr[-4000:]
    assert report["killsTotal"] > 0 and report["commands"]["acknowledged"] > 0
    assert report["commands"]["lost"] == report["effects"]["duplicated"] == report["violations"] == 0
    assert report["agents"]["runs"] > 0 and report["agents"]["requestsAccepted"] > 0
    telegram = report["telegram"]
    assert telegram["decisionRuns"] > 0 and telegram["presses"] > 0
    assert sum(telegram["submissions"].values()) == telegram["presses"]  # each press one submission
    assert telegram["cursor"] == telegram["lastUpdate"] + 1

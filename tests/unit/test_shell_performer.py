"""The shell performer when the command's process group cannot be recorded (host.json unwritable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from piworkflows.performers import shell


@pytest.mark.parametrize(("policy", "settlement"), [("idempotent", "retry"), ("manual", "rejected")])
def test_a_command_whose_group_cannot_be_recorded_never_runs(tmp_path: Path, policy: str, settlement: str):
    marker = tmp_path / "ran"
    payload = shell.payload({"command": "touch", "args": [str(marker)]}, max_output_chars=100,
                            allow_non_zero_exit=False)  # fmt: skip
    seen: list[int] = []

    def refuse(pid: int) -> bool:
        seen.append(pid)
        return False

    outcome = shell.ShellPerformer().perform(payload, "key-1", policy, refuse)
    assert seen and not marker.exists()
    # nothing ran: an idempotent effect is tried again later, a manual one is not repeated on its own
    assert outcome.settlement == settlement and outcome.error_code == "spawnFailed"

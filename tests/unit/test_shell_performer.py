"""The shell performer: a command whose process group cannot be recorded (host.json unwritable) never runs;
each output stream is kept whole up to the stream cap, whatever the node's output bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from piworkflows.performers import Stream, shell


@pytest.mark.parametrize(("policy", "settlement"), [("idempotent", "retry"), ("manual", "rejected")])
def test_a_command_whose_group_cannot_be_recorded_never_runs(tmp_path: Path, policy: str, settlement: str):
    marker = tmp_path / "ran"
    payload = shell.payload(
        {"command": "touch", "args": [str(marker)]}, max_output_chars=100, allow_non_zero_exit=False
    )
    seen: list[int] = []

    def refuse(pid: int) -> bool:
        seen.append(pid)
        return False

    outcome = shell.ShellPerformer(stream_max_bytes=1 << 20).perform(payload, "key-1", policy, refuse)
    assert seen and not marker.exists()
    # nothing ran: an idempotent effect is tried again later, a manual one is not repeated on its own
    assert outcome.settlement == settlement and outcome.error_code == "spawnFailed"


def accept(pid: int) -> bool:
    return True


def printing(stdout_bytes: int, max_output_chars: int) -> dict:
    """A command writing ``stdout_bytes`` of digits and lines to stdout and a line to stderr."""
    script = (
        f"import sys; sys.stdout.write(''.join(f'{{i:09d}}\\n' for i in range({stdout_bytes // 10}))); "
        "sys.stderr.write('done\\n')"
    )
    return shell.payload(
        {"command": sys.executable, "args": ["-c", script]},
        max_output_chars=max_output_chars,
        allow_non_zero_exit=False,
    )


def expected_stdout(stdout_bytes: int) -> bytes:
    return "".join(f"{i:09d}\n" for i in range(stdout_bytes // 10)).encode()


def test_each_stream_is_kept_whole_up_to_the_cap_whatever_max_output_chars_is():
    outcome = shell.ShellPerformer(stream_max_bytes=1 << 20).perform(
        printing(300_000, 50), "key-1", "idempotent", accept
    )
    assert outcome.settlement == "applied"
    assert outcome.streams["stdout"] == Stream(expected_stdout(300_000), 300_000)
    assert outcome.streams["stderr"] == Stream(b"done\n", 5)
    output = outcome.result["output"]
    assert output["stdout"] == expected_stdout(300_000)[:50].decode()  # the node's output value stays bounded
    assert output["stderr"] == "done\n"


def test_beyond_the_cap_a_stream_is_read_to_its_end_and_the_cut_counted():
    outcome = shell.ShellPerformer(stream_max_bytes=1000).perform(
        printing(300_000, 100_000), "key-1", "idempotent", accept
    )
    assert outcome.settlement == "applied" and outcome.result["output"]["exitCode"] == 0  # never blocked on a pipe
    assert outcome.streams["stdout"] == Stream(expected_stdout(300_000)[:1000], 300_000)
    assert outcome.result["output"]["stdout"] == expected_stdout(1000).decode()  # the cap bounds the output too

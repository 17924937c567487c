"""``pi-workflows run logs`` on real servers: a shell step's complete stdout and stderr.

The outbox worker stores each stream as a content-addressed text blob (in parts when it is larger
than one frame) before it settles, the settlement links the blobs to the run (``run_view_content``),
and the CLI reads them back in verified parts through ``run.logs``. Checked through the CLI's own
bytes: a 5 MB stdout printed completely and identically, the stream cap, ``--follow`` printing each
step as it finishes, and prune taking the stream blobs with the run.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from piworkflows.isotime import epoch_ms
from tests.engine_util import start, view, wait_status, write
from tests.server_util import ServerProcess, query, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]

# Some 5.2 MB of UTF-8 (two- to four-byte characters too) on stdout in whole lines, a little on stderr.
BIG_SCRIPT = """
import sys
lines = [f"line {i:07d} \\u00e9\\u00e8 \\u2713 \\U0001f600 {'x' * (i % 61)}\\n" for i in range(96_000)]
sys.stdout.write("".join(lines))
sys.stderr.write("warning: this went to stderr\\n")
"""

# One shell node whose command the input names; the node's output keeps only 100 characters.
TALK = """
import sys
from piworkflows.workflows import define_workflow, idempotent_effect, shell
workflow = define_workflow("talk", "talk", {
    "talk": shell(effect=idempotent_effect("test.talk"), max_output_chars=100,
                  exec=lambda ctx: {"command": sys.executable, "args": ["-c", ctx.input["script"]]}),
})
"""

# Three steps; each waits for its flag file (polling with a deadline). The middle one is a shell command.
GATED = """
import os, time
from piworkflows.workflows import compute, define_workflow, edge, idempotent_effect, shell
def gate(name):
    def run(ctx):
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(ctx.input["dir"], name)):
            if time.monotonic() > deadline:
                raise TimeoutError(name)
            time.sleep(0.02)
        return {"passed": name}
    return run
WAIT_TWO = 'while [ ! -e "$1/two" ]; do sleep 0.02; done; echo "two passed"'
workflow = define_workflow("gated", "one", {
    "one": compute(gate("one")),
    "two": shell(effect=idempotent_effect("test.gate"),
                 exec=lambda ctx: {"command": "sh", "args": ["-c", WAIT_TWO, "sh", ctx.input["dir"]]}),
    "three": compute(gate("three")),
}, [edge("one", "two"), edge("two", "three")])
"""


def expected_output(script: str) -> subprocess.CompletedProcess[bytes]:
    """What the command writes, run here the same way."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, check=True, timeout=60)


def run_talk(server: ServerProcess, project: Path, script: str) -> tuple[str, dict[str, Any]]:
    write(project, "talk", TALK)
    run_id = start(server, project, "talk", {"script": script})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    return run_id, done


def stream_digests(server: ServerProcess, run_id: str) -> set[str]:
    """The stream blobs the run's steps name, from ``run logs --json``."""
    shown = server.cli("run", "logs", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return {
        reference["digest"].removeprefix("sha256:")
        for line in shown.stdout.splitlines()
        for reference in (json.loads(line)["streams"] or {}).values()
        if reference["digest"]
    }


def test_run_logs_prints_a_5_mb_stdout_completely_and_identically(server, project):
    expected = expected_output(BIG_SCRIPT)
    assert len(expected.stdout) > 5_000_000
    run_id, done = run_talk(server, project, BIG_SCRIPT)
    assert len(done["state"]["finalOutput"]["stdout"]) == 100  # the node's output value stays bounded

    raw = server.cli("run", "logs", run_id, "--stdout", text=False)
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == expected.stdout
    raw_err = server.cli("run", "logs", run_id, "talk", "--stderr", text=False)
    assert raw_err.returncode == 0 and raw_err.stdout == expected.stderr

    shown = server.cli("run", "logs", run_id, text=False)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.split(b"\n")
    assert lines[0].startswith(b"== step 0: talk (shell) visit 1 attempt 1: completed in ")
    assert lines[1] == f"-- stdout: {len(expected.stdout):,} bytes --".encode()
    stdout_starts = len(lines[0]) + len(lines[1]) + 2
    assert shown.stdout[stdout_starts : stdout_starts + len(expected.stdout)] == expected.stdout
    after = shown.stdout[stdout_starts + len(expected.stdout) :].decode()
    assert after.startswith(f"-- stderr: {len(expected.stderr)} bytes --\n{expected.stderr.decode()}-- output --\n")
    assert json.loads(after.split("-- output --\n")[1])["stdout"] == done["state"]["finalOutput"]["stdout"]

    (line,) = server.cli("run", "logs", run_id, "--json").stdout.splitlines()
    step = json.loads(line)
    assert (step["stdout"], step["stderr"]) == (expected.stdout.decode(), expected.stderr.decode())
    assert step["streams"]["stdout"] == {
        "digest": "sha256:" + hashlib.sha256(expected.stdout).hexdigest(),
        "mediaType": "text/plain;charset=utf-8",
        "byteLength": len(expected.stdout),
        "keptBytes": len(expected.stdout),
        "seenBytes": len(expected.stdout),
    }
    # the blobs are linked to the run, which keeps them as long as it exists
    linked = query(server, "SELECT byte_length FROM run_view_content WHERE run_id = ? ORDER BY byte_length", run_id)
    assert linked == [(len(expected.stderr),), (len(expected.stdout),)]


@pytest.mark.server_env(PI_WORKFLOWS_SHELL_STREAM_MAX_BYTES="1000")
def test_a_stream_over_the_cap_keeps_its_start_and_says_how_much_was_cut(server, project):
    script = "import sys; sys.stdout.write(''.join(f'{i:09d}\\n' for i in range(500)))"
    expected = expected_output(script).stdout
    assert len(expected) == 5000
    run_id, _ = run_talk(server, project, script)

    raw = server.cli("run", "logs", run_id, "--stdout", text=False)
    assert raw.returncode == 0 and raw.stdout == expected[:1000]
    shown = server.cli("run", "logs", run_id)
    assert shown.returncode == 0, shown.stderr
    kept = expected[:1000].decode()
    assert f"-- stdout: 5,000 bytes --\n{kept}-- stdout cut: 4,000 bytes not kept (the cap is 1,000 bytes) --\n" in (
        shown.stdout
    )
    step = json.loads(server.cli("run", "logs", run_id, "--json").stdout)
    assert (step["streams"]["stdout"]["keptBytes"], step["streams"]["stdout"]["seenBytes"]) == (1000, 5000)


class Follower:
    """``run logs --follow`` in the background, its output lines collected as they come."""

    def __init__(self, server: ServerProcess, run_id: str) -> None:
        command = server.cli_command("run", "logs", run_id, "--follow")
        self.proc = subprocess.Popen(
            command, env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.decode())

    def printed(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.lines)


def test_follow_prints_each_step_as_it_finishes_and_exits_when_the_run_completes(server, project, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    write(project, "gated", GATED)
    run_id = start(server, project, "gated", {"dir": str(flags)})
    follower = Follower(server, run_id)
    try:
        (flags / "one").touch()
        wait_until(lambda: follower.printed("== step 0: one (compute) visit 1 attempt 1: completed"), what="step one")
        assert not follower.printed("== step 1") and follower.proc.poll() is None  # two waits for its flag
        assert view(server, run_id)["state"]["steps"][1]["status"] == "running"

        (flags / "two").touch()
        wait_until(lambda: follower.printed("== step 1: two (shell) visit 1 attempt 1: completed"), what="step two")
        wait_until(lambda: "two passed\n" in follower.lines, what="step two's stdout")
        assert not follower.printed("== step 2") and follower.proc.poll() is None

        (flags / "three").touch()
        assert follower.proc.wait(timeout=60) == 0, follower.proc.stderr.read() if follower.proc.stderr else ""
        follower.reader.join(timeout=10)
    finally:
        if follower.proc.poll() is None:
            follower.proc.kill()
            follower.proc.wait()
    headers = [line.split(":")[0] for line in follower.lines if line.startswith("== ")]
    assert headers == ["== step 0", "== step 1", "== step 2", f"== {run_id} completed\n"]


def test_prune_of_a_run_takes_its_stream_blobs_and_leaves_another_runs(server, project, tmp_path):
    first, _ = run_talk(server, project, "print('the first run speaks')")
    first_streams = stream_digests(server, first)
    assert len(first_streams) == 1
    finished = epoch_ms(view(server, first)["queue"]["finishedAt"])
    wait_until(lambda: time.time() * 1000 > finished + 1, what="a later millisecond")
    cutoff = datetime.datetime.fromtimestamp((finished + 1) / 1000, datetime.UTC).isoformat()
    second, _ = run_talk(server, project, "import sys; print('the second run speaks'); print('oops', file=sys.stderr)")
    second_streams = stream_digests(server, second)
    assert len(second_streams) == 2 and not first_streams & second_streams
    second_logs = server.cli("run", "logs", second, text=False).stdout

    # a content read names the run, the digest and the media type of a link: anything else is notFound
    digest = "sha256:" + next(iter(first_streams))
    with server.client() as client:
        other_run = client.request(
            "run.logs", {"content": {"digest": digest, "mediaType": "text/plain;charset=utf-8"}}, run_id=second
        )
        other_type = client.request(
            "run.logs", {"content": {"digest": digest, "mediaType": "application/json"}}, run_id=first
        )
    for refused in (other_run, other_type):
        assert (refused.outcome, refused.receipt["code"]) == ("notFound", "contentNotFound"), refused

    def blobs() -> set[str]:
        return {row[0].hex() for row in query(server, "SELECT digest FROM blobs")}

    before = blobs()
    assert first_streams | second_streams <= before
    pruned = server.cli(
        "state", "prune", "--before", cutoff, "--backup", str(tmp_path / "b" / "before.sqlite"), "--apply", "--json"
    )
    assert pruned.returncode == 0, pruned.stderr
    receipt = json.loads(pruned.stdout)
    assert receipt["eligible"] == [first] and receipt["deleted"]["runs"] == 1
    after = blobs()
    assert not first_streams & after  # the first run's streams went with it
    assert second_streams <= after
    assert query(server, "SELECT count(*) FROM run_view_content WHERE run_id = ?", first) == [(0,)]
    assert server.cli("run", "logs", second, text=False).stdout == second_logs  # the other run is untouched
    gone = server.cli("run", "logs", first)
    assert gone.returncode == 1 and "notFound (runNotFound)" in gone.stderr
    verified = server.cli("state", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr

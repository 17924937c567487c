"""Effects end to end: ``shell`` and ``action`` nodes run through the transactional outbox.

Each node reserves its effect (one ``effects`` row per node visit, keyed by
``[runId, effectType, nodePath, visit]``), the supervisor claims it (a numbered
``effect_attempts`` row) for an outbox worker, which performs it (the runner
waits), or for the runner itself (an action body), and settles it. These tests
drive real servers and check the outcome three ways: the run view, the SQLite
rows (read-only), and the processes themselves (host.json and psutil).

Workflows that must block do so in a shell command that polls for a flag file
(with a deadline), so a test can kill a runner or cancel the run while the
command is applying, then let it go by creating the flag.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from piworkflows import canonical
from piworkflows.writer.views.display import AMBIGUOUS
from tests.engine_util import (
    effect_attempts,
    effect_content,
    effect_row,
    node_attempts,
    run_phases,
    start,
    view,
    wait_status,
    write,
)
from tests.server_util import ServerProcess, query, stays, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

FINISHED = ("completed", "failed", "timed_out", "cancelled")

# --- workflows -------------------------------------------------------------------

ECHO = """
from piworkflows.workflows import compute, define_workflow, edge, idempotent_effect, shell
workflow = define_workflow("echo", "say", {
    "say": shell(effect=idempotent_effect("test.echo"),
                 exec=lambda ctx: {"command": "sh", "args": ["-c", "echo out-$1; echo err >&2", "sh",
                                                             ctx.input["word"]]}),
    "after": compute(lambda ctx: {"heard": ctx.outputs["say"]["stdout"].strip(), "say": ctx.outputs["say"]}),
}, [edge("say", "after")])
"""

EXIT3 = """
from piworkflows.workflows import define_workflow, idempotent_effect, shell
workflow = define_workflow("{name}", "fail", {{
    "fail": shell(effect=idempotent_effect("test.exit"), allow_non_zero_exit={allow},
                  exec=lambda ctx: {{"command": "sh", "args": ["-c", "echo partial; echo broken >&2; exit 3"]}}),
}})
"""

PARSED = """
from piworkflows.workflows import define_workflow, idempotent_effect, shell
workflow = define_workflow("parsed", "count", {
    "count": shell(effect=idempotent_effect("test.count"),
                   exec=lambda ctx: {"command": "printf", "args": ["a\\nb\\nc\\n"]},
                   parse=lambda out: {"lines": out["stdout"].splitlines(), "code": out["exitCode"]}),
})
"""

# A unique argument, so the test can look for a leftover `sleep` process by its command line.
SLEEP_ARG = "30.4242"
SLEEPY = """
from piworkflows.workflows import define_workflow, {effect}, shell
workflow = define_workflow("{name}", "nap", {{
    "nap": shell(effect={effect}("test.nap"),
                 exec=lambda ctx: {{"command": "sleep", "args": ["{arg}"], "timeoutMs": 300}}),
}})
"""

ACTIONS = """
from piworkflows.workflows import action, define_workflow, idempotent_effect
def act(ctx):
    if ctx.input.get("fail"):
        raise RuntimeError("the outside system said no")
    return {"booked": ctx.input["what"]}
workflow = define_workflow("book", "book", {
    "book": action(effect=idempotent_effect("test.book"), run=act),
})
"""

# Blocks until FLAG exists (about 60 s at most, then exit 7), then appends one line to LEDGER.
WAIT_SCRIPT = 'i=0; while [ ! -e "$1" ]; do i=$((i+1)); [ $i -gt 3000 ] && exit 7; sleep 0.02; done; echo done >> "$2"'
BLOCKING = """
from piworkflows.workflows import compute, define_workflow, edge, {effect}, shell
workflow = define_workflow("{name}", "cmd", {{
    "cmd": shell(effect={effect}("test.ledger"),
                 exec=lambda ctx: {{"command": "sh", "args": ["-c", {script!r}, "sh", ctx.input["flag"],
                                                            ctx.input["ledger"]], "timeoutMs": 90_000}}),
    "after": compute(lambda ctx: {{"ran": ctx.outputs["cmd"]["exitCode"] == 0}}),
}}, [edge("cmd", "after")])
"""

# Counts its runs: one line "started" in LEDGER as it begins, then as WAIT_SCRIPT.
COUNTED_SCRIPT = 'echo started >> "$2"; ' + WAIT_SCRIPT

# Like BLOCKING, but the command's arguments include the content of a file the test changes,
# so a retried attempt asks for a different effect under the same key.
CHANGING = f"""
from pathlib import Path
from piworkflows.workflows import define_workflow, idempotent_effect, shell
def command(ctx):
    version = Path(ctx.input["version"]).read_text()
    return {{"command": "sh", "args": ["-c", {WAIT_SCRIPT!r}, "sh", ctx.input["flag"], ctx.input["ledger"], version],
            "timeoutMs": 90_000}}
workflow = define_workflow("changing", "cmd", {{"cmd": shell(effect=idempotent_effect("test.changing"), exec=command)}})
"""


def blocking(name: str, effect: str) -> str:
    return BLOCKING.format(name=name, effect=effect, script=WAIT_SCRIPT)


# --- helpers -----------------------------------------------------------------------


def effect_result(server: ServerProcess, run_id: str) -> Any:
    """The stored result of the run's outside effect (a JSON blob)."""
    media_type, data = effect_content(server, run_id, "result")
    assert media_type == "application/json", media_type
    return json.loads(data)


def commands(server: ServerProcess) -> list[int]:
    """Command process groups the supervisor has recorded in host.json."""
    return server.child_pids("command")


def live_runner_pid(server: ServerProcess, run_id: str) -> int:
    rows = query(server, "SELECT pid FROM run_workers WHERE run_id = ? AND ended_at IS NULL", run_id)
    assert len(rows) == 1 and rows[0][0] is not None, rows
    return int(rows[0][0])


def group_gone(pgid: int) -> bool:
    """No live (non-zombie) process is left in the process group."""
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error):
            continue
    return True


def processes_with_cmdline(cmdline: list[str]) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


def start_with_files(server: ServerProcess, project: Path, name: str, source: str, flag: Path, ledger: Path) -> str:
    """Write ``source`` as ``name`` and start it with its input naming the flag and ledger files."""
    write(project, name, source)
    return start(server, project, name, {"flag": str(flag), "ledger": str(ledger)})


def block_on_command(server: ServerProcess, run_id: str) -> int:
    """Wait until the run's shell command is recorded and applying; returns its group leader pid."""
    pid = wait_until(lambda: (pids := commands(server)) and pids[-1], what="the command recorded in host.json")
    wait_until(lambda: effect_attempts(server, run_id) == [(1, "applying")], what="effect attempt 1 applying")
    assert not group_gone(pid)
    return pid


# --- shell: output, exit codes, parse ---------------------------------------------


def test_shell_output_reaches_the_next_node_and_the_effect_is_applied_once(server, project):
    write(project, "echo", ECHO)
    run_id = start(server, project, "echo", {"word": "hi"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    output = done["state"].get("finalOutput")
    assert output["heard"] == "out-hi"
    say = output["say"]
    assert set(say) == {"stdout", "stderr", "exitCode", "signal", "durationMs"}
    assert (say["stdout"], say["stderr"], say["exitCode"], say["signal"]) == ("out-hi\n", "err\n", 0, None)
    assert isinstance(say["durationMs"], int) and say["durationMs"] >= 0
    assert [(s["nodeId"], s["nodeType"], s["status"]) for s in done["state"]["steps"]] == [
        ("say", "shell", "completed"),
        ("after", "compute", "completed"),
    ]

    effect = effect_row(server, run_id)
    assert effect["type"] == "test.echo" and effect["policy"] == "idempotent"
    assert effect["key"] == canonical.dumps([run_id, "test.echo", "say", 1])
    assert (effect["status"], effect["attempts"], effect["errorCode"]) == ("applied", 1, None)
    assert effect_attempts(server, run_id) == [(1, "applied")]
    assert commands(server) == []  # the finished command's group was forgotten


def test_a_non_zero_exit_fails_the_run_and_rejects_the_effect(server, project):
    write(project, "strict", EXIT3.format(name="strict", allow=False))
    run_id = start(server, project, "strict")
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "failed"
    assert done["piworkflows"]["errorCode"] == "nonZeroExit"
    # the run's error names it
    assert done["state"]["error"] == "node 'fail': the command failed (exit code 3): broken"
    assert [(s["nodeId"], s["status"], s["errorCode"]) for s in done["state"]["steps"]] == [
        ("fail", "failed", "nonZeroExit")
    ]
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"], effect["errorCode"]) == ("rejected", 1, "nonZeroExit")
    assert effect_attempts(server, run_id) == [(1, "rejected")]
    # The failed node keeps the command's output (the rejected effect's result), its error the node's own text.
    output, error = query(
        server,
        "SELECT o.bytes, e.bytes FROM node_attempts a JOIN blobs o ON o.digest = "
        "a.output_digest JOIN blobs e ON e.digest = a.error_digest WHERE a.run_id = ?",
        run_id,
    )[0]
    assert json.loads(output)["stdout"] == "partial\n" and json.loads(output)["exitCode"] == 3
    assert error.decode() == "the command failed (exit code 3): broken"
    assert effect_result(server, run_id)["output"]["stderr"] == "broken\n"


def test_allow_non_zero_exit_completes_with_the_exit_code_in_the_output(server, project):
    write(project, "lenient", EXIT3.format(name="lenient", allow=True))
    run_id = start(server, project, "lenient")
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    output = done["state"]["finalOutput"]
    assert output["exitCode"] == 3 and output["signal"] is None
    assert (output["stdout"], output["stderr"]) == ("partial\n", "broken\n")
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"], effect["errorCode"]) == ("applied", 1, None)


def test_parse_turns_the_shell_output_into_the_node_output(server, project):
    write(project, "parsed", PARSED)
    run_id = start(server, project, "parsed")
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"lines": ["a", "b", "c"], "code": 0}
    assert effect_row(server, run_id)["status"] == "applied"


# --- shell: timeouts ---------------------------------------------------------------


def test_an_idempotent_timeout_kills_the_command_and_times_the_run_out(server, project):
    write(project, "nap", SLEEPY.format(name="nap", effect="idempotent_effect", arg=SLEEP_ARG))
    run_id = start(server, project, "nap")
    done = wait_status(server, run_id, "completed", "failed", "timed_out")
    assert done["display"]["status"] == "timed_out"
    assert [(s["nodeId"], s["status"], s["outcome"]) for s in done["state"]["steps"]] == [
        ("nap", "timed_out", "timed_out")
    ]
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"]) == ("applied", 1)
    assert effect_attempts(server, run_id) == [(1, "applied")]
    result = effect_result(server, run_id)  # the kill is the recorded result
    assert result["nodeOutcome"] == "timed_out"
    assert (result["output"]["exitCode"], result["output"]["signal"]) == (None, "SIGKILL")
    assert 300 <= result["output"]["durationMs"] < 20_000
    assert processes_with_cmdline(["sleep", SLEEP_ARG]) == []
    assert commands(server) == []


def test_a_manual_timeout_makes_the_effect_ambiguous_and_parks_the_run(server, project):
    write(project, "napm", SLEEPY.format(name="napm", effect="manual_effect", arg=SLEEP_ARG))
    run_id = start(server, project, "napm")
    parked = wait_status(server, run_id, "ambiguous", "completed", "failed", "timed_out")
    assert parked["display"]["status"] == "ambiguous"
    assert parked["display"]["reason"] == AMBIGUOUS and parked["display"]["controls"] == ["review"]
    wait_until(lambda: view(server, run_id)["piworkflows"]["parkReason"] == "effectAmbiguous", what="run parked")
    assert run_phases(server, run_id) == ("running", "effectAmbiguous", "parked")
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["policy"], effect["attempts"]) == ("ambiguous", "manual", 1)
    assert effect["errorCode"] == "timedOut"
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]
    assert node_attempts(server, run_id, "nap") == [(1, "interrupted")]  # the runner exited; an operator decides
    assert processes_with_cmdline(["sleep", SLEEP_ARG]) == []
    assert commands(server) == []


# --- action nodes ---------------------------------------------------------------------


def test_an_action_body_result_is_the_node_output(server, project):
    write(project, "book", ACTIONS)
    run_id = start(server, project, "book", {"what": "a table"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"booked": "a table"}
    effect = effect_row(server, run_id)
    assert (effect["type"], effect["status"], effect["attempts"]) == ("test.book", "applied", 1)
    assert effect_attempts(server, run_id) == [(1, "applied")]


def test_an_exception_in_an_action_body_fails_the_run_and_rejects_the_effect(server, project):
    write(project, "book", ACTIONS)
    run_id = start(server, project, "book", {"what": "a table", "fail": True})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "failed"
    # the run's error names it
    assert done["state"]["error"] == "node 'book': RuntimeError: the outside system said no"
    assert done["piworkflows"]["errorCode"] == "actionFailed"
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"], effect["errorCode"]) == ("rejected", 1, "actionFailed")
    assert effect_attempts(server, run_id) == [(1, "rejected")]


# --- the process that runs the command killed (an outbox worker), or the runner awaiting it --------


def performer_of(command: int) -> int:
    """The process running the command: its parent, an outbox worker (never the runner)."""
    worker = psutil.Process(command).parent()
    assert worker is not None and "piworkflows.outbox" in " ".join(worker.cmdline()), worker
    return worker.pid


def test_kill_9_of_the_worker_retries_an_idempotent_command_under_the_same_key(server, project, tmp_path):
    flag, ledger = tmp_path / "flag", tmp_path / "ledger.txt"
    run_id = start_with_files(server, project, "ledger", blocking("ledger", "idempotent_effect"), flag, ledger)
    first = block_on_command(server, run_id)
    runner = live_runner_pid(server, run_id)

    os.kill(performer_of(first), signal.SIGKILL)
    wait_until(lambda: group_gone(first), what="the first command's group killed")
    # Pending again at a backoff time, then claimed by a (restarted) worker: attempt 2, a new command.
    wait_until(
        lambda: effect_attempts(server, run_id) == [(1, "ambiguous"), (2, "applying")], what="effect attempt 2 applying"
    )
    second = wait_until(lambda: [p for p in commands(server) if p != first], what="the second command")[0]
    assert first not in commands(server)
    assert not ledger.exists()  # the first attempt never got past the flag
    retry = query(
        server,
        "SELECT a.retry_at - a.ended_at, a.error_code FROM effect_attempts a JOIN effects e "
        "USING (effect_id) WHERE e.run_id = ? AND a.attempt_number = 1",
        run_id,
    )
    assert retry[0][1] == "uncertainAttempt" and 0 <= retry[0][0] <= 100  # base 100 ms: drawn from [50, 100]

    flag.write_text("go")
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"ran": True}
    assert ledger.read_text() == "done\n"  # exactly one line: only the completed attempt wrote
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"]) == ("applied", 2)
    assert effect_attempts(server, run_id) == [(1, "ambiguous"), (2, "applied")]
    # The runner only waited: the same node attempt completed, with the same runner.
    assert node_attempts(server, run_id, "cmd") == [(1, "completed")]
    assert query(server, "SELECT pid FROM run_workers WHERE run_id = ?", run_id) == [(runner,)]
    wait_until(lambda: group_gone(second), what="the second command's group ended")
    assert commands(server) == []


def test_kill_9_of_the_worker_parks_a_manual_command_as_ambiguous(server, project, tmp_path):
    flag, ledger = tmp_path / "flag", tmp_path / "ledger.txt"
    run_id = start_with_files(server, project, "ledgerm", blocking("ledgerm", "manual_effect"), flag, ledger)
    first = block_on_command(server, run_id)

    os.kill(performer_of(first), signal.SIGKILL)
    wait_until(lambda: group_gone(first), what="the command's group killed")
    parked = wait_until(
        lambda: (v := view(server, run_id))["piworkflows"]["parkReason"] == "effectAmbiguous" and v,
        what="run parked effectAmbiguous",
    )
    assert parked["display"]["status"] == "ambiguous" and parked["display"]["reason"] == AMBIGUOUS
    assert parked["display"]["controls"] == ["review"]

    flag.write_text("go")

    def still_parked() -> bool:
        live = query(server, "SELECT count(*) FROM run_workers WHERE run_id = ? AND ended_at IS NULL", run_id)
        parked = run_phases(server, run_id) == ("running", "effectAmbiguous", "parked")
        return parked and live == [(0,)] and commands(server) == []

    stays(still_parked, 1.0, "the parked run")  # no runner, no new attempt: only an operator decides
    assert not ledger.exists()  # no second command ran
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["policy"], effect["attempts"]) == ("ambiguous", "manual", 1)
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]
    assert node_attempts(server, run_id, "cmd") == [(1, "interrupted")]


def test_kill_9_of_a_runner_awaiting_its_command_adopts_the_settled_result(server, project, tmp_path):
    flag, ledger = tmp_path / "flag", tmp_path / "ledger.txt"
    run_id = start_with_files(server, project, "ledger", blocking("ledger", "idempotent_effect"), flag, ledger)
    command = block_on_command(server, run_id)
    runner = live_runner_pid(server, run_id)

    os.kill(runner, signal.SIGKILL)
    wait_until(
        lambda: query(server, "SELECT outcome FROM run_workers WHERE run_id = ?", run_id) == [("crashed",)],
        what="the runner's exit recorded",
    )
    assert not group_gone(command)  # the worker's command goes on: the runner only waited for it
    stays(
        lambda: query(server, "SELECT count(*) FROM run_workers WHERE run_id = ?", run_id) == [(1,)],
        0.5,
        "no second runner while the effect applies under a live claim",
    )

    flag.write_text("go")
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"ran": True}
    assert ledger.read_text() == "done\n"
    assert effect_attempts(server, run_id) == [(1, "applied")]  # adopted: no new attempt
    assert node_attempts(server, run_id, "cmd") == [(1, "interrupted"), (2, "completed")]


# --- cancel while a command applies ------------------------------------------------------


def test_cancel_while_a_command_runs_makes_its_effect_ambiguous_and_kills_its_group(server, project, tmp_path):
    flag, ledger = tmp_path / "flag", tmp_path / "ledger.txt"
    run_id = start_with_files(server, project, "ledger", blocking("ledger", "idempotent_effect"), flag, ledger)
    command = block_on_command(server, run_id)
    runner = live_runner_pid(server, run_id)

    with server.client() as client:
        cancelled = client.request("run.cancel", {}, run_id=run_id)
    assert cancelled.outcome == "accepted", cancelled
    assert (cancelled.receipt["runId"], cancelled.receipt["status"]) == (run_id, "cancelled")
    wait_until(lambda: group_gone(command), what="the command's group killed")
    wait_until(lambda: group_gone(runner), what="the runner's group stopped")
    wait_until(lambda: commands(server) == [], what="host.json forgets the command")

    done = view(server, run_id)
    assert done["display"]["status"] == "cancelled"
    assert [(s["nodeId"], s["status"]) for s in done["state"]["steps"]] == [("cmd", "cancelled")]
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"]) == ("ambiguous", 1)  # cancel while applying: may have acted
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]
    flag.write_text("go")  # nothing is left to see it
    stays(lambda: not ledger.exists(), 0.3, "an empty ledger")


def test_an_operator_retry_after_the_run_was_cancelled_is_refused_and_the_command_never_runs_again(
    server, project, tmp_path
):
    """The issue's scenario: a manual command runs, the run is cancelled (the effect is ambiguous),
    and an operator's retry must not run it again for the finished run; a confirmation records it."""
    write(project, "once", BLOCKING.format(name="once", effect="manual_effect", script=COUNTED_SCRIPT))
    flag, ledger = tmp_path / "flag", tmp_path / "ledger.txt"
    run_id = start(server, project, "once", {"flag": str(flag), "ledger": str(ledger)})
    command = block_on_command(server, run_id)
    wait_until(lambda: ledger.exists() and ledger.read_text() == "started\n", what="the command started once")
    with server.client() as client:
        cancelled = client.request("run.cancel", {}, run_id=run_id)
    assert cancelled.outcome == "accepted", cancelled
    wait_until(lambda: group_gone(command), what="the command's group killed")
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["policy"]) == ("ambiguous", "manual")

    retried = server.cli("effect", "retry", effect["effectId"])
    assert retried.returncode == 1, (retried.stdout, retried.stderr)
    assert "conflict (runFinished)" in retried.stderr and f"run {run_id} already ended cancelled" in retried.stderr
    flag.write_text("go")  # a second run of the command would not block now
    stays(lambda: ledger.read_text() == "started\n" and commands(server) == [], 1.0, "one run of the command")
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]
    assert effect_row(server, run_id)["status"] == "ambiguous"

    confirmed = server.cli("effect", "confirm", effect["effectId"], "--note", "the deploy log shows it")
    assert confirmed.returncode == 0, confirmed.stderr
    assert effect_row(server, run_id)["status"] == "applied"
    assert view(server, run_id)["display"]["status"] == "cancelled"  # the run keeps its outcome


# --- a changed request under the same key ----------------------------------------------------


@pytest.mark.server_env(PI_WORKFLOWS_EFFECT_RETRY_BASE_MS="120000", PI_WORKFLOWS_EFFECT_RETRY_MAX_MS="120000")
def test_a_changed_request_under_the_same_key_is_a_conflict_that_stops_the_run(server, project, tmp_path):
    write(project, "changing", CHANGING)
    flag, ledger, version = tmp_path / "flag", tmp_path / "ledger.txt", tmp_path / "version"
    version.write_text("v1")
    run_id = start(server, project, "changing", {"flag": str(flag), "ledger": str(ledger), "version": str(version)})
    first = block_on_command(server, run_id)
    runner = live_runner_pid(server, run_id)

    version.write_text("v2")  # attempt 2 of the same visit builds another payload: same key, other request
    os.kill(runner, signal.SIGKILL)  # then the command's worker: the effect waits (a long backoff) for
    os.kill(performer_of(first), signal.SIGKILL)  # the next runner, which asks for another request
    wait_until(lambda: group_gone(first), what="the first command's group killed")

    def stopped() -> dict | None:
        v = view(server, run_id)
        return v if v["piworkflows"]["parkReason"] is not None or v["display"]["status"] in FINISHED else None

    settled = wait_until(stopped, what="the run stopped")
    # The conflict ends the node visit: no runner relaunched again and again, the conflict named.
    assert len(node_attempts(server, run_id, "cmd")) <= 2, node_attempts(server, run_id, "cmd")[-3:]
    ours = settled["piworkflows"]
    assert "effectKeyConflict" in (ours["errorCode"], ours["parkReason"]), ours
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]  # the changed request never ran
    assert effect_row(server, run_id)["status"] == "cancelled"  # the run ended: it never will
    assert not ledger.exists()

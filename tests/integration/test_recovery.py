"""Crash recovery of the engine with real processes: the supervisor, the writer, a runner.

Each test kills a process with SIGKILL at a point where work is in flight,
restarts what a user would restart (the supervisor), and checks what the
spec promises: nothing acknowledged is lost, no node output is recorded
twice, effects follow the table of WORKFLOWS.md, and the invariants hold.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from piworkflows.client import WorkflowClient
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.settings import Settings
from piworkflows.writer.process import spawn
from piworkflows.writer.views.display import AMBIGUOUS, PARKED
from tests.engine_util import BLOCKING, start, view, write
from tests.server_util import SCHEDULER_TICK, ServerProcess, check_state, gone, query, serving, wait_until
from tests.support import run_create, take_epoch, token_hash

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]


# A shell command that waits for its flag, then appends one line to a ledger.
SHELL = """
from piworkflows.workflows import compute, define_workflow, edge, {policy}, shell
SCRIPT = 'n=0; while [ ! -e "$1" ]; do n=$((n+1)); [ $n -gt 3000 ] && exit 9; sleep 0.02; done; echo done >> "$2"'
workflow = define_workflow("{name}", "first", {{
    "first": compute(lambda ctx: {{"first": True}}),
    "cmd": shell(effect={policy}("test.ledger"),
                 exec=lambda ctx: {{"command": "sh",
                                   "args": ["-c", SCRIPT, "sh", ctx.input["flag"], ctx.input["ledger"]]}}),
    "last": compute(lambda ctx: {{"exit": ctx.outputs["cmd"]["exitCode"]}}),
}}, [edge("first", "cmd"), edge("cmd", "last")])
"""

CHECKPOINT = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge
workflow = define_workflow("asking", "first", {
    "first": compute(lambda ctx: {"first": True}),
    "ask": checkpoint(summary="go on?"),
    "last": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
}, [edge("first", "ask"), edge("ask", "last")])
"""

# Exits before doing anything, but only in a runner (the resolver loads it fine).
EXITS_IN_RUNNER = """
import os, sys
from piworkflows.workflows import compute, define_workflow
if sys.argv[-1] == "run":
    os._exit(3)
workflow = define_workflow("quitter", "only", {"only": compute(lambda ctx: 1)}, [])
"""

ONE_NODE = """
from piworkflows.workflows import compute, define_workflow
workflow = define_workflow("one", "only", {"only": compute(lambda ctx: {"n": ctx.input["n"]})}, [])
"""


def running_node(state_dir: Path, run_id: str) -> str | None:
    found = query(
        state_dir, "SELECT node_path FROM node_attempts WHERE run_id = ? AND attempt_status = 'running'", run_id
    )
    return found[0][0] if found else None


def applying(state_dir: Path, run_id: str) -> bool:
    return bool(
        query(
            state_dir,
            "SELECT 1 FROM effect_attempts a JOIN effects e USING (effect_id) "
            "WHERE e.run_id = ? AND a.attempt_status = 'applying'",
            run_id,
        )
    )


def command_running(server: ServerProcess) -> int:
    return sum(1 for child in server.registry()["children"] if child["role"] == "command")


def settled(server: ServerProcess, run_id: str, *statuses: str) -> dict:
    def reached():
        current = view(server, run_id)
        return current if current["display"]["status"] in statuses else None

    return wait_until(reached, timeout=60, what=f"{run_id} {statuses}")


def no_output_twice(state_dir: Path) -> None:
    """A node visit completes at most once, whatever was killed."""
    twice = query(
        state_dir,
        "SELECT run_id, node_path, visit_number FROM node_attempts "
        "WHERE attempt_status = 'completed' GROUP BY 1, 2, 3 HAVING count(*) > 1",
    )
    assert twice == []


def test_kill_9_of_the_supervisor_with_four_runs_in_flight(tmp_path: Path, project: Path):
    for name, source in (
        ("blocking", BLOCKING),
        ("asking", CHECKPOINT),
        ("idem", SHELL.format(name="idem", policy="idempotent_effect")),
        ("manual", SHELL.format(name="manual", policy="manual_effect")),
    ):
        write(project, name, source)
    flag = tmp_path / "flag"
    ledgers = {name: tmp_path / f"{name}.txt" for name in ("idem", "manual")}
    server = ServerProcess(tmp_path / "s", env=SCHEDULER_TICK).start()
    state_dir = server.state_dir
    try:
        asking = start(server, project, "asking")
        settled(server, asking, "waiting")  # waits without a runner: the four below take all four
        runs = {
            "blocking-1": start(server, project, "blocking", {"flag": str(flag)}),
            "blocking-2": start(server, project, "blocking", {"flag": str(flag)}),
            "idem": start(server, project, "idem", {"flag": str(flag), "ledger": str(ledgers["idem"])}),
            "manual": start(server, project, "manual", {"flag": str(flag), "ledger": str(ledgers["manual"])}),
        }
        wait_until(
            lambda: (
                all(running_node(state_dir, runs[k]) == "wait" for k in ("blocking-1", "blocking-2"))
                and applying(state_dir, runs["idem"])
                and applying(state_dir, runs["manual"])
                and command_running(server) == 2
            ),
            timeout=60,
            what="four runs in flight",
        )
    except BaseException:
        server.stop()
        raise
    old = [c for c in server.registry()["children"] if c["role"] in ("runner", "command", "outbox")]
    assert {c["role"] for c in old} == {"runner", "command", "outbox"}
    server.kill()
    # Outbox workers see their supervisor gone (stdin ends): they kill their command group and exit.
    wait_until(
        lambda: all(gone(c["pid"]) for c in old if c["role"] in ("outbox", "command")),
        what="the workers and their commands ended by themselves",
    )
    server = ServerProcess(state_dir, env=SCHEDULER_TICK).start()  # the takeover ends the old groups before it serves
    try:
        assert all(gone(c["pid"]) for c in old), old
        flag.write_text("go")
        for key in ("blocking-1", "blocking-2", "idem"):
            done = settled(server, runs[key], "completed", "failed", "ambiguous")
            assert done["display"]["status"] == "completed", (key, done["state"].get("error"))
        # The idempotent command ran again under the same key: attempt 2, one line in the ledger.
        assert query(
            state_dir,
            "SELECT a.attempt_number, a.attempt_status FROM effect_attempts a JOIN effects e "
            "USING (effect_id) WHERE e.run_id = ? AND e.effect_class = 'external' ORDER BY 1",
            runs["idem"],
        ) == [(1, "ambiguous"), (2, "applied")]
        assert ledgers["idem"].read_text() == "done\n"
        # The manual one may have acted: ambiguous, parked for an operator, never repeated.
        parked = settled(server, runs["manual"], "ambiguous")
        assert parked["display"]["reason"] == AMBIGUOUS and parked["display"]["controls"] == ["review"]
        assert query(
            state_dir,
            "SELECT e.effect_status, a.attempt_number, a.attempt_status FROM effects e "
            "JOIN effect_attempts a USING (effect_id) "
            "WHERE e.run_id = ? AND e.effect_class = 'external'",
            runs["manual"],
        ) == [("ambiguous", 1, "ambiguous")]
        assert query(state_dir, "SELECT status, park_reason FROM runs WHERE run_id = ?", runs["manual"]) == [
            ("running", "effectAmbiguous")
        ]
        assert not ledgers["manual"].exists()
        # The checkpoint still waits, exactly as committed; its answer completes it in the same run.
        assert settled(server, asking, "waiting")["display"]["controls"] == ["pause", "cancel", "answer"]
        with server.client() as client:
            answered = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"ok": 1}}, run_id=asking)
        assert answered.outcome == "accepted", answered
        assert settled(server, asking, "completed")["state"]["finalOutput"] == {"answer": {"ok": 1}}
        no_output_twice(state_dir)
    finally:
        assert server.stop() == 0
    check_state(state_dir)


def test_a_runner_that_exits_before_progress_parks_the_run(tmp_path: Path, project: Path):
    write(project, "quitter", EXITS_IN_RUNNER)
    with serving(tmp_path / "s", env=SCHEDULER_TICK) as server:
        run_id = start(server, project, "quitter")
        settled(server, run_id, "queued")  # parked: not restarted automatically
        parked = wait_until(
            lambda: (v := view(server, run_id))["display"]["reason"] == PARKED["runnerNoProgress"] and v,
            what="parked runnerNoProgress",
        )
        assert parked["display"]["controls"] == ["resume", "cancel"]
        workers = "SELECT outcome FROM run_workers WHERE run_id = ? ORDER BY runner_epoch"
        assert query(server.state_dir, workers, run_id) == [("crashed",)]
        assert query(server.state_dir, "SELECT count(*) FROM node_attempts WHERE run_id = ?", run_id) == [(0,)]
        # An operator resumes it: one more runner, which exits the same way; never a loop.
        with server.client() as client:
            resumed = client.request("run.resume", {}, run_id=run_id)
        assert resumed.outcome == "accepted" and resumed.receipt["status"] == "queued", resumed
        twice = [("crashed",), ("crashed",)]
        wait_until(
            lambda: (
                query(server.state_dir, workers, run_id) == twice
                and view(server, run_id)["display"]["reason"] == PARKED["runnerNoProgress"]
            ),
            what="parked again",
        )
        with server.client() as client:
            assert client.request("server.status").receipt["activeRunners"] == 0
        assert query(server.state_dir, workers, run_id) == twice


def test_kill_9_of_the_writer_while_clients_start_runs(tmp_path: Path, project: Path):
    """Every run.start acknowledged exactly once: a retry after the crash adopts the committed run."""
    write(project, "one", ONE_NODE)
    server = ServerProcess(tmp_path / "s", env=SCHEDULER_TICK).start()
    state_dir = server.state_dir
    per_client, clients = 12, 4
    answers: list[list] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    halfway = threading.Barrier(clients + 1)

    def starter(index: int) -> None:
        try:
            with WorkflowClient(state_dir, retry_for=60, timeout=30) as client:
                for n in range(per_client):
                    if n == per_client // 2:
                        halfway.wait(timeout=60)
                    payload = {"projectPath": str(project), "workflowName": "one", "input": {"n": index * 100 + n}}
                    answers[index].append(client.request("run.start", payload))
        except BaseException as exc:  # noqa: B036 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=starter, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        halfway.wait(timeout=60)
        writer = next(c for c in server.registry()["children"] if c["role"] == "writer")
        os.kill(writer["pid"], signal.SIGKILL)
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)
        outcomes = [a.outcome for answered in answers for a in answered]
        assert set(outcomes) <= {"accepted", "adopted"}, outcomes
        run_ids = [a.receipt["runId"] for answered in answers for a in answered]
        assert len(run_ids) == len(set(run_ids)) == clients * per_client
        stored = {row[0] for row in query(state_dir, "SELECT run_id FROM runs")}
        assert stored == set(run_ids)  # nothing acknowledged lost, nothing started twice
        for run_id in run_ids:
            assert settled(server, run_id, "completed", "failed")["display"]["status"] == "completed"
    finally:
        assert server.stop() == 0
    check_state(state_dir)


def test_a_stale_generation_cannot_write_through_the_writer_process(tmp_path: Path):
    """Generation 1's claim expired and generation 2 took the run: 1 gets claimLost, 2 writes."""
    paths = StatePaths.resolve(tmp_path / "s")
    writer = spawn(paths.state_dir, Settings())
    try:
        assert writer.link.request("server.take_epoch", take_epoch().body, timeout=30).outcome == "accepted"
        assert writer.link.request("run.create", run_create("run-1").body, timeout=30).outcome == "accepted"

        def claim(token: str, ttl_ms: int):
            body = {
                "actor": {"actor_class": "server"},
                "run_id": "run-1",
                "server_epoch": 1,
                "owner_id": "server-1",
                "claim_token_hash": token_hash(token),
                "ttl_ms": ttl_ms,
                "launch_command": "start",
            }
            return writer.link.request("run.claim", body, timeout=30)

        first = claim("old", 1)
        assert first.outcome == "accepted" and first.receipt["leaseGeneration"] == 1
        # The first runner never reports: its one-millisecond claim expires; the run is claimable again.
        wait_until(
            lambda: (
                writer.link.request(
                    "runner.exited",
                    {
                        "actor": {"actor_class": "server"},
                        "run_id": "run-1",
                        "runner_epoch": first.receipt["runnerEpoch"],
                        "outcome": "timedOut",
                        "stopped_by_server": True,
                    },
                    timeout=30,
                ).outcome
                == "accepted"
            )
        )
        second = claim("new", 30_000)
        assert second.outcome == "accepted" and second.receipt["leaseGeneration"] == 2

        def start_node(token: str, generation: int, revision: int):
            body = {
                "actor": {"actor_class": "runner"},
                "run_id": "run-1",
                "expected_revision": revision,
                "claim": {
                    "server_epoch": 1,
                    "owner_id": "server-1",
                    "claim_token_hash": token_hash(token),
                    "lease_generation": generation,
                    "ttl_ms": 30_000,
                },
                "node_path": "greet",
                "node_kind": "compute",
                "visit_number": 1,
            }
            return writer.link.request("node.start", body, timeout=30)

        stale = start_node("old", 1, second.revision)
        assert stale.outcome == "claimLost" and stale.receipt["code"] == "staleGeneration", stale
        live = start_node("new", 2, second.revision)
        assert live.outcome == "accepted", live
        finish = {
            "actor": {"actor_class": "runner"},
            "run_id": "run-1",
            "expected_revision": live.revision,
            "claim": {
                "server_epoch": 1,
                "owner_id": "server-1",
                "claim_token_hash": token_hash("old"),
                "lease_generation": 1,
                "ttl_ms": 30_000,
            },
            "attempt_id": live.receipt["attemptId"],
            "outcome": "ok",
            "output": BlobValue.of_json({"late": True}).model_dump(),
            "end_status": "completed",
        }
        refused = writer.link.request("node.finish", finish, timeout=30)
        assert refused.outcome == "claimLost", refused
    finally:
        assert writer.stop() == 0
    assert query(paths.state_dir, "SELECT status FROM runs") == [("running",)]  # the stale finish changed nothing
    assert query(paths.state_dir, "SELECT attempt_status, output_digest FROM node_attempts") == [("running", None)]
    check_state(paths.state_dir)

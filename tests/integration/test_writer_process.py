"""The real writer process: handshake, refusal of incompatible state, crashes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from piworkflows.errors import StateIncompatible
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.writer import ViewerAdvanced, ViewerWatched
from piworkflows.settings import Settings
from piworkflows.writer import schema
from piworkflows.writer.process import spawn
from piworkflows.writer.views import projection
from tests.support import claim_run, client_receipt, effect_request, run_create, take_epoch

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

SERVER = {"actor_class": "server"}


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(interval)


def project_body(n: int, key_prefix: str = "p") -> dict:
    body = {"actor": SERVER, "canonical_path": f"/projects/{key_prefix}{n}"}
    body["client_receipt"] = client_receipt(f"{key_prefix}-{n}", body["canonical_path"])
    return body


def test_writer_starts_serves_and_stops(paths: StatePaths):
    writer = spawn(paths.state_dir, Settings())
    try:
        assert writer.ready.ddl_sha256 == schema.ddl_sha256()
        reply = writer.link.request("project.ensure", project_body(1), timeout=30)
        assert reply.outcome == "accepted" and reply.receipt["created"] is True
        again = writer.link.request("project.ensure", project_body(1), timeout=30)
        assert again.outcome == "adopted" and again.receipt == reply.receipt
    finally:
        assert writer.stop() == 0
    assert oct(paths.state_dir.stat().st_mode & 0o777) == "0o700"
    assert oct(paths.database.stat().st_mode & 0o777) == "0o600"
    conn = sqlite3.connect(paths.database)
    assert conn.execute("SELECT canonical_path FROM projects").fetchall() == [("/projects/p1",)]
    conn.close()


def test_incompatible_state_is_refused_before_anything_is_answered(paths: StatePaths):
    paths.state_dir.mkdir(mode=0o700)
    foreign = sqlite3.connect(paths.database)
    foreign.execute("CREATE TABLE notes (body TEXT)")
    foreign.commit()
    foreign.close()
    paths.database.chmod(0o600)  # a wider mode is refused before the file is read
    before = paths.database.read_bytes()
    with pytest.raises(StateIncompatible) as info:
        spawn(paths.state_dir, Settings())
    assert str(info.value) == StateIncompatible.MESSAGE
    assert paths.database.read_bytes() == before
    assert sorted(p.name for p in paths.state_dir.iterdir()) == ["state.sqlite"]


def test_writer_exits_when_its_parent_dies(paths: StatePaths, tmp_path: Path):
    """A parent killed with SIGKILL leaves no writer behind."""
    pid_file = tmp_path / "writer.pid"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from piworkflows.settings import Settings\n"
        "from piworkflows.writer.process import spawn\n"
        f"w = spawn(Path({str(paths.state_dir)!r}), Settings())\n"
        f"Path({str(pid_file)!r}).write_text(str(w.popen.pid))\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text())
        writer = psutil.Process(int(pid_file.read_text()))
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: not writer.is_running() or writer.status() == psutil.STATUS_ZOMBIE)
    finally:
        parent.kill()
        parent.wait()


def _submit_until_lost(writer, bodies: list[dict], log: list[tuple[int, str]]) -> None:
    for n, body in enumerate(bodies):
        reply = writer.link.request("project.ensure", body, timeout=60)
        log.append((n, reply.outcome))
        if reply.outcome == "unavailable":
            return


def _start_submitters(writer, bodies_by_thread):
    logs: list[list[tuple[int, str]]] = [[] for _ in bodies_by_thread]
    threads = [
        threading.Thread(target=_submit_until_lost, args=(writer, bodies, log))
        for bodies, log in zip(bodies_by_thread, logs, strict=True)
    ]
    for thread in threads:
        thread.start()
    return threads, logs


def _check_converged(paths: StatePaths, bodies_by_thread, logs) -> None:
    """Acknowledged commands are present; retrying every command converges."""
    writer = spawn(paths.state_dir, Settings())
    try:
        conn = sqlite3.connect(f"file:{paths.database}?mode=ro", uri=True)
        present = {row[0] for row in conn.execute("SELECT canonical_path FROM projects")}
        receipts = {row[0] for row in conn.execute("SELECT idempotency_key FROM host_commands")}
        conn.close()
        for bodies, log in zip(bodies_by_thread, logs, strict=True):
            for n, outcome in log:
                path = bodies[n]["canonical_path"]
                key = bodies[n]["client_receipt"]["idempotency_key"]
                if outcome == "accepted":
                    assert path in present and key in receipts
                # Never half-applied: the row and its receipt commit together.
                assert (path in present) == (key in receipts)
            for body in bodies:
                committed = body["canonical_path"] in present
                retry = writer.link.request("project.ensure", body, timeout=60)
                assert retry.outcome == ("adopted" if committed else "accepted")
    finally:
        writer.stop()


def test_crash_after_commit_before_reply_loses_nothing_acknowledged(paths: StatePaths):
    """writer.after_commit=crash: the group committed, nobody heard back; retries adopt it."""
    writer = spawn(paths.state_dir, Settings(), extra_env={"PIW_FAULTS": "writer.after_commit=crash@25"})
    bodies_by_thread = [[project_body(n, f"t{t}-") for n in range(60)] for t in range(4)]
    threads, logs = _start_submitters(writer, bodies_by_thread)
    for t in threads:
        t.join()
    assert writer.popen.wait(30) == -signal.SIGKILL
    writer.link.close()
    assert all(log and log[-1][1] == "unavailable" for log in logs)
    _check_converged(paths, bodies_by_thread, logs)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_at_a_random_moment(paths: StatePaths, seed: int):
    import random

    rng = random.Random(seed)
    writer = spawn(paths.state_dir, Settings())
    bodies_by_thread = [[project_body(n, f"s{seed}t{t}-") for n in range(400)] for t in range(4)]
    threads, logs = _start_submitters(writer, bodies_by_thread)
    target = rng.randrange(20, 300)
    wait_until(lambda: sum(len(log) for log in logs) >= target)
    os.kill(writer.popen.pid, signal.SIGKILL)
    for t in threads:
        t.join()
    writer.popen.wait(30)
    writer.link.close()
    _check_converged(paths, bodies_by_thread, logs)


def test_multi_row_commands_are_whole_or_absent_after_a_crash(paths: StatePaths):
    """effect.reserve writes a revision, events, effects and blobs: all or nothing."""
    writer = spawn(paths.state_dir, Settings(), extra_env={"PIW_FAULTS": "writer.after_commit=crash@6"})
    assert writer.link.request("server.take_epoch", take_epoch().body, timeout=30).outcome == "accepted"
    revision, acknowledged = 1, []
    for n in range(20):
        body = {
            "actor": SERVER,
            "source_resource_id": "server",
            "expected_revision": revision,
            "effects": [effect_request(f"r{n}-{i}") for i in range(3)],
        }
        reply = writer.link.request("effect.reserve", body, timeout=30)
        if reply.outcome != "accepted":
            assert reply.outcome == "unavailable"
            break
        acknowledged.append(n)
        revision = reply.revision
    writer.popen.wait(30)
    writer.link.close()
    assert acknowledged, "the crash came before any reserve was acknowledged"
    conn = sqlite3.connect(f"file:{paths.database}?mode=ro", uri=True)
    server_revision = conn.execute("SELECT revision FROM resources WHERE resource_id = 'server'").fetchone()[0]
    events = conn.execute("SELECT resource_revision FROM events WHERE resource_id = 'server' ORDER BY 1").fetchall()
    assert [e[0] for e in events] == list(range(1, server_revision + 1))
    keys = {row[0] for row in conn.execute("SELECT idempotency_key FROM effects")}
    reserves = server_revision - 1
    assert reserves >= len(acknowledged)
    assert keys == {f"r{n}-{i}" for n in range(reserves) for i in range(3)}
    effect_events = conn.execute("SELECT count(*) FROM events WHERE resource_id LIKE 'effect-%'").fetchone()[0]
    assert effect_events == len(keys)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


def test_large_value_round_trips_through_bounded_reads(paths: StatePaths):
    writer = spawn(paths.state_dir, Settings())
    try:
        value = BlobValue.of_text("ü" * 400_000)  # 800,000 bytes, more than one read part
        put = writer.link.request("blob.put", {"actor": SERVER, "blob": value.model_dump()}, timeout=30)
        assert put.outcome == "accepted"
        data, offset = b"", 0
        while offset < len(value.data):
            part = writer.link.request(
                "blob.read", {"actor": SERVER, "digest": value.digest, "offset": offset}, timeout=30
            )
            assert part.outcome == "accepted"
            data += part.receipt["data"]
            offset += len(part.receipt["data"])
        assert data == value.data
    finally:
        writer.stop()


def test_failed_commit_answers_unavailable_and_the_writer_carries_on(paths: StatePaths):
    """writer.before_commit=raise on the 2nd group: that group is lost whole, later ones commit."""
    writer = spawn(paths.state_dir, Settings(), extra_env={"PIW_FAULTS": "writer.before_commit=raise@2"})
    try:
        first = writer.link.request("project.ensure", project_body(1), timeout=30)
        lost = writer.link.request("project.ensure", project_body(2), timeout=30)
        third = writer.link.request("project.ensure", project_body(3), timeout=30)
        retry = writer.link.request("project.ensure", project_body(2), timeout=30)
        assert [r.outcome for r in (first, lost, third, retry)] == ["accepted", "unavailable", "accepted", "accepted"]
        assert lost.receipt == {"code": "unavailable"} and lost.error
    finally:
        assert writer.stop() == 0
    conn = sqlite3.connect(paths.database)
    assert [r[0] for r in conn.execute("SELECT canonical_path FROM projects ORDER BY 1")] == [
        "/projects/p1",
        "/projects/p2",
        "/projects/p3",
    ]
    conn.close()


def test_a_queue_settlement_left_pending_by_a_crash_is_applied_when_the_writer_opens(paths: StatePaths):
    """The commit that cancelled the run made the settlement; the writer died before applying it."""
    from piworkflows.clock import SystemClock
    from piworkflows.writer import db
    from tests.support import run_create, submitted

    executor = db.GroupExecutor(db.open_database(paths, Settings(), SystemClock()), Settings(), SystemClock())
    cancel = submitted("run.cancel", {"actor": {"actor_class": "client"}, "run_id": "run-1"})
    for item in (take_epoch(), run_create("run-1"), cancel):
        replies, _ = executor.run([item])  # no apply_local_effects: as if the writer died right after COMMIT
        assert replies[0][1].outcome == "accepted", replies
    executor.conn.close()
    conn = sqlite3.connect(paths.database)
    assert conn.execute("SELECT queue_status FROM run_queue").fetchone() == ("queued",)
    assert conn.execute("SELECT effect_status FROM effects").fetchone() == ("pending",)
    conn.close()

    writer = spawn(paths.state_dir, Settings())
    assert writer.stop() == 0  # no command at all: the writer applies it when it opens the database
    conn = sqlite3.connect(paths.database)
    assert conn.execute("SELECT queue_status FROM run_queue").fetchone() == ("cancelled",)
    assert conn.execute("SELECT effect_status, attempt_count FROM effects").fetchone() == ("applied", 1)
    conn.close()


def test_the_command_after_a_vacuum_commits(paths: StatePaths):
    """VACUUM bumps SQLite's schema cookie; the writer's own compaction must not make the next group
    look like a schema change (it was answered unavailable and the writer reopened)."""
    schema.ensure_database(paths, 1)
    conn = sqlite3.connect(paths.database, isolation_level=None)
    conn.execute("INSERT INTO blobs VALUES (zeroblob(32), 'application/json', 400000, zeroblob(400000), 1)")
    conn.execute("DELETE FROM blobs")  # free pages for VACUUM to reclaim
    conn.close()
    writer = spawn(paths.state_dir, Settings(retention_vacuum_min_bytes=0))
    try:
        assert writer.link.request("project.ensure", project_body(1), timeout=30).outcome == "accepted"
        compacted = writer.link.request("state.compact", {"actor": SERVER}, timeout=30)
        assert compacted.outcome == "accepted" and compacted.receipt["vacuumed"] is True, compacted
        after = writer.link.request("project.ensure", project_body(2), timeout=30)
        assert after.outcome == "accepted", after
    finally:
        assert writer.stop() == 0


def test_a_refused_backup_or_prune_is_not_stored_so_the_same_key_is_checked_again(paths: StatePaths, tmp_path: Path):
    """Their refusals depend on the filesystem at that moment: answered, never kept for the key."""
    client = {"actor_class": "client", "actor_id": "client-1"}
    folder = tmp_path / "backups"
    folder.mkdir()
    os.chmod(folder, 0o755)  # not private: refused
    backup = {
        "actor": client,
        "destination": str(folder / "b.sqlite"),
        "client_receipt": client_receipt("backup-1", "b.sqlite", operation="state.backup"),
    }
    prune = {
        "actor": client,
        "before_ms": 1,
        "apply": True,
        "backup_path": str(folder / "p.sqlite"),
        "client_receipt": client_receipt("prune-1", "p.sqlite", operation="state.prune"),
    }

    def stored_keys() -> list[str]:
        conn = sqlite3.connect(f"file:{paths.database}?mode=ro", uri=True)
        try:
            return [row[0] for row in conn.execute("SELECT idempotency_key FROM host_commands ORDER BY 1")]
        finally:
            conn.close()

    writer = spawn(paths.state_dir, Settings())
    try:
        for kind, body in (("state.backup", backup), ("state.prune", prune)):
            refused = writer.link.request(kind, body, timeout=30)
            assert refused.outcome == "rejected" and f"chmod 700 {folder}" in refused.error, refused
        assert stored_keys() == []
        os.chmod(folder, 0o700)  # the cause fixed: the same keys are checked again
        made = writer.link.request("state.backup", backup, timeout=30)
        assert made.outcome == "accepted" and made.receipt["verified"] is True, made
        assert writer.link.request("state.backup", backup, timeout=30).outcome == "adopted"  # accepted: stored
        pruned = writer.link.request("state.prune", prune, timeout=30)
        assert pruned.outcome == "accepted" and pruned.receipt["backup"] == str(folder / "p.sqlite"), pruned
        assert stored_keys() == ["backup-1", "prune-1"]
    finally:
        assert writer.stop() == 0
    assert sorted(p.name for p in folder.iterdir()) == ["b.sqlite", "p.sqlite"]


def test_viewer_advanced_carries_the_ops_of_the_watched_runs_once_committed(paths: StatePaths):
    """After viewer.watched names run-1, each viewer.advanced brings run-1's committed revisions in
    order, their ops as the retained ones; a run not named brings none."""
    told: list[ViewerAdvanced] = []
    writer = spawn(paths.state_dir, Settings(), on_viewer=told.append)
    try:
        writer.link.tell(ViewerWatched.kind, ViewerWatched(runs=["run-1"]).model_dump())
        for item in (take_epoch(), run_create("run-1"), run_create("run-2"), claim_run()):
            assert writer.link.request(item.kind, item.body, timeout=30).outcome == "accepted"
        wait_until(lambda: any(ops.revision == 2 for advanced in told for ops in advanced.patches))
    finally:
        assert writer.stop() == 0
    assert {run for advanced in told for run in advanced.runs} == {"run-1", "run-2"}
    patches = [ops for advanced in told for ops in advanced.patches]
    assert [(ops.run_id, ops.revision) for ops in patches] == [("run-1", 2)]  # its first revision is the view made
    conn = sqlite3.connect(paths.database)
    try:
        retained = projection.patches(conn, "run-1", 1)
    finally:
        conn.close()
    assert retained is not None and patches[0].run_revision == retained["runRevision"]
    assert json.loads(patches[0].ops) == retained["patches"][0]["ops"]

"""The viewer projection (writer/views/projection.py): after every commit, the snapshot at revision R
equals an older snapshot with the retained ops applied (piworkflows/views/materialize.py); one
revision per viewer-visible command; 256 retained revisions; a patch's cost does not grow with the run."""

from __future__ import annotations

import copy
import re
import sqlite3
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piworkflows import canonical, faults
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.states import VIEW_TARGETS
from piworkflows.views.materialize import Document, Gap, apply_op
from piworkflows.writer.db import GroupExecutor, GroupFailed, open_database
from piworkflows.writer.views import projection, targets
from piworkflows.writer.views.projection import RETAINED
from piworkflows.writer.views.run_view import run_view
from tests.support import claim_run, run_create, run_group, runner_exited, submitted, take_epoch, token_hash
from tests.support_agents import AgentStep

pytestmark = pytest.mark.timeout(300)

RUNNER = {"actor_class": "runner"}
CLIENT = {"actor_class": "client"}
NODES = ("greet", "work/inner", "done~x")  # a node path with "/" and "~" is an escaped pointer token


def claim(generation: int = 1) -> dict[str, Any]:
    return {
        "server_epoch": 1,
        "owner_id": "server-1",
        "claim_token_hash": token_hash("tok"),
        "lease_generation": generation,
        "ttl_ms": 10_000,
    }


def revision(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT revision FROM resources WHERE resource_id = 'run-1'").fetchone()[0]


def node_start(at: int, node: str, visit: int, kind: str = "compute", generation: int = 1) -> Any:
    body = {
        "actor": RUNNER,
        "run_id": "run-1",
        "claim": claim(generation),
        "expected_revision": at,
        "node_path": node,
        "node_kind": kind,
        "visit_number": visit,
    }
    return submitted("node.start", body)


def node_finish(
    at: int, attempt: str, output: Any, outcome: str = "ok", end: str | None = None, generation: int = 1
) -> Any:
    """A node.finish that ends the run with ``end``; its caller names the next node otherwise."""
    body: dict[str, Any] = {
        "actor": RUNNER,
        "run_id": "run-1",
        "claim": claim(generation),
        "expected_revision": at,
        "attempt_id": attempt,
        "outcome": outcome,
    }
    if outcome == "ok":
        body["output"] = BlobValue.of_json(output).model_dump()
    else:
        body["error"] = BlobValue.of_text(str(output)).model_dump()
    if end:
        body["end_status"] = end
    return submitted("node.finish", body)


@pytest.fixture(autouse=True)
def projected_every_time(caplog):
    """No run's projection failed (a failure is logged and answered by a full replace later, which
    would keep the documents equal and hide it)."""
    yield
    assert not [r for r in caplog.records if "cannot be projected" in r.getMessage()]


@pytest.fixture
def make_executor(tmp_path_factory, settings, clock):
    """A new state database for each call (a Hypothesis example each)."""
    made = []

    def make() -> GroupExecutor:
        paths = StatePaths.resolve(tmp_path_factory.mktemp("state"))
        made.append(GroupExecutor(open_database(paths, settings, clock), settings, clock))
        return made[-1]

    yield make
    for executor in made:
        executor.conn.close()


class Follower:
    """Every revision of run-1 the way a patch watcher sees it: a snapshot kept at each revision it
    checked, brought forward with the retained ops and compared with the snapshot then. With a
    ``told`` projection watching run-1, the revisions it staged for viewer.advanced are checked too:
    every committed one once, in order, its ops the canonical encoding of the retained ones."""

    def __init__(self, conn: sqlite3.Connection, told: projection.Projection | None = None) -> None:
        self.conn = conn
        self.told = told
        view = run_view(conn, "run-1")
        assert view is not None
        self.held = [Document(view)]  # documents at earlier revisions (each brought forward too)
        self.taken = view["revision"]  # the newest revision ``told`` staged and this checked
        if told is not None:
            self.check_told()

    def check_told(self) -> None:
        assert self.told is not None
        staged = self.told.take()
        assert [item["revision"] for item in staged] == list(range(self.taken + 1, self.taken + 1 + len(staged)))
        for item in staged:
            assert item["run_id"] == "run-1"
            patch = projection.patches(self.conn, "run-1", item["revision"] - 1)
            if patch is None:  # retention moved past it already
                continue
            assert item["ops"] == canonical.dumps_bytes(patch["patches"][0]["ops"])
            self.taken = item["revision"]

    def check(self) -> None:
        now = run_view(self.conn, "run-1")
        assert now is not None
        check_deltas(self.conn, self.held[0].revision, now["revision"])
        for document in self.held:
            patch = projection.patches(self.conn, "run-1", document.revision)
            if patch is None:  # past retention: a snapshot is needed
                (floor,) = self.conn.execute("SELECT retained_revision_floor FROM viewer_runs").fetchone()
                assert document.revision < floor - 1
                continue
            revisions = [step["revision"] for step in patch["patches"]]
            assert revisions == list(range(document.revision + 1, now["revision"] + 1))  # each once, in order
            only_ops = copy.deepcopy(document.view)  # a client that applies the ops and nothing else
            for step in copy.deepcopy(patch["patches"]):  # an op's value becomes part of the document
                for op in step["ops"]:
                    apply_op(only_ops, op)
            document.apply({"fromRevision": document.revision, **patch})
            assert document.view == now and only_ops == now  # /revision and /runRevision came in the ops
        self.held = [Document(copy.deepcopy(now))] + self.held[:2]
        if self.told is not None:
            self.check_told()
            assert self.taken == now["revision"]  # every committed revision was staged


def check_deltas(conn: sqlite3.Connection, after: int, upto: int) -> None:
    """Each revision's deltas: one per target it changed, in the targets' order, each op under its
    own target, the first beginning with ``replace /revision`` (and ``/runRevision`` when it moved)."""
    rows = conn.execute(
        "SELECT d.presentation_revision, d.delta_index, d.target_type, d.target_key, b.bytes FROM viewer_deltas d "
        "JOIN blobs b ON b.digest = d.patch_digest WHERE d.run_id = 'run-1' AND d.presentation_revision > ? "
        "AND d.presentation_revision <= ? ORDER BY 1, 2",
        (after, upto),
    ).fetchall()
    by_revision: dict[int, list[tuple[int, str, str, list[dict[str, Any]]]]] = {}
    for at, index, target, key, data in rows:
        by_revision.setdefault(at, []).append((index, target, key, canonical.loads(data)))
    for at, deltas in by_revision.items():
        assert [index for index, *_ in deltas] == list(range(len(deltas)))
        kinds = [target for _, target, _, _ in deltas]
        assert kinds == sorted(kinds, key=VIEW_TARGETS.index) and len(set(kinds)) == len(kinds)
        first = deltas[0][3]
        assert first[0] == {"op": "replace", "path": "/revision", "value": at}
        prefix = 2 if len(first) > 1 and first[1]["path"] == "/runRevision" else 1
        assert all(op["path"] not in ("/revision", "/runRevision") for op in first[prefix:])
        for index, target, key, ops in deltas:
            assert key == "" and all(
                targets.target_of(op["path"]) == target for op in ops[prefix if index == 0 else 0 :]
            )


class Run:
    """run-1 under a claim, driven by commands (a refused one changes nothing, and is allowed)."""

    def __init__(self, executor) -> None:
        self.executor = executor
        executor.projection.watched = frozenset({"run-1"})  # as viewer.watched tells it
        run_group(executor, take_epoch(), run_create("run-1"))
        executor.conn.execute("UPDATE runs SET max_steps = 100000")  # long runs; shown from the claim on
        run_group(executor, claim_run())
        executor.projection.take()
        self.follower = Follower(executor.conn, executor.projection)
        self.visits: dict[str, int] = {}
        self.open: str | None = None

    def at(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        """A runner command at the run's current revision under its current claim generation."""
        conn = self.executor.conn
        found = conn.execute("SELECT lease_generation FROM leases WHERE resource_id = 'run-1'").fetchone()
        return command(revision(conn), *args, generation=found[0] if found else 1, **kwargs)

    def wait(self) -> None:
        """A checkpoint node that asks and waits (the runner's claim ends with it)."""
        self.visits["ask"] = self.visits.get("ask", 0) + 1
        (started,) = run_group(self.executor, self.at(node_start, "ask", self.visits["ask"], kind="checkpoint"))
        if started.outcome != "accepted":
            return
        wait = self.at(node_finish, started.receipt["attemptId"], None)
        body = {key: wait.body[key] for key in ("actor", "run_id", "claim", "expected_revision", "attempt_id")}
        body["request"] = BlobValue.of_json({"summary": "go on?"}).model_dump()
        run_group(self.executor, submitted("node.wait", body))

    def answer(self) -> None:
        answer = BlobValue.of_json({"go": True}).model_dump()
        body = {"actor": CLIENT, "run_id": "run-1", "node_path": "ask", "answer": answer}
        run_group(self.executor, submitted("checkpoint.answer", body))

    def reclaim(self) -> None:
        """The runner exits (if one is live) and the server claims the run again (if it may)."""
        self.runner_exits()
        run_group(self.executor, claim_run(command="resume"))

    def _visit(self, n: int) -> tuple[str, int]:
        node = NODES[n % len(NODES)]
        self.visits[node] = self.visits.get(node, 0) + 1
        return node, self.visits[node]

    def steps(self, count: int, size: int, fail: bool = False, together: bool = True) -> None:
        """``count`` node visits, one command each (finishing one and starting the next in one
        command when ``together``), outputs of ``size`` characters; the last fails when ``fail``."""
        node, visit = self._visit(0)
        (started,) = run_group(self.executor, self.at(node_start, node, visit))
        if started.outcome != "accepted":
            return
        attempt = started.receipt["attemptId"]
        for n in range(1, count + 1):
            last = n == count
            output = {"n": n, "text": "x" * size}
            next_node, visit = self._visit(n)
            finish = self.at(node_finish, attempt, output, "failed" if fail and last else "ok")
            finish.body["next_node"] = next_node
            if together and not last:
                finish.body["start_next"] = {"node_kind": "compute", "visit_number": visit}
            (done,) = run_group(self.executor, finish)
            assert done.outcome == "accepted", done
            if last:
                self.visits[next_node] -= 1  # not started
                return
            if together:
                attempt = done.receipt["nextAttemptId"]
                continue
            (started,) = run_group(self.executor, self.at(node_start, next_node, visit))
            assert started.outcome == "accepted", started
            attempt = started.receipt["attemptId"]

    def start_only(self) -> None:
        node = NODES[0]
        self.visits[node] = self.visits.get(node, 0) + 1
        (reply,) = run_group(self.executor, self.at(node_start, node, self.visits[node]))
        if reply.outcome == "accepted":
            self.open = reply.receipt["attemptId"]

    def finish_open(self, end: str | None) -> None:
        if self.open is not None:
            finish = self.at(node_finish, self.open, {"end": end}, end=end)
            if end is None:
                finish.body["next_node"] = NODES[1]
            run_group(self.executor, finish)
            self.open = None

    def control(self, operation: str) -> None:
        run_group(self.executor, submitted(operation, {"actor": CLIENT, "run_id": "run-1"}))

    def runner_exits(self) -> None:
        (epoch,) = self.executor.conn.execute(
            "SELECT coalesce(max(runner_epoch), 0) FROM run_workers WHERE ended_at IS NULL"
        ).fetchone()
        if epoch:
            run_group(self.executor, runner_exited(epoch))


ACTIONS = st.one_of(
    st.tuples(st.just("steps"), st.integers(1, 5), st.sampled_from([4, 300]), st.booleans()),
    st.tuples(st.just("separately"), st.integers(1, 3), st.none(), st.none()),
    st.tuples(st.just("start"), st.none(), st.none(), st.none()),
    st.tuples(st.just("finish"), st.sampled_from([None, "completed"]), st.none(), st.none()),
    st.tuples(st.just("control"), st.sampled_from(["run.pause", "run.resume", "run.cancel"]), st.none(), st.none()),
    st.tuples(st.just("exit"), st.none(), st.none(), st.none()),
    st.tuples(st.just("wait"), st.none(), st.none(), st.none()),
    st.tuples(st.just("answer"), st.none(), st.none(), st.none()),
    st.tuples(st.just("reclaim"), st.none(), st.none(), st.none()),
)


def act(run: Run, action: tuple[Any, ...]) -> None:
    kind, a, b, c = action
    if kind == "steps":
        run.steps(a, b, c)
    elif kind == "separately":
        run.steps(a, 4, together=False)
    elif kind == "start":
        run.start_only()
    elif kind == "finish":
        run.finish_open(a)
    elif kind == "control":
        run.control(a)
    elif kind == "wait":
        run.wait()
    elif kind == "answer":
        run.answer()
    elif kind == "reclaim":
        run.reclaim()
    else:
        run.runner_exits()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(ACTIONS, min_size=1, max_size=14))
def test_the_snapshot_equals_an_older_one_with_the_retained_ops_applied(make_executor, actions):
    """Random command sequences; after every group the follower's documents, brought forward with
    the retained ops, equal the snapshot, and every revision comes once, in order."""
    run = Run(make_executor())
    for action in actions:
        act(run, action)
        run.follower.check()


def test_a_long_run_moves_its_windows_and_keeps_256_revisions(executor):
    run = Run(executor)
    for _ in range(55):  # over 300 revisions: every window slides, the floor moves
        run.steps(5, 4)
        run.follower.check()
    conn = executor.conn
    (at, floor) = conn.execute("SELECT presentation_revision, retained_revision_floor FROM viewer_runs").fetchone()
    assert at > 300 and floor == at - 255
    assert conn.execute("SELECT min(presentation_revision) FROM viewer_deltas").fetchone() == (floor,)
    assert projection.patches(conn, "run-1", floor - 1) is not None
    assert projection.patches(conn, "run-1", floor - 2) is None  # older: a snapshot
    view = run_view(conn, "run-1")
    assert view is not None and view["stepStart"] == view["stepTotal"] - 64 and len(view["state"]["steps"]) == 64


def test_retention_removes_the_patch_blobs_it_orphans_and_only_those(executor):
    """Past 256 revisions each advance deletes the oldest revision's deltas in its own transaction,
    and their patch blobs unless another row still references one (here a workflow update whose
    body is, byte for byte, a patch about to go)."""
    run = Run(executor)
    conn = executor.conn
    while conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone()[0] < RETAINED + 2:
        run.steps(5, 4)

    def oldest() -> tuple[int, set[bytes]]:
        (floor,) = conn.execute("SELECT retained_revision_floor FROM viewer_runs").fetchone()
        rows = conn.execute("SELECT patch_digest FROM viewer_deltas WHERE presentation_revision = ?", (floor,))
        return floor, {row[0] for row in rows}

    floor, going = oldest()
    kept = sorted(going)[0]
    attempt = conn.execute("SELECT attempt_id FROM node_attempts LIMIT 1").fetchone()[0]
    conn.execute(
        "INSERT INTO workflow_updates (run_id, update_seq, attempt_id, update_kind, body_digest, created_at) "
        "VALUES ('run-1', 999, ?, 'progress', ?, 0)",
        (attempt, kept),
    )
    conn.execute("DELETE FROM temp.viewer_touched")  # the row was planted outside any command
    deltas = conn.execute("SELECT presentation_revision, patch_digest FROM viewer_deltas").fetchall()
    blobs_before = {row[0] for row in conn.execute("SELECT digest FROM blobs")}
    run.steps(1, 4)  # one node visit: the floor moves on by its revisions
    new_floor, _ = oldest()
    assert new_floor > floor
    below = "FROM viewer_deltas WHERE presentation_revision < ?"
    assert conn.execute(f"SELECT count(*) {below}", (new_floor,)).fetchone() == (0,)
    still = {row[0] for row in conn.execute("SELECT patch_digest FROM viewer_deltas")}
    gone = {digest for at, digest in deltas if at < new_floor}
    removed = blobs_before - {row[0] for row in conn.execute("SELECT digest FROM blobs")}
    assert kept in gone and removed == gone - still - {kept}  # exactly the orphans


def test_a_command_that_changes_nothing_shown_advances_nothing(executor):
    run = Run(executor)
    conn = executor.conn
    (before,) = conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone()
    renewed = submitted("claim.renew", {"actor": {"actor_class": "server"}, "resource_id": "run-1", "claim": claim()})
    assert run_group(executor, renewed)[0].outcome == "accepted"
    assert conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone() == (before,)
    run.steps(1, 4)
    assert conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone() == (before + 2,)


def test_the_queue_row_is_written_once_per_claim_not_at_every_node(executor):
    """The first attempt makes the queue row running; later nodes leave the row alone (the view's
    queue.updatedAt still moves: it is the later of the run's and the queue row's times)."""
    run = Run(executor)
    conn = executor.conn
    run.steps(1, 4)
    (running_since,) = conn.execute("SELECT updated_at FROM run_queue WHERE run_id = 'run-1'").fetchone()
    for _ in range(3):
        executor.clock.advance(1000)  # each node later
        run.steps(1, 4)
    assert conn.execute("SELECT queue_status, updated_at FROM run_queue WHERE run_id = 'run-1'").fetchone() == (
        "running",
        running_since,
    )
    view = run_view(conn, "run-1")
    assert view is not None and view["queue"]["updatedAt"] == view["state"]["updatedAt"]
    run.follower.check()


def test_a_restarted_writer_replaces_every_member_once(executor):
    """The projection's memory is gone: its first revision replaces each member, then patches resume."""
    run = Run(executor)
    run.steps(2, 4)
    run.follower.check()
    executor.projection = projection.Projection()  # as after a writer restart
    executor.projection.watched = run.follower.told.watched  # told again
    run.follower.told = executor.projection
    run.steps(1, 4)
    conn = executor.conn
    (at,) = conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone()
    first = projection.patches(conn, "run-1", at - 2)
    assert first is not None
    paths = [op["path"] for op in first["patches"][0]["ops"]]
    assert "/state" in paths and "/display" in paths and all(path.count("/") == 1 for path in paths)
    assert "/state" not in [op["path"] for op in first["patches"][1]["ops"]]  # then patches again
    run.follower.check()


def test_a_group_that_does_not_commit_stages_no_ops(executor):
    """viewer.advanced carries only committed revisions: a group whose COMMIT fails stages none, and
    the next committed revision (a full replace: the memory is ahead of the database) is told."""
    run = Run(executor)
    run.steps(1, 4)
    run.follower.check()
    faults.configure(f"{faults.WRITER_BEFORE_COMMIT}=raise")
    try:
        with pytest.raises(GroupFailed):
            run.steps(1, 4)
    finally:
        faults.configure("")
    assert executor.projection.take() == []
    run.steps(1, 4)
    run.follower.check()


# The statements that write a revision's patches: one per target patch and its blob, and per blob
# retention frees.
OP_WRITES = re.compile(
    r"INSERT INTO (viewer_deltas|blobs)|DELETE FROM (viewer_deltas|blobs)|SELECT patch_digest FROM viewer_deltas"
    r"|SELECT media_type, byte_length, bytes FROM blobs"
)


def statements(run: Run) -> tuple[int, int, int]:
    """The statements of one more node visit (two commands): those that are not op writes, the
    delta rows written, and the ops of the two revisions."""
    executed: list[str] = []
    conn = run.executor.conn
    (before,) = conn.execute("SELECT presentation_revision FROM viewer_runs").fetchone()
    conn.set_trace_callback(executed.append)
    try:
        run.steps(1, 4)
    finally:
        conn.set_trace_callback(None)
    patch = projection.patches(conn, "run-1", before)
    assert patch is not None
    ops = sum(len(step["ops"]) for step in patch["patches"])
    reads = [s for s in executed if not OP_WRITES.search(s)]
    return len(reads), sum(s.startswith("INSERT INTO viewer_deltas") for s in executed), ops


def test_a_patch_costs_the_same_statements_at_1000_steps_as_at_10(make_executor):
    """Reading what changed costs the same statements however long the run; writing costs one
    row per target a revision changed, however many ops (a sliding window's removes are ops)."""
    costs = []
    for steps in (10, 1000):
        run = Run(make_executor())
        for _ in range(steps // 10):
            run.steps(10, 4)
        costs.append(statements(run))
    (reads_10, deltas_10, ops_10), (reads_1000, deltas_1000, ops_1000) = costs
    assert reads_10 == reads_1000
    assert deltas_10 == deltas_1000 <= 2 * len(VIEW_TARGETS) and ops_1000 > ops_10  # the windows slide


def test_the_materializer_is_strict():
    document = {"a": {"b": [1, 2]}, "c": None}
    apply_op(document, {"op": "append", "path": "/a/b", "value": [3]})
    apply_op(document, {"op": "remove", "path": "/a/b/0"})
    apply_op(document, {"op": "add", "path": "/a/x~1y", "value": 1})
    apply_op(document, {"op": "replace", "path": "/c", "value": {"d": 1}})
    assert document == {"a": {"b": [2, 3], "x/y": 1}, "c": {"d": 1}}
    for op in (
        {"op": "replace", "path": "/missing", "value": 1},
        {"op": "remove", "path": "/a/b/5"},
        {"op": "append", "path": "/c", "value": [1]},
        {"op": "add", "path": "/nope/x", "value": 1},
        {"op": "move", "path": "/c", "value": 1},
    ):
        with pytest.raises(Gap):
            apply_op(document, op)
    held = Document({"revision": 3, "runRevision": 9, "x": 1})
    with pytest.raises(Gap):  # not from the document's revision
        held.apply({"fromRevision": 2, "revision": 4, "runRevision": 10, "patches": []})
    with pytest.raises(Gap):  # a skipped revision; the document is left as it was
        held.apply(
            {
                "fromRevision": 3,
                "revision": 5,
                "runRevision": 10,
                "patches": [{"revision": 5, "ops": [{"op": "replace", "path": "/x", "value": 2}]}],
            }
        )
    assert held.view == {"revision": 3, "runRevision": 9, "x": 1}


def test_an_agent_steps_revisions_patch_the_view_exactly(executor):
    """An agent step's whole life (request, session opened, message, turn, recorded conversation,
    rejected and accepted submissions, turn end): after every command the retained ops bring the
    older documents to the snapshot, session members included."""
    step = AgentStep(executor)
    assert step.start(timeout_ms=1000).outcome == "accepted"
    follower = Follower(executor.conn)
    step.open()
    follower.check()
    step.host("agent.message_sent", workflow_message_id=step.initial_id, pi_entry_id="0a1b2c3d")
    follower.check()
    step.turn("started", "turn-segment-1-1")
    follower.check()
    entries = [
        {"pi_entry_id": pi_id, "entry_role": role, "content": BlobValue.of_text(f"{role}: {pi_id}").model_dump()}
        for pi_id, role in (("0a1b2c3d", "user"), ("1b2c3d4e", "assistant"))
    ]
    events = [{"event_type": "message_update", "event_status": "streaming"} for _ in range(3)]
    reply = step.host("agent.record", first_event_index=0, events=events, entries=entries)
    assert reply.outcome == "accepted", reply
    follower.check()
    first = step.submit({"summary": 1})
    follower.check()
    step.settle(first.receipt["submissionId"], error="summary: 1 is not of type 'string'")
    follower.check()
    second = step.submit({"summary": "fixed"}, key="submit-2")
    step.settle(second.receipt["submissionId"], output={"summary": "fixed"})
    follower.check()
    step.turn("ended", "turn-segment-1-1", stop_reason="stop", elapsed_ms=450)
    follower.check()
    view = run_view(executor.conn, "run-1")
    assert view is not None and view["session"]["capture"]["entryCount"] == 2

"""Run views and lists: derived from rows; the display precedence of PROTOCOL.md."""

from __future__ import annotations

import hashlib

import pytest

from piworkflows import canonical
from piworkflows.isotime import epoch_ms, iso
from piworkflows.writer.views.display import RunFacts, display
from tests.support import run_create, run_group, submitted

pytestmark = pytest.mark.timeout(60)


def facts(**overrides) -> RunFacts:
    base = dict(
        status="queued",
        paused=False,
        park_reason=None,
        ambiguous_effects=0,
        waiting_for=None,
        live_runner=False,
        open_turn=False,
    )
    return RunFacts(**{**base, **overrides})


@pytest.mark.parametrize(
    "overrides, status, controls",
    [
        ({}, "queued", ["cancel"]),
        ({"park_reason": "shutdown"}, "queued", ["resume", "cancel"]),  # a parked queue is not a pause
        ({"live_runner": True}, "running", ["pause", "cancel"]),
        ({"open_turn": True}, "running", ["pause", "cancel"]),
        ({"waiting_for": "checkpoint", "live_runner": True}, "waiting", ["pause", "cancel", "answer"]),
        ({"waiting_for": "agent"}, "waiting", ["pause", "cancel", "update", "submit"]),
        ({"waiting_for": "human_decision"}, "waiting", ["pause", "cancel", "human-answer"]),
        ({"paused": True, "waiting_for": "checkpoint"}, "paused", ["resume", "cancel"]),
        ({"ambiguous_effects": 1, "paused": True}, "ambiguous", ["review"]),
        ({"status": "completed", "ambiguous_effects": 1, "paused": True}, "completed", []),
        ({"status": "cancelled", "open_turn": True}, "cancelled", []),
    ],
)
def test_display_precedence(overrides, status, controls):
    shown = display(facts(**overrides))
    assert shown["status"] == status and shown["controls"] == controls


@pytest.mark.parametrize(
    "overrides, activity, reason",
    [
        ({}, None, None),
        ({"live_runner": True}, "supervised_runner", None),
        ({"open_turn": True}, "origin_turn", None),
        ({"paused": True}, None, "The workflow is durably paused."),
        ({"ambiguous_effects": 2}, None, "An external effect needs explicit recovery."),
        ({"waiting_for": "checkpoint"}, None, "The workflow needs a checkpoint answer."),
        ({"waiting_for": "human_decision"}, None, "The workflow needs a protected human decision."),
        ({"park_reason": "runnerNoProgress"}, None, "The worker exited before it saved workflow progress."),
        ({"park_reason": "shutdown"}, None, "The server stopped; the workflow resumes when it starts."),
        ({"park_reason": "workflowSourceChanged"}, None, "The workflow source changed since the run started."),
        ({"status": "completed"}, None, None),
        ({"status": "failed", "error": b"boom: the step raised"}, None, "boom: the step raised"),
        ({"status": "failed", "error": b"x" * (16 * 1024)}, None, "x" * (16 * 1024)),
        (
            {"status": "failed", "error": b"x" * (16 * 1024 + 1)},
            None,
            "Complete workflow failure details are available.",
        ),
        ({"status": "failed", "open_turn": True}, "origin_turn", None),
    ],
)
def test_display_activity_and_reason_in_upstreams_vocabulary(overrides, activity, reason):
    shown = display(facts(**overrides))
    assert (shown["activity"], shown["reason"]) == (activity, reason)


def test_every_park_reason_is_shown_by_a_rule():
    """A sentence of its own, or another rule: the pause flag, an ambiguous effect (rule 2), the
    cause an agent host left."""
    from piworkflows.states import PARK_REASONS
    from piworkflows.writer.views.display import PARKED

    assert set(PARKED) | {"paused", "effectAmbiguous", "agentNoProgress"} == PARK_REASONS
    assert display(facts(status="failed", open_turn=True))["controls"] == ["cancel"]


AGENT_CONTROLS = ["pause", "cancel", "update", "submit"]


@pytest.mark.parametrize(
    "overrides, activity, reason",
    [
        ({}, None, "The workflow needs its assigned agent result."),
        ({"expected_output": "schema"}, None, "The workflow needs its assigned agent result."),
        ({"expected_output": "assistant-message"}, None, "The workflow needs its assigned visible response."),
        ({"pending_step": True}, None, "The workflow needs its assigned agent result."),  # not sent yet
        ({"open_turn": True}, "origin_turn", "The agent is working on the workflow step."),
        (
            {"open_turn": True, "expected_output": "assistant-message"},
            "origin_turn",
            "The agent is working on the workflow step.",
        ),
        (
            {"open_turn": True, "pending_step": True},
            "origin_turn",
            "A step is pending delivery. It starts a new model turn after this turn ends.",
        ),
    ],
)
@pytest.mark.parametrize("kind", ["agent", "decision"])
def test_a_run_at_an_agent_step_waits_for_its_agent(kind, overrides, activity, reason):
    """VIEWS.md §5 rule 4 for agent steps: the controls, the reason by what the step needs, the
    open model turn as the activity."""
    shown = display(facts(status="waiting", waiting_for=kind, **overrides))
    assert shown == {"status": "waiting", "activity": activity, "controls": AGENT_CONTROLS, "reason": reason}


def test_a_run_parked_because_its_agent_could_not_start_is_queued_with_the_cause():
    cause = "Pi (the coding agent that runs agent steps) was not found: run 'pi-workflows setup pi'"
    parked = facts(status="waiting", waiting_for="agent", park_reason="agentNoProgress", park_cause=cause)
    assert display(parked) == {
        "status": "queued",
        "activity": None,
        "controls": ["resume", "cancel"],
        "reason": "The agent made no progress: " + cause,
    }
    assert (
        display(facts(park_reason="agentNoProgress"))["reason"] == "The agent made no progress: no cause was recorded"
    )
    assert display(facts(status="waiting", paused=True, park_reason="agentNoProgress"))["status"] == "paused"
    assert display(facts(status="cancelled", park_reason="agentNoProgress"))["status"] == "cancelled"


def read(executor, kind, body):
    (reply,) = run_group(executor, submitted(kind, {"actor": {"actor_class": "client"}, **body}))
    return reply


def test_run_list_pages_newest_first_and_filters_by_project(executor, clock):
    for n in range(5):
        clock.advance(1)
        run_group(executor, run_create(f"run-{n}", project="/p/a" if n % 2 else "/p/b"))
    page = read(executor, "run.list", {"limit": 2}).receipt
    assert [i["runId"] for i in page["items"]] == ["run-4", "run-3"]
    cursor = page["cursor"]
    rest = read(
        executor, "run.list", {"limit": 10, "before": {"created_at": cursor["createdAt"], "run_id": cursor["runId"]}}
    ).receipt
    assert [i["runId"] for i in rest["items"]] == ["run-2", "run-1", "run-0"] and rest["cursor"] is None
    only_a = read(executor, "run.list", {"project_path": "/p/a"}).receipt
    assert [i["runId"] for i in only_a["items"]] == ["run-3", "run-1"]
    assert (page["start"], page["total"], rest["start"], rest["total"]) == (0, 5, 2, 5)
    assert (only_a["start"], only_a["total"]) == (0, 2)
    item = page["items"][0]
    # upstream's WorkflowRunSummary fields, ours under piworkflows
    assert set(item) == {
        "runId",
        "workflowName",
        "originSessionId",
        "createdAt",
        "updatedAt",
        "display",
        "manifest",
        "live",
        "possiblyInterrupted",
        "piworkflows",
    }
    assert set(item["piworkflows"]) == {
        "title",
        "projectPath",
        "revision",
        "runRevision",
        "executionMode",
        "parkReason",
        "startedAt",
        "claim",
    }
    assert item["createdAt"] == iso(clock.now_ms()) and item["createdAt"].endswith("Z")
    assert item["manifest"] == {
        "schema": "pi-workflows.run-manifest.v1",
        "runId": "run-4",
        "workflowName": item["workflowName"],
        "workflowSource": item["manifest"]["workflowSource"],
        "startedAt": item["createdAt"],  # not started: its creation, as upstream
        "finishedAt": None,
        "status": "queued",
        "traceSchema": "pi-workflows.trace-event.v1",
        "paths": {"workflow": "host", "state": "host", "trace": "host"},
    }
    assert item["live"] is False and item["possiblyInterrupted"] is False
    assert "input" not in item  # metadata only, never payload bodies


def _plant(executor, clock, count: int, start: int = 0) -> list[str]:
    """``count`` runs, run n created n + 1 ms after the clock's start: workflow a or b (every
    third is b), statuses cycling failed, queued, completed (finished as the engine leaves
    them), two projects."""
    run_ids = [f"run-{n:05d}" for n in range(start, start + count)]
    for first in range(0, count, 200):
        chunk = range(start + first, start + min(first + 200, count))
        creates = [run_create(f"run-{n:05d}", project=f"/p/{n % 2}", workflow_name="ab"[n % 3 == 0]) for n in chunk]
        run_group(executor, *creates)
    for n, run_id in enumerate(run_ids, start):
        executor.conn.execute("UPDATE runs SET created_at = ? WHERE run_id = ?", (clock.now_ms() + n + 1, run_id))
        status = ("failed", "queued", "completed")[n % 3]
        if status != "queued":
            executor.conn.execute(
                "UPDATE runs SET status = ?, started_at = created_at, finished_at = created_at + 7 WHERE run_id = ?",
                (status, run_id),
            )
    return run_ids


def _all_pages(executor, body: dict, limit: int) -> list[dict]:
    items, before = [], None
    while True:
        page = read(executor, "run.list", {**body, "limit": limit, **({"before": before} if before else {})}).receipt
        items += page["items"]
        if page["cursor"] is None:
            return items
        before = {"created_at": page["cursor"]["createdAt"], "run_id": page["cursor"]["runId"]}


@pytest.mark.parametrize(
    "body, expected",
    [
        ({}, lambda n: True),
        ({"statuses": ["queued"]}, lambda n: n % 3 == 1),
        ({"statuses": ["failed", "completed"]}, lambda n: n % 3 != 1),
        ({"workflow_name": "b"}, lambda n: n % 3 == 0),
        ({"since": 40}, lambda n: n >= 39),
        (
            {"project_path": "/p/1", "statuses": ["queued", "failed"], "workflow_name": "a", "since": 11},
            lambda n: n % 2 == 1 and n % 3 == 1 and n >= 10,
        ),
    ],
)
def test_run_list_filters_combine_with_the_keyset_cursor(executor, clock, body, expected):
    if "since" in body:  # milliseconds after the clock's start: run n is created at start + n + 1
        body = {**body, "since": clock.now_ms() + body["since"]}
    run_ids = _plant(executor, clock, 60)
    listed = _all_pages(executor, body, limit=7)
    assert [item["runId"] for item in listed] == [r for n, r in reversed(list(enumerate(run_ids))) if expected(n)]
    ended = [item for item in listed if item["manifest"]["finishedAt"] is not None]
    assert all(
        epoch_ms(item["manifest"]["finishedAt"]) - epoch_ms(item["piworkflows"]["startedAt"]) == 7 for item in ended
    )


def test_run_list_items_carry_when_the_run_started(executor):
    run_group(executor, run_create("run-1"))
    (item,) = read(executor, "run.list", {}).receipt["items"]
    assert item["piworkflows"]["startedAt"] is None and item["manifest"]["finishedAt"] is None


def _vm_steps(conn, read):
    """SQLite VM steps (one per 10 instructions, deterministic) that ``read()`` takes; and its value."""
    counted = [0]

    def count() -> int:
        counted[0] += 1
        return 0

    conn.set_progress_handler(count, 10)
    try:
        value = read()
    finally:
        conn.set_progress_handler(None, 0)
    return counted[0], value


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"statuses": ["queued"]},
        {"statuses": ["queued", "completed", "failed"]},
        {"workflow_name": "b"},
        {"since": 0},
        {"project_path": "/p/1"},
    ],
)
def test_a_run_list_page_reads_bounded_items_and_counts_the_filtered_runs_cheaply(executor, clock, filters):
    """Counted in SQLite VM steps (deterministic, one step per 10 instructions): the items walk a
    bounded number of index keys; ``total``, ``start`` and ``revision`` count the runs the filters
    admit, a few instructions per run and no payload, so 1,800 more runs add under 2 steps each."""
    from piworkflows.writer.views.runs import list_runs

    def steps() -> int:
        return _vm_steps(executor.conn, lambda: list_runs(executor.conn, clock.now_ms(), limit=10, **filters))[0]

    _plant(executor, clock, 200)
    few = steps()
    _plant(executor, clock, 1800, start=200)
    assert (steps() - few) / 1800 < 2


def test_a_run_list_page_costs_the_same_with_1_kib_and_1_mib_outputs(executor, clock):
    """A page reads no payload: the same runs with outputs of 1 KiB and of 1 MiB cost the same
    number of SQLite VM steps, to within 1% (and give the same items)."""
    from piworkflows.writer.views.runs import list_runs

    run_ids = _plant(executor, clock, 50)

    def with_outputs(size: int) -> tuple[int, list[dict]]:
        for n, run_id in enumerate(run_ids):  # planted as rows (a value this large is not inline)
            data = canonical.dumps_bytes({"n": n, "text": "x" * size})
            digest = hashlib.sha256(data).digest()
            executor.conn.execute(
                "INSERT INTO blobs (digest, media_type, byte_length, bytes, created_at) VALUES (?, ?, ?, ?, ?)",
                (digest, "application/json", len(data), data, clock.now_ms()),
            )
            executor.conn.execute("UPDATE runs SET output_digest = ? WHERE run_id = ?", (digest, run_id))
        steps, page = _vm_steps(executor.conn, lambda: list_runs(executor.conn, clock.now_ms(), limit=256))
        return steps, page["items"]

    small_steps, small_items = with_outputs(1024)
    large_steps, large_items = with_outputs(1 << 20)
    # within 1%: one step (10 instructions) of variance shows even between two plants of 1 KiB
    assert abs(large_steps - small_steps) <= small_steps // 100 and large_items == small_items

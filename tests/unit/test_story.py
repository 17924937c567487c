"""The CLI's run story and watch, without a server: words, formats, wrapping, and the events of
successive run views."""

from __future__ import annotations

import pytest

from piworkflows.cli import story
from piworkflows.cli.watch import Follower, settled

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "ms, text",
    [(None, "-"), (0, "0 ms"), (999, "999 ms"), (1_500, "1.5 s"), (125_000, "2m 05s"), (3_720_000, "1h 02m")],
)
def test_durations(ms, text):
    assert story.duration(ms) == text


def test_blocks_wrap_within_80_columns_and_stop_after_a_few_lines():
    lines = story.block("error", "word " * 200, indent=8)
    assert len(lines) == story.TEXT_LINES and lines[0].startswith("        error: word")
    assert all(len(line) <= story.WIDTH for line in lines) and lines[-1].endswith(" ...")
    assert story.block("output", '{"a":1}', indent=2) == ['  output: {"a":1}']
    too_large = {"omitted": {"byteLength": 70000, "digest": "sha256:00"}}
    assert story.json_text(too_large) == "70000 bytes, too large to show here"


def step(index: int, status: str, kind: str = "compute") -> dict:
    """A step item of the run view (upstream's step record and ours)."""
    done = status not in ("running", "waiting")
    return {
        "attemptId": f"attempt-{index}",
        "nodeId": f"n{index}",
        "nodeType": kind,
        "visit": 1,
        "attempt": 1,
        "status": status,
        "outcome": "ok" if done else None,
        "startedAt": "2026-01-01T00:00:01.000Z",
        "finishedAt": "2026-01-01T00:00:01.005Z" if done else None,
        "durationMs": 5 if done else None,
        "errorCode": None,
        "prompt": None,
        "output": None,
        **({"request": {"summary": "go?"}} if kind == "checkpoint" else {}),
    }


def run_view(
    status: str,
    steps: list[dict],
    activity: str | None = "running",
    reason: str | None = None,
    park_reason: str | None = None,
) -> dict:
    """The parts of a run view the follower reads."""
    current = next((s["attemptId"] for s in steps if s["status"] in ("running", "waiting")), None)
    return {
        "runId": "run-1",
        "state": {"steps": steps, **({"currentAttemptId": current} if current else {})},
        "stepStart": 0,
        "stepTotal": len(steps),
        "display": {"status": status, "activity": activity, "controls": [], "reason": reason},
        "piworkflows": {"effects": [], "errorCode": None, "parkReason": park_reason},
    }


def test_the_follower_reports_each_start_end_wait_and_finish_once():
    follower = Follower()
    names = lambda view: [(e["event"], e.get("stepIndex")) for e, _ in follower.events(view)]  # noqa: E731
    assert names(run_view("running", [step(0, "running")])) == [("stepStarted", 0)]
    assert names(run_view("running", [step(0, "running")])) == []
    # Missed in between: step 1 started and ended, step 2 started and waits.
    waiting = run_view("waiting", [step(0, "completed"), step(1, "completed"), step(2, "waiting", "checkpoint")])
    assert names(waiting) == [
        ("stepFinished", 0),
        ("stepStarted", 1),
        ("stepFinished", 1),
        ("stepStarted", 2),
        ("waiting", 2),
    ]
    assert names(waiting) == [] and settled(waiting)
    done = run_view(
        "completed",
        [step(0, "completed"), step(1, "completed"), step(2, "completed", "checkpoint")],
        activity="finished",
    )
    assert names(done) == [("stepFinished", 2), ("finished", None)] and names(done) == []


def test_parked_runs_are_settled_unless_for_a_shutdown():
    """By the display status and the run's park reason, whatever the activity and reason say."""
    assert settled(run_view("queued", [], activity="parked", reason="runnerNoProgress", park_reason="runnerNoProgress"))
    assert not settled(run_view("queued", [], activity="parked", reason="shutdown", park_reason="shutdown"))
    assert not settled(run_view("queued", [], activity="queued"))
    cause = "The agent could not start: Pi was not found"
    assert settled(run_view("queued", [], activity=None, reason=cause, park_reason="agentNoProgress"))
    assert not settled(run_view("running", [step(0, "running")]))


@pytest.mark.parametrize("kind", ["agent", "decision"])
def test_a_run_at_an_agent_step_is_not_settled_its_agent_works_on_it(kind):
    working = run_view("waiting", [step(0, "waiting", kind)], activity="origin_turn")
    assert not settled(working) and not settled(run_view("waiting", [step(0, "waiting", kind)], activity=None))
    assert settled(run_view("waiting", [step(0, "waiting", "checkpoint")], activity="waiting for checkpoint"))
    assert settled(run_view("paused", [step(0, "waiting", kind)], activity="paused"))


def transcript_item(seq: int, role: str, entry: dict) -> dict:
    import json

    return {"runSeq": seq, "piEntryId": "0a1b2c3d", "role": role, "settledAt": None, "entry": json.dumps(entry)}


def test_a_transcript_entry_for_people():
    from piworkflows.cli.agent_steps import entry_lines

    def message(role: str, **fields: object) -> dict:
        return {"type": "message", "id": "0a1b2c3d", "message": {"role": role, **fields}}

    user = entry_lines(transcript_item(1, "user", message("user", content="Fix it.\nThen submit.")))
    assert user == ["#1 user -", "  Fix it.", "  Then submit."]
    call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "x" * 300}}
    said = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Running it."}, call]
    assistant = entry_lines(transcript_item(2, "assistant", message("assistant", content=said, stopReason="toolUse")))
    assert assistant[:3] == ["#2 assistant -", "  (thinking, 3 characters)", "  Running it."]
    assert assistant[3].startswith('  -> bash {"command":"xxx') and assistant[3].endswith("...")
    assert len(assistant[3]) <= len("  -> bash ") + 160
    output = "\n".join(f"line {n}" for n in range(10))
    result = message("toolResult", toolName="bash", isError=True, content=[{"type": "text", "text": output}])
    assert entry_lines(transcript_item(3, "toolResult", result)) == [
        "#3 toolResult bash (error) -",
        "  line 0",
        "  line 1",
        "  line 2",
        "  line 3",
        "  ... (6 more lines)",
    ]
    change = {"type": "model_change", "id": "0a1b2c3d", "provider": "scripted", "modelId": "m"}
    assert entry_lines(transcript_item(4, "model_change", change)) == [
        "#4 [model_change] -",
        '  {"modelId":"m","provider":"scripted"}',
    ]
    aborted = message("assistant", content=[], stopReason="error", errorMessage="rate limited")
    assert entry_lines(transcript_item(5, "assistant", aborted)) == ["#5 assistant -", "  (ended: rate limited)"]


def test_times_are_read_as_views_and_log_pages_give_them():
    """A view's times are ISO-8601 UTC; run.logs and run.transcript pages still give epoch ms."""
    at = "2026-01-01T00:00:01.500Z"
    assert story.epoch_ms(at) == story.epoch_ms(1_767_225_601_500) == 1_767_225_601_500
    assert story.clock(at) == story.clock(1_767_225_601_500) and story.moment(None) == "-"

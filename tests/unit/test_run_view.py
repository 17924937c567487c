"""The run view (``pi-workflows.run-view.v1``, writer/views/run_view.py) in upstream's fields, and
``view.content``, which reads back its content references (writer/views/content.py)."""

from __future__ import annotations

import base64
import hashlib
import re

from piworkflows import canonical
from piworkflows.cli.run_view import current_step
from piworkflows.protocol import frames
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.internal.writer import Reply
from piworkflows.writer import records
from piworkflows.writer.views.content import CHUNK_BYTES, REFERENCE_BYTES, STATE_VALUE_BYTES
from piworkflows.writer.views.run_view import WINDOW
from tests.support import run_create, run_group, submitted

ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")

# upstream's WorkflowRunView, and our piworkflows
TOP_LEVEL = {
    "schema",
    "runId",
    "revision",
    "runRevision",
    "display",
    "manifest",
    "state",
    "workflow",
    "queue",
    "updates",
    "updateStart",
    "updateTotal",
    "graphSteps",
    "takenTransitions",
    "graphHistory",
    "takenTransitionStart",
    "takenTransitionTotal",
    "graphCursor",
    "stepStart",
    "stepTotal",
    "tracePage",
    "session",
    "settingsScopes",
    "settingsStart",
    "settingsTotal",
    "followUpQueue",
    "followUpStart",
    "followUpTotal",
    "workflowMessages",
    "workflowMessageStart",
    "workflowMessageTotal",
    "live",
    "possiblyInterrupted",
    "piworkflows",
}


def read(executor, kind, body):
    (reply,) = run_group(executor, submitted(kind, {"actor": {"actor_class": "client"}, **body}))
    return reply


def view_of(executor, run_id: str = "run-1") -> dict:
    reply = read(executor, "run.get", {"run_id": run_id})
    assert reply.outcome == "accepted", reply
    return reply.receipt


def content(executor, run_id: str, path: str, offset: int = 0) -> Reply:
    return read(executor, "view.content", {"run_id": run_id, "path": path, "offset": offset})


def read_all(executor, run_id: str, reference: dict) -> bytes:
    """A reference's content chunk by chunk, each chunk checked against the last."""
    artifact, data = reference["$artifact"], b""
    while True:
        chunk = content(executor, run_id, artifact["path"], len(data)).receipt
        assert (chunk["offset"], chunk["bytes"], chunk["sha256"]) == (len(data), artifact["bytes"], artifact["sha256"])
        assert len(chunk["data"]) <= CHUNK_BYTES
        data += chunk["data"]
        assert chunk["nextOffset"] == len(data)
        if chunk["complete"]:
            assert hashlib.sha256(data).hexdigest() == artifact["sha256"]
            return data


def times(value) -> list[str]:
    """Every time the view carries (keys ending in At, and ``at``)."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if (key.endswith("At") or key == "at") and isinstance(item, str):
                found.append(item)
            found += times(item)
    elif isinstance(value, list):
        for item in value:
            found += times(item)
    return found


def test_a_queued_run_in_upstreams_fields(executor):
    run_group(executor, run_create("run-1", input_value={"who": "view"}))
    reply = read(executor, "run.get", {"run_id": "run-1"})
    view = reply.receipt
    assert reply.outcome == "accepted" and reply.revision == view["revision"] == 1
    assert set(view) == TOP_LEVEL
    assert view["schema"] == "pi-workflows.run-view.v1" and view["runRevision"] == 1
    state = view["state"]
    assert state["schema"] == "pi-workflows.run-state.v1" and state["traceSeq"] == 1
    assert state["status"] == "running"  # upstream's durable vocabulary: its queue says queued
    assert view["queue"]["status"] == "queued" and view["piworkflows"]["status"] == "queued"
    assert view["display"]["status"] == "queued" and view["manifest"]["status"] == "queued"
    assert state["input"] == {"who": "view"} and state["workflowName"] == "demo"
    assert state["workflowSource"] == {"kind": "builtin", "id": "builtin:demo", "revision": "2"}
    assert state["definitionDigest"].startswith("sha256:") and state["paused"] is False
    assert (state["steps"], state["outputs"], state["results"], view["stepTotal"]) == ([], {}, {}, 0)
    assert "finalOutput" not in state and "error" not in state and "currentNode" not in state
    assert view["workflow"]["schema"] == "pi-workflows.definition-snapshot.v1" and view["workflow"]["nodes"]
    assert view["tracePage"]["items"][0]["type"] == "run.queued" and view["tracePage"]["total"] == 1
    assert view["piworkflows"]["title"] == "demo for tests" and view["piworkflows"]["projectPath"] == "/projects/p1"
    assert view["live"] is False and view["possiblyInterrupted"] is False
    shown = times({key: value for key, value in view.items() if key != "workflow"})  # its startAt is a node
    assert shown and all(ISO_MS.fullmatch(at) for at in shown)


def test_an_open_runner_shows_running_and_an_ended_one_does_not(executor, clock):
    """No clock at view time: a runner is live while its run_workers row is open, and startup
    recovery ends an older server's rows (as orphaned), which the view then shows."""
    run_group(executor, run_create("run-1"))
    conn = executor.conn
    conn.execute("UPDATE runs SET status = 'running' WHERE run_id = 'run-1'")
    conn.execute(
        "INSERT INTO run_workers (run_id, server_epoch, lease_generation, launch_command, start_revision, "
        "created_at) VALUES ('run-1', 1, 1, 'start', 1, 0)"
    )
    assert view_of(executor)["display"]["status"] == "running"
    clock.advance(60_000)  # time alone changes nothing shown
    assert view_of(executor)["display"]["status"] == "running"
    conn.execute("UPDATE run_workers SET outcome = 'orphaned', ended_at = 1 WHERE run_id = 'run-1'")
    assert view_of(executor)["display"]["status"] == "queued"


def test_unknown_run(executor):
    reply = read(executor, "run.get", {"run_id": "nope"})
    assert reply.outcome == "notFound" and reply.receipt == {"code": "runNotFound", "runId": "nope"}


def test_a_value_shaped_like_a_reference_is_escaped(executor):
    run_group(executor, run_create("run-1", input_value={"$artifact": {"path": "x"}}))
    assert view_of(executor)["state"]["input"] == {"$escaped": {"$artifact": {"path": "x"}}}


def test_a_large_input_is_a_reference_read_back_in_verified_chunks(executor):
    value = {"big": "x" * (2 * CHUNK_BYTES + 10)}
    run_group(executor, run_create("run-1", input_value=value))
    reference = view_of(executor)["state"]["input"]
    artifact = reference["$artifact"]
    assert set(reference) == {"$artifact"} and artifact["opaque"] is True and artifact["runId"] == "run-1"
    assert artifact["mediaType"] == "application/json" and artifact["bytes"] > STATE_VALUE_BYTES
    assert artifact["path"] == f"artifacts/sha256/{artifact['sha256']}.json"
    assert canonical.loads(read_all(executor, "run-1", reference)) == value


def test_content_needs_the_run_the_digest_and_the_media_type(executor):
    run_group(executor, run_create("run-1", input_value={"big": "y" * 20_000}), run_create("run-2"))
    path = view_of(executor)["state"]["input"]["$artifact"]["path"]
    before = executor.conn.total_changes
    refused = {
        "another run": content(executor, "run-2", path),
        "another media type": content(executor, "run-1", path.replace(".json", ".txt")),
        "a path not of a reference": content(executor, "run-1", "../state.sqlite"),
        "an unknown run": content(executor, "nope", path),
    }
    for why, reply in refused.items():
        assert (reply.outcome, reply.receipt["code"]) == ("notFound", "contentNotFound"), why
    past = content(executor, "run-1", path, offset=10**9)
    assert (past.outcome, past.receipt["code"]) == ("rejected", "validationFailed")
    end = content(executor, "run-1", path, offset=20_000 + 10).receipt  # the canonical JSON's length
    assert (end["data"], end["complete"]) == (b"", True)
    assert executor.conn.total_changes == before  # reads never write


def add_step(conn, index: int, kind: str = "compute", status: str = "completed", output=None, error=None, request=None):
    """A step of run-1 as the runner's transitions leave it: node n0, n1 or n2 in turn, started at
    1000 + index, finished 5 ms later."""
    blobs = [None if value is None else BlobValue.of_json(value) for value in (output, request)]
    error_blob = None if error is None else BlobValue.of_text(error)
    for blob in (*blobs, error_blob):
        if blob is not None:
            records.put_blob(conn, blob, 0)
    active = status in ("running", "waiting")
    conn.execute(
        "INSERT INTO node_attempts (attempt_id, run_id, node_path, node_kind, visit_number, attempt_number, "
        "attempt_status, outcome, lease_generation, output_digest, error_digest, receipt_digest, started_at, "
        "finished_at) VALUES (?, 'run-1', ?, ?, ?, 1, ?, ?, 1, ?, ?, ?, ?, ?)",
        (
            f"attempt-{index}",
            f"n{index % 3}",  # n0, n1, n2, n0 (its second visit), ...
            kind,
            index // 3 + 1,
            status,
            None if active else ("ok" if error is None else "failed"),
            *(blob.digest if blob else None for blob in (blobs[0], error_blob, blobs[1])),
            1000 + index,
            None if active else 1005 + index,
        ),
    )
    conn.execute(
        "INSERT INTO run_steps (run_id, step_index, attempt_id) VALUES ('run-1', ?, ?)", (index, f"attempt-{index}")
    )


def test_steps_carry_their_values_durations_and_the_current_node(executor):
    run_group(executor, run_create("run-1"))
    big = {"big": "x" * REFERENCE_BYTES}
    add_step(executor.conn, 0, output=big)
    add_step(executor.conn, 1, output={"n": 1}, error="ValueError: no")
    add_step(executor.conn, 2, kind="checkpoint", status="waiting", request={"summary": "go on?"})
    view = view_of(executor)
    first, failed, waiting = view["state"]["steps"]
    assert first["output"]["$artifact"]["bytes"] > REFERENCE_BYTES and first["durationMs"] == 5
    assert canonical.loads(read_all(executor, "run-1", first["output"])) == big  # a node's output is the run's
    assert (first["nodeId"], first["nodeType"], first["outcome"], first["startedAt"]) == (
        "n0",
        "compute",
        "ok",
        "1970-01-01T00:00:01.000Z",
    )
    assert (failed["output"], failed["error"], failed["errorCode"]) == ({"n": 1}, "ValueError: no", None)
    assert "request" not in failed and waiting["request"] == {"summary": "go on?"} and waiting["durationMs"] is None
    state = view["state"]
    assert (state["currentNode"], state["waitingOn"], state["currentAttemptId"]) == ("n2", "n2", "attempt-2")
    assert set(state["results"]) == {"n0", "n1"} and set(state["outputs"]) == {"n0"}  # n1 failed: no output
    assert "currentStep" not in view["piworkflows"] and current_step(view) == waiting
    assert view["piworkflows"]["pending"] == {
        "kind": "checkpoint",
        "nodePath": "n2",
        "attemptId": "attempt-2",
        "request": {"summary": "go on?"},
    }
    assert view["takenTransitions"] == ["n0->n1", "n1->n2"] and view["graphCursor"] == 2
    assert [step["nodeId"] for step in view["graphSteps"]] == ["n0", "n1", "n2"]


def test_a_long_run_shows_the_tail_of_its_steps_with_bounded_values(executor):
    """200 steps of 60 KB outputs: the last WINDOW steps, each value a reference, the view small."""
    run_group(executor, run_create("run-1"))
    total = 200
    for index in range(total - 1):
        add_step(executor.conn, index, output={"n": index, "text": "y" * 60_000})
    add_step(executor.conn, total - 1, kind="checkpoint", status="waiting", request={"summary": "go on?"})
    view = view_of(executor)
    steps = view["state"]["steps"]
    assert (view["stepStart"], view["stepTotal"], len(steps)) == (total - WINDOW, total, WINDOW)
    assert steps[0]["attemptId"] == f"attempt-{total - WINDOW}" and steps[-1]["status"] == "waiting"
    assert all("$artifact" in step["output"] for step in steps[:-1])
    assert [step["attemptId"] for step in view["graphSteps"]] == [step["attemptId"] for step in steps]  # one window
    assert view["takenTransitions"] == ["n0->n1", "n1->n2", "n2->n0"]
    assert len(canonical.dumps(view)) < 256 * 1024  # bounded whatever the run produced
    frames.encode(Reply.kind, 1, {"receipt": view})  # one reply frame holds it
    assert view["state"]["currentNode"] == f"n{(total - 1) % 3}"


def test_view_content_base64_over_the_router_shape(executor):
    """The writer's chunk carries bytes; the router sends them as base64 (client_v1.ContentChunkReceipt)."""
    from piworkflows.protocol import client_v1

    run_group(executor, run_create("run-1", input_value={"text": "z" * 40_000}))
    path = view_of(executor)["state"]["input"]["$artifact"]["path"]
    chunk = dict(content(executor, "run-1", path).receipt)
    chunk["data"] = base64.b64encode(chunk["data"]).decode()
    assert client_v1.ContentChunkReceipt.model_validate(chunk).complete is True


def page_of(executor, kind: str, start: int = 0, limit: int = 256, run_id: str = "run-1"):
    body = {"run_id": run_id, "page_kind": kind, "start": start, "limit": limit}
    return read(executor, "view.page", body)


def test_view_page_reads_any_part_of_a_history_and_agrees_with_the_window(executor):
    run_group(executor, run_create("run-1"))
    total = 150
    for index in range(total):
        add_step(executor.conn, index, output={"n": index})
    first = page_of(executor, "steps", 0, 100).receipt
    assert first["schema"] == "pi-workflows.run-page.v1" and first["kind"] == "steps"
    assert (first["start"], first["total"], len(first["items"]), first["cursor"]) == (0, total, 100, 100)
    assert [item["output"] for item in first["items"][:2]] == [{"n": 0}, {"n": 1}]
    rest = page_of(executor, "steps", first["cursor"]).receipt
    assert (len(rest["items"]), rest["cursor"], rest["items"][-1]["output"]) == (50, None, {"n": total - 1})
    assert page_of(executor, "steps", 500).receipt["items"] == []
    view = view_of(executor)
    tail = page_of(executor, "steps", view["stepStart"], WINDOW).receipt
    assert tail["items"] == view["state"]["steps"] and tail["revision"] == view["revision"]
    trace = page_of(executor, "trace", 0, 1).receipt
    assert trace["items"][0]["type"] == "run.queued" and trace["total"] == view["runRevision"]
    for kind in ("updates", "session_entries", "session_events", "settings", "follow_ups", "workflow_messages"):
        empty = page_of(executor, kind).receipt
        assert (empty["items"], empty["total"], empty["cursor"]) == ([], 0, None), kind
    unknown = page_of(executor, "steps", run_id="nope")
    assert (unknown.outcome, unknown.receipt["code"]) == ("notFound", "runNotFound")

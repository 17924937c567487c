"""Live views over real sockets: view.run.watch snapshots and patches, view.runs.watch pages,
unwatch, a slow reader that is caught up with a fresh snapshot, and the client's RunWatch."""

from __future__ import annotations

import json
import os
import signal
import socket
import uuid

import pytest

from piworkflows.protocol import client_v1
from piworkflows.views.materialize import Document
from piworkflows.views.watch import RunsWatch, RunWatch, WatchEnded
from tests.engine_util import CHECKPOINT, TENSTEP, start, view, wait_status, write
from tests.server_util import ServerProcess, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


class Raw:
    """A client connection read by hand: requests sent, every message kept in order."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(server.state_dir / "host" / "host.sock"))
        self.file = self.sock.makefile("rb")
        assert json.loads(self.file.readline())["type"] == "hello"

    def send(self, operation: str, payload: dict, run_id: str | None = None) -> str:
        request_id = "req-" + uuid.uuid4().hex
        request = client_v1.Request(
            requestId=request_id,
            clientId="raw-client",
            operation=operation,
            idempotencyKey="key-" + uuid.uuid4().hex,
            payload=payload,
            runId=run_id,
        )
        self.sock.sendall(client_v1.encode(request))
        return request_id

    def read(self) -> dict:
        return json.loads(self.file.readline())

    def until(self, predicate) -> list[dict]:
        """Messages up to and including the first that ``predicate`` accepts."""
        seen = []
        while True:
            seen.append(self.read())
            if predicate(seen[-1]):
                return seen

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def snapshots(messages: list[dict], subscription: str) -> list[dict]:
    return [m for m in messages if m["type"] == "event" and m["subscriptionId"] == subscription]


def test_a_watcher_gets_the_snapshot_then_one_after_each_change_in_order(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    raw = Raw(server)
    request_id = raw.send("view.run.watch", {"subscriptionId": "mine"}, run_id)
    first = raw.until(lambda m: m["type"] == "response")[-1]
    assert first["outcome"] == "accepted" and first["receipt"]["subscribed"] is True
    assert first["requestId"] == request_id and first["receipt"]["subscriptionId"] == "mine"
    snapshot = raw.read()  # after the response
    assert (snapshot["event"], snapshot["runId"], snapshot["subscriptionId"]) == ("run_snapshot", run_id, "mine")
    assert snapshot["payload"]["revision"] == snapshot["revision"] == first["receipt"]["revision"]
    assert snapshot["payload"]["display"]["status"] == "waiting"
    with server.client() as client:
        answered = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id)
    assert answered.outcome == "accepted"
    completed = raw.until(lambda m: m.get("payload", {}).get("display", {}).get("status") == "completed")
    events = snapshots(completed, "mine")
    revisions = [event["revision"] for event in events]
    # in order and none twice (snapshots of changes made while one was read are coalesced)
    assert revisions == sorted(set(revisions)) and revisions[0] > snapshot["revision"]
    assert all(event["payload"]["runId"] == run_id for event in events)
    raw.send("view.run.unwatch", {"subscriptionId": "mine"})
    ended = raw.until(lambda m: m["type"] == "response")[-1]
    assert ended["receipt"] == {"subscribed": False, "subscriptionId": "mine"}
    raw.close()


def test_a_patch_watcher_sees_every_revision_once_in_order_and_ends_at_the_snapshot(server, project):
    """A snapshot, then run_patch events whose revisions follow each other with none skipped or
    repeated; the document they make equals the server's snapshot at the same revision."""
    write(project, "tenstep", TENSTEP)
    run_id = start(server, project, "tenstep")
    raw = Raw(server)
    raw.send("view.run.watch", {"subscriptionId": "p", "patches": True}, run_id)
    assert raw.until(lambda m: m["type"] == "response")[-1]["outcome"] == "accepted"
    snapshot = raw.until(lambda m: m["type"] == "event")[-1]
    assert snapshot["event"] == "run_snapshot"
    held = Document(snapshot["payload"])
    seen = [held.revision]
    wait_status(server, run_id, "completed")
    final = view(server, run_id)
    while held.revision < final["revision"]:
        event = raw.read()
        assert event["event"] == "run_patch" and event["subscriptionId"] == "p"
        patch = event["payload"]
        assert patch["schema"] == "pi-workflows.run-patch.v1" and patch["fromRevision"] == held.revision
        seen += [step["revision"] for step in patch["patches"]]
        held.apply(patch)
        if held.revision >= final["revision"]:
            final = view(server, run_id)  # anything after it (the queue settled) comes too
    assert seen == list(range(seen[0], final["revision"] + 1))  # every revision once, in order
    assert held.view == final and held.view["display"]["status"] == "completed"
    raw.close()


# A checkpoint, then 80 node visits: the step, graph and trace windows slide past their 64 rows.
LONG_CHAIN = """
from piworkflows.workflows import checkpoint, compute, define_workflow, edge
nodes = {f"n{i}": compute(lambda ctx, i=i: {"i": i, "text": "x" * 300}) for i in range(80)}
nodes["go"] = checkpoint(summary="go?")
edges = [edge("go", "n0")] + [edge(f"n{i}", f"n{i + 1}") for i in range(79)]
workflow = define_workflow("longchain", "go", nodes, edges, max_steps=100)
"""


def test_a_snapshot_watcher_is_sent_the_view_kept_current_and_ends_at_the_writers_snapshot(server, project):
    """Snapshot watchers get the view the server keeps current with each commit's ops (windows
    sliding, outputs added): in order, and the last equals a fresh read by the writer, member for
    member."""
    write(project, "longchain", LONG_CHAIN)
    run_id = start(server, project, "longchain")
    wait_status(server, run_id, "waiting")
    raw = Raw(server)
    raw.send("view.run.watch", {"subscriptionId": "s"}, run_id)
    assert raw.until(lambda m: m["type"] == "response")[-1]["outcome"] == "accepted"
    last = raw.read()["payload"]
    with server.client() as client:
        answered = client.request("checkpoint.answer", {"nodePath": "go", "answer": {}}, run_id=run_id)
    assert answered.outcome == "accepted"
    wait_status(server, run_id, "completed")
    final = view(server, run_id)
    seen = [last["revision"]]
    while last["revision"] != final["revision"]:
        event = raw.read()
        assert event["event"] == "run_snapshot" and event["revision"] > seen[-1]  # in order, none twice
        last = event["payload"]
        seen.append(last["revision"])
        if last["revision"] >= final["revision"]:
            final = view(server, run_id)  # anything after it (the queue settled) comes too
    assert len(seen) > 2 and last == final
    assert final["stepTotal"] == 81 and len(final["state"]["steps"]) == 64
    raw.close()


def test_a_patch_watcher_catches_up_from_a_retained_revision_without_a_snapshot(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    held = Document(view(server, run_id))
    with server.client() as client:
        client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id)
    wait_status(server, run_id, "completed")
    final = wait_until(lambda: (v := view(server, run_id))["queue"]["status"] == "done" and v, what="settled")
    raw = Raw(server)
    raw.send("view.run.watch", {"subscriptionId": "c", "patches": True, "revision": held.revision}, run_id)
    response = raw.until(lambda m: m["type"] == "response")[-1]
    assert response["receipt"]["revision"] == final["revision"]
    event = raw.read()
    assert event["event"] == "run_patch" and event["payload"]["fromRevision"] == held.revision
    held.apply(event["payload"])
    assert held.view == final
    raw.close()


def test_a_pinned_page_comes_as_run_page_events_when_it_changes(server, project):
    write(project, "tenstep", TENSTEP)
    run_id = start(server, project, "tenstep")
    raw = Raw(server)
    pinned = [{"kind": "steps", "cursor": 2, "limit": 3}, {"kind": "trace", "cursor": 0, "limit": 2}]
    raw.send("view.run.watch", {"subscriptionId": "pin", "patches": True, "pages": pinned}, run_id)
    assert raw.until(lambda m: m["type"] == "response")[-1]["outcome"] == "accepted"
    wait_status(server, run_id, "completed")
    final = wait_until(lambda: (v := view(server, run_id))["queue"]["status"] == "done" and v, what="settled")
    pages: dict[int, dict] = {}
    while (
        len(pages) < 2 or len(pages[0]["items"]) < 3 or pages[0]["items"][-1]["finishedAt"] is None
    ):  # the steps page fills as the run goes
        message = raw.read()
        if message.get("event") == "run_page":
            pages[message["payload"]["page"]] = message["payload"]
    steps, trace = pages[0], pages[1]
    assert (
        steps["kind"] == "steps" and steps["start"] == 2 and [s["nodeId"] for s in steps["items"]] == ["n2", "n3", "n4"]
    )
    assert steps["items"] == final["state"]["steps"][2:5]
    assert trace["kind"] == "trace" and [event["seq"] for event in trace["items"]] == [1, 2]
    raw.close()


def test_a_session_watch_follows_the_run_its_session_starts(server, project):
    """A session with no run gets a snapshot with run null; the run it then starts (interactive,
    from that session) comes in session_snapshot events until it completes; a coordinator's watch
    is refused and the connection stays."""
    write(project, "ask", CHECKPOINT)
    raw = Raw(server)
    raw.send("view.session.watch", {"subscriptionId": "s", "sessionId": "pi-session-1", "coordinator": True})
    refused = raw.until(lambda m: m["type"] == "response")[-1]
    assert (refused["outcome"], refused["receipt"]["code"]) == ("rejected", "notAvailable")
    raw.send("view.session.watch", {"subscriptionId": "s", "sessionId": "pi-session-1"})
    assert raw.until(lambda m: m["type"] == "response")[-1]["receipt"]["subscribed"] is True
    empty = raw.read()
    assert empty["event"] == "session_snapshot" and empty["subscriptionId"] == "s"
    assert empty["payload"]["schema"] == "pi-workflows.session-snapshot.v1"
    assert (empty["payload"]["sessionId"], empty["payload"]["run"]) == ("pi-session-1", None)
    with server.client() as client:
        started = client.request(
            "run.start",
            {
                "projectPath": str(project),
                "workflowName": "ask",
                "input": {},
                "executionMode": "interactive",
                "originSessionId": "pi-session-1",
            },
        )
    assert started.outcome == "accepted", started
    run_id = started.receipt["runId"]
    waiting = raw.until(lambda m: (m["payload"].get("run") or {}).get("display", {}).get("status") == "waiting")
    assert waiting[-1]["payload"]["runId"] == run_id
    with server.client() as client:
        client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id)
    done = raw.until(lambda m: (m["payload"].get("run") or {}).get("display", {}).get("status") == "completed")
    revisions = [m["payload"]["revision"] for m in waiting + done if m.get("event") == "session_snapshot"][1:]
    assert revisions == sorted(set(revisions))  # in order, none twice
    raw.close()


def test_watch_refusals_keep_the_connection(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    raw = Raw(server)
    raw.send("view.run.watch", {}, "run-unknown")
    unknown = raw.until(lambda m: m["type"] == "response")[-1]
    assert (unknown["outcome"], unknown["receipt"]["code"]) == ("notFound", "runNotFound")
    raw.send("view.run.watch", {"pages": [{"kind": "nope", "cursor": 0}]}, run_id)
    pages = raw.until(lambda m: m["type"] == "response")[-1]
    assert (pages["outcome"], pages["receipt"]["code"]) == ("rejected", "validationFailed")
    raw.send("view.run.watch", {}, None)
    no_run = raw.until(lambda m: m["type"] == "response")[-1]
    assert (no_run["outcome"], no_run["receipt"]["code"]) == ("rejected", "validationFailed")
    raw.send("view.run.watch", {"subscriptionId": "ok"}, run_id)  # still served
    assert raw.until(lambda m: m["type"] == "response")[-1]["outcome"] == "accepted"
    raw.close()


@pytest.mark.parametrize("patches", [False, True], ids=["snapshots", "patches"])
def test_a_stalled_watcher_slows_no_one_and_ends_with_a_fresh_snapshot(server, project, patches):
    """A watcher that reads nothing while a run makes many commits: other clients and the run go
    on; when it reads, it is caught up (with the newest snapshot, or with the ops since the
    revision it holds), never a gap shown as current."""
    write(project, "tenstep", TENSTEP)
    stalled = Raw(server)
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    first = start(server, project, "tenstep")
    stalled.send("view.run.watch", {"subscriptionId": "slow", "patches": patches}, first)
    for _ in range(4):  # more runs while it reads nothing; they complete regardless
        wait_status(server, start(server, project, "tenstep"), "completed")
    wait_status(server, first, "completed")
    done = wait_until(lambda: (v := view(server, first))["queue"]["status"] == "done" and v, what="settled")
    held: Document | None = None
    stalled.sock.settimeout(5)
    while held is None or held.revision < done["revision"]:
        message = stalled.read()
        if message["type"] != "event":
            continue
        if message["event"] == "run_snapshot":
            held = Document(message["payload"])
        else:
            assert patches and message["event"] == "run_patch" and held is not None
            held.apply(message["payload"])  # strict: a skipped revision would raise
    assert held.view == done and held.view["display"]["status"] == "completed"
    stalled.close()


def test_run_watch_follows_a_run_and_the_run_list_watch_sees_new_runs(server, project):
    write(project, "ask", CHECKPOINT)
    with RunsWatch(server.state_dir, {"projectPath": str(project)}) as runs:
        empty = runs.next(timeout=30)
        assert empty is not None and empty["schema"] == "pi-workflows.run-list-page.v1" and empty["total"] == 0
        run_id = start(server, project, "ask")
        page = wait_until(lambda: (p := runs.next(timeout=1)) and p["total"] == 1 and p, what="a runs event")
        assert page["items"][0]["runId"] == run_id
    with RunWatch(server.state_dir, run_id) as watch:
        view = wait_until(
            lambda: (v := watch.next(timeout=1) or watch.document) and v["display"]["status"] == "waiting" and v,
            what="waiting",
        )
        assert view["runId"] == run_id
        with server.client() as client:
            client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": False}}, run_id=run_id)
        done = wait_until(
            lambda: (v := watch.next(timeout=1) or watch.document) and v["display"]["status"] == "completed" and v,
            what="completed",
        )
        assert done["state"]["outputs"]["no"] == {"answered": False}
    with pytest.raises(WatchEnded) as ended, RunWatch(server.state_dir, "run-unknown") as unknown:
        unknown.next(timeout=30)
    assert (ended.value.outcome, ended.value.code) == ("notFound", "runNotFound")


def test_a_watcher_goes_on_after_the_writer_was_killed(server, project):
    """A writer killed and restarted may have committed changes it never told: every watched run
    is read again, so the watcher still ends with the run's newest state."""
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    with RunWatch(server.state_dir, run_id) as watch:
        assert watch.next(timeout=30)["display"]["status"] == "waiting"
        writer = next(c for c in server.registry()["children"] if c["role"] == "writer")
        os.kill(writer["pid"], signal.SIGKILL)
        with server.client() as client:  # retried with its key until the new writer answers
            answer = {"nodePath": "ask", "answer": {"go": True}}
            assert client.request("checkpoint.answer", answer, run_id=run_id).outcome in ("accepted", "adopted")
        done = wait_until(
            lambda: (v := watch.next(timeout=1) or watch.document) and v["display"]["status"] == "completed" and v,
            what="the completed run through the watch",
        )
        assert done["state"]["outputs"]["yes"] == {"answered": True}


def test_a_patch_watcher_catches_up_from_the_deltas_after_a_writer_restart(server, project):
    """The writer is killed while a patch watcher follows a run: what the new writer commits (and
    what the old one may have committed untold) reaches the watcher from viewer_deltas as patches,
    every revision exactly once, in order, ending at the server's snapshot."""
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    raw = Raw(server)
    raw.send("view.run.watch", {"subscriptionId": "k", "patches": True}, run_id)
    assert raw.until(lambda m: m["type"] == "response")[-1]["outcome"] == "accepted"
    held = Document(raw.until(lambda m: m["type"] == "event")[-1]["payload"])
    seen = [held.revision]
    writer = next(c for c in server.registry()["children"] if c["role"] == "writer")
    os.kill(writer["pid"], signal.SIGKILL)
    with server.client() as client:  # retried with its key until the new writer answers
        answer = {"nodePath": "ask", "answer": {"go": True}}
        assert client.request("checkpoint.answer", answer, run_id=run_id).outcome in ("accepted", "adopted")
    final = wait_until(lambda: (v := view(server, run_id))["queue"]["status"] == "done" and v, what="settled")
    while held.revision < final["revision"]:
        event = raw.read()
        assert event["event"] == "run_patch", event["event"]  # caught up from the deltas, no snapshot
        seen += [step["revision"] for step in event["payload"]["patches"]]
        held.apply(event["payload"])
    assert seen == list(range(seen[0], final["revision"] + 1))  # every revision once, in order
    assert held.view == final
    raw.close()


@pytest.mark.parametrize("patches", [False, True], ids=["snapshots", "patches"])
def test_deleting_a_watched_run_ends_its_watch(server, project, patches):
    write(project, "tenstep", TENSTEP)
    run_id = start(server, project, "tenstep")
    wait_status(server, run_id, "completed")
    raw = Raw(server)
    raw.send("view.run.watch", {"subscriptionId": "gone", "patches": patches}, run_id)
    assert raw.until(lambda m: m["type"] == "response")[-1]["outcome"] == "accepted"
    with server.client() as client:
        assert client.request("run.delete", {}, run_id=run_id).outcome == "accepted"
    ended = raw.until(lambda m: m.get("event") == "unavailable")[-1]
    assert (ended["subscriptionId"], ended["runId"], ended["payload"]["code"]) == ("gone", run_id, "runNotFound")
    raw.send("view.run.unwatch", {"subscriptionId": "gone"})  # already ended: still answered
    assert raw.until(lambda m: m["type"] == "response")[-1]["receipt"]["subscribed"] is False
    raw.close()

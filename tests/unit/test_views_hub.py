"""The supervisor's live views (supervisor/views.py) with a fake writer and fake connections: one
read per change burst, one encoding per event, a slow reader caught up with the newest snapshot,
a deleted run, the bounds of a connection's watches."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from piworkflows.errors import CommandError
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal.writer import Reply, RunOps
from piworkflows.supervisor import views as hub
from piworkflows.supervisor.views import MAX_WATCHES, Recent, Views, event_line, patch_lines, subscriber

pytestmark = pytest.mark.timeout(30)


class Writer:
    """Answers run.get with the run's current revision; ``gate`` holds reads back while cleared."""

    def __init__(self) -> None:
        self.revision = {"run-1": 1}
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def request(self, kind: str, body: dict) -> Reply:
        self.reads += 1
        await self.gate.wait()
        if kind == "run.list":
            page = {"schema": "pi-workflows.run-list-page.v1", "revision": f"{len(self.revision)}:x", "items": []}
            return Reply(outcome="accepted", receipt=page)
        run = body["run_id"]
        if run not in self.revision:
            return Reply(outcome="notFound", receipt={"code": "runNotFound", "runId": run}, error="no such run")
        view = {"schema": "pi-workflows.run-view.v1", "runId": run, "revision": self.revision[run]}
        view |= {"runRevision": self.revision[run] + 10, "x": f"read at {self.revision[run]}"}
        if kind == "view.patches":  # as when the revisions are past retention
            return Reply(outcome="accepted", receipt={"snapshot": view})
        return Reply(outcome="accepted", receipt=view)


class Conn:
    def __init__(self, name: str = "conn-1") -> None:
        self.id, self.closed, self.watches = name, False, set()
        self.lines: list[dict] = []
        self.open = True  # whether its buffer takes events
        self.read_down = asyncio.Event()
        self.dropped: list[str] = []

    def send_event(self, line: bytes) -> bool:
        if self.open:
            self.lines.append(json.loads(line))
        return self.open

    async def drained(self) -> None:
        await self.read_down.wait()

    def drop(self, kind: str, message: str, *args: object, level: int = logging.INFO) -> None:
        self.dropped.append(kind)
        self.closed = True


def request(operation: str, run_id: str | None = "run-1") -> client_v1.Request:
    return client_v1.Request(
        requestId="req-1", clientId="c", operation=operation, idempotencyKey="k", payload={}, runId=run_id
    )


async def settle() -> None:
    """Let every ready task run (the hub's reads and callbacks), a bounded number of turns."""
    for _ in range(20):
        await asyncio.sleep(0)


async def watching(
    views: Views, conn: Conn, subscription: str = "s1", revision: int | None = None, patches: bool = False
) -> Reply:
    subscriber.set(conn)
    payload = client_v1.ViewRunWatchPayload(subscriptionId=subscription, revision=revision, patches=patches)
    reply = await views.watch_run(request("view.run.watch"), payload)
    await settle()
    return reply


def test_one_event_line_serves_every_subscriber():
    line = event_line("run_snapshot", {"subscriptionId": "in the payload", "x": 1}, "run-1", 7)
    for subscription in ("a", 'quote"d'):
        message = json.loads(line(subscription))
        assert message["subscriptionId"] == subscription and message["payload"]["subscriptionId"] == "in the payload"
        event = client_v1.Event(
            subscriptionId=subscription, event="run_snapshot", payload=message["payload"], runId="run-1", revision=7
        )
        assert line(subscription) == client_v1.encode(event)  # exactly the canonical line


def test_a_watch_gets_its_snapshot_then_one_per_change_burst(monkeypatch):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)  # the burst, not the pause between reads

    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        views = Views(writer)
        reply = await watching(views, conn)
        assert reply.receipt == {"subscribed": True, "subscriptionId": "s1", "revision": 1}
        assert [line["revision"] for line in conn.lines] == [1]
        writer.gate.clear()  # a read in flight while three more commits come
        writer.revision["run-1"] = 2
        views.advanced(["run-1"])
        await settle()
        for revision in (3, 4, 5):
            writer.revision["run-1"] = revision
            views.advanced(["run-1", "run-other"])
        reads = writer.reads
        writer.gate.set()
        await settle()
        assert writer.reads == reads + 1  # the burst became one more read
        assert [line["revision"] for line in conn.lines] == [1, 5]  # the first read saw 5 already
        views.advanced(["run-1"])  # nothing new: nothing sent twice
        await settle()
        assert [line["revision"] for line in conn.lines] == [1, 5]

    asyncio.run(scenario())


def test_a_run_is_read_at_most_once_per_interval(monkeypatch):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0.2)

    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        views = Views(writer)
        await watching(views, conn)
        loop = asyncio.get_running_loop()
        sent_at = []
        for revision in (2, 3):
            writer.revision["run-1"] = revision
            views.advanced(["run-1"])
            await asyncio.wait_for(asyncio.gather(*(r.task for r in views.reads.values() if r.task)), 5)
            sent_at.append(loop.time())
        assert [line["revision"] for line in conn.lines] == [1, 2, 3]
        assert sent_at[1] - sent_at[0] >= 0.2 - 0.01  # the second change waited for the interval

    asyncio.run(scenario())


def test_a_watch_at_the_current_revision_gets_nothing_until_a_change():
    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        views = Views(writer)
        await watching(views, conn, revision=1)
        assert conn.lines == []
        writer.revision["run-1"] = 2
        views.advanced(["run-1"])
        await settle()
        assert [line["revision"] for line in conn.lines] == [2]

    asyncio.run(scenario())


def test_a_slow_reader_is_caught_up_with_the_newest_snapshot(monkeypatch):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)

    async def scenario() -> None:
        writer, slow, quick = Writer(), Conn("slow"), Conn("quick")
        views = Views(writer)
        await watching(views, slow)
        await watching(views, quick)
        slow.open = False  # its buffer is full
        for revision in (2, 3, 4):
            writer.revision["run-1"] = revision
            views.advanced(["run-1"])
            await settle()
        assert [line["revision"] for line in quick.lines] == [1, 2, 3, 4]  # the other goes on
        assert [line["revision"] for line in slow.lines] == [1]
        slow.open = True
        slow.read_down.set()  # it read its buffer down
        await settle()
        assert [line["revision"] for line in slow.lines] == [1, 4]  # the newest, no stale one

    asyncio.run(scenario())


def test_a_reader_behind_for_too_long_is_closed(monkeypatch):
    monkeypatch.setattr(hub, "CATCH_UP_S", 0.05)

    async def scenario() -> None:
        writer, slow = Writer(), Conn("slow")
        views = Views(writer)
        await watching(views, slow)
        slow.open = False
        writer.revision["run-1"] = 2
        views.advanced(["run-1"])
        await settle()
        await asyncio.wait_for(asyncio.gather(*views.catching_up.values()), 5)
        assert slow.dropped == ["slow watcher"]

    asyncio.run(scenario())


def test_a_deleted_run_ends_its_watches_and_closed_connections_are_forgotten():
    async def scenario() -> None:
        writer, conn, other = Writer(), Conn(), Conn("conn-2")
        views = Views(writer)
        await watching(views, conn)
        await watching(views, other)
        views.forget(other)
        assert other.watches == set() and len(views.by_run["run-1"]) == 1
        del writer.revision["run-1"]
        views.advanced(["run-1"])
        await settle()
        assert conn.lines[-1]["event"] == "unavailable" and conn.lines[-1]["payload"]["code"] == "runNotFound"
        assert conn.watches == set() and views.by_run == {} and views.watches == {}

    asyncio.run(scenario())


def test_a_connection_watches_a_bounded_number_and_a_reused_id_replaces():
    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        views = Views(writer)
        for n in range(MAX_WATCHES):
            await watching(views, conn, f"s{n}")
        await watching(views, conn, "s0")  # a reused id: replaced, not added
        assert len(conn.watches) == MAX_WATCHES
        with pytest.raises(CommandError) as refused:
            await watching(views, conn, "one-more")
        assert refused.value.code == "tooManyWatches"
        subscriber.set(conn)
        await views.unwatch(request("view.run.unwatch"), "s1")
        assert len(conn.watches) == MAX_WATCHES - 1

    asyncio.run(scenario())


def ops(revision: int, value: str = "v") -> RunOps:
    """run-1's revision as the writer tells it in viewer.advanced (run revision ten ahead)."""
    encoded = b'[{"op":"replace","path":"/x","value":' + json.dumps(value).encode() + b"}]"
    return RunOps(run_id="run-1", revision=revision, run_revision=revision + 10, ops=encoded)


def test_recent_keeps_the_newest_revisions_without_a_gap(monkeypatch):
    monkeypatch.setattr(hub, "RECENT_REVISIONS", 3)
    recent = Recent()
    assert recent.since(0) is None  # nothing shows yet where its revisions start
    for revision in (2, 3, 4, 5):
        told = ops(revision)
        recent.add(told.revision, told.run_revision, told.ops)
    assert [item[0] for item in recent.revisions] == [3, 4, 5]  # the oldest went
    assert recent.since(1) is None  # revision 2 is no longer here
    assert [item[0] for item in recent.since(2) or ()] == [3, 4, 5]
    assert recent.since(5) == [] and recent.since(6) == []  # nothing newer came
    member = json.loads(recent.revisions[0][2])
    assert member == {"ops": [{"op": "replace", "path": "/x", "value": "v"}], "revision": 3}
    recent.add(7, 17, ops(7).ops)  # revision 6 was committed untold (its notice lost)
    assert [item[0] for item in recent.revisions] == [7] and recent.since(5) is None
    assert [item[0] for item in recent.since(6) or ()] == [7]
    recent.forget_through(7)
    assert recent.since(7) == [] and recent.since(6) is None
    read = Recent()  # a read made after it found the run at revision 10: every later one comes
    read.read(10)
    read.add(10, 20, ops(10).ops)  # told after the read had shown it: not kept twice
    read.add(11, 21, ops(11).ops)
    assert [item[0] for item in read.since(10) or ()] == [11] and read.since(9) is None


def test_patch_lines_split_a_backlog_into_events_within_the_bound(monkeypatch):
    recent = Recent()
    for revision in range(2, 8):
        recent.add(revision, revision + 10, ops(revision, "x" * 40).ops)
    size = len(recent.revisions[0][2])
    monkeypatch.setattr(hub, "PATCH_EVENT_BYTES", 2 * size + 2)  # two revisions to an event
    events = patch_lines("run-1", 1, recent.since(1) or [])
    assert events is not None and [(start, end) for start, end, _ in events] == [(1, 3), (3, 5), (5, 7)]
    for start, end, line in events:
        message = json.loads(line("s1"))
        payload = message["payload"]
        assert message["event"] == "run_patch" and message["subscriptionId"] == "s1" and message["revision"] == end
        assert (payload["fromRevision"], payload["revision"], payload["runRevision"]) == (start, end, end + 10)
        assert [patch["revision"] for patch in payload["patches"]] == [start + 1, end]
        expected = client_v1.Event(subscriptionId="s1", event="run_patch", payload=payload, runId="run-1", revision=end)
        assert line("s1") == client_v1.encode(expected)  # exactly the canonical line
    monkeypatch.setattr(hub, "PATCH_EVENT_BYTES", size - 1)
    assert patch_lines("run-1", 1, recent.since(1) or []) is None  # one revision alone is too big


def test_a_patch_watcher_is_sent_the_told_ops_without_a_read(monkeypatch):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)

    async def scenario() -> None:
        writer, conn, told = Writer(), Conn(), []
        views = Views(writer, watch=told.append)
        await watching(views, conn, patches=True)
        assert told == [["run-1"]]  # the writer is told to bring run-1's ops from now on
        reads = writer.reads
        for revision in (2, 3):
            writer.revision["run-1"] = revision
            views.advanced(["run-1"], [ops(revision)])
            await settle()
        assert writer.reads == reads  # no read: the ops came with viewer.advanced
        assert [(line["event"], line["revision"]) for line in conn.lines] == [
            ("run_snapshot", 1),
            ("run_patch", 2),
            ("run_patch", 3),
        ]
        assert conn.lines[-1]["payload"]["patches"] == [
            {"revision": 3, "ops": [{"op": "replace", "path": "/x", "value": "v"}]}
        ]
        writer.revision["run-1"] = 5  # revision 4 was committed untold (a writer restart)
        views.advanced(["run-1"], [ops(5)])
        await settle()
        assert writer.reads == reads + 1 and conn.lines[-1]["event"] == "run_snapshot"  # read, not skipped
        subscriber.set(conn)
        await views.unwatch(request("view.run.unwatch"), "s1")
        assert told == [["run-1"], []] and views.recent == {}

    asyncio.run(scenario())


def test_a_patch_too_big_for_one_event_becomes_a_snapshot(monkeypatch):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)
    monkeypatch.setattr(hub, "PATCH_EVENT_BYTES", 200)

    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        views = Views(writer, watch=lambda runs: None)
        await watching(views, conn, patches=True)
        writer.revision["run-1"] = 2
        views.advanced(["run-1"], [ops(2, "x" * 300)])
        await settle()
        assert [(line["event"], line["revision"]) for line in conn.lines] == [("run_snapshot", 1), ("run_snapshot", 2)]
        writer.revision["run-1"] = 3
        views.advanced(["run-1"], [ops(3)])  # patches again from the snapshot's revision
        await settle()
        assert [line["event"] for line in conn.lines][-1] == "run_patch"

    asyncio.run(scenario())


def test_a_fan_out_lets_the_loop_run_between_batches_and_skips_a_watch_gone_meanwhile(monkeypatch):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)
    monkeypatch.setattr(hub, "FAN_OUT_BATCH", 1)
    order: list[str] = []
    forgotten: list[Conn] = []
    armed: list[bool] = []

    class Noting(Conn):
        def send_event(self, line: bytes) -> bool:
            if armed and not order:  # the fan-out's first send: other work is ready meanwhile
                waiting = next(conn for conn in conns if conn is not self)
                asyncio.get_running_loop().call_soon(lambda: (order.append("other"), views.forget(waiting)))
                forgotten.append(waiting)
            order.append(self.id)
            return super().send_event(line)

    writer = Writer()
    views = Views(writer)
    conns = [Noting(f"conn-{n}") for n in range(3)]

    async def scenario() -> None:
        for conn in conns:
            await watching(views, conn)
        order.clear()
        armed.append(True)
        writer.revision["run-1"] = 2
        views.advanced(["run-1"])
        await settle()
        assert len(order) == 3 and order[1] == "other"  # the loop ran between the two sends
        assert forgotten[0].id not in order and [line["revision"] for line in forgotten[0].lines] == [1]

    asyncio.run(scenario())


def test_a_snapshot_watcher_is_sent_the_view_kept_current_from_the_ops(monkeypatch, caplog):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)

    async def scenario() -> None:
        writer, conn, told = Writer(), Conn(), []
        views = Views(writer, watch=told.append)
        await watching(views, conn)
        assert told == [["run-1"]]  # snapshot watchers' runs bring their ops too
        reads = writer.reads
        for revision, value in ((2, "a"), (3, "b")):
            writer.revision["run-1"] = revision
            views.advanced(["run-1"], [ops(revision, value)])
            await settle()
        assert writer.reads == reads  # the view kept here, brought forward with the ops
        assert [(line["revision"], line["payload"]["x"], line["payload"]["runRevision"]) for line in conn.lines] == [
            (1, "read at 1", 11),
            (2, "a", 12),
            (3, "b", 13),
        ]
        other = Conn("conn-2")
        await watching(views, other)  # a new watcher's first snapshot: the kept view
        assert writer.reads == reads and other.lines[-1]["payload"]["x"] == "b"
        views.advanced(None)  # a new writer: what the lost one committed may not have been told
        writer.revision["run-1"] = 5
        views.advanced(["run-1"], [ops(5, "c")])
        await settle()
        assert writer.reads == reads + 1 and conn.lines[-1]["payload"]["x"] == "read at 5"
        writer.revision["run-1"] = 6
        views.advanced(["run-1"], [ops(6, "d")])
        await settle()
        assert writer.reads == reads + 1 and conn.lines[-1]["payload"]["x"] == "d"
        writer.revision["run-1"] = 7
        views.advanced(
            ["run-1"], [RunOps(run_id="run-1", revision=7, run_revision=17, ops=b'[{"op":"remove","path":"/nope"}]')]
        )
        await settle()  # an op that does not apply: logged, and the view read again
        assert writer.reads == reads + 2 and conn.lines[-1]["payload"]["x"] == "read at 7"

    caplog.set_level(logging.ERROR)
    asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if "kept run view" in r.getMessage()]


def test_at_most_materialized_runs_views_are_kept(monkeypatch):
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)
    monkeypatch.setattr(hub, "MATERIALIZED_RUNS", 1)

    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        writer.revision["run-2"] = 1
        views = Views(writer, watch=lambda runs: None)
        await watching(views, conn, "s1")
        subscriber.set(conn)
        payload = client_v1.ViewRunWatchPayload(subscriptionId="s2")
        await views.watch_run(request("view.run.watch", "run-2"), payload)
        await settle()
        assert list(views.documents) == ["run-2"]  # the least recently used went
        subscriber.set(conn)
        await views.unwatch(request("view.run.unwatch"), "s2")
        assert views.documents == {} and list(views.recent) == ["run-1"]

    asyncio.run(scenario())


@pytest.mark.parametrize("patches", [False, True], ids=["snapshots", "patches"])
def test_a_deleted_run_with_its_ops_told_ends_its_watches(monkeypatch, patches):
    """A notice without ops for a run whose ops come (it was deleted) is read, not trusted."""
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)

    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        views = Views(writer, watch=lambda runs: None)
        await watching(views, conn, patches=patches)
        writer.revision["run-1"] = 2
        views.advanced(["run-1"], [ops(2)])
        await settle()
        del writer.revision["run-1"]
        views.advanced(["run-1"])
        await settle()
        assert conn.lines[-1]["event"] == "unavailable" and conn.watches == set() and views.recent == {}

    asyncio.run(scenario())


def test_a_patch_watcher_holding_a_document_gets_patches_not_a_stray_snapshot(monkeypatch):
    """A snapshot fan-out that grouped a patch watcher while its first snapshot was pending reaches
    it after it holds that one: it is sent the patches from its revision instead."""
    monkeypatch.setattr(hub, "SNAPSHOT_INTERVAL_S", 0)

    async def scenario() -> None:
        writer, conn = Writer(), Conn()
        views = Views(writer, watch=lambda runs: None)
        await watching(views, conn, patches=True)
        (watch,) = views.by_run["run-1"]
        writer.revision["run-1"] = 2
        views.advanced(["run-1"], [ops(2)])
        await settle()
        assert [line["event"] for line in conn.lines] == ["run_snapshot", "run_patch"] and watch.sent == 2
        writer.revision["run-1"] = 3
        views.recent["run-1"].add(3, 13, ops(3).ops)
        stray = event_line("run_snapshot", {"revision": 3}, "run-1", 3)
        views._deliver(watch, stray, 3)
        await settle()
        assert [line["event"] for line in conn.lines] == ["run_snapshot", "run_patch", "run_patch"]
        assert conn.lines[-1]["payload"]["fromRevision"] == 2 and watch.sent == 3

    asyncio.run(scenario())

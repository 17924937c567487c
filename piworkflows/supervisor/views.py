"""Live views: the watches of each client connection and the events they get.

::

    view.run.watch {subscriptionId?, revision?}, the run in runId
        response {subscribed, subscriptionId, revision}, then run_snapshot (the run view) now and
        after every commit that changed the run; a snapshot the watcher holds already is not sent
    view.runs.watch {subscriptionId?, limit?, filters of run.list}
        response {subscribed, subscriptionId}, then runs (the list's first page) now and after
        changes, at most one per LIST_INTERVAL_S (upstream's client pages on with view.runs.page)
    view.run.unwatch {subscriptionId}    any kind; {subscribed: false}
    a deleted run: unavailable {code: runNotFound, message}, and its watches end

    writer ── viewer.advanced [run ids] ──> Views.advanced ── per watched run, one snapshot read
        (run.get) at a time and at most one per SNAPSHOT_INTERVAL_S; changes meanwhile are
        coalesced into the next read
    one encoding per event: the line is built once and each subscriber's id spliced in

Backpressure: a connection with more than EVENT_BUFFER_BYTES unsent gets no event; its watches are
marked behind and, once it has read its buffer down, get the run's current snapshot. Snapshots
replace each other, so a slow reader skips revisions but never sees a stale document as current,
and never slows the writer or another client. One still behind after CATCH_UP_S is closed.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from piworkflows import canonical
from piworkflows.errors import CommandError
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal.writer import Reply
from piworkflows.supervisor.seams import WriterRequests

log = logging.getLogger("piworkflows.supervisor")

MAX_WATCHES = 64  # per connection
EVENT_BUFFER_BYTES = 256 * 1024  # unsent bytes past which a connection gets no more events for now
CATCH_UP_S = 30.0  # a connection behind for longer is closed
LIST_INTERVAL_S = 0.25  # at most four run-list pages a second
# At most one snapshot read of a run per this interval: a busy run's watchers get its newest state
# this often, and the writer spends a bounded share of its time on them (BENCHMARKS.md, views).
SNAPSHOT_INTERVAL_S = 0.25
RETRY_S = 0.5  # a snapshot read the writer could not answer (restarting) is tried again after this
SERVER = {"actor_class": "server"}
_PLACEHOLDER = "subscription-placeholder"
_MARKER = b'"subscriptionId":"' + _PLACEHOLDER.encode() + b'"'


class Subscriber(Protocol):
    """A client connection as live views use it (supervisor/server.py's Connection)."""

    id: str
    closed: bool
    watches: set[str]

    def send_event(self, line: bytes) -> bool: ...

    async def drained(self) -> None: ...

    def drop(self, kind: str, message: str, *args: object, level: int = logging.INFO) -> None: ...


# The connection whose request is being handled (set by the connection for each request).
subscriber: contextvars.ContextVar[Subscriber | None] = contextvars.ContextVar("subscriber", default=None)


@dataclass(eq=False)
class Watch:
    conn: Subscriber
    subscription_id: str
    run_id: str | None  # None: the run list
    list_body: dict[str, Any] | None = None
    sent: int | str | None = None  # the revision of the last snapshot or page sent
    behind: bool = False


@dataclass
class _Read:
    """A run whose snapshot is being read, and whether it changed again meanwhile."""

    again: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def event_line(
    event: str, payload: Any, run_id: str | None = None, revision: int | None = None
) -> Callable[[str], bytes]:
    """The event's line for any subscription id: encoded once, the id spliced in per subscriber."""
    line = client_v1.encode(
        client_v1.Event(subscriptionId=_PLACEHOLDER, event=event, payload=payload, runId=run_id, revision=revision)
    )
    head, found, tail = line.rpartition(_MARKER)  # the envelope's members follow the payload's
    assert found, "an event line names its subscription"
    return lambda subscription_id: head + b'"subscriptionId":' + canonical.dumps_bytes(subscription_id) + tail


class Views:
    def __init__(self, writer: WriterRequests) -> None:
        self.writer = writer
        self.watches: dict[tuple[str, str], Watch] = {}  # (connection id, subscription id)
        self.by_run: dict[str, set[Watch]] = {}
        self.lists: set[Watch] = set()
        self.reads: dict[str, _Read] = {}
        self.read_at: dict[str, float] = {}  # when each watched run's snapshot was last read (loop time)
        self.list_task: asyncio.Task[None] | None = None
        self.list_dirty = False
        self.catching_up: dict[str, asyncio.Task[None]] = {}

    # --- requests ---------------------------------------------------------------------------

    async def watch_run(self, request: client_v1.Request, payload: client_v1.ViewRunWatchPayload) -> Reply:
        """The watch's receipt, or the writer's refusal (an unknown run: notFound)."""
        conn = _current(request)
        if payload.patches:
            raise CommandError("notAvailable", "run patches are not served yet: watch without patches for snapshots")
        if payload.pages is not None:
            raise CommandError("notAvailable", "pinned pages are not served yet")
        assert request.runId is not None
        # Watching before the read: a commit while it is read is not missed (a newer snapshot wins).
        watch = self._add(conn, payload.subscriptionId or request.requestId, request.runId)
        reply = await self.writer.request("run.get", {"actor": SERVER, "run_id": request.runId})
        if reply.outcome != "accepted" or reply.receipt is None:
            self._remove(watch)
            return reply
        revision = reply.receipt["revision"]
        if payload.revision != revision:  # the client's own is current: nothing to send
            asyncio.get_running_loop().call_soon(self._send_snapshot, watch, reply.receipt)
        else:
            watch.sent = revision
        receipt = {"subscribed": True, "subscriptionId": watch.subscription_id, "revision": revision}
        return Reply(outcome="accepted", receipt=receipt)

    async def watch_runs(
        self, request: client_v1.Request, payload: client_v1.ViewRunsWatchPayload, body: dict[str, Any]
    ) -> Reply:
        """The watch's receipt, or the writer's refusal."""
        conn = _current(request)
        watch = self._add(conn, payload.subscriptionId or request.requestId, None, body)
        reply = await self.writer.request("run.list", body)
        if reply.outcome != "accepted" or reply.receipt is None:
            self._remove(watch)
            return reply
        asyncio.get_running_loop().call_soon(self._send_page, watch, reply.receipt)
        return Reply(outcome="accepted", receipt={"subscribed": True, "subscriptionId": watch.subscription_id})

    async def unwatch(self, request: client_v1.Request, subscription_id: str) -> Reply:
        watch = self.watches.get((_current(request).id, subscription_id))
        if watch is not None:
            self._remove(watch)
        return Reply(outcome="accepted", receipt={"subscribed": False, "subscriptionId": subscription_id})

    def forget(self, conn: Subscriber) -> None:
        """A closed connection's watches end."""
        for watch in [w for (conn_id, _), w in self.watches.items() if conn_id == conn.id]:
            self._remove(watch)
        task = self.catching_up.pop(conn.id, None)
        if task is not None:
            task.cancel()

    def _add(
        self, conn: Subscriber, subscription_id: str, run_id: str | None, body: dict[str, Any] | None = None
    ) -> Watch:
        old = self.watches.get((conn.id, subscription_id))
        if old is not None:
            self._remove(old)  # a reused id replaces its watch
        elif len(conn.watches) >= MAX_WATCHES:
            raise CommandError("tooManyWatches", f"a connection watches at most {MAX_WATCHES} things at once")
        watch = Watch(conn, subscription_id, run_id, body)
        self.watches[(conn.id, subscription_id)] = watch
        conn.watches.add(subscription_id)
        if run_id is None:
            self.lists.add(watch)
        else:
            self.by_run.setdefault(run_id, set()).add(watch)
        return watch

    def _remove(self, watch: Watch) -> None:
        self.watches.pop((watch.conn.id, watch.subscription_id), None)
        watch.conn.watches.discard(watch.subscription_id)
        if watch.run_id is None:
            self.lists.discard(watch)
            return
        watchers = self.by_run.get(watch.run_id)
        if watchers is not None:
            watchers.discard(watch)
            if not watchers:
                del self.by_run[watch.run_id]
                self.read_at.pop(watch.run_id, None)

    # --- commits ----------------------------------------------------------------------------

    def advanced(self, runs: list[str] | None) -> None:
        """The writer committed changes to these runs' views (None: anything may have changed, the
        writer restarted). Called on the event loop."""
        for run_id in list(self.by_run) if runs is None else runs:
            if run_id in self.by_run:
                self._refresh(run_id)
        if self.lists:
            self._list_changed()

    def _refresh(self, run_id: str) -> None:
        read = self.reads.get(run_id)
        if read is not None:
            read.again = True
            return
        read = self.reads[run_id] = _Read()
        read.task = asyncio.create_task(self._read(run_id, read), name=f"view-{run_id}")

    async def _read(self, run_id: str, read: _Read) -> None:
        loop = asyncio.get_running_loop()
        try:
            while run_id in self.by_run:
                last = self.read_at.get(run_id)
                if last is not None and last + SNAPSHOT_INTERVAL_S > loop.time():
                    await asyncio.sleep(last + SNAPSHOT_INTERVAL_S - loop.time())  # changes until then: this read
                read.again = False
                self.read_at[run_id] = loop.time()
                reply = await self.writer.request("run.get", {"actor": SERVER, "run_id": run_id})
                if reply.outcome == "accepted" and reply.receipt is not None:
                    line = event_line("run_snapshot", reply.receipt, run_id, reply.receipt["revision"])
                    for watch in list(self.by_run.get(run_id, ())):
                        self._deliver(watch, line, reply.receipt["revision"])
                elif reply.outcome == "notFound":
                    self._end_run(run_id)
                    return
                else:  # the writer cannot read now (restarting): again after a while
                    read.again = True
                    await asyncio.sleep(RETRY_S)
                if not read.again:
                    return
        except Exception as exc:  # one run's failure ends its read, never the server
            log.error("a run view could not be sent: %s", type(exc).__name__)
        finally:
            self.reads.pop(run_id, None)

    def _end_run(self, run_id: str) -> None:
        """The run is gone (deleted): its watchers are told, their watches end."""
        line = event_line("unavailable", {"code": "runNotFound", "message": "the run was deleted"}, run_id)
        for watch in list(self.by_run.get(run_id, ())):
            watch.conn.send_event(line(watch.subscription_id))
            self._remove(watch)

    def _send_snapshot(self, watch: Watch, view: dict[str, Any]) -> None:
        if self.watches.get((watch.conn.id, watch.subscription_id)) is watch:
            self._deliver(watch, event_line("run_snapshot", view, watch.run_id, view["revision"]), view["revision"])

    def _send_page(self, watch: Watch, page: dict[str, Any]) -> None:
        if self.watches.get((watch.conn.id, watch.subscription_id)) is watch:
            self._deliver(watch, event_line("runs", page), page["revision"])

    def _deliver(self, watch: Watch, line: Callable[[str], bytes], revision: int | str) -> None:
        """One event to one watch, unless it holds this revision already or its connection is behind."""
        if watch.sent == revision or watch.conn.closed:
            return
        if isinstance(revision, int) and isinstance(watch.sent, int) and revision < watch.sent:
            return  # a newer snapshot went first (a read that started earlier ended later)
        if watch.behind or not watch.conn.send_event(line(watch.subscription_id)):
            self._behind(watch)
            return
        watch.sent = revision

    # --- the run list -----------------------------------------------------------------------

    def _list_changed(self) -> None:
        self.list_dirty = True
        if self.list_task is None:
            self.list_task = asyncio.create_task(self._pages(), name="view-runs")

    async def _pages(self) -> None:
        """First pages for the list watches while the list changes, one read per distinct filter."""
        try:
            while self.list_dirty and self.lists:
                self.list_dirty = False
                bodies: dict[bytes, list[Watch]] = {}
                for watch in self.lists:
                    assert watch.list_body is not None
                    bodies.setdefault(canonical.dumps_bytes(_filters(watch.list_body)), []).append(watch)
                for watches in bodies.values():
                    reply = await self.writer.request("run.list", watches[0].list_body or {})
                    if reply.outcome != "accepted" or reply.receipt is None:
                        self.list_dirty = True  # tried again after the interval
                        continue
                    line = event_line("runs", reply.receipt)
                    for watch in watches:
                        if watch in self.lists:
                            self._deliver(watch, line, reply.receipt["revision"])
                await asyncio.sleep(LIST_INTERVAL_S)
        except Exception as exc:
            log.error("a run-list page could not be sent: %s", type(exc).__name__)
        finally:
            self.list_task = None

    # --- backpressure -----------------------------------------------------------------------

    def _behind(self, watch: Watch) -> None:
        watch.behind = True
        conn = watch.conn
        if conn.id not in self.catching_up:
            self.catching_up[conn.id] = asyncio.create_task(self._catch_up(conn), name=f"catch-up-{conn.id}")

    async def _catch_up(self, conn: Subscriber) -> None:
        """Once the connection read its buffer down: its watches behind get the current snapshot."""
        try:
            try:
                await asyncio.wait_for(conn.drained(), CATCH_UP_S)
            except TimeoutError:
                conn.drop("slow watcher", "closed a connection that did not read its events for %d s", int(CATCH_UP_S))
                return
            except (ConnectionError, OSError):
                return
            for (conn_id, _), watch in list(self.watches.items()):
                if conn_id != conn.id or not watch.behind:
                    continue
                watch.behind, watch.sent = False, None
                if watch.run_id is None:
                    self._list_changed()
                else:
                    self._refresh(watch.run_id)
        finally:
            self.catching_up.pop(conn.id, None)


def _filters(body: dict[str, Any]) -> dict[str, Any]:
    """A list watch's filters: watches with the same ones share one read."""
    return {key: value for key, value in body.items() if key != "actor"}


def _current(request: client_v1.Request) -> Subscriber:
    conn = subscriber.get()
    if conn is None:
        raise CommandError("notAvailable", f"{request.operation} needs a client connection")
    return conn

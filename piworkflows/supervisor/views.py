"""Live views: the watches of each client connection and the events they get.

::

    view.run.watch {subscriptionId?, revision?, patches?}, the run in runId
        response {subscribed, subscriptionId, revision}, then run_snapshot (the run view) now and
        after every commit that changed the run; a snapshot the watcher holds already is not sent.
        patches: after the first snapshot (none when the revision held is still retained),
        run_patch events: the ops of every revision since the last one sent (view.patches).
        pages: each pinned page (view.page's kind, cursor, limit) as a run_page event now and
        whenever it changed
    view.runs.watch {subscriptionId?, limit?, filters of run.list}
        response {subscribed, subscriptionId}, then runs (the list's first page) now and after
        changes, at most one per LIST_INTERVAL_S (upstream's client pages on with view.runs.page)
    view.session.watch {subscriptionId?, sessionId}
        response {subscribed, subscriptionId}, then session_snapshot {sessionId, runId, revision,
        run} (the run the Pi session runs, null while none) now and after changes, at most one
        per LIST_INTERVAL_S
    view.run.unwatch {subscriptionId}    any kind; {subscribed: false}
    a deleted run: unavailable {code: runNotFound, message}, and its watches end

    Views ── viewer.watched [the watched runs] ──> writer: from then on its viewer.advanced
        carries their committed revisions' ops, kept here as it encoded them (Recent)
    writer ── viewer.advanced [run ids, ops] ──> Views.advanced ── per watched run, at most one
        send per SNAPSHOT_INTERVAL_S (changes meanwhile go with the next):
          patch watchers: the ops from the revision each holds (view.patches read only when
            Recent does not reach back that far: it watched before they came, the writer restarted)
          snapshot watchers: the run view kept here (documents, up to MATERIALIZED_RUNS), brought
            forward with the ops; read (run.get) only when none is kept or its ops do not follow
    one encoding per event: the line is built once and each subscriber's id spliced in

Backpressure: a connection with more than EVENT_BUFFER_BYTES unsent gets no event; its watches are
marked behind and, once it has read its buffer down, get the run's current snapshot. Snapshots
replace each other, so a slow reader skips revisions but never sees a stale document as current,
and never slows the writer or another client. One still behind after CATCH_UP_S is closed.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from piworkflows import canonical
from piworkflows.errors import CommandError
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal.writer import Reply, RunOps
from piworkflows.supervisor.seams import WriterRequests
from piworkflows.views.materialize import Gap, apply_op

log = logging.getLogger("piworkflows.supervisor")

MAX_WATCHES = 64  # per connection
EVENT_BUFFER_BYTES = 256 * 1024  # unsent bytes past which a connection gets no more events for now
CATCH_UP_S = 30.0  # a connection behind for longer is closed
LIST_INTERVAL_S = 0.25  # at most four run-list pages a second
# At most one snapshot read of a run per this interval: a busy run's watchers get its newest state
# this often, and the writer spends a bounded share of its time on them (BENCHMARKS.md, views).
SNAPSHOT_INTERVAL_S = 0.25
FAN_OUT_BATCH = 16  # watchers sent an event between two turns of the event loop
RETRY_S = 0.5  # a snapshot read the writer could not answer (restarting) is tried again after this
SERVER = {"actor_class": "server"}
RUN_PATCH_SCHEMA = "pi-workflows.run-patch.v1"
SESSION_SNAPSHOT_SCHEMA = "pi-workflows.session-snapshot.v1"
_PLACEHOLDER = "subscription-placeholder"
_MARKER = b'"subscriptionId":"' + _PLACEHOLDER.encode() + b'"'
_PATCHES = "patches-placeholder"
_PATCHES_MARKER = b'"patches":"' + _PATCHES.encode() + b'"'
RECENT_REVISIONS = 256  # a watched run's newest revisions kept encoded (as many as the writer retains)
MATERIALIZED_RUNS = 64  # watched runs whose view is kept current here from their ops (least recently used go)
PATCH_EVENT_BYTES = client_v1.MAX_MESSAGE_BYTES - 16 * 1024  # a run_patch's patches: its envelope fits the rest


_Event = tuple[Callable[[str], bytes], int, int | None]  # a line, its revision, the revision it patches from


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
    sent: int | str | None = None  # the revision of the last snapshot, patch or page sent
    behind: bool = False
    patches: bool = False  # run_patch events after the first snapshot
    session_id: str | None = None  # a session watch: the run of this Pi session
    pages: list[dict[str, Any]] = field(default_factory=list)  # pinned: view.page's kind, cursor, limit
    page_digests: dict[int, bytes] = field(default_factory=dict)  # of each pinned page as last sent


@dataclass
class Recent:
    """A watched run's newest committed revisions as viewer.advanced brought them, in order and
    without a gap: (revision, run revision, its ``{ops, revision}`` member of ``patches`` encoded
    once). Made when the writer is told to bring the run's ops (or anew after a writer restart),
    so every revision committed since comes; ``covered``: every revision after it is here (or was
    forgotten, needed no more). None until a read or the first told revision shows where that
    starts."""

    revisions: collections.deque[tuple[int, int, bytes]] = field(default_factory=collections.deque)
    covered: int | None = None

    def add(self, revision: int, run_revision: int, ops: bytes) -> None:
        """The revision's ops as the writer encoded them (RunOps)."""
        last = self.revisions[-1][0] if self.revisions else self.covered
        if last is not None and revision <= last:
            return  # a read showed it already
        if last is not None and revision > last + 1:
            self.revisions.clear()  # a revision committed untold (its notice lost): only newer ones serve
            self.covered = revision - 1
        elif self.covered is None:
            self.covered = revision - 1  # the first committed since the writer was told
        # canonical key order: ops, revision
        member = b'{"ops":' + ops + b',"revision":' + str(revision).encode() + b"}"
        self.revisions.append((revision, run_revision, member))
        while len(self.revisions) > RECENT_REVISIONS:
            self.covered = self.revisions.popleft()[0]

    def read(self, revision: int) -> None:
        """A read made after this Recent found the run at ``revision``: every later one comes here."""
        if self.covered is None:
            self.covered = revision

    def since(self, after: int) -> list[tuple[int, int, bytes]] | None:
        """The revisions after ``after`` (none: nothing newer came), or None when not all of them
        are here."""
        if self.covered is None or after < self.covered:
            return None
        return [item for item in self.revisions if item[0] > after]

    def forget_through(self, revision: int) -> None:
        """Every watcher holds ``revision``: the revisions up to it are needed no more."""
        while self.revisions and self.revisions[0][0] <= revision:
            self.covered = self.revisions.popleft()[0]


@dataclass
class _Read:
    """A run whose snapshot is being read, and whether it changed again meanwhile."""

    again: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def event_line(
    event: str,
    payload: Any,
    run_id: str | None = None,
    revision: int | None = None,
    splice: tuple[bytes, bytes] | None = None,
) -> Callable[[str], bytes]:
    """The event's line for any subscription id: encoded once, the id spliced in per subscriber
    (and ``splice``'s member, encoded already, in place of its marker)."""
    line = client_v1.encode(
        client_v1.Event(subscriptionId=_PLACEHOLDER, event=event, payload=payload, runId=run_id, revision=revision)
    )
    if splice is not None:  # a member encoded already, in place of its marker
        marker, member = splice
        before, found, after = line.partition(marker)
        assert found, "the payload holds the marker"
        line = before + member + after
    head, found, tail = line.rpartition(_MARKER)  # the envelope's members follow the payload's
    assert found, "an event line names its subscription"
    return lambda subscription_id: head + b'"subscriptionId":' + canonical.dumps_bytes(subscription_id) + tail


def patch_lines(
    run_id: str, after: int, revisions: list[tuple[int, int, bytes]]
) -> list[tuple[int, int, Callable[[str], bytes]]] | None:
    """``run_patch`` events (from, to, line) of consecutive revisions encoded already (Recent),
    each within the protocol's message bound; None when one revision alone exceeds it."""
    events: list[tuple[int, int, Callable[[str], bytes]]] = []
    chunk: list[bytes] = []
    size = 0
    for index, (revision, run_revision, member) in enumerate(revisions):
        if len(member) > PATCH_EVENT_BYTES:
            return None
        chunk.append(member)
        size += len(member) + 1
        following = revisions[index + 1][2] if index + 1 < len(revisions) else None
        if following is None or size + len(following) + 1 > PATCH_EVENT_BYTES:
            head = {"revision": revision, "runRevision": run_revision, "patches": _PATCHES}
            patches = b'"patches":[' + b",".join(chunk) + b"]"
            line = event_line(
                "run_patch", _run_patch(run_id, after, head), run_id, revision, splice=(_PATCHES_MARKER, patches)
            )
            events.append((after, revision, line))
            after, chunk, size = revision, [], 0
    return events


class Views:
    def __init__(self, writer: WriterRequests, watch: Callable[[list[str]], None] | None = None) -> None:
        self.writer = writer
        self.tell_watched = watch  # the runs whose ops viewer.advanced should carry (WriterChild.watch)
        self.told: list[str] = []
        self.recent: dict[str, Recent] = {}  # the runs in ``told``
        # run views kept current from the ops in ``recent``: snapshots without a read
        self.documents: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self.watches: dict[tuple[str, str], Watch] = {}  # (connection id, subscription id)
        self.by_run: dict[str, set[Watch]] = {}
        self.lists: set[Watch] = set()
        self.reads: dict[str, _Read] = {}
        self.read_at: dict[str, float] = {}  # when each watched run's snapshot was last read (loop time)
        self.list_task: asyncio.Task[None] | None = None
        self.list_dirty = False
        self.sessions: set[Watch] = set()
        self.session_task: asyncio.Task[None] | None = None
        self.sessions_dirty = False
        self.catching_up: dict[str, asyncio.Task[None]] = {}

    # --- requests ---------------------------------------------------------------------------

    async def watch_run(self, request: client_v1.Request, payload: client_v1.ViewRunWatchPayload) -> Reply:
        """The watch's receipt, or the writer's refusal (an unknown run: notFound)."""
        conn = _current(request)
        assert request.runId is not None
        # Watching before the read: a commit while it is read is not missed (a newer snapshot wins).
        watch = self._add(conn, payload.subscriptionId or request.requestId, request.runId)
        watch.patches = payload.patches
        watch.pages = [page.model_dump() for page in payload.pages or ()]
        self._watched_changed()
        held = payload.revision if payload.patches else None
        recent = self.recent.get(request.runId)
        view = None if held else self._document(request.runId)
        if view is not None:  # kept current here: no read
            reply = Reply(outcome="accepted", receipt=view)
        elif held:  # catch up from the revision the client holds
            body = {"actor": SERVER, "run_id": request.runId, "after": held}
            reply = await self.writer.request("view.patches", body)
        else:
            reply = await self.writer.request("run.get", {"actor": SERVER, "run_id": request.runId})
        if reply.outcome != "accepted" or reply.receipt is None:
            self._remove(watch)
            return reply
        loop = asyncio.get_running_loop()
        if "patch" in reply.receipt:
            patch = reply.receipt["patch"]
            revision = patch["revision"]
            watch.sent = held
            if held and held != revision:
                loop.call_soon(self._send_patch, watch, held, patch)
        else:
            view = reply.receipt.get("snapshot", reply.receipt)
            revision = view["revision"]
            if payload.revision != revision:  # the client's own is current: nothing to send
                line = event_line("run_snapshot", view, request.runId, revision)  # now: a kept view changes
                loop.call_soon(self._send_line, watch, line, revision)
            else:
                watch.sent = revision
            self._keep(request.runId, recent, view)
        if recent is not None and self.recent.get(request.runId) is recent:
            recent.read(revision)
        if watch.pages:
            loop.call_soon(self._refresh, request.runId)  # the pinned pages follow the snapshot
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

    async def watch_session(self, request: client_v1.Request, payload: client_v1.ViewSessionWatchPayload) -> Reply:
        """The watch's receipt; the session's snapshot follows (its run: null while it has none)."""
        conn = _current(request)
        watch = self._add(conn, payload.subscriptionId or request.requestId, None, session_id=payload.sessionId)
        reply = await self.writer.request("view.session.get", {"actor": SERVER, "session_id": payload.sessionId})
        if reply.outcome != "accepted" or reply.receipt is None:
            self._remove(watch)
            return reply
        asyncio.get_running_loop().call_soon(self._send_session, watch, reply.receipt)
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
        self,
        conn: Subscriber,
        subscription_id: str,
        run_id: str | None,
        body: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Watch:
        old = self.watches.get((conn.id, subscription_id))
        if old is not None:
            self._remove(old)  # a reused id replaces its watch
        elif len(conn.watches) >= MAX_WATCHES:
            raise CommandError("tooManyWatches", f"a connection watches at most {MAX_WATCHES} things at once")
        watch = Watch(conn, subscription_id, run_id, body, session_id=session_id)
        self.watches[(conn.id, subscription_id)] = watch
        conn.watches.add(subscription_id)
        if session_id is not None:
            self.sessions.add(watch)
        elif run_id is None:
            self.lists.add(watch)
        else:
            self.by_run.setdefault(run_id, set()).add(watch)
        return watch

    def _remove(self, watch: Watch) -> None:
        self.watches.pop((watch.conn.id, watch.subscription_id), None)
        watch.conn.watches.discard(watch.subscription_id)
        if watch.run_id is None:
            self.lists.discard(watch)
            self.sessions.discard(watch)
            return
        watchers = self.by_run.get(watch.run_id)
        if watchers is not None:
            watchers.discard(watch)
            if not watchers:
                del self.by_run[watch.run_id]
                self.read_at.pop(watch.run_id, None)
                self._watched_changed()

    def _watched_changed(self) -> None:
        """Tell the writer when the watched runs changed (their ops come with viewer.advanced from
        then on); a run no longer watched keeps neither its ops nor its view here."""
        runs = sorted(self.by_run)
        if runs == self.told or self.tell_watched is None:  # None: no writer to tell, every change read
            return
        self.recent = {run_id: self.recent.get(run_id) or Recent() for run_id in runs}
        for run_id in [run_id for run_id in self.documents if run_id not in self.recent]:
            del self.documents[run_id]
        self.told = runs
        if self.tell_watched is not None:
            self.tell_watched(runs)

    def _keep(self, run_id: str, recent: Recent | None, view: dict[str, Any]) -> None:
        """A view read after ``recent`` was made: kept and brought forward with its ops from now on
        (the least recently used beyond MATERIALIZED_RUNS go)."""
        if recent is None or self.recent.get(run_id) is not recent:
            return  # not watched, or the writer restarted meanwhile
        recent.read(view["revision"])
        self.documents[run_id] = view
        self.documents.move_to_end(run_id)
        while len(self.documents) > MATERIALIZED_RUNS:
            self.documents.popitem(last=False)

    def _document(self, run_id: str) -> dict[str, Any] | None:
        """The run's view kept here, brought to the newest revision told (None: none kept, or its
        revisions are not all here)."""
        view, recent = self.documents.get(run_id), self.recent.get(run_id)
        if view is None or recent is None:
            return None
        found = recent.since(view["revision"])
        try:
            if found is None:
                raise Gap(f"revisions after {view['revision']} are not kept")
            for revision, run_revision, member in found:
                for op in canonical.loads(member)["ops"]:
                    apply_op(view, op)
                view["revision"], view["runRevision"] = revision, run_revision
        except Gap as gap:  # read again (an op that does not apply would be a projection bug: logged)
            del self.documents[run_id]
            if found is not None:
                log.error("a kept run view could not be brought forward: %s", gap)
            return None
        self.documents.move_to_end(run_id)
        return view

    # --- commits ----------------------------------------------------------------------------

    def advanced(self, runs: list[str] | None, patches: Iterable[RunOps] = ()) -> None:
        """The writer committed changes to these runs' views (None: anything may have changed, the
        writer restarted), with the ops of the runs it was told are watched. On the event loop."""
        patches = list(patches)
        if runs is None:  # the lost writer may have committed revisions it never told
            self.recent = {run_id: Recent() for run_id in self.told}
            self.documents.clear()
        else:
            with_ops = {ops.run_id for ops in patches}
            for run_id in runs:
                if run_id in self.recent and run_id not in with_ops:  # deleted (or made anew): read
                    self.recent[run_id] = Recent()
                    self.documents.pop(run_id, None)
        for ops in patches:
            recent = self.recent.get(ops.run_id)
            if recent is not None:
                recent.add(ops.revision, ops.run_revision, ops.ops)
        for run_id in list(self.by_run) if runs is None else runs:
            if run_id in self.by_run:
                self._refresh(run_id)
        if self.lists:
            self._list_changed()
        if self.sessions:
            self._sessions_changed()

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
                if not await self._send_changes(run_id):
                    return
                if not read.again:
                    return
        except Exception as exc:  # one run's failure ends its read, never the server
            log.error("a run view could not be sent: %s", type(exc).__name__)
        finally:
            self.reads.pop(run_id, None)

    async def _send_changes(self, run_id: str) -> bool:
        """The run's watchers brought to its current revision: one snapshot read for those that
        take snapshots (and patch watchers without a revision), one patch read per revision patch
        watchers hold. False: the run is gone."""
        groups: dict[int | None, list[Watch]] = {}
        for watch in self.by_run.get(run_id, ()):
            after = watch.sent if watch.patches and isinstance(watch.sent, int) else None
            groups.setdefault(after, []).append(watch)
        recent = self.recent.get(run_id)
        for after, watches in groups.items():
            view = self._document(run_id) if after is None else None
            if view is not None:  # kept current here: no read
                line = event_line("run_snapshot", view, run_id, view["revision"])
                await self._fan_out(watches, [(line, view["revision"], None)])
                continue
            found = recent.since(after) if recent is not None and after is not None else None
            if found is not None:  # the revisions viewer.advanced brought: no read
                assert after is not None
                events = patch_lines(run_id, after, found)
                if events is None:  # one revision exceeds an event: a snapshot instead
                    self._resync(run_id, watches)
                    continue
                await self._fan_out(watches, [(line, end, start) for start, end, line in events])
                continue
            if after is None:
                reply = await self.writer.request("run.get", {"actor": SERVER, "run_id": run_id})
            else:
                body = {"actor": SERVER, "run_id": run_id, "after": after}
                reply = await self.writer.request("view.patches", body)
            if reply.outcome == "notFound":
                self._end_run(run_id)
                return False
            if reply.outcome != "accepted" or reply.receipt is None:  # the writer cannot read now (restarting)
                self.reads[run_id].again = True
                await asyncio.sleep(RETRY_S)
                return True
            if after is not None and "patch" in reply.receipt:
                patch = reply.receipt["patch"]
                if recent is not None and self.recent.get(run_id) is recent:
                    recent.read(patch["revision"])
                if patch["revision"] != after:
                    try:
                        line = event_line("run_patch", _run_patch(run_id, after, patch), run_id, patch["revision"])
                    except ValueError:  # more than one event holds: a snapshot instead
                        self._resync(run_id, watches)
                        continue
                    await self._fan_out(watches, [(line, patch["revision"], after)])
                continue
            view = reply.receipt.get("snapshot", reply.receipt) if after is not None else reply.receipt
            if after is not None:  # their revision is no longer retained: they start again from a snapshot
                for watch in watches:
                    watch.sent = None
            line = event_line("run_snapshot", view, run_id, view["revision"])
            self._keep(run_id, recent, view)
            await self._fan_out(watches, [(line, view["revision"], None)])
        held = [w.sent for w in self.by_run.get(run_id, ()) if w.patches and isinstance(w.sent, int)]
        if recent is not None and held:  # a kept view left behind (no snapshot watcher) is read again
            recent.forget_through(min(held))
        for watch in [w for w in self.by_run.get(run_id, ()) if w.pages]:
            await self._send_pages(watch)
        return True

    async def _fan_out(self, watches: list[Watch], events: list[_Event]) -> None:
        """The events (line, revision, from revision) to each watch still registered, in order; the
        loop serves other work (a runner's command) between every FAN_OUT_BATCH watchers."""
        for index, watch in enumerate(watches):
            if self.watches.get((watch.conn.id, watch.subscription_id)) is not watch:
                continue  # unwatched or its connection closed meanwhile
            for line, revision, after in events:
                self._deliver(watch, line, revision, after)
            if index % FAN_OUT_BATCH == FAN_OUT_BATCH - 1:
                await asyncio.sleep(0)

    def _resync(self, run_id: str, watches: list[Watch]) -> None:
        """These patch watchers get the run's snapshot next (their patch would not fit one event)."""
        for watch in watches:
            watch.sent = None
        self.reads[run_id].again = True

    async def _send_pages(self, watch: Watch) -> None:
        """Each pinned page of the watch that changed since it was last sent, as a ``run_page``."""
        for index, page in enumerate(watch.pages):
            body = {"actor": SERVER, "run_id": watch.run_id, "page_kind": page["kind"]}
            reply = await self.writer.request("view.page", body | {"start": page["cursor"], "limit": page["limit"]})
            if reply.outcome != "accepted" or reply.receipt is None:
                continue  # a deleted run ends the watch through its view's read
            shown = {key: value for key, value in reply.receipt.items() if key != "revision"}
            digest = hashlib.sha256(canonical.dumps_bytes(shown)).digest()
            if watch.page_digests.get(index) == digest:
                continue
            if (
                watch.behind
                or watch.conn.closed
                or self.watches.get((watch.conn.id, watch.subscription_id)) is not watch
            ):
                return
            payload = {**reply.receipt, "page": index}
            line = event_line("run_page", payload, watch.run_id, reply.receipt["revision"])
            if not watch.conn.send_event(line(watch.subscription_id)):
                self._behind(watch)
                return
            watch.page_digests[index] = digest

    def _end_run(self, run_id: str) -> None:
        """The run is gone (deleted): its watchers are told, their watches end."""
        line = event_line("unavailable", {"code": "runNotFound", "message": "the run was deleted"}, run_id)
        for watch in list(self.by_run.get(run_id, ())):
            watch.conn.send_event(line(watch.subscription_id))
            self._remove(watch)

    def _send_line(self, watch: Watch, line: Callable[[str], bytes], revision: int) -> None:
        if self.watches.get((watch.conn.id, watch.subscription_id)) is watch:
            self._deliver(watch, line, revision)

    def _send_patch(self, watch: Watch, after: int, patch: dict[str, Any]) -> None:
        if self.watches.get((watch.conn.id, watch.subscription_id)) is watch:
            line = event_line(
                "run_patch", _run_patch(watch.run_id or "", after, patch), watch.run_id, patch["revision"]
            )
            self._deliver(watch, line, patch["revision"], after)

    def _send_page(self, watch: Watch, page: dict[str, Any]) -> None:
        if self.watches.get((watch.conn.id, watch.subscription_id)) is watch:
            self._deliver(watch, event_line("runs", page), page["revision"])

    def _deliver(
        self, watch: Watch, line: Callable[[str], bytes], revision: int | str, after: int | None = None
    ) -> None:
        """One event to one watch, unless it holds this revision already or its connection is behind;
        a patch (from ``after``) only to a watch at exactly that revision."""
        if watch.sent == revision or watch.conn.closed:
            return
        if isinstance(revision, int) and isinstance(watch.sent, int) and revision < watch.sent:
            return  # a newer snapshot went first (a read that started earlier ended later)
        if watch.behind:
            return  # its catch-up follows once its connection has read its buffer down
        if after is None and watch.patches and isinstance(watch.sent, int):
            # a patch watcher holding a document gets patches (a resync clears ``sent`` first): a
            # snapshot meant for the snapshot group it was in when its first snapshot was pending
            self._refresh(watch.run_id or "")
            return
        if after is not None and watch.sent != after:
            self._refresh(watch.run_id or "")  # it moved meanwhile: its own read follows
            return
        if not watch.conn.send_event(line(watch.subscription_id)):
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

    # --- sessions ---------------------------------------------------------------------------

    def _send_session(self, watch: Watch, found: dict[str, Any]) -> None:
        """A session snapshot, unless the watch holds this run at this revision already."""
        if self.watches.get((watch.conn.id, watch.subscription_id)) is watch:
            payload = {"schema": SESSION_SNAPSHOT_SCHEMA, **found}
            self._deliver(watch, event_line("session_snapshot", payload), f"{found['runId']}:{found['revision']}")

    def _sessions_changed(self) -> None:
        self.sessions_dirty = True
        if self.session_task is None:
            self.session_task = asyncio.create_task(self._session_snapshots(), name="view-sessions")

    async def _session_snapshots(self) -> None:
        """The session watches' snapshots while runs change (a session may start a new run), one
        read per session, at most one round every LIST_INTERVAL_S."""
        try:
            while self.sessions_dirty and self.sessions:
                self.sessions_dirty = False
                by_session: dict[str, list[Watch]] = {}
                for watch in self.sessions:
                    by_session.setdefault(watch.session_id or "", []).append(watch)
                for session_id, watches in by_session.items():
                    body = {"actor": SERVER, "session_id": session_id}
                    reply = await self.writer.request("view.session.get", body)
                    if reply.outcome != "accepted" or reply.receipt is None:
                        self.sessions_dirty = True
                        continue
                    for watch in watches:
                        self._send_session(watch, reply.receipt)
                await asyncio.sleep(LIST_INTERVAL_S)
        except Exception as exc:
            log.error("a session snapshot could not be sent: %s", type(exc).__name__)
        finally:
            self.session_task = None

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
                watch.behind = False
                if not watch.patches:  # a patch watcher catches up from the revision it holds
                    watch.sent = None
                if watch.session_id is not None:
                    self._sessions_changed()
                elif watch.run_id is None:
                    self._list_changed()
                else:
                    self._refresh(watch.run_id)
        finally:
            self.catching_up.pop(conn.id, None)


def _run_patch(run_id: str, after: int, patch: dict[str, Any]) -> dict[str, Any]:
    """``pi-workflows.run-patch.v1``: every revision from ``after`` on, in order, none skipped."""
    return {
        "schema": RUN_PATCH_SCHEMA,
        "runId": run_id,
        "fromRevision": after,
        "revision": patch["revision"],
        "runRevision": patch["runRevision"],
        "patches": patch["patches"],
    }


def _filters(body: dict[str, Any]) -> dict[str, Any]:
    """A list watch's filters: watches with the same ones share one read."""
    return {key: value for key, value in body.items() if key != "actor"}


def _current(request: client_v1.Request) -> Subscriber:
    conn = subscriber.get()
    if conn is None:
        raise CommandError("notAvailable", f"{request.operation} needs a client connection")
    return conn

"""The viewer projection: every transaction that changes what a run view shows advances the run's
presentation revision once and writes its ordered ops to ``viewer_deltas`` before the same commit
(docs/protocol.md, Live views), so a watcher that holds revision R is brought to R+k by the ops alone.

::

    TEMP triggers on the rows a run view reads       temp.viewer_touched: the runs a command
      (runs, queue, runners, attempts, steps,         touched, the histories it added to, the
      effects, events, updates, session rows, ...)    steps and follow-ups it changed in place,
                                                      settings and session rows changed
    Projection.project(conn, now), before RELEASE     per touched run: its head (run_view.head,
      of each accepted command and before COMMIT      bounded, indexed reads; /session only when
      of the local effects' transaction               a session row changed) against the head
                                                      the projection last recorded, and the new
                                                      and changed rows of the histories touched,
                                                      by position arithmetic on their own keys
    no op: nothing advances (a renewal, a heartbeat)
    ops: viewer_runs + 1, floor = max(floor, revision - 255), one delta per target the ops
         change (targets.py), each patch a canonical-JSON blob, deltas below the floor deleted

The ops of a window are upstream's tail patch at width WINDOW: ``remove <array>/0`` per item
leaving, ``append`` of the new items, ``replace`` of start (when it moved) and total; WINDOW or
more new items replace the array. An item changed in place inside the window is a ``replace`` at
its index. A node that finished gets ``add /state/outputs/<node>`` and ``/state/results/<node>``.

What the projection last recorded of each run (its head, window totals, transitions) is kept in
memory at the revision it belongs to. A run it does not know at its current revision (the writer
restarted, the run was evicted, a transaction was rolled back) gets its next revision as a
``replace`` of every member: correct, only larger.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import sqlite3
from dataclasses import dataclass, replace
from typing import Any

from piworkflows import canonical
from piworkflows.states import MEDIA_JSON
from piworkflows.writer import prune, records
from piworkflows.writer.views import targets
from piworkflows.writer.views.content import RunValues
from piworkflows.writer.views.pages import WINDOW
from piworkflows.writer.views.run_view import (
    WINDOWS,
    Window,
    escape,
    extend_transitions,
    head,
    node_results,
    run_view,
    taken_transitions,
    transitions_window,
)

log = logging.getLogger("piworkflows.writer")

RETAINED = 256  # presentation revisions whose ops are kept: a cursor below floor - 1 gets a snapshot
KNOWN_RUNS = 256  # runs whose last recorded head the projection keeps (least recently projected go)
CREATED = "created"  # a touched row's history: the run's viewer row was created
APPENDED = "-1"  # a touched row's key: rows were added to the history (else: the key of a changed row)
SESSION = "session"  # a touched row's history: the run's Pi session rows (its /session head is read again)
_SESSION_ROWS = {SESSION, "session_entries", "session_events"}
_FIXED = ("schema", "runId", "revision")  # top-level members a full replace leaves

# (table, events, when, the run, the history it adds to or changes (its window is read only then),
#  the key of the row changed in place, or APPENDED)
_TOUCHES: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("viewer_runs", "INSERT", "", "NEW.run_id", CREATED, "0"),
    ("runs", "UPDATE", "", "NEW.run_id", "", "0"),
    ("resources", "UPDATE OF revision", "WHEN NEW.resource_kind = 'run'", "NEW.resource_id", "", "0"),
    ("run_queue", "INSERT", "", "NEW.run_id", "", "0"),
    ("run_queue", "UPDATE", "", "NEW.run_id", "", "0"),
    ("run_queue", "DELETE", "", "OLD.run_id", "", "0"),
    ("run_workers", "INSERT", "", "NEW.run_id", "", "0"),
    ("run_workers", "UPDATE", "", "NEW.run_id", "", "0"),
    ("run_steps", "INSERT", "", "NEW.run_id", "steps", APPENDED),
    ("node_attempts", "INSERT", "", "NEW.run_id", "", "0"),
    (
        "node_attempts",
        "UPDATE",
        "",
        "NEW.run_id",
        "steps",
        "(SELECT step_index FROM run_steps WHERE attempt_id = NEW.attempt_id)",
    ),
    ("effects", "INSERT", "WHEN NEW.run_id IS NOT NULL", "NEW.run_id", "", "0"),
    ("effects", "UPDATE OF effect_status", "WHEN NEW.run_id IS NOT NULL", "NEW.run_id", "", "0"),
    ("events", "INSERT", "", "NEW.resource_id", "trace", APPENDED),
    ("workflow_updates", "INSERT", "", "NEW.run_id", "updates", APPENDED),
    ("session_entries", "INSERT", "", "NEW.run_id", "session_entries", APPENDED),
    ("session_events", "INSERT", "", "NEW.run_id", "session_events", APPENDED),
    ("session_segments", "INSERT", "", "NEW.run_id", SESSION, "0"),
    ("session_segments", "UPDATE", "", "NEW.run_id", SESSION, "0"),
    ("attempt_entries", "INSERT", "", "NEW.run_id", "", "0"),
    ("attempt_entries", "UPDATE", "", "NEW.run_id", "", "0"),
    ("workflow_turns", "INSERT", "", "NEW.run_id", "", "0"),
    ("workflow_turns", "UPDATE", "", "NEW.run_id", "", "0"),
    ("workflow_messages", "INSERT", "", "NEW.run_id", "workflow_messages", APPENDED),
    ("workflow_messages", "UPDATE", "", "NEW.run_id", "workflow_messages", "NEW.rowid"),
    ("interactive_requests", "INSERT", "", "NEW.run_id", "", "0"),
    ("interactive_requests", "UPDATE", "", "NEW.run_id", "", "0"),
    (
        "interactive_submissions",
        "INSERT",
        "",
        "(SELECT run_id FROM interactive_requests WHERE request_id = NEW.request_id)",
        "",
        "0",
    ),
    ("viewer_session_checkpoints", "INSERT", "", "NEW.run_id", SESSION, "0"),
    ("workflow_settings", "INSERT", "", "NEW.run_id", "settings", APPENDED),
    ("workflow_settings", "UPDATE", "", "NEW.run_id", "settings", APPENDED),
    ("workflow_follow_ups", "INSERT", "", "NEW.run_id", "follow_ups", APPENDED),
    ("workflow_follow_ups", "UPDATE", "", "NEW.run_id", "follow_ups", "NEW.source_order"),
)


def _ddl() -> str:
    statements = [
        "CREATE TEMP TABLE IF NOT EXISTS viewer_touched (run_id TEXT NOT NULL, history TEXT NOT NULL, "
        "key INTEGER NOT NULL, PRIMARY KEY (run_id, history, key)) WITHOUT ROWID;"
    ]
    for table, event, when, run, history, key in _TOUCHES:
        name = f"viewer_touch_{table}_{event.split()[0].lower()}"
        # NOT EXISTS rather than OR IGNORE: an outer statement's conflict clause would override it
        statements.append(
            f"CREATE TEMP TRIGGER IF NOT EXISTS {name} AFTER {event} ON main.{table} {when} BEGIN "
            f"INSERT INTO viewer_touched SELECT t.run_id, t.history, t.key FROM "
            f"(SELECT {run} AS run_id, '{history}' AS history, {key} AS key) t "
            "WHERE t.run_id IS NOT NULL AND t.key IS NOT NULL AND NOT EXISTS (SELECT 1 FROM viewer_touched v "
            "WHERE v.run_id = t.run_id AND v.history = t.history AND v.key = t.key); END;"
        )
    return "\n".join(statements)


_DDL = _ddl()


def install(conn: sqlite3.Connection) -> None:
    """The temp table and triggers on a newly opened writer connection (outside any transaction)."""
    conn.executescript(_DDL)


@dataclass(frozen=True)
class Known:
    """What the projection recorded of a run at ``revision``."""

    revision: int
    head: dict[str, Any]
    totals: tuple[int, ...]  # per WINDOWS
    taken: tuple[str, ...]  # every distinct transition taken, in order (at most the graph's edges)


class Projection:
    """The projection of one writer connection (its memory of each run's last recorded head)."""

    def __init__(self) -> None:
        self.known: collections.OrderedDict[str, Known] = collections.OrderedDict()
        self.watched: frozenset[str] = frozenset()  # runs whose ops the supervisor wants (viewer.watched)
        self._staged: list[dict[str, Any]] = []  # the ops of watched runs the current command recorded
        self._transaction: list[dict[str, Any]] = []  # ... the commands of the open transaction kept
        self._committed: list[dict[str, Any]] = []  # ... committed transactions, not yet taken

    def settle(self, kept: bool) -> None:
        """The command that called ``project`` last was kept (its savepoint released) or rolled back."""
        if kept:
            self._transaction += self._staged
        self._staged = []

    def end(self, committed: bool) -> None:
        """The transaction committed or rolled back."""
        if committed:
            self._committed += self._transaction
        self._staged, self._transaction = [], []

    def take(self) -> list[dict[str, Any]]:
        """The committed revisions of watched runs since the last call (viewer.advanced's RunOps), in
        commit order."""
        taken, self._committed = self._committed, []
        return taken

    def project(self, conn: sqlite3.Connection, now: int) -> None:
        """Record the ops of every run the transaction touched since the last call (those of the
        watched runs are also staged for ``viewer.advanced``, see settle, end and take)."""
        touched = conn.execute("SELECT run_id, history, key FROM temp.viewer_touched").fetchall()
        if not touched:
            return
        conn.execute("DELETE FROM temp.viewer_touched")
        runs: dict[str, dict[str, set[int]]] = {}
        for run_id, history, key in touched:
            runs.setdefault(run_id, {}).setdefault(history, set()).add(key)
        for run_id, changed in runs.items():
            found = conn.execute(
                "SELECT v.presentation_revision, v.retained_revision_floor, r.revision FROM viewer_runs v "
                "JOIN resources r ON r.resource_id = v.run_id WHERE v.run_id = ?",
                (run_id,),
            ).fetchone()
            if found is None:  # not a run, or deleted
                self.known.pop(run_id, None)
                continue
            try:
                ops = self._ops(conn, run_id, found[0], changed)
            except sqlite3.Error:
                raise  # the executor decides whether the group is lost
            except Exception as exc:  # a value the view cannot show, or a bug: never the command's fault
                log.error("the view of a run cannot be projected: %s", getattr(exc, "code", type(exc).__name__))
                self.known.pop(run_id, None)  # its next projection replaces every member
                continue
            if ops:
                revision = found[0] + 1
                encoded = _record(conn, run_id, revision, max(found[1], revision - RETAINED + 1), ops, now)
                self.known[run_id] = replace(self.known[run_id], revision=revision)
                if run_id in self.watched:
                    staged = {"run_id": run_id, "revision": revision, "run_revision": found[2], "ops": encoded}
                    self._staged.append(staged)

    def _ops(
        self, conn: sqlite3.Connection, run_id: str, revision: int, changed: dict[str, set[int]]
    ) -> list[dict[str, Any]]:
        """The run's ops since ``revision`` (none: nothing shown changed), its new head remembered."""
        values = RunValues(conn, run_id)
        known = self.known.pop(run_id, None)
        same_session = known is not None and not _SESSION_ROWS & changed.keys()
        parts = head(conn, run_id, values, session=not same_session)
        assert parts is not None, "a viewer row has its run"
        if same_session:
            assert known is not None
            parts |= {pointer: value for pointer, value in known.head.items() if pointer.startswith("/session/")}
        totals = tuple(
            window.history.total(conn, run_id) if known is None or window.kind in changed else total
            for window, total in zip(WINDOWS, known.totals if known else [0] * len(WINDOWS), strict=True)
        )
        if CREATED in changed and revision == 1:
            ops, taken = [], taken_transitions(conn, run_id)
        elif known is None or known.revision != revision:
            view = run_view(conn, run_id)
            assert view is not None
            ops = [_op("replace", "/" + key, value) for key, value in view.items() if key not in _FIXED]
            taken = taken_transitions(conn, run_id)
        else:
            ops, taken = _changes(conn, run_id, values, known, parts, totals, changed)
        self.known[run_id] = Known(revision, parts, totals, tuple(taken))
        while len(self.known) > KNOWN_RUNS:
            self.known.popitem(last=False)
        return ops


def _op(op: str, path: str, value: Any = None) -> dict[str, Any]:
    return {"op": op, "path": path} if op == "remove" else {"op": op, "path": path, "value": value}


def _changes(
    conn: sqlite3.Connection,
    run_id: str,
    values: RunValues,
    known: Known,
    parts: dict[str, Any],
    totals: tuple[int, ...],
    changed: dict[str, set[int]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The ops from what ``known`` recorded to now, and the transitions taken now."""
    ops: list[dict[str, Any]] = []
    finished: dict[str, None] = {}  # nodes with a step that finished or changed
    taken = list(known.taken)
    for window, before, after in zip(WINDOWS, known.totals, totals, strict=True):
        name = window.kind
        if name == "settings":  # ordered by scope key: a new scope may land anywhere
            if before != after or "settings" in changed:
                ops += [_op("replace", p, v) for p, v in window.snapshot(conn, run_id, values).items()]
            continue
        if after < before or (window.holder is not None and before == 0 and after > 0):
            ops += [_op("replace", p, v) for p, v in window.snapshot(conn, run_id, values).items()]
            continue
        new = min(after - before, WINDOW)
        extra = 1 if name == "steps" and before else 0  # the step before the new ones: a transition
        fetched = window.history.newest(conn, run_id, new + extra) if new else []
        rows = fetched[extra:]
        if name == "steps" and new:
            taken = _taken(conn, run_id, known.taken, after - before, fetched[0] if extra else None, rows)
        ops += _tail(window, before, after, rows, values)
        start = max(0, after - WINDOW)
        for key in sorted(key for key in changed.get(name, ()) if key != int(APPENDED)):
            row = window.history.row(conn, run_id, key)
            assert row is not None, "a changed row of a run's history is there"
            rows.append(row)
            position = after - 1 - window.history.later(conn, run_id, key, WINDOW)
            if start <= position < before:  # inside the window, not one of the new rows
                for array, item in window.arrays:
                    ops.append(_op("replace", f"{array}/{position - start}", item(row, values)))
        if name == "steps":
            finished |= {row[2]: None for row in rows if row[9] is not None}
            if list(known.taken) != taken:
                was = transitions_window(list(known.taken))
                ops += [_op("replace", p, v) for p, v in transitions_window(taken).items() if was[p] != v]
    for node in finished:
        shown = node_results(conn, run_id, values, node)
        for member in ("outputs", "results"):
            if node in shown[member]:
                ops.append(_op("add", f"/state/{member}/{escape(node)}", shown[member][node]))
    for pointer in sorted(known.head.keys() | parts.keys()):
        if pointer not in parts:
            ops.append(_op("remove", pointer))
        elif pointer not in known.head:
            ops.append(_op("add", pointer, parts[pointer]))
        elif parts[pointer] != known.head[pointer]:
            ops += _member_ops(pointer, known.head[pointer], parts[pointer])
    return ops, taken


def _member_ops(pointer: str, was: Any, now: Any) -> list[dict[str, Any]]:
    """A changed part of the head: its changed members when both are objects (a step's current
    node changes, not the whole of /piworkflows), else the part."""
    if not (isinstance(was, dict) and isinstance(now, dict)):
        return [_op("replace", pointer, now)]
    ops = []
    for key in sorted(was.keys() | now.keys()):
        member = f"{pointer}/{escape(key)}"
        if key not in now:
            ops.append(_op("remove", member))
        elif key not in was:
            ops.append(_op("add", member, now[key]))
        elif now[key] != was[key]:
            ops.append(_op("replace", member, now[key]))
    return ops


def _taken(
    conn: sqlite3.Connection,
    run_id: str,
    known: tuple[str, ...],
    appended: int,
    previous: tuple[Any, ...] | None,
    rows: list[tuple[Any, ...]],
) -> list[str]:
    """The transitions taken: those known, and those of the new steps (with the step before them)."""
    if appended > len(rows):  # more new steps than read: all of them
        return taken_transitions(conn, run_id)
    nodes = ([previous[2]] if previous is not None else []) + [row[2] for row in rows]
    return extend_transitions(list(known), nodes)


def _tail(
    window: Window, before: int, after: int, rows: list[tuple[Any, ...]], values: RunValues
) -> list[dict[str, Any]]:
    """upstream's tail patch: ``after - before`` rows appended to a window of width WINDOW."""
    if after == before:
        return []
    ops: list[dict[str, Any]] = []
    start, moved = max(0, before - WINDOW), max(0, after - WINDOW)
    for array, item in window.arrays:
        items = [item(row, values) for row in rows]
        if after - before >= WINDOW:
            ops.append(_op("replace", array, items))
            continue
        ops += [_op("remove", f"{array}/0") for _ in range(min(moved - start, before - start))]
        ops.append(_op("append", array, items))
    if moved != start:
        ops += [_op("replace", pointer, moved) for pointer in window.starts]
    ops += [_op("replace", pointer, after) for pointer in window.totals]
    return ops


def _record(
    conn: sqlite3.Connection, run_id: str, revision: int, floor: int, ops: list[dict[str, Any]], now: int
) -> bytes:
    """The revision's ops as one patch per target they change (targets.py), in the targets' fixed
    order, the first beginning with ``replace /revision`` (and ``/runRevision`` when it moved);
    each patch a canonical-JSON blob. The retained revisions move on. Returns the canonical JSON
    of all the revision's ops in that order (the array ``patches`` shows for it)."""
    conn.execute(
        "UPDATE viewer_runs SET presentation_revision = ?, retained_revision_floor = ?, updated_at = ? "
        "WHERE run_id = ?",
        (revision, floor, now, run_id),
    )
    prefix = [_op("replace", "/revision", revision)]
    grouped: dict[str, list[dict[str, Any]]] = {}
    for op in ops:
        if op["path"] == "/runRevision":
            prefix.append(op)
        else:
            grouped.setdefault(targets.target_of(op["path"]), []).append(op)
    deltas = sorted(grouped.items(), key=lambda item: targets.ORDER[item[0]]) or [("summary", [])]
    deltas[0] = (deltas[0][0], prefix + deltas[0][1])
    blobs: dict[bytes, bytes] = {}
    rows, inner = [], []
    for index, (target, members) in enumerate(deltas):
        data = canonical.dumps_bytes(members)  # an op's keys sort as op, path, value
        digest = hashlib.sha256(data).digest()
        blobs[digest] = data
        inner.append(data[1:-1])  # the patch without its brackets
        rows.append((run_id, revision, index, target, "", digest, now))
    records.put_own_blobs(conn, blobs, MEDIA_JSON, now)
    conn.executemany(
        "INSERT INTO viewer_deltas (run_id, presentation_revision, delta_index, target_type, target_key, "
        "patch_digest, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    if revision > RETAINED:  # the oldest revision's patches go, and their blobs when no other row holds them
        past = "FROM viewer_deltas WHERE run_id = ? AND presentation_revision < ?"
        freed = {row[0] for row in conn.execute(f"SELECT patch_digest {past}", (run_id, floor))}
        conn.execute(f"DELETE {past}", (run_id, floor))
        prune.delete_unreferenced(conn, [digest for digest in freed if digest not in blobs])
    return b"[" + b",".join(inner) + b"]"  # each delta has at least one op


def patches(conn: sqlite3.Connection, run_id: str, after: int) -> dict[str, Any] | None:
    """The run's revisions after ``after`` as ``[{revision, ops}]`` with the current revision and run
    revision; None when they are not all retained (a snapshot is needed) or the run is unknown."""
    found = conn.execute(
        "SELECT v.presentation_revision, v.retained_revision_floor, r.revision FROM viewer_runs v "
        "JOIN resources r ON r.resource_id = v.run_id WHERE v.run_id = ?",
        (run_id,),
    ).fetchone()
    if found is None:
        return None
    revision, floor, run_revision = found
    if after < 1 or after > revision or after < floor - 1:
        return None
    rows = conn.execute(
        "SELECT d.presentation_revision, b.bytes FROM viewer_deltas d JOIN blobs b ON b.digest = d.patch_digest "
        "WHERE d.run_id = ? AND d.presentation_revision > ? ORDER BY d.presentation_revision, d.delta_index",
        (run_id, after),
    ).fetchall()
    by_revision: dict[int, list[dict[str, Any]]] = {}
    for at, data in rows:  # a revision's ops: its deltas' patches in order
        by_revision.setdefault(at, []).extend(canonical.loads(data))
    if list(by_revision) != list(range(after + 1, revision + 1)):
        return None
    return {
        "revision": revision,
        "runRevision": run_revision,
        "patches": [{"revision": at, "ops": ops} for at, ops in by_revision.items()],
    }

"""Active execution time (docs/storage.md): an agent attempt's numbered intervals and its budget.

An interval opens at a turn's start and ends at its end, a pause, the host's
exit or the attempt's settlement; at most one is open per attempt. The host
measures with a monotonic clock: a sample only raises ``elapsed_ms``, so a
wall-clock jump neither spends nor restores the budget, and ``last_observed_at``
and ``ended_at`` never move before the interval's start. Recovery ends an
interval at its last durable observation (the unobserved gap is not charged).
"""

from __future__ import annotations

import sqlite3


def open_interval(conn: sqlite3.Connection, attempt_id: str, now: int) -> int:
    """The attempt's open interval, opened now unless one is open (a duplicate start counts nothing twice)."""
    row = conn.execute(
        "SELECT interval_number FROM attempt_active_intervals WHERE attempt_id = ? AND ended_at IS NULL",
        (attempt_id,),
    ).fetchone()
    if row is not None:
        return int(row[0])
    (number,) = conn.execute(
        "SELECT coalesce(max(interval_number), 0) + 1 FROM attempt_active_intervals WHERE attempt_id = ?",
        (attempt_id,),
    ).fetchone()
    conn.execute(
        "INSERT INTO attempt_active_intervals (attempt_id, interval_number, started_at, last_observed_at) "
        "VALUES (?, ?, ?, ?)",
        (attempt_id, number, now, now),
    )
    return int(number)


def sample(conn: sqlite3.Connection, attempt_id: str, elapsed_ms: int, now: int) -> bool:
    """A measurement of the open interval: its elapsed time only rises (a wall-clock jump neither
    spends nor restores the budget). False when no interval is open."""
    return (
        conn.execute(
            "UPDATE attempt_active_intervals SET elapsed_ms = max(elapsed_ms, ?), "
            "last_observed_at = max(last_observed_at, ?) WHERE attempt_id = ? AND ended_at IS NULL",
            (elapsed_ms, now, attempt_id),
        ).rowcount
        == 1
    )


_OPEN_INTERVALS = {
    "attempt_id": "attempt_id = ?",
    "run_id": "attempt_id IN (SELECT attempt_id FROM node_attempts WHERE run_id = ?)",
}


def close_intervals(
    conn: sqlite3.Connection,
    column: str,
    value: str,
    cause: str,
    now: int | None,
    elapsed_ms: int | None = None,
) -> None:
    """End the open interval of an attempt (or of every attempt of a run): at ``now``, or at its
    last durable observation when ``now`` is None (recovery: the unobserved gap is not charged).
    ``elapsed_ms``: a final measurement (it only raises the elapsed time)."""
    conn.execute(
        "UPDATE attempt_active_intervals SET end_cause = ?, elapsed_ms = max(elapsed_ms, ?), "
        "last_observed_at = max(last_observed_at, coalesce(?, last_observed_at)), "
        "ended_at = max(last_observed_at, coalesce(?, last_observed_at)) "
        f"WHERE {_OPEN_INTERVALS[column]} AND ended_at IS NULL",
        (cause, elapsed_ms or 0, now if elapsed_ms is not None else None, now, value),
    )


def spent_ms(conn: sqlite3.Connection, attempt_id: str) -> int:
    (spent,) = conn.execute(
        "SELECT coalesce(sum(elapsed_ms), 0) FROM attempt_active_intervals WHERE attempt_id = ?", (attempt_id,)
    ).fetchone()
    return int(spent)


def timeout_ms_of(conn: sqlite3.Connection, attempt_id: str) -> int:
    (timeout_ms,) = conn.execute("SELECT timeout_ms FROM node_attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
    return int(timeout_ms or 0)


def budget_spent(conn: sqlite3.Connection, attempt_id: str, measured_ms: int | None = None) -> tuple[int, int, bool]:
    """(timeout_ms, spent_ms, whether a positive budget is spent); ``measured_ms``: a final
    measurement of the open interval not yet written (it counts as a sample would)."""
    timeout_ms, spent = timeout_ms_of(conn, attempt_id), spent_ms(conn, attempt_id)
    if measured_ms is not None:
        row = conn.execute(
            "SELECT elapsed_ms FROM attempt_active_intervals WHERE attempt_id = ? AND ended_at IS NULL", (attempt_id,)
        ).fetchone()
        spent += max(0, measured_ms - row[0]) if row else 0
    return timeout_ms, spent, 0 < timeout_ms <= spent

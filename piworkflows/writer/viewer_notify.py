"""Which run views a commit changed, told to the supervisor after the commit (``viewer.advanced``),
so that it sends their watchers fresh snapshots and the run-list watchers a new first page.

::

    TEMP triggers on viewer_runs    a run created, its presentation revision advanced, the run
      └─> temp.viewer_advanced      deleted: its id, written inside the transaction of the change
                                    (a rolled-back transaction or savepoint leaves no row)
    take(conn), after COMMIT        the ids, the table emptied; WriterLoop sends them in one frame

The temp table lives only in the writer's connection (``install`` after each open): nothing durable,
and nothing read at view time.
"""

from __future__ import annotations

import sqlite3

_DDL = """
CREATE TEMP TABLE IF NOT EXISTS viewer_advanced (run_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TRIGGER IF NOT EXISTS viewer_runs_created AFTER INSERT ON main.viewer_runs
BEGIN INSERT OR IGNORE INTO viewer_advanced VALUES (NEW.run_id); END;
CREATE TEMP TRIGGER IF NOT EXISTS viewer_runs_advanced AFTER UPDATE OF presentation_revision ON main.viewer_runs
BEGIN INSERT OR IGNORE INTO viewer_advanced VALUES (NEW.run_id); END;
CREATE TEMP TRIGGER IF NOT EXISTS viewer_runs_deleted AFTER DELETE ON main.viewer_runs
BEGIN INSERT OR IGNORE INTO viewer_advanced VALUES (OLD.run_id); END;
"""


def install(conn: sqlite3.Connection) -> None:
    """The temp table and triggers on a newly opened writer connection (outside any transaction)."""
    conn.executescript(_DDL)


def take(conn: sqlite3.Connection) -> list[str]:
    """The runs whose views changed since the last take, in committed transactions only."""
    runs = [row[0] for row in conn.execute("SELECT run_id FROM temp.viewer_advanced")]
    if runs:
        conn.execute("DELETE FROM temp.viewer_advanced")
    return runs

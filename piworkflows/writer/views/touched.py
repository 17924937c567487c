"""The mark a command leaves when it changes what a run's view shows in rows no trigger of the
projection watches (writer/views/projection.py reads the marks and installs their temp table).
A leaf: the writer's domain modules import it without importing the projection."""

from __future__ import annotations

import sqlite3


def touch(conn: sqlite3.Connection, run_id: str) -> None:
    """The transaction changed what the run's view shows in rows no trigger watches."""
    conn.execute(
        "INSERT INTO temp.viewer_touched SELECT ?1, '', 0 WHERE NOT EXISTS "
        "(SELECT 1 FROM temp.viewer_touched WHERE run_id = ?1 AND history = '' AND key = 0)",
        (run_id,),
    )

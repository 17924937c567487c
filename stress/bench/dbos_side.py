"""The DBOS Transact side of the runs benchmark: the same 10-step workflow, run in its own process.

``python -m stress.bench.dbos_side DIR COUNT`` prints one JSON line
``{"workflows_per_s": ..., "nodes_per_s": ..., "dbos": version}``. Needs the
optional ``bench`` extra (``pip install -e '.[bench]'``); never imported by
the test suite or the server.

As the issue sets it up: the SQLite system database is created beforehand in
WAL mode (default ``synchronous``), 4 threads start workflows, each a chain of
10 ``@DBOS.step`` functions computing the same running sum as the
piworkflows ``ten-nodes`` workflow; the clock runs from the first start to the
last result.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

THREADS = 4


def main(argv: list[str]) -> int:
    directory, count = Path(argv[0]), int(argv[1])
    database = directory / "dbos.sqlite"
    conn = sqlite3.connect(database)
    if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
        raise SystemExit("SQLite refused WAL mode")
    conn.close()

    from dbos import DBOS, DBOSConfig

    DBOS(
        config=DBOSConfig(
            name="piworkflows-bench",
            system_database_url=f"sqlite:///{database}",
            log_level="WARNING",
            enable_otlp=False,
        )
    )

    @DBOS.step()
    def add(previous: int, i: int) -> int:
        return previous + i

    @DBOS.workflow()
    def ten_steps() -> int:
        total = 0
        for i in range(10):
            total = add(total, i)
        return total

    DBOS.launch()
    for _ in range(THREADS):  # before the clock, as on the piworkflows side
        DBOS.start_workflow(ten_steps).get_result()
    results: list[int] = []
    lock = threading.Lock()

    def starter(n: int) -> None:
        for _ in range(n):
            handle = DBOS.start_workflow(ten_steps)
            value = handle.get_result()
            with lock:
                results.append(value)

    shares = [count // THREADS + (1 if t < count % THREADS else 0) for t in range(THREADS)]
    threads = [threading.Thread(target=starter, args=(n,)) for n in shares]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    DBOS.destroy()
    if results != [45] * count:
        raise SystemExit("a DBOS workflow returned a wrong result")
    print(
        json.dumps(
            {
                "workflows_per_s": round(count / elapsed, 1),
                "nodes_per_s": round(count * 10 / elapsed, 1),
                "dbos": version("dbos"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The startup check: what ``PRAGMA quick_check`` (run before the server serves) costs per 100 MiB.

A state dir is planted to at least ``--mib`` MiB with old run trees, 10,000 at a time, each
written by the writer's own ``run.create`` (``stress/bench/trees.py``: a run row, its queue,
resource, event and viewer rows, its input blob, and their indexes; about 1.1 KB a tree). Each
figure is the median of ``--repeat`` timings, on a warm page cache (the file was just written) or,
with ``--cold`` (root only), after the kernel's page cache was dropped before each timing:

- ``quick_check_s``: ``PRAGMA quick_check`` alone, on the read-only immutable connection startup
  uses after a clean stop;
- ``verify_clean_s``: all of startup's verification (header, schema shape, quick_check);
- ``verify_after_crash_s``: the same with a -wal and -shm present (a crash or kill left them), where
  the three files are first copied to a private directory so nothing live is touched;
- ``integrity_check_s``: ``state verify``'s ``PRAGMA integrity_check``, for comparison.

``*_per_100_mib_s`` scale each to 100 MiB of database file.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import time
from collections.abc import Callable
from typing import Any

from piworkflows.paths import StatePaths
from piworkflows.writer import invariants, schema
from stress.bench.fs import bench_dir, cleanup, filesystem_of
from stress.bench.trees import plant

TREES_AT_ONCE = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=int, default=100, help="database size to plant")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each timing (root)")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def fill(paths: StatePaths, mib: int) -> int:
    """Old run trees until the database file holds ``mib`` MiB; returns how many."""
    trees = 0
    while not paths.database.exists() or paths.database.stat().st_size < mib * 1024 * 1024:
        plant(paths, TREES_AT_ONCE, prefix=f"old{trees // TREES_AT_ONCE}")
        trees += TREES_AT_ONCE
    return trees


def timed(action: Callable[[], object], repeat: int, cold: bool) -> float:
    seconds = []
    for _ in range(repeat):
        if cold:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as caches:  # the whole machine's page cache
                caches.write("3\n")
        began = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def check(paths: StatePaths, pragma: str) -> None:
    conn = sqlite3.connect(f"file:{paths.database}?mode=ro&immutable=1", uri=True)
    try:
        assert invariants.damage(conn, pragma) == [], f"{pragma} found damage"
    finally:
        conn.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        paths = StatePaths.resolve(base / "s")
        trees = fill(paths, args.mib)
        mib = paths.database.stat().st_size / (1024 * 1024)
        figures = {
            "quick_check_s": timed(lambda: check(paths, "quick_check"), args.repeat, args.cold),
            "verify_clean_s": timed(lambda: schema.verify_database(paths), args.repeat, args.cold),
            "integrity_check_s": timed(lambda: check(paths, "integrity_check"), args.repeat, args.cold),
        }
        keep = sqlite3.connect(paths.database)  # an open writer leaves -wal and -shm, as a crash does
        keep.execute("PRAGMA journal_mode = WAL")
        keep.execute("INSERT INTO blobs VALUES (randomblob(32), 'application/json', 2, X'7B7D', 1)")
        keep.commit()
        try:
            figures["verify_after_crash_s"] = timed(lambda: schema.verify_database(paths), args.repeat, args.cold)
        finally:
            keep.close()
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    report: dict[str, Any] = {
        "benchmark": "startup",
        "database_mib": round(mib, 1),
        "trees": trees,
        "repeat": args.repeat,
        "cold": args.cold,
        "filesystem": fstype,
    }
    for name, seconds in figures.items():
        report[name] = round(seconds, 3)
        report[name.removesuffix("_s") + "_per_100_mib_s"] = round(seconds * 100 / mib, 3)
    return report

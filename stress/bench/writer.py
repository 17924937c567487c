"""Group commit against a plain one-commit-per-command loop (same write, same pragmas).

``writer_commands_per_s``: 8 concurrent submitters, each waiting for every
reply before sending its next command, through the real writer process
(synchronous=FULL). Each command is ``blob.put`` of a small distinct JSON
value: one row inserted into ``blobs``. ``raw_sqlite_commits_per_s``: the
same INSERT into the same table, one ``BEGIN IMMEDIATE ... COMMIT`` per
command, on a plain sqlite3 connection with the writer's pragmas, in the same
run, on the same filesystem. ``ratio`` = the first over the second.
"""

from __future__ import annotations

import argparse
import sqlite3
import threading
import time
from typing import Any

from piworkflows.clock import SystemClock
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal import BlobValue
from piworkflows.settings import Settings
from piworkflows.writer import db, schema
from piworkflows.writer.process import spawn
from stress.bench.fs import bench_dir, cleanup, filesystem_of

SERVER = {"actor_class": "server"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--commands", type=int, default=8000, help="writer commands in all (split over submitters)")
    parser.add_argument("--raw-commits", type=int, default=2000)
    parser.add_argument("--dir", help="where to create the temporary state dirs (a disk, not tmpfs)")


def _values(prefix: str, count: int) -> list[BlobValue]:
    """Prepared outside the timed loop: hashing is the submitter's job, done before it sends."""
    return [BlobValue.of_json({"bench": prefix, "n": n}) for n in range(count)]


def measure_writer(state_dir: Any, submitters: int, commands: int) -> float:
    settings = Settings()
    writer = spawn(state_dir, settings)
    per = commands // submitters
    work = [[{"actor": SERVER, "blob": v.model_dump()} for v in _values(f"s{i}", per)] for i in range(submitters)]
    failures: list[str] = []

    def submit(bodies: list[dict[str, Any]]) -> None:
        for body in bodies:
            reply = writer.link.request("blob.put", body, timeout=60)
            if reply.outcome != "accepted":
                failures.append(reply.outcome)

    threads = [threading.Thread(target=submit, args=(w,)) for w in work]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    writer.stop()
    if failures:
        raise SystemExit(f"{len(failures)} writer commands failed: {sorted(set(failures))}")
    return per * submitters / elapsed


def measure_raw(paths: StatePaths, commits: int) -> float:
    schema.ensure_database(paths, SystemClock().now_ms())
    conn = db.connect(paths, Settings())
    rows = [(v.digest, v.media_type, len(v.data), v.data, 0) for v in _values("raw", commits)]
    started = time.perf_counter()
    for row in rows:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO blobs (digest, media_type, byte_length, bytes, created_at) VALUES (?, ?, ?, ?, ?)", row
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return commits / elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        writer_rate = measure_writer(base / "writer-state", args.submitters, args.commands)
        raw_rate = measure_raw(StatePaths.resolve(base / "raw-state"), args.raw_commits)
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    return {
        "benchmark": "writer",
        "submitters": args.submitters,
        "writer_commands": args.commands // args.submitters * args.submitters,
        "raw_commits": args.raw_commits,
        "writer_commands_per_s": round(writer_rate, 1),
        "raw_sqlite_commits_per_s": round(raw_rate, 1),
        "ratio": round(writer_rate / raw_rate, 2),
        "filesystem": fstype,
        "sqlite": sqlite3.sqlite_version,
        "synchronous": "FULL",
    }

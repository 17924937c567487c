"""Group commit against a plain one-commit-per-command loop (same write, same pragmas).

``writer_commands_per_s``: 8 concurrent submitters, each waiting for every
reply before sending its next command, through the real writer process
(synchronous=FULL). The submitters are coroutines on one event loop sharing
one link to the writer, exactly as the supervisor submits. Each command is
``blob.put`` of a small distinct JSON value: one row inserted into ``blobs``.

``raw_sqlite_commits_per_s``: the same INSERT into the same table, one
``BEGIN IMMEDIATE ... COMMIT`` per command, on a plain sqlite3 connection
with the writer's pragmas, in the same run, on the same filesystem.

The two alternate in rounds (writer, raw, writer, raw, ...) so that both see
the same disk and CPU noise of a shared machine; rates are totals over all
rounds. ``ratio`` = the first over the second.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

from piworkflows.clock import SystemClock
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.base import BlobValue
from piworkflows.protocol.link import AsyncLink
from piworkflows.settings import Settings
from piworkflows.writer import db, schema
from piworkflows.writer.process import spawn
from stress.bench.fs import bench_dir, cleanup, filesystem_of

SERVER = {"actor_class": "server"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--commands", type=int, default=8000, help="writer commands in all (split over submitters)")
    parser.add_argument("--raw-commits", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4, help="alternating writer/raw rounds")
    parser.add_argument("--dir", help="where to create the temporary state dirs (a disk, not tmpfs)")


def _values(prefix: str, count: int) -> list[BlobValue]:
    """Prepared outside the timed loop: hashing is the submitter's job, done before it sends."""
    return [BlobValue.of_json({"bench": prefix, "n": n}) for n in range(count)]


async def _writer_round(link: AsyncLink, work: list[list[dict[str, Any]]]) -> float:
    async def submit(bodies: list[dict[str, Any]]) -> None:
        for body in bodies:
            reply = await link.request("blob.put", body)
            if reply.outcome != "accepted":
                raise SystemExit(f"a writer command answered {reply.outcome}")

    started = time.perf_counter()
    await asyncio.gather(*(submit(bodies) for bodies in work))
    return time.perf_counter() - started


def _raw_round(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> float:
    started = time.perf_counter()
    for row in rows:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO blobs (digest, media_type, byte_length, bytes, created_at) VALUES (?, ?, ?, ?, ?)", row
        )
        conn.execute("COMMIT")
    return time.perf_counter() - started


def measure(base: Path, args: argparse.Namespace) -> tuple[float, float, int, int]:
    rounds, submitters = args.rounds, args.submitters
    per = args.commands // (submitters * rounds)
    raw_per = args.raw_commits // rounds
    raw_paths = StatePaths.resolve(base / "raw-state")
    schema.ensure_database(raw_paths, SystemClock().now_ms())
    raw_conn = db.connect(raw_paths, Settings())
    writer = spawn(base / "writer-state", Settings(), event_loop_link=True)
    writer_time = raw_time = 0.0

    async def main() -> None:
        nonlocal writer_time, raw_time
        assert isinstance(writer.link, AsyncLink)
        await writer.link.start()
        for r in range(rounds):
            work = [
                [{"actor": SERVER, "blob": v.model_dump()} for v in _values(f"r{r}s{i}", per)]
                for i in range(submitters)
            ]
            writer_time += await _writer_round(writer.link, work)
            rows = [(v.digest, v.media_type, len(v.data), v.data, 0) for v in _values(f"raw{r}", raw_per)]
            raw_time += _raw_round(raw_conn, rows)
        writer.link.close()

    try:
        asyncio.run(main())
    finally:
        writer.reap()
        raw_conn.close()
    writer_commands, raw_commits = per * submitters * rounds, raw_per * rounds
    return writer_commands / writer_time, raw_commits / raw_time, writer_commands, raw_commits


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    try:
        writer_rate, raw_rate, writer_commands, raw_commits = measure(base, args)
        fstype = filesystem_of(base)
    finally:
        cleanup(base)
    return {
        "benchmark": "writer",
        "submitters": args.submitters,
        "rounds": args.rounds,
        "writer_commands": writer_commands,
        "raw_commits": raw_commits,
        "writer_commands_per_s": round(writer_rate, 1),
        "raw_sqlite_commits_per_s": round(raw_rate, 1),
        "ratio": round(writer_rate / raw_rate, 2),
        "filesystem": fstype,
        "sqlite": sqlite3.sqlite_version,
        "synchronous": "FULL",
    }

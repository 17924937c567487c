"""Where the writer's commits go: the WAL frames of whole workflows, by the B-tree each one rewrites.

The workflow part of ``runs`` (``--workflows`` 10-node runs by 4 runners, after 4 warm-up runs) on
a server whose WAL is never checkpointed (``PI_WORKFLOWS_WAL_AUTOCHECKPOINT_PAGES`` set beyond the
run's size for that server only). Once the server is idle, its database and WAL are copied and the
WAL is read frame by frame:

- ``commits``, ``frames``, ``frames_per_commit`` and ``frames_per_node`` (nodes of every run the
  WAL holds, the warm-up runs included; the server's own start is in it too);
- ``by_btree``: the twelve tables and indexes with the most frames, each one's share of the frames
  in percent (a frame's page named through SQLite's ``dbstat`` on the copy; null where SQLite
  lacks it).

A commit writes every page it changed once, whole, whatever it changed on it: an insert into an
index keyed by a digest lands on a page of its own nearly every time.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sqlite3
import struct
from pathlib import Path
from typing import Any

from piworkflows.paths import StatePaths
from stress.bench.fs import bench_dir, cleanup, filesystem_of
from stress.bench.runs import measure_workflows

WARM_UP_RUNS = 4  # measure_workflows starts these before it measures
_HEADER = 32  # the WAL header; each frame is a 24-byte header and one page
_FRAME_HEADER = 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workflows", type=int, default=200, help="10-node workflow runs (at most 252)")
    parser.add_argument("--dir", help="where to create the temporary state dir (a disk, not tmpfs)")


def wal_frames(wal: bytes) -> tuple[int, list[tuple[int, bool]]]:
    """The page size and each frame's (page number, ends a commit) of a WAL file's bytes."""
    (page_size,) = struct.unpack(">I", wal[8:12])
    frames = []
    offset = _HEADER
    while offset + _FRAME_HEADER + page_size <= len(wal):
        page, size_after_commit = struct.unpack(">II", wal[offset : offset + 8])
        frames.append((page, size_after_commit != 0))
        offset += _FRAME_HEADER + page_size
    return page_size, frames


def page_owners(database: Path) -> dict[int, str] | None:
    """Each page's table or index (None: this SQLite has no dbstat)."""
    conn = sqlite3.connect(database)
    try:
        return {page: name for name, page in conn.execute("SELECT name, pageno FROM dbstat")}
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = bench_dir(args.dir)
    count = min(args.workflows, 252)  # run.list shows 256: every run is checked completed
    copy = base / "copy.sqlite"
    os.environ["PI_WORKFLOWS_WAL_AUTOCHECKPOINT_PAGES"] = str(1 << 30)

    def keep(paths: StatePaths) -> None:  # the idle server's database and WAL, as they are
        shutil.copyfile(paths.database, copy)
        shutil.copyfile(f"{paths.database}-wal", f"{copy}-wal")

    try:
        workflows, nodes, _ = measure_workflows(StatePaths.resolve(base / "w" / "s"), count, before_stop=keep)
        page_size, frames = wal_frames(Path(f"{copy}-wal").read_bytes())
        owners = page_owners(copy)  # reads the WAL copy too (no checkpoint: only a reader)
        fstype = filesystem_of(base)
    finally:
        del os.environ["PI_WORKFLOWS_WAL_AUTOCHECKPOINT_PAGES"]
        cleanup(base)
    commits = sum(1 for _, ends in frames if ends)
    by_btree = None
    if owners is not None:
        shares = collections.Counter(owners.get(page, "(free)") for page, _ in frames)
        by_btree = {name: round(100 * n / len(frames), 1) for name, n in shares.most_common(12)}
    return {
        "benchmark": "wal",
        "workflows": count,
        "workflows_per_s": round(workflows, 1),
        "nodes_per_s": round(nodes, 1),
        "page_size": page_size,
        "commits": commits,
        "frames": len(frames),
        "frames_per_commit": round(len(frames) / max(commits, 1), 1),
        "frames_per_node": round(len(frames) / ((count + WARM_UP_RUNS) * 10), 1),
        "by_btree": by_btree,
        "filesystem": fstype,
        "sqlite": sqlite3.sqlite_version,
    }

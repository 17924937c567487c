"""Where benchmarks put their databases: a real disk, never tmpfs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def filesystem_of(path: Path) -> str:
    """The filesystem type of the mount that holds ``path`` (Linux /proc/mounts)."""
    path = path.resolve()
    best, fstype = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                _, mount_point, kind, *_ = line.split()
                if (path == Path(mount_point) or Path(mount_point) in path.parents) and len(mount_point) > len(best):
                    best, fstype = mount_point, kind
    except OSError:
        pass
    return fstype


def bench_dir(requested: str | None) -> Path:
    """A fresh directory on a disk filesystem: the requested one, else the temp dir, else the cwd."""
    if requested:
        base = Path(requested)
    else:
        base = Path(tempfile.gettempdir())
        if filesystem_of(base) in ("tmpfs", "ramfs"):
            base = Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    if filesystem_of(base) in ("tmpfs", "ramfs"):
        raise SystemExit(f"{base} is on {filesystem_of(base)}; benchmarks need a disk (pass --dir)")
    return Path(tempfile.mkdtemp(prefix="piw-bench-", dir=base))


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

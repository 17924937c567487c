"""The harness's evidence: append-only JSON lines, each fsynced before it is counted.

Clients log every command they send (``sent``) and every response they got (``ack``);
the harness logs its kills, restarts and checks. A kill of the harness itself can at most
tear the last line, which ``load`` skips.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class EvidenceLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def append(self, record: dict[str, Any]) -> None:
        """Durable when this returns: only then may the caller count the record."""
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def load(path: Path) -> list[dict[str, Any]]:
    """Every whole record of one log (a torn last line is skipped)."""
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def load_all(directory: Path, pattern: str) -> list[dict[str, Any]]:
    return [record for path in sorted(directory.glob(pattern)) for record in load(path)]

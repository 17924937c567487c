"""Times as views show them: ISO 8601 UTC with milliseconds (``2026-01-01T00:00:00.000Z``), from
and back to the epoch milliseconds the database stores. Durations stay integer milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache


@lru_cache(maxsize=4096)  # a run's views show the same few times again at every revision
def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_or_none(ms: int | None) -> str | None:
    return None if ms is None else iso(ms)


def epoch_ms(text: str) -> int:
    """The epoch milliseconds of a time ``iso`` wrote (ValueError for anything else)."""
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def prune_before_ms(before: str) -> int:
    """``StatePrunePayload.before`` in epoch milliseconds (the router's check and the CLI's
    ``--before``); ValueError, its message the fix, unless an ISO 8601 time with a zone after 1970."""
    try:
        moment: datetime | None = datetime.fromisoformat(before)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or moment.timestamp() < 0:
        raise ValueError("before must be an ISO 8601 time with a zone (after 1970), e.g. 2026-08-01T00:00:00Z")
    return int(moment.timestamp() * 1000)

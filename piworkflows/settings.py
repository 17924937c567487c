"""Every tunable duration and bound of the server, in one settings object.

Fields are overridable by ``PI_WORKFLOWS_<FIELD_NAME_UPPER>`` environment
variables (and, from the server issue on, by ``server run`` options).
Integration tests start real processes with short values instead of faking
time across processes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ENV_PREFIX = "PI_WORKFLOWS_"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Group commit (ARCHITECTURE.md, The write path): a group holds the
    # commands already waiting, at most this many, and stops taking more once
    # it has executed for group_max_ms.
    group_max_commands: int = Field(default=256, ge=1, le=10_000)
    group_max_ms: int = Field(default=25, ge=1, le=10_000)
    # Bounded WAL: checkpoint every N pages and cap the -wal file kept after.
    wal_autocheckpoint_pages: int = Field(default=1000, ge=100)
    journal_size_limit_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    busy_timeout_ms: int = Field(default=5000, ge=0)
    # How often a child checks that the process that spawned it still lives.
    parent_check_ms: int = Field(default=1000, ge=10)
    # How long a spawner waits for a child's ready handshake.
    child_ready_timeout_ms: int = Field(default=30_000, ge=100)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process see these settings."""
        return {ENV_PREFIX + name.upper(): str(value) for name, value in self.model_dump().items()}

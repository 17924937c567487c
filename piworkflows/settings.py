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

    # Group commit (docs/design/group-commit.md): a group holds the
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
    # Claims (docs/workflows.md): TTL and renewal.
    claim_ttl_ms: int = Field(default=30_000, ge=100)
    claim_renew_ms: int = Field(default=10_000, ge=10)
    # Writer restart backoff after it died: first delay, doubling up to the max.
    writer_restart_min_ms: int = Field(default=100, ge=1)
    writer_restart_max_ms: int = Field(default=5_000, ge=1)
    # Runners: how many run at once (0: runs are accepted and stay queued),
    # and how often the scheduler looks for claimable runs without a notice.
    max_runners: int = Field(default=4, ge=0, le=256)
    scheduler_tick_ms: int = Field(default=1000, ge=10)
    # A runner that dies (a node that ends its process) after the run advanced: the run is queued
    # again after runner_crash_backoff_ms, doubled for each death in a row at the same node
    # visit; at runner_crash_limit deaths there the run parks runnerNoProgress with the count.
    runner_crash_limit: int = Field(default=3, ge=1, le=100)
    runner_crash_backoff_ms: int = Field(default=1000, ge=0)
    # How long a resolver child may take to load and compile a workflow, and
    # how many resolver children may exist at once.
    resolve_timeout_ms: int = Field(default=30_000, ge=100)
    resolvers: int = Field(default=4, ge=1, le=64)
    # How long a child with nothing to do lives on: an outbox worker without an effect, a
    # resolver child without a request, a runner process waiting for a launch, the ready agent
    # host. Each is started again for the next work (an idle server runs none of them).
    child_idle_exit_ms: int = Field(default=60_000, ge=10)
    # What the supervisor keeps of a runner's or resolver's stderr (workflow code's own text): the
    # last lines, each cut to this many characters, for server.log when the child dies (a runner:
    # before it saved progress); and how long it waits for a dead child's last lines.
    child_stderr_lines: int = Field(default=20, ge=1, le=200)
    child_stderr_line_chars: int = Field(default=200, ge=20, le=256)  # 4 bytes a char fit a park detail
    child_stderr_drain_ms: int = Field(default=1_000, ge=10)
    # Outbox workers (PI_WORKFLOWS_OUTBOX_WORKERS): how many perform external effects at once,
    # their restart backoff, and how long an idle slot waits at most without a notice before it
    # looks for a due effect again (each slot starts its worker for the first effect it claims).
    outbox_workers: int = Field(default=2, ge=0, le=64)
    outbox_restart_min_ms: int = Field(default=100, ge=1)
    outbox_restart_max_ms: int = Field(default=5_000, ge=1)
    outbox_idle_check_ms: int = Field(default=5_000, ge=10)
    # Retries of idempotent effects: exponential backoff from the base, capped, with jitter.
    effect_retry_base_ms: int = Field(default=1_000, ge=1)
    effect_retry_max_ms: int = Field(default=60_000, ge=1)
    # How long a runner waiting on an effect the pool applies waits before it looks again.
    effect_await_ms: int = Field(default=30_000, ge=10)
    # Shell commands: each stream is kept whole up to this many bytes (beyond, it is read and dropped
    # and the cut recorded) and stored as a blob that `run logs` prints; maxOutputChars bounds only
    # the node's output value.
    shell_stream_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    # Values larger than one frame are uploaded in parts (blob.put_part): the writer holds the
    # uploads in progress in memory, together at most blob_upload_max_bytes (beyond: unavailable, the
    # uploader tries again later; one larger than that alone is refused), and forgets an upload no part
    # reached for blob_upload_idle_ms.
    blob_upload_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    blob_upload_idle_ms: int = Field(default=60_000, ge=10)
    # Automatic retention (spec, Automatic retention): terminal root-run trees older than
    # retention_age_ms go; at most one completed sweep per retention_interval_ms; a sweep that found
    # work active (or failed) is tried again after retention_idle_retry_ms.
    retention: bool = True  # off only where a test counts the writer's commits
    retention_age_ms: int = Field(default=30 * 24 * 3600 * 1000, ge=0)
    retention_interval_ms: int = Field(default=24 * 3600 * 1000, ge=10)
    retention_idle_retry_ms: int = Field(default=5 * 60 * 1000, ge=10)
    # Retention vacuums only when at least this many bytes (and 20 percent of the pages) are free.
    retention_vacuum_min_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    # Protected human decisions: the deadline timer sleeps at most this long between two sweeps
    # (a new decision wakes it sooner).
    decision_timer_max_sleep_ms: int = Field(default=60_000, ge=10)
    # The Telegram channel (docs/decisions.md): getUpdates long-poll seconds, one Bot API request's
    # bound, and the adapter child's restart delay (doubling from min to max).
    telegram_poll_timeout_s: int = Field(default=25, ge=0, le=50)
    telegram_request_timeout_ms: int = Field(default=30_000, ge=100)
    channel_restart_min_ms: int = Field(default=1_000, ge=1)
    channel_restart_max_ms: int = Field(default=60_000, ge=1)
    # state.backup copies this many pages between two write groups.
    backup_step_pages: int = Field(default=256, ge=1)
    # Benchmarks only: append every SQL statement the writer runs to this file.
    sql_trace_path: str | None = None
    # Agent nodes on Pi: the Pi command (unset: the copy `pi-workflows setup pi` installed, else
    # `pi` on PATH).
    pi_command: str | None = None
    # Agent nodes (docs/agents.md): hosts at once, the model (unset: the workflow's, else Pi's
    # default), Pi's extra arguments (shell words), the default active-time budget, how often a
    # host samples active time and flushes captured events, how long Pi may take to start, the
    # grace after an RPC abort, how long an error end waits for Pi's auto-retry, and how long a
    # validator child may take.
    max_agents: int = Field(default=4, ge=0, le=64)
    agent_model: str | None = None
    pi_args: str | None = None
    agent_timeout_ms: int = Field(default=900_000, ge=0)
    active_sample_ms: int = Field(default=1_000, ge=10)
    agent_flush_ms: int = Field(default=250, ge=10)
    agent_start_timeout_ms: int = Field(default=30_000, ge=100)
    agent_abort_grace_ms: int = Field(default=10_000, ge=10)
    agent_retry_settle_ms: int = Field(default=500, ge=0)
    validate_timeout_ms: int = Field(default=30_000, ge=100)
    # An agent host that ends without finishing a model turn (Pi exited, crashed) is replaced after
    # agent_host_backoff_ms, doubled for each such end in a row of one request; at
    # agent_host_failure_limit in a row (at once when Pi is missing or refuses the step) the run
    # parks agentNoProgress with the host's own error. A request fails after
    # agent_max_rejections rejected submissions, naming the last rejection.
    agent_host_failure_limit: int = Field(default=3, ge=1, le=100)
    agent_host_backoff_ms: int = Field(default=1_000, ge=0)
    agent_max_rejections: int = Field(default=20, ge=1, le=10_000)
    # How long a stopping child gets between SIGTERM and SIGKILL.
    stop_grace_ms: int = Field(default=5_000, ge=10)
    # Client connections: requests in flight per connection, and how many
    # bytes of unsent output a connection may hold before it is dropped.
    client_max_in_flight: int = Field(default=64, ge=1)
    client_output_buffer_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024)
    # Hostile or broken clients (docs/protocol.md, Limits): a frame must complete within
    # frame_timeout_ms of its first byte; a connection with nothing pending is closed after
    # idle_timeout_ms without a byte; at most max_connections are open (fewer if the fd limit leaves
    # fewer); the bytes buffered for partial frames of all connections together stay within
    # client_partial_bytes_max. 64 MiB holds 64 maximal frames arriving at once (64 KiB a connection
    # at the default bound), while 1,024 trickling clients cannot grow the supervisor by more.
    frame_timeout_ms: int = Field(default=10_000, ge=10)
    idle_timeout_ms: int = Field(default=600_000, ge=10)
    max_connections: int = Field(default=1024, ge=1)
    client_partial_bytes_max: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)  # >= one maximal frame
    # Connection log lines (refusals, malformed frames, timeouts, failures): at most this many of
    # each kind per interval, then one line counting the rest, so no client can quickly rotate the
    # startup lines out of the log (at worst about 100 lines a minute: the default 20 MiB of log
    # hold more than a day of them).
    connection_log_lines: int = Field(default=10, ge=1)
    connection_log_interval_ms: int = Field(default=60_000, ge=10)
    # Shell completion (pi-workflows completion): how long the CLI waits for the server's answer
    # before it completes nothing.
    completion_timeout_ms: int = Field(default=1_500, ge=10)
    # The server log (host/server.log): size per file and rotated files kept.
    log_max_bytes: int = Field(default=5 * 1024 * 1024, ge=4096)
    log_backups: int = Field(default=3, ge=0)

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
        """The environment that makes a child process see these settings (unset ones stay unset)."""
        return {ENV_PREFIX + name.upper(): str(value) for name, value in self.model_dump().items() if value is not None}

"""The server epoch and its counts (writer/commands/server.py)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from piworkflows.protocol.internal.base import Command, Digest, Id, ReadCommand


class ServerTakeEpoch(Command):
    kind: ClassVar[str] = "server.take_epoch"
    host_id: Id
    claim_token_hash: Digest
    pid: int = Field(ge=1)
    process_started_at: int = Field(ge=0)
    ttl_ms: int = Field(ge=1)


class ServerRenewEpoch(Command):
    kind: ClassVar[str] = "server.renew_epoch"
    server_epoch: int = Field(ge=1)
    claim_token_hash: Digest
    ttl_ms: int = Field(ge=1)


class ServerReleaseEpoch(Command):
    kind: ClassVar[str] = "server.release_epoch"
    server_epoch: int = Field(ge=1)
    claim_token_hash: Digest


class ServerRecordStop(Command):
    """A client asked the server to stop: recorded on the server resource, with a receipt."""

    kind: ClassVar[str] = "server.record_stop"
    server_epoch: int = Field(ge=1)


class ServerCounts(ReadCommand):
    """Privacy-safe counts for server.status: no ids, paths or payloads."""

    kind: ClassVar[str] = "server.counts"

"""The server epoch (``workflow_host_state``) and its live local claim.

A supervisor takes a new epoch only after it holds ``host/host.lock``, so the
previous server is provably gone: taking never waits for the old claim to
expire, and every claim stamped with an older epoch is dead from that commit.
"""

from __future__ import annotations

from piworkflows.errors import CommandError
from piworkflows.protocol.internal.server import (
    ServerCounts,
    ServerRecordStop,
    ServerReleaseEpoch,
    ServerRenewEpoch,
    ServerTakeEpoch,
)
from piworkflows.writer import records
from piworkflows.writer.commands import state
from piworkflows.writer.contract import Change, Handler, ResourceHandler, Result, Stamp, Target, Tx

SERVER_RESOURCE_ID = "server"
SERVER_ONLY = frozenset({"server"})


class TakeEpoch(ResourceHandler[ServerTakeEpoch]):
    model = ServerTakeEpoch
    actors = SERVER_ONLY

    def target(self, tx: Tx, cmd: ServerTakeEpoch) -> Target:
        current = records.get_resource(tx.conn, SERVER_RESOURCE_ID)
        if current is None:
            return Target(SERVER_RESOURCE_ID, None, create_kind="server")
        return Target(SERVER_RESOURCE_ID, current.revision)

    def transition(self, tx: Tx, cmd: ServerTakeEpoch, resource: records.Resource | None) -> Change:
        row = tx.conn.execute("SELECT server_epoch FROM workflow_host_state").fetchone()
        epoch = (row[0] if row else 0) + 1
        change = Change(event_type="server.epoch_taken", receipt={"serverEpoch": epoch})

        def apply(stamp: Stamp) -> None:
            tx.conn.execute(
                "INSERT INTO workflow_host_state (singleton, server_epoch, host_id, claim_token_hash, pid, "
                "process_started_at, started_at, heartbeat_at, expires_at) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (singleton) DO UPDATE SET server_epoch = excluded.server_epoch, "
                "host_id = excluded.host_id, claim_token_hash = excluded.claim_token_hash, pid = excluded.pid, "
                "process_started_at = excluded.process_started_at, started_at = excluded.started_at, "
                "heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at",
                (
                    epoch,
                    cmd.host_id,
                    cmd.claim_token_hash,
                    cmd.pid,
                    cmd.process_started_at,
                    tx.now,
                    tx.now,
                    tx.now + cmd.ttl_ms,
                ),
            )

        change.apply = apply
        return change


def _verify_epoch_claim(tx: Tx, server_epoch: int, claim_token_hash: bytes) -> None:
    row = tx.conn.execute("SELECT server_epoch, claim_token_hash, expires_at FROM workflow_host_state").fetchone()
    if row is None or row[0] != server_epoch or row[1] is None:
        raise CommandError("staleServerEpoch", "a newer server epoch owns the state")
    if row[1] != claim_token_hash:
        raise CommandError("claimTokenMismatch", "the server claim token does not match")
    if row[2] <= tx.now:
        raise CommandError("claimExpired", "the server claim expired")


class RenewEpoch(Handler[ServerRenewEpoch]):
    """The heartbeat: renews the exact live epoch claim (no event; nothing changed)."""

    model = ServerRenewEpoch
    actors = SERVER_ONLY

    def execute(self, tx: Tx, cmd: ServerRenewEpoch) -> Result:
        _verify_epoch_claim(tx, cmd.server_epoch, cmd.claim_token_hash)
        expires_at = tx.now + cmd.ttl_ms
        tx.conn.execute(
            "UPDATE workflow_host_state SET heartbeat_at = ?, expires_at = ? WHERE server_epoch = ?",
            (tx.now, expires_at, cmd.server_epoch),
        )
        return Result(receipt={"serverEpoch": cmd.server_epoch, "expiresAt": expires_at})


class ReleaseEpoch(Handler[ServerReleaseEpoch]):
    """A clean shutdown clears the live claim; the epoch number stays."""

    model = ServerReleaseEpoch
    actors = SERVER_ONLY

    def execute(self, tx: Tx, cmd: ServerReleaseEpoch) -> Result:
        _verify_epoch_claim(tx, cmd.server_epoch, cmd.claim_token_hash)
        tx.conn.execute(
            "UPDATE workflow_host_state SET host_id = NULL, claim_token_hash = NULL, pid = NULL, "
            "process_started_at = NULL, heartbeat_at = NULL, expires_at = NULL WHERE server_epoch = ?",
            (cmd.server_epoch,),
        )
        return Result(receipt={"serverEpoch": cmd.server_epoch, "released": True})


class RecordStop(ResourceHandler[ServerRecordStop]):
    """server.stop from a client: an audited, idempotent control on the server resource."""

    model = ServerRecordStop
    actors = frozenset({"client", "operator"})

    def target(self, tx: Tx, cmd: ServerRecordStop) -> Target:
        current = records.get_resource(tx.conn, SERVER_RESOURCE_ID)
        if current is None:
            raise CommandError("resourceNotFound", "the server has not taken an epoch")
        return Target(SERVER_RESOURCE_ID, current.revision)

    def transition(self, tx: Tx, cmd: ServerRecordStop, resource: records.Resource | None) -> Change:
        row = tx.conn.execute("SELECT server_epoch FROM workflow_host_state").fetchone()
        if row is None or row[0] != cmd.server_epoch:
            raise CommandError("staleServerEpoch", "a newer server epoch owns the state")
        return Change(event_type="server.stop_requested", receipt={"stopping": True, "serverEpoch": cmd.server_epoch})


class Counts(Handler[ServerCounts]):
    """Counts only: run queue phases, expired claims, pending interactions, ambiguous effects."""

    model = ServerCounts
    actors = SERVER_ONLY
    read_only = True

    def execute(self, tx: Tx, cmd: ServerCounts) -> Result:
        conn = tx.conn
        runs = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        # Parked: held for a reason someone must act on (not a pause). A run that waits for an answer
        # has a parked queue row too, but it is waiting, not parked.
        # From the parked queue rows (an index range, few rows: clients poll this), not the runs.
        parked, parked_waiting = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE r.status = 'waiting') FROM run_queue q "
            "JOIN runs r ON r.run_id = q.run_id WHERE q.queue_status = 'parked' "
            "AND r.park_reason IS NOT NULL AND r.park_reason != 'paused'"
        ).fetchone()
        shared = {
            name: state.count(conn, name, tx.now)
            for name in ("expiredClaims", "pendingInteractions", "ambiguousEffects", "ambiguousEffectsOfEndedRuns")
        }
        return Result(
            receipt={
                "queuedRuns": runs.get("queued", 0),
                "runningRuns": runs.get("running", 0),
                "parkedRuns": parked,
                "waitingRuns": runs.get("waiting", 0) - parked_waiting,
                **shared,
            }
        )


HANDLERS = (TakeEpoch(), RenewEpoch(), ReleaseEpoch(), RecordStop(), Counts())

"""The supervisor process: one per user and state dir.

::

    flock host/host.lock ── take over: end the older epoch's children (identity checked)
      ── host.json (this supervisor) ── spawn writer (schema verified) ── host.json (+ writer)
      ── server.take_epoch (epoch + 1, claim token hash) ── bind host/host.sock (0600)
      ── ready ── serve ... heartbeat: server.renew_epoch every claim_renew_ms
    SIGTERM / SIGINT / server.stop ── stop accepting ── in-flight requests finish
      ── release the epoch claim ── writer last ── socket removed ── lock released

The supervisor never opens SQLite. The claim token lives only in its memory;
the database stores its SHA-256.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import signal
from collections.abc import Callable

import psutil

from piworkflows.paths import StatePaths
from piworkflows.settings import Settings
from piworkflows.supervisor import registry
from piworkflows.supervisor.lock import HostLock
from piworkflows.supervisor.outbox import OutboxPool
from piworkflows.supervisor.registry import Identity, Registry
from piworkflows.supervisor.resolver import Resolvers
from piworkflows.supervisor.retention import Retention
from piworkflows.supervisor.router import Router
from piworkflows.supervisor.scheduler import Scheduler
from piworkflows.supervisor.server import ClientServer, PeerCheck, check_socket_path, same_user
from piworkflows.supervisor.writer_child import WriterChild

log = logging.getLogger("piworkflows.supervisor")

# The supervisor runs as `pi-workflows server run` or `python -m piworkflows.supervisor`,
# so its command line has no fixed marker; pid + create time identify it.
SUPERVISOR_MARKER = ""
SERVER = {"actor_class": "server"}


class StartupFailed(Exception):
    pass


class Supervisor:
    def __init__(
        self,
        paths: StatePaths,
        settings: Settings,
        peer_check: PeerCheck = same_user,
        writer_env: dict[str, str] | None = None,
    ) -> None:
        self.paths = paths
        self.settings = settings
        self.lock = HostLock(paths)
        self.registry = Registry()
        self.writer = WriterChild(paths, settings, self._record_writer, writer_env)
        self.resolvers = Resolvers(self, settings)
        self.scheduler = Scheduler(self)
        self.outbox = OutboxPool(self)
        self.retention = Retention(self)
        self.router = Router(self)
        self.server = ClientServer(paths.socket, settings, self.router.handle, peer_check)
        self.state = "running"
        self.epoch = 0
        self._token = secrets.token_bytes(32)  # memory only
        self._stop = asyncio.Event()
        self._stop_reason = ""

    @property
    def token_hash(self) -> bytes:
        return hashlib.sha256(self._token).digest()

    def request_stop(self, reason: str) -> None:
        """Only enqueues (safe from signal callbacks); the main task does the work."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    def _record_writer(self, identity: Identity | None) -> None:
        self.registry.children = [c for c in self.registry.children if c.role != "writer"]
        if identity is not None:
            self.registry.children.append(identity)
        self.registry.save(self.paths.registry)

    def record_child(self, identity: Identity) -> None:
        """In host.json before the child is waited for, so a takeover can end it."""
        self.registry.set_child(identity)
        self.registry.save(self.paths.registry)

    def forget_child(self, pid: int) -> None:
        self.registry.drop_child(pid)
        self.registry.save(self.paths.registry)

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until stopped. Raises AlreadyRunning / StateIncompatible / StartupFailed."""
        check_socket_path(self.paths.socket)  # before anything is touched
        self.lock.acquire()
        try:
            ended = registry.take_over(self.paths.registry, self.settings.stop_grace_ms / 1000)
            if ended:
                log.warning("ended leftover processes of an older server: %s", ", ".join(ended))
            self.registry = Registry(supervisor=Identity.of("supervisor", os.getpid(), SUPERVISOR_MARKER))
            self.registry.save(self.paths.registry)
            await self.writer.start()
            await self._take_epoch()
            await self.outbox.start()
            await self.scheduler.start()
            self.retention.start()  # after startup recovery
            await self.server.start()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.request_stop, signal.Signals(signum).name)
            heartbeat = asyncio.create_task(self._heartbeat(), name="epoch-heartbeat")
            log.info("serving on %s (server epoch %d, at most %d connections, fd limit %s)", self.paths.socket,
                     self.epoch, self.server.max_connections, self.server.fd_limit or "unlimited")  # fmt: skip
            if ready is not None:
                ready()
            await self._stop.wait()
            log.info("stopping: %s", self._stop_reason)
            heartbeat.cancel()
            await self._shutdown()
        finally:
            await self.writer.stop()
            if self.registry.supervisor is not None:  # ours: an older server's record is kept otherwise
                self.registry.children = []
                self.registry.save(self.paths.registry)
            self.lock.release()

    async def _take_epoch(self) -> None:
        me = psutil.Process()
        reply = await self.writer.request(
            "server.take_epoch",
            {"actor": SERVER, "host_id": "host-" + secrets.token_hex(8), "claim_token_hash": self.token_hash,
             "pid": me.pid, "process_started_at": int(me.create_time() * 1000), "ttl_ms": self.settings.claim_ttl_ms},
        )  # fmt: skip
        if reply.outcome != "accepted" or reply.receipt is None:
            raise StartupFailed(f"could not take a server epoch: {reply.error}")
        self.epoch = int(reply.receipt["serverEpoch"])
        self.registry.serverEpoch = self.epoch
        self.registry.save(self.paths.registry)

    async def _heartbeat(self) -> None:
        body = {"actor": SERVER, "server_epoch": self.epoch, "claim_token_hash": self.token_hash,
                "ttl_ms": self.settings.claim_ttl_ms}  # fmt: skip
        while True:
            await asyncio.sleep(self.settings.claim_renew_ms / 1000)
            reply = await self.writer.request("server.renew_epoch", body)
            if reply.outcome == "claimLost":
                log.error("the server epoch claim is lost (%s); stopping", (reply.receipt or {}).get("code"))
                self.request_stop("epoch claim lost")
                return

    async def _shutdown(self) -> None:
        self.state = "stopping"
        await self.server.close()
        await self.retention.stop()
        await self.scheduler.stop()
        await self.outbox.stop()
        await self.resolvers.close()
        body = {"actor": SERVER, "server_epoch": self.epoch, "claim_token_hash": self.token_hash}
        deadline = asyncio.get_running_loop().time() + self.settings.stop_grace_ms / 1000
        while True:
            reply = await self.writer.request("server.release_epoch", body)
            if reply.outcome != "unavailable" or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(self.settings.writer_restart_min_ms / 1000)  # the writer is restarting
        if reply.outcome != "accepted":
            log.warning("the epoch claim was not released: %s", reply.outcome)

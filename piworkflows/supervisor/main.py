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

A full or failing disk never ends it: a host.json that cannot be written is
kept as it was and written again by the heartbeat (a child that could not be
recorded is ended before it acts and started again later); an epoch claim
that expired while nothing could be committed is replaced in place by a new
epoch, with the children of the old one ended and started again, as at a
start (this supervisor still holds the lock, so no other server took over).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import psutil

from piworkflows.clock import Clock, SystemClock
from piworkflows.errors import StatePathRefused
from piworkflows.lock import HostLock
from piworkflows.paths import StatePaths
from piworkflows.protocol.internal.writer import Reply, ViewerAdvanced
from piworkflows.settings import Settings
from piworkflows.supervisor import lineage, registry
from piworkflows.supervisor.agents import AgentManager
from piworkflows.supervisor.channels import Channels
from piworkflows.supervisor.decision_timer import DecisionTimer
from piworkflows.supervisor.leftovers import Leftovers
from piworkflows.supervisor.outbox import OutboxPool
from piworkflows.supervisor.registry import ChildNotRecorded, Identity, Registry
from piworkflows.supervisor.resolver import Resolvers
from piworkflows.supervisor.retention import Retention
from piworkflows.supervisor.router import Router
from piworkflows.supervisor.scheduler import Scheduler
from piworkflows.supervisor.seams import HubWiring, Load, ask_while_unavailable
from piworkflows.supervisor.server import ClientServer, PeerCheck, check_socket_path, same_user
from piworkflows.supervisor.views import Views
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
        clock: Clock | None = None,
    ) -> None:
        self.paths = paths
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.lock = HostLock(paths)
        self.registry = Registry()
        self.leftovers = Leftovers(lineage.state_tag(paths.state_dir), recorded=self._recorded_pids)
        _, writer_env = self.leftovers.issue(writer_env or {}, spawning=False)  # it starts nothing itself
        self.writer = WriterChild(paths, settings, self._record_writer, writer_env, on_viewer=self._viewer_advanced)
        self.views = Views(self.writer, watch=self.writer.watch)
        self.resolvers = Resolvers(self, settings)
        self.retention = Retention(self.writer, settings, self.clock, busy=self._busy)
        self.decisions = DecisionTimer(self.writer, settings, self.clock, resolved=self.wake_scheduler)
        self.channels = self._channels()
        self.outbox, self.scheduler = self._pool_and_scheduler()
        self.agents = self._agent_manager()
        self.router = Router(
            self.writer, self.resolvers, self, self, settings, self.clock, self.views, channels=self.channels
        )
        self.server = ClientServer(paths.socket, settings, self.router.handle, peer_check, self.views.forget)
        self.state = "running"
        self.epoch = 0
        self._token = secrets.token_bytes(32)  # memory only
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._registry_unsaved = False  # host.json is behind the registry in memory
        # The writer's identity is recorded from the thread that spawns it: one change of the
        # registry and one write of host.json (its temp file is O_EXCL) at a time.
        self._registry_lock = threading.RLock()

    @property
    def token_hash(self) -> bytes:
        return hashlib.sha256(self._token).digest()

    def _viewer_advanced(self, advanced: ViewerAdvanced | None) -> None:
        """The writer's commits changed these run views (None: it restarted); on the event loop."""
        if advanced is None:
            self.views.advanced(None)
        else:
            self.views.advanced(advanced.runs, advanced.patches)
        self.channels.wake()  # a decision may have opened or been resolved: its messages may be due

    def request_stop(self, reason: str) -> None:
        """Only enqueues (safe from signal callbacks); the main task does the work."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    def _pool_and_scheduler(self) -> tuple[OutboxPool, Scheduler]:
        """A new outbox pool and scheduler (at the start, and for a new epoch), wired to each
        other through this supervisor, whose scheduler and pool they always are."""
        pool = OutboxPool(self._hub_wiring())
        scheduler = Scheduler(
            self.writer,
            self,
            pool,
            self.settings,
            self.clock,
            server_epoch=lambda: self.epoch,
            request_retention=self.retention.request,
            wake_agents=lambda: self.agents.wake(),
            wake_decisions=self.decisions.wake,
            decision_routes=self.channels.routes,
        )
        return pool, scheduler

    def _hub_wiring(self) -> HubWiring:
        """What each hub of children gets: the writer, this supervisor's host.json and scheduler,
        and the current epoch (read when used: a new epoch needs no new wiring)."""
        return HubWiring(
            self.writer,
            self,
            self.settings,
            self.clock,
            server_epoch=lambda: self.epoch,
            wake_scheduler=self.wake_scheduler,
        )

    def _channels(self) -> Channels:
        return Channels(self._hub_wiring())

    def _agent_manager(self) -> AgentManager:
        return AgentManager(
            self._hub_wiring(),
            socket_path=str(self.paths.socket),
            tmp_dir=self.paths.pi_tmp,
            resolvers=self.resolvers,
            runs=self,
        )

    # --- what the components ask of each other (supervisor/seams.py) -------------------

    def wake_scheduler(self) -> None:
        """A run may be claimable (started, answered, resumed, an effect it waited for settled)."""
        self.scheduler.wake()

    def wake_outbox(self) -> None:
        """An effect may be due."""
        self.outbox.wake()

    def stop_run(self, run_id: str, let_effect_settle: bool = False) -> None:
        self.scheduler.stop_run(run_id, let_effect_settle)
        self.agents.stop_run(run_id)

    def stop_agent_host(self, run_id: str) -> None:
        """An operator settled the run's agent step: its host (Pi with it) has nothing left to do."""
        self.agents.stop_run(run_id)

    def cancel_effects(self, run_id: str) -> None:
        self.outbox.cancel_run(run_id)

    def maintenance(self) -> AbstractContextManager[None]:
        return self.retention.maintenance()

    def load(self) -> Load:
        return Load(
            active_runners=len(self.scheduler.active),
            connections=len(self.server.connections),
            max_connections=self.server.max_connections,
            fd_limit=self.server.fd_limit,
        )

    def _busy(self) -> bool:
        """Not idle for automatic retention: the server stops, or a runner is active."""
        return self.state != "running" or bool(self.scheduler.active)

    def _record_writer(self, identity: Identity | None) -> None:
        with self._registry_lock:
            self.registry.children = [c for c in self.registry.children if c.role != "writer"]
            if identity is not None:
                self.record_child(identity)
            else:
                self.save_registry()

    def _recorded_pids(self) -> set[int]:
        with self._registry_lock:
            return {child.pid for child in self.registry.children}

    def record_child(self, identity: Identity) -> None:
        """In host.json before the child does anything, so a takeover can end it. Raises
        ChildNotRecorded when host.json cannot be written: the caller ends the child."""
        with self._registry_lock:
            self.registry.set_child(identity)
            if not self.save_registry():
                self.registry.drop_child(identity.pid)
                raise ChildNotRecorded(f"the {identity.role} could not be recorded in host.json")

    def forget_child(self, pid: int) -> None:
        with self._registry_lock:
            self.registry.drop_child(pid)
            self.save_registry()

    def save_registry(self) -> bool:
        """Write host.json; when it cannot be written (a full disk) the previous file stays, one line
        is logged, and the heartbeat writes it again. Returns whether it was written."""
        with self._registry_lock:
            return self._save_registry()

    def _save_registry(self) -> bool:
        try:
            self.registry.save(self.paths.registry)
        except (OSError, StatePathRefused) as exc:
            if not self._registry_unsaved:
                log.error(
                    "host.json could not be written (%s); the previous one is kept and written again later",
                    exc.strerror if isinstance(exc, OSError) else exc,
                )
            self._registry_unsaved = True
            return False
        if self._registry_unsaved:
            log.info("host.json is written again")
            self._registry_unsaved = False
        return True

    async def run(self, ready: Callable[[], None] | None = None, subreaper: bool = False) -> None:
        """Serve until stopped. Raises AlreadyRunning / StateIncompatible / StartupFailed.
        ``subreaper``: this process is the server's own (not a test's), and follows what its
        children leave behind (supervisor/leftovers.py)."""
        check_socket_path(self.paths.socket)  # before anything is touched
        self.lock.acquire()
        try:
            # a server that stopped cleanly recorded no children at the end and ended its orphans
            unclean = bool(Registry.load(self.paths.registry).children)
            ended = registry.take_over(self.paths.registry, self.settings.stop_grace_ms / 1000)
            if ended:
                log.warning("ended leftover processes of an older server: %s", ", ".join(ended))
            left = lineage.end(lineage.find(self.leftovers.tag)) if unclean else []
            if left:
                log.warning("ended what an older server's children left behind: pids %s", ", ".join(map(str, left)))
            if subreaper:
                self.leftovers.enable()
            self.registry = Registry(supervisor=Identity.of("supervisor", os.getpid(), SUPERVISOR_MARKER))
            self.registry.save(self.paths.registry)  # at the start a failed write is a failed start
            await self.writer.start()
            reply = await self._take_epoch()
            if reply.outcome != "accepted":
                raise StartupFailed(f"could not take a server epoch: {reply.error}")
            await self.decisions.start()  # deadlines passed while the server was down, before runs are claimed
            await self.outbox.start()
            await self.scheduler.start()
            await self.agents.start()
            await self.channels.start()  # after the deadline sweep: no press competes with a passed deadline
            self.retention.start()  # after startup recovery
            await self.server.start()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.request_stop, signal.Signals(signum).name)
            heartbeat = asyncio.create_task(self._heartbeat(), name="epoch-heartbeat")
            log.info(
                "serving on %s (server epoch %d, at most %d connections, fd limit %s)",
                self.paths.socket,
                self.epoch,
                self.server.max_connections,
                self.server.fd_limit or "unlimited",
            )
            if ready is not None:
                ready()
            await self._stop.wait()
            log.info("stopping: %s", self._stop_reason)
            heartbeat.cancel()
            await self._shutdown()
        finally:
            await self.writer.stop()
            self.leftovers.final(self.settings.stop_grace_ms / 1000)
            if self.registry.supervisor is not None:  # ours: an older server's record is kept otherwise
                self.registry.children = []
                self.save_registry()
            self.lock.release()

    async def _take_epoch(self) -> Reply:
        me = psutil.Process()
        reply: Reply = await self.writer.request(
            "server.take_epoch",
            {
                "actor": SERVER,
                "host_id": "host-" + secrets.token_hex(8),
                "claim_token_hash": self.token_hash,
                "pid": me.pid,
                "process_started_at": int(me.create_time() * 1000),
                "ttl_ms": self.settings.claim_ttl_ms,
            },
        )
        if reply.outcome == "accepted" and reply.receipt is not None:
            self.epoch = int(reply.receipt["serverEpoch"])
            self.registry.serverEpoch = self.epoch
            self.save_registry()
        return reply

    async def _heartbeat(self) -> None:
        while True:
            await self.clock.sleep_ms(self.settings.claim_renew_ms)
            if self._registry_unsaved:
                self.save_registry()
            body = {
                "actor": SERVER,
                "server_epoch": self.epoch,
                "claim_token_hash": self.token_hash,
                "ttl_ms": self.settings.claim_ttl_ms,
            }
            reply = await self.writer.request("server.renew_epoch", body)
            code = (reply.receipt or {}).get("code")
            if reply.outcome == "claimLost" and code == "claimExpired":
                await self._new_epoch()
            elif reply.outcome == "claimLost":
                log.error("the server epoch claim is lost (%s); stopping", code)
                self.request_stop("epoch claim lost")
                return

    async def _new_epoch(self) -> None:
        """The epoch claim expired while nothing could be committed (a full disk, a writer that could
        not start). The lock is still ours, so no other server took over: as at a start, end the old
        epoch's runners and workers, take a new epoch (asked again until the writer commits), and
        start them again; their recovery reclaims what the old epoch held."""
        log.warning("the server epoch claim expired while nothing could be committed; taking a new epoch")
        await self.channels.stop()
        await self.agents.stop()
        await self.scheduler.stop()
        await self.outbox.stop()
        self._token = secrets.token_bytes(32)
        while (await self._take_epoch()).outcome != "accepted":
            if self._stop.is_set():
                return
            await self.clock.sleep_ms(self.settings.claim_renew_ms)
        log.info("serving under server epoch %d", self.epoch)
        self.outbox, self.scheduler = self._pool_and_scheduler()
        self.agents = self._agent_manager()
        self.channels = self._channels()
        self.router.channels = self.channels
        await self.outbox.start()
        await self.scheduler.start()
        await self.agents.start()
        await self.channels.start()

    async def _shutdown(self) -> None:
        self.state = "stopping"
        await self.server.close()
        await self.retention.stop()
        await self.decisions.stop()
        await self.channels.stop()
        await self.agents.stop()
        await self.scheduler.stop()
        await self.outbox.stop()
        await self.resolvers.close()
        body = {"actor": SERVER, "server_epoch": self.epoch, "claim_token_hash": self.token_hash}
        reply = await ask_while_unavailable(
            self.writer, "server.release_epoch", body, self.settings, self.clock, within_ms=self.settings.stop_grace_ms
        )
        if reply.outcome != "accepted":
            log.warning("the epoch claim was not released: %s", reply.outcome)

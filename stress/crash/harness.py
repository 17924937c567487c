"""The crash-recovery stress harness: a real server under load, killed again and again.

::

    ledger process (HTTP, scripted answers, every request fsynced with its key and answer)
    scripted model (agents.py, in this process) <── Pi of the agent steps
    fake Bot API and chat users (telegram.py, in this process) <── the server's Telegram adapter
    server (detached, short durations) <── N client processes (workload.py, seeded)
      ├─ every --kill-every ms: SIGKILL one target, drawn from the seed:
      │    supervisor | group (the supervisor's process group) -> restart the server
      │    writer | outbox | runner                            -> its supervisor restarts it
      │    agent (an agent host) | pi (its Pi)                 -> the step resumes in a new host
      │    channel (the Telegram adapter)                      -> its manager restarts it
      │  a restart may arm one fault of a --fault-kinds kind for that server's life:
      │    crash: a --faults point kills its process at the Nth hit
      │    enospc | eio: hits N to N+K of a disk write site fail as on a full or failing disk
      │      (the writer's groups, host.json, server.log)
      ├─ a server that stopped by itself (epoch claim lost) is restarted and counted
      ├─ after every restart: state.verify (integrity, foreign keys, the spec's invariants)
    end: clients stop; a kill-free quiet period; every unanswered command retried with its key;
         paused or parked agent and decision runs resumed until each ends, a decision nobody
         can press any more answered by the operator; the server stops; no host or Pi left; the
         database and Pi's session files are read; oracles.judge; the report

The evidence (client logs, harness log, ledger) lives in the work directory beside the
state dir; a failed run keeps both and prints the command that repeats it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from piworkflows import faults
from piworkflows.client import ClientError, WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from piworkflows.supervisor.registry import Registry
from stress.crash import agents, evidence, oracles, snapshot, telegram, workload

AGENT_TARGETS = ("agent", "pi")
TELEGRAM_TARGETS = ("channel",)  # the Telegram adapter child (host.json role "channel")
TARGETS = ("supervisor", "writer", "outbox", "runner", "group", *AGENT_TARGETS, *TELEGRAM_TARGETS)
# Every point the load reaches: the harness makes no backups. Agent runs alone reach the agent
# host's points, the workflow tool's (in Pi) and the submission's (recorded, judged); each is hit
# once or twice in the process it fires in (a host, a Pi, a server's few submissions).
CRASH_POINTS = tuple(sorted(faults.POINTS - {faults.WRITER_BACKUP_STEP}))
AGENT_POINTS = tuple(
    sorted(
        {
            faults.AGENT_AFTER_OPEN,
            faults.AGENT_BEFORE_PROMPT,
            faults.AGENT_AFTER_PROMPT,
            faults.AGENT_AFTER_MESSAGE_SENT,
            faults.AGENT_AFTER_TURN_STARTED,
            faults.AGENT_BEFORE_TURN_END,
            faults.AGENT_AFTER_RECORD,
            faults.AGENT_BEFORE_CLOSE,
            faults.TOOL_AFTER_SUBMIT_SENT,
            faults.SUPERVISOR_AFTER_SUBMISSION_RECORDED,
            faults.VALIDATOR_BEFORE_VERDICT,
        }
    )
)
# The Telegram adapter's points: reached only with --telegram, a few times in an adapter's life (a
# restarted adapter runs without fault rules): early hits too.
TELEGRAM_POINTS = tuple(
    sorted(
        {
            faults.CHANNEL_AFTER_UPDATES_RECEIVED,
            faults.CHANNEL_AFTER_UPDATES_COMMITTED,
            faults.CHANNEL_AFTER_ATTEMPT_RECORDED,
            faults.CHANNEL_AFTER_REQUEST_SENT,
        }
    )
)
FAULT_KINDS = ("crash", "enospc", "eio")
# Where a disk fault strikes: the writer's next groups (answered unavailable, nothing committed), and
# the supervisor's own writes.
DISK_POINTS = (faults.WRITER_BEFORE_COMMIT, faults.SUPERVISOR_REGISTRY_SAVE, faults.SUPERVISOR_LOG_WRITE)
# Short durations (docs/workflows.md): recovery within seconds, not minutes.
SERVER_ENV = {
    "PI_WORKFLOWS_CLAIM_TTL_MS": "3000",
    "PI_WORKFLOWS_CLAIM_RENEW_MS": "300",
    "PI_WORKFLOWS_WRITER_RESTART_MIN_MS": "20",
    "PI_WORKFLOWS_WRITER_RESTART_MAX_MS": "300",
    "PI_WORKFLOWS_OUTBOX_RESTART_MIN_MS": "20",
    "PI_WORKFLOWS_OUTBOX_RESTART_MAX_MS": "300",
    "PI_WORKFLOWS_PARENT_CHECK_MS": "100",
    "PI_WORKFLOWS_STOP_GRACE_MS": "2000",
    "PI_WORKFLOWS_EFFECT_RETRY_BASE_MS": "100",
    "PI_WORKFLOWS_EFFECT_RETRY_MAX_MS": "1000",
    "PI_WORKFLOWS_EFFECT_AWAIT_MS": "2000",
    "PI_WORKFLOWS_SCHEDULER_TICK_MS": "200",
    "PI_WORKFLOWS_OUTBOX_IDLE_CHECK_MS": "500",
}
CLIENT_RETRY_S = 30.0  # a client waits this long for a server that is being restarted
WATCH_S = 0.25  # how often the harness looks whether the server is still there
# A crash window: from a kill until the server has recovered (children respawned, warm again).
CHILD_WINDOW_S = 1.0  # after a child kill
RESTART_WINDOW_S = 3.0  # after a restarted server is ready


@dataclass
class Options:
    seconds: float = 60.0
    seed: int = 1
    clients: int = 4
    kill_every_ms: int = 1500
    targets: tuple[str, ...] = TARGETS
    faults: tuple[str, ...] = CRASH_POINTS
    fault_kinds: tuple[str, ...] = FAULT_KINDS
    state_dir: Path | None = None
    quiet_s: float = 60.0
    pace_ms: int = 100
    agents: int = 2  # clients keeping an agent run going (the server's max_agents); 0: no agent load
    pi: str | None = None  # the Pi command the servers run (agents > 0)
    telegram: bool = True  # decision runs answered through the fake Bot API; the adapter a target

    def command(self) -> str:
        """The command that repeats this run's schedule."""
        parts = [
            sys.executable,
            "-m",
            "stress.crash",
            "--seconds",
            f"{self.seconds:g}",
            "--seed",
            str(self.seed),
            "--clients",
            str(self.clients),
            "--kill-every",
            str(self.kill_every_ms),
            "--agents",
            str(self.agents),
            "--telegram" if self.telegram else "--no-telegram",
            "--targets",
            ",".join(self.targets),
        ]
        if self.faults:
            parts += ["--faults", ",".join(self.faults)]
        if self.fault_kinds:
            parts += ["--fault-kinds", ",".join(self.fault_kinds)]
        return " ".join(parts)


@dataclass
class Tally:
    kills: dict[str, int] = field(default_factory=lambda: {target: 0 for target in TARGETS})
    restarts: int = 0
    exits: int = 0  # the server stopped by itself (not killed by the harness)
    faults_armed: dict[str, int] = field(default_factory=lambda: {kind: 0 for kind in FAULT_KINDS})
    windows: list[tuple[float, float]] = field(default_factory=list)  # crash windows (wall clock)


class Harness:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.rng = random.Random(f"{options.seed}:harness")  # kill times and targets
        self.fault_rng = random.Random(f"{options.seed}:faults")  # armed faults (also after a self-stop)
        if options.state_dir is not None:
            state_dir = options.state_dir.absolute()
            self.work = state_dir.parent / f"{state_dir.name}.crash"
        else:
            self.work = Path(tempfile.mkdtemp(prefix="piw-crash-"))
            state_dir = self.work / "state"
        self.paths = StatePaths.resolve(state_dir)
        self.evidence_dir = self.work / "evidence"
        self.project = self.work / "project"
        self.log: evidence.EvidenceLog | None = None
        self.tally = Tally()
        self.checks: list[dict[str, Any]] = []
        self.ledger: subprocess.Popen[str] | None = None
        self.agents: agents.AgentSide | None = None
        self.agent_runs: dict[str, str] = {}  # agent run -> its status at the end of the quiet period
        self.telegram: telegram.TelegramSide | None = None

    # --- the run -------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        workload.write_project(self.project)
        self.log = evidence.EvidenceLog(self.evidence_dir / "harness.jsonl")
        os.environ.update(SERVER_ENV, PI_WORKFLOWS_CONFIG_DIR=str(self.work / "config"))
        if self.options.agents:
            assert self.options.pi is not None
            self.agents = agents.AgentSide(self.work, self.options.pi, self.options.agents)
            os.environ.update(self.agents.env())
        else:
            os.environ["PI_WORKFLOWS_MAX_AGENTS"] = "0"
        if self.options.telegram:
            self.telegram = telegram.TelegramSide(self.work, self.options.seed, self.evidence_dir)
            os.environ.update(self.telegram.env())
        ledger_url = self._start_ledger()
        try:
            self._start_server(arm=False)
            if self.telegram is not None:
                self.telegram.users.start()
            stop, procs = self._start_clients(ledger_url)
            began = time.monotonic()
            next_kill = began + self._kill_delay()
            while time.monotonic() - began < self.options.seconds:
                time.sleep(WATCH_S)
                self._restart_if_gone()
                if time.monotonic() >= next_kill:
                    self._kill_one()
                    next_kill = time.monotonic() + self._kill_delay()
            stop.set()
            deadline = time.monotonic() + 3 * CLIENT_RETRY_S
            while any(proc.is_alive() for proc in procs) and time.monotonic() < deadline:
                self._restart_if_gone()  # each client finishes its command: the server is kept up
                time.sleep(WATCH_S)
            for proc in procs:
                proc.kill()  # one still waiting: its command is unanswered and retried below
            self._restart_if_gone()
            if os.environ.get(faults.ENV):  # the quiet period is free of faults too
                self._stop_server()
                self._start_server(arm=False)
            self._quiet()
            if self.telegram is not None:
                self.telegram.users.stop()
            evidence_now = self._evidence()
            self._stop_server()
            evidence_now.update(self.agents.evidence() if self.agents is not None else {})
            if self.telegram is not None:
                evidence_now["telegram"] = self.telegram.evidence()
            state = snapshot.read(self.paths.database, int(time.time() * 1000))
        finally:
            self._stop_ledger()
            self._end_server()
            if self.agents is not None:
                self.agents.kill_leftovers()
                self.agents.close()
            if self.telegram is not None:
                self.telegram.close()
        agent_workflow = workload.AGENT_WORKFLOW if self.agents is not None else None
        decision_workflow = workload.DECISION_WORKFLOW if self.telegram is not None else None
        findings = oracles.judge(
            evidence_now, state, frozenset({workload.MANUAL_PATH}), agent_workflow, decision_workflow
        )
        report = self._report(evidence_now, state, findings)
        if report["ok"] and self.options.state_dir is None:
            shutil.rmtree(self.work, ignore_errors=True)  # a passing run leaves nothing behind
        return report

    def _kill_delay(self) -> float:
        """Seconds to the next kill: the mean --kill-every, drawn from the seed."""
        return self.rng.uniform(0.5, 1.5) * self.options.kill_every_ms / 1000

    # --- kills and restarts ------------------------------------------------

    def _kill_one(self) -> None:
        target = self.rng.choice(self.options.targets)
        registry = Registry.load(self.paths.registry)
        at = time.time()
        if target in AGENT_TARGETS:
            self._kill_agent(target, registry, at)
            return
        if target in ("supervisor", "group"):
            supervisor = registry.supervisor
            if supervisor is None or not _same_process(supervisor.pid, supervisor.createTime):
                return  # gone already: the watch restarts it
            pid = supervisor.pid
            try:
                if target == "group" and os.getpgid(pid) != os.getpgrp():  # never the harness's own group
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            self._wait_gone(pid)
            self.tally.kills[target] += 1
            self._record({"t": "kill", "target": target, "pid": pid, "at": at})
            self._start_server(arm=True)
            self.tally.windows.append((at, time.time() + RESTART_WINDOW_S))
            return
        candidates = [child for child in registry.children if child.role == target]
        if not candidates:
            self._record({"t": "skip", "target": target, "at": at})
            return
        child = self.rng.choice(candidates)
        if not _same_process(child.pid, child.createTime):
            return
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.tally.kills[target] += 1
        self.tally.windows.append((at, at + CHILD_WINDOW_S))
        self._record({"t": "kill", "target": target, "pid": child.pid, "at": at})

    def _kill_agent(self, target: str, registry: Registry, at: float) -> None:
        proc = agents.victim(target, registry, self.rng)
        if proc is None:
            self._record({"t": "skip", "target": target, "at": at})
            return
        try:
            proc.kill()
        except psutil.Error:
            return
        self.tally.kills[target] += 1
        self.tally.windows.append((at, at + CHILD_WINDOW_S))
        self._record({"t": "kill", "target": target, "pid": proc.pid, "at": at})

    def _restart_if_gone(self, arm: bool = True) -> None:
        """A server that stopped by itself (it lost its epoch claim while its writer was down
        longer than the claim TTL) is restarted, as a user would; it is counted, not hidden."""
        supervisor = Registry.load(self.paths.registry).supervisor
        if supervisor is not None and _same_process(supervisor.pid, supervisor.createTime):
            return
        at = time.time()
        self.tally.exits += 1
        self._record({"t": "exited", "at": at})
        self._start_server(arm=arm)
        self.tally.windows.append((at, time.time() + RESTART_WINDOW_S))

    def _start_server(self, arm: bool) -> None:
        os.environ.pop(faults.ENV, None)
        if arm and self.options.fault_kinds and self.fault_rng.random() < 0.5:
            kind = self.fault_rng.choice(self.options.fault_kinds)
            fault = self._fault(kind)
            if fault is not None:
                os.environ[faults.ENV] = fault
                self.tally.faults_armed[kind] += 1
                self._record({"t": "arm", "fault": fault, "at": time.time()})
        if self.telegram is not None:
            self.telegram.write_config()  # what the server reads at startup
        deadline = time.monotonic() + 60
        while True:
            try:
                start_server(self.paths)
                break
            except ClientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the killed group's children are still letting go of the lock
        self.tally.restarts += 1
        self._verify(after=f"start {self.tally.restarts}")

    def _fault(self, kind: str) -> str | None:
        """One PIW_FAULTS rule of this kind, drawn from the seed (None: no point for it)."""
        first = self.fault_rng.randint(20, 200)
        if kind == "crash":
            if not self.options.faults:
                return None
            point = self.fault_rng.choice(self.options.faults)
            if point in AGENT_POINTS:  # a host's, a Pi's, a server life's few submissions: early hits
                first = self.fault_rng.randint(1, 2)
            elif point in TELEGRAM_POINTS:  # an adapter's few batches and calls before its next kill
                first = self.fault_rng.randint(1, 3)
            return f"{point}=crash@{first}"
        point = self.fault_rng.choice(DISK_POINTS)
        return f"{point}={kind}@{first}-{first + self.fault_rng.randint(0, 20)}"

    def _verify(self, after: str) -> None:
        try:
            with WorkflowClient(self.paths.state_dir, retry_for=CLIENT_RETRY_S) as client:
                response = client.request("state.verify")
        except (ClientError, OSError, ConnectionError) as exc:
            self._record({"t": "verifyUnanswered", "after": after, "error": type(exc).__name__})
            return
        if response.outcome != "accepted":
            self._record({"t": "verifyUnanswered", "after": after, "error": response.outcome})
            return
        check = {
            "after": after,
            "integrity": response.receipt["integrity"],
            "violations": response.receipt["violations"],
        }
        self.checks.append(check)
        self._record({"t": "check", **check})

    def _wait_gone(self, pid: int) -> None:
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            time.sleep(0.01)

    def _stop_server(self) -> None:
        """server.stop, asked again while the server cannot record it yet (its writer restarting)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                stop_server(self.paths)
                return
            except (ClientError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(WATCH_S)

    def _end_server(self) -> None:
        """Whatever happened, no server of this run is left behind."""
        try:
            self._stop_server()
        except (ClientError, OSError):
            supervisor = Registry.load(self.paths.registry).supervisor
            if supervisor is not None and _same_process(supervisor.pid, supervisor.createTime):
                os.killpg(supervisor.pid, signal.SIGKILL)  # its own group (start_new_session); children follow

    # --- load ----------------------------------------------------------------

    def _start_ledger(self) -> str:
        script = self.work / "ledger-script.json"
        script.write_text(json.dumps(workload.ledger_script(self.options.seed)), encoding="utf-8")
        self.ledger = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stress.ledger",
                "--ledger",
                str(self.evidence_dir / "ledger.jsonl"),
                "--script",
                f"@{script}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.ledger.stdout is not None
        line = self.ledger.stdout.readline().split()
        if line[:1] != ["ready"]:
            raise RuntimeError("the ledger did not start")
        return line[1]

    def _stop_ledger(self) -> None:
        if self.ledger is not None:
            self.ledger.terminate()
            self.ledger.wait(timeout=30)

    def _start_clients(self, ledger_url: str) -> tuple[Any, list[Any]]:
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        common = (
            self.options.seed,
            str(self.paths.state_dir),
            str(self.project),
            ledger_url,
            str(self.evidence_dir),
            CLIENT_RETRY_S,
            stop,
            self.options.pace_ms,
        )
        procs = [
            ctx.Process(target=workload.client_main, args=(i, *common, i < self.options.agents, self.options.telegram))
            for i in range(self.options.clients)
        ]
        for proc in procs:
            proc.start()
        return stop, procs

    def _quiet(self) -> None:
        """No kills: the unanswered commands are retried with their keys, then the runs settle."""
        final = workload.Client(
            self.options.clients,
            self.options.seed,
            self.paths.state_dir,
            self.project,
            "",
            self.evidence_dir,
            CLIENT_RETRY_S,
        )
        try:
            found = self._evidence()
            own = final.client.client_id
            for sent in oracles.unanswered_commands(found["sent"], found["acks"]):
                final.client.client_id = sent["clientId"]  # the same client and key: it must converge
                final.send(sent["op"], sent["payload"], sent["runId"], sent["revision"], key=sent["key"])
            final.client.client_id = own
            found = self._evidence()
            self.agent_runs = {run_id: "unknown" for run_id in workload.agent_runs(found["sent"], found["acks"])}
            deadline = time.monotonic() + self.options.quiet_s
            fewest: int | None = None  # the fewest runs left moving (or agent runs unended) seen
            while time.monotonic() < deadline:  # what still moves once none settled for quiet_s is stuck
                self._restart_if_gone(arm=False)
                try:
                    left = agents.resume_unended(final, self.agent_runs) + self._moving(final)
                    left += self.telegram.settle(final) if self.telegram is not None else 0
                except (ClientError, OSError, ConnectionError):
                    time.sleep(WATCH_S)  # not answered now (its writer restarting), or it stopped by itself:
                    continue  # restarted above on the next turn
                if left == 0:
                    break
                if fewest is None or left < fewest:  # progress: a slow backlog is not stuck
                    fewest, deadline = left, time.monotonic() + self.options.quiet_s
                time.sleep(0.2)
        finally:
            final.close()

    @staticmethod
    def _moving(final: workload.Client) -> int:
        """The queued or running runs that move on by themselves: neither paused nor parked for a
        reason that waits for a person (an ambiguous effect among them)."""
        payload: dict[str, Any] = {"status": ["queued", "running"], "limit": 256}
        moving = 0
        while True:
            response = final.client.request("run.list", payload)
            if response.outcome != "accepted":
                raise ConnectionError(f"run.list: {response.outcome}")
            page = response.receipt
            for item in page["items"]:
                shown = item["display"]
                if shown["status"] in ("paused", "ambiguous"):
                    continue
                if item["piworkflows"]["parkReason"] in oracles.DOCUMENTED_PARKS:
                    continue
                moving += 1
            if page["cursor"] is None:
                return moving
            payload["cursor"] = page["cursor"]

    # --- evidence and report ----------------------------------------------------

    def _record(self, record: dict[str, Any]) -> None:
        assert self.log is not None
        self.log.append(record)

    def _evidence(self) -> dict[str, Any]:
        records = evidence.load_all(self.evidence_dir, "client-*.jsonl")
        return {
            "sent": [r for r in records if r["t"] == "sent"],
            "acks": [r for r in records if r["t"] == "ack"],
            "ledger": evidence.load(self.evidence_dir / "ledger.jsonl"),
            "checks": self.checks,
        }

    def _report(self, found: dict[str, Any], state: snapshot.State, findings: dict[str, list[str]]) -> dict[str, Any]:
        acks = [a for a in found["acks"] if a["outcome"] != "unavailable"]
        calm = [1000 * (a["ackedAt"] - a["sentAt"]) for a in acks if not self._in_window(a["sentAt"], a["ackedAt"])]
        statuses = [effect["status"] for effect in state.effects.values()]
        ok = not any(findings.values())
        return {
            "ok": ok,
            "seed": self.options.seed,
            "seconds": self.options.seconds,
            "clients": self.options.clients,
            "kills": dict(self.tally.kills),
            "killsTotal": sum(self.tally.kills.values()),
            "faultsArmed": sum(self.tally.faults_armed.values()),
            "faultsByKind": self.tally.faults_armed,
            "restarts": self.tally.restarts,
            "serverExits": self.tally.exits,
            "verifiedStarts": len(self.checks),  # starts after which state.verify answered
            "commands": {
                "sent": len({(s["clientId"], s["key"]) for s in found["sent"]}),
                "acknowledged": len({(a["clientId"], a["key"]) for a in acks}),
                "lost": len(findings["lost"]),
            },
            "runs": len(state.runs),
            "effects": {
                "applied": statuses.count("applied"),
                "ambiguous": statuses.count("ambiguous"),
                "duplicated": len(findings["duplicated"]),
                "total": len(statuses),
            },
            "violations": len(findings["violations"]),
            "stuck": len(findings["stuck"]),
            "agents": agents.counts(found, state) if self.agents is not None else None,
            "telegram": telegram.counts(found, state) if "telegram" in found else None,
            "latencyMs": _percentiles(calm),
            "findings": {name: items[:20] for name, items in findings.items() if items},
            "stateDir": str(self.paths.state_dir) if not ok else None,
            "reproduce": self.options.command() if not ok else None,
        }

    def _in_window(self, start: float, end: float) -> bool:
        return any(start < w_end and end > w_start for w_start, w_end in self.tally.windows)


def _same_process(pid: int, create_time: float) -> bool:
    """psutil: the pid still names the process host.json recorded (not a reused pid)."""
    try:
        return abs(psutil.Process(pid).create_time() - create_time) < 0.05
    except psutil.NoSuchProcess:
        return False


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "count": 0}
    ordered = sorted(values)
    return {
        "p50": round(ordered[len(ordered) // 2], 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "count": len(ordered),
    }

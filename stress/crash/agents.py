"""The harness's agent side: the scripted model its agent runs talk to, the servers' agent
settings, and where the agent hosts and their Pi processes are to kill.

::

    harness process ── ScriptedModel (cycling scripts, 127.0.0.1) <── Pi (--provider scripted)
    PI_CODING_AGENT_DIR (models.json naming it, Pi's session files under sessions/)
    every server the harness starts: PI_WORKFLOWS_PI_COMMAND, PI_CODING_AGENT_DIR,
        PI_WORKFLOWS_AGENT_MODEL=scripted/submit, PI_WORKFLOWS_MAX_AGENTS, short agent durations
    kill targets: agent  an agent host (host.json role "agent host": its process group's leader)
                  pi     that host's child, Pi (psutil)

The model serves every agent run of the harness at once: each request takes its model's next
step, so which run gets which answer depends on timing (the oracles hold for any order).
``crash-agent``'s ``plan`` step runs on ``scripted/submit``: a slow acceptable submission, a
submission its ``validate`` rejects, an acceptable one, and a text-only turn (a reminder
follows); its ``reply`` step (an assistant-message output) runs on ``scripted/reply``.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import psutil

from piworkflows.agents.pi import find_pi
from piworkflows.agents.rpc import WORKFLOW_TOOL
from piworkflows.settings import Settings
from piworkflows.supervisor.agents import HOST_MARKER
from piworkflows.supervisor.registry import Registry
from piworkflows.testing.scripted_model import PROVIDER, ScriptedModel
from stress.crash import agent_oracles, workload
from stress.crash.snapshot import State

HOST_ROLE = "agent host"  # supervisor/agents.py spawns it under this role
SUBMIT_MODEL, REPLY_MODEL = "submit", "reply"
SLOW_TURN_MS = 400  # a turn long enough for a kill to land in it


def submit(output: Any, stall_ms: int = 0) -> dict[str, Any]:
    """A model turn calling the workflow tool with ``output`` for the step it was given."""
    step: dict[str, Any] = {
        "tool_calls": [
            {"name": "workflow", "arguments": {"action": "submit", "requestId": "${requestId}", "output": output}}
        ]
    }
    return {**step, "stall_ms": stall_ms} if stall_ms else step


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    SUBMIT_MODEL: [
        submit({"ok": True}, stall_ms=SLOW_TURN_MS),
        submit({"ok": False}),  # validate rejects it: the model is told and answers again
        submit({"ok": True}),
        {"text": "Working on it."},  # no submission: the turn is unproductive, a reminder follows
    ],
    REPLY_MODEL: [{"text": "Done."}, {"stall_ms": SLOW_TURN_MS, "text": "All done here."}],
}
# Agent durations short enough for a 25 s run; the rest are the server's defaults.
AGENT_ENV = {
    "PI_WORKFLOWS_ACTIVE_SAMPLE_MS": "200",
    "PI_WORKFLOWS_AGENT_FLUSH_MS": "100",
    "PI_WORKFLOWS_AGENT_ABORT_GRACE_MS": "2000",
    "PI_WORKFLOWS_AGENT_RETRY_SETTLE_MS": "200",
}


def pi_command() -> str | None:
    """The Pi the servers run (as they would find it: PI_WORKFLOWS_PI_COMMAND, the installed copy,
    PATH), or None."""
    return find_pi(Settings.from_env())


class AgentSide:
    """The scripted model (served until :meth:`close`) and the servers' agent environment."""

    def __init__(self, work: Path, pi: str, max_agents: int) -> None:
        self.model = ScriptedModel(SCRIPTS, cycle=True)
        self.agent_dir = self.model.write_pi_config(work / "pi-agent").absolute()
        self.pi = pi
        self.max_agents = max_agents

    def env(self) -> dict[str, str]:
        return {
            **AGENT_ENV,
            "PI_WORKFLOWS_PI_COMMAND": self.pi,
            "PI_CODING_AGENT_DIR": str(self.agent_dir),
            "PI_WORKFLOWS_AGENT_MODEL": f"{PROVIDER}/{SUBMIT_MODEL}",
            "PI_WORKFLOWS_MAX_AGENTS": str(self.max_agents),
        }

    def session_files(self) -> list[Path]:
        """Every Pi session file the run's agents wrote."""
        return sorted((self.agent_dir / "sessions").rglob("*.jsonl"))

    def leftovers(self, wait_s: float) -> list[str]:
        """Processes of this run's agents (hosts, Pi) still alive ``wait_s`` after the server
        stopped: each should have ended with its host."""
        deadline = time.monotonic() + wait_s
        while True:
            found = [f"pid {proc.pid}: {' '.join(cmd)[:200]}" for proc, cmd in self._ours()]
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    def kill_leftovers(self) -> None:
        for proc, _ in self._ours():
            try:
                proc.kill()
            except psutil.Error:
                pass

    def _ours(self) -> list[tuple[psutil.Process, list[str]]]:
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmd = proc.cmdline()
                if not any(HOST_MARKER in part or part == str(WORKFLOW_TOOL) for part in cmd):
                    continue  # neither a host nor a Pi with the workflow tool
                if proc.environ().get("PI_CODING_AGENT_DIR") == str(self.agent_dir):
                    found.append((proc, cmd))
            except psutil.Error:
                continue
        return found

    def evidence(self) -> dict[str, Any]:
        """After the server stopped: the hosts and Pi left alive, Pi's session files, every request
        the model received."""
        return {
            "leftovers": self.leftovers(wait_s=5.0),
            "sessions": {str(path): agent_oracles.read_session(path) for path in self.session_files()},
            "modelRequests": json.loads(json.dumps(self.model.requests)),
        }

    def close(self) -> None:
        self.model.close()


def victim(target: str, registry: Registry, rng: random.Random) -> psutil.Process | None:
    """What a kill of ``target`` hits: an agent host host.json names (the leader of its process
    group: killed, Pi sees its input close), or that host's Pi (its child: the host sees Pi exit);
    None when none runs now."""
    hosts = [child for child in registry.children if child.role == HOST_ROLE]
    if not hosts:
        return None
    host = rng.choice(hosts).find()
    if host is None or target == "agent":
        return host
    try:
        children = host.children()
    except psutil.Error:
        return None
    return children[0] if children else None


def resume_unended(final: workload.Client, statuses: dict[str, str]) -> int:
    """How many agent runs (``statuses``: run id -> its last seen status) have not ended; a paused
    or parked one is resumed (with a key: evidence) so that it goes on."""
    for run_id, status in statuses.items():
        if status in agent_oracles.TERMINAL:
            continue
        view = final.status(run_id)
        if view is None:
            continue  # not seen now: still counted as it was
        status = view["piworkflows"]["status"]
        statuses[run_id] = status
        if status not in agent_oracles.TERMINAL and (view["state"]["paused"] or view["piworkflows"]["parkReason"]):
            final.send("run.resume", run_id=run_id, key=f"quiet-resume-{run_id}-{final.sent}")
    return sum(status not in agent_oracles.TERMINAL for status in statuses.values())


def counts(found: dict[str, Any], state: State) -> dict[str, Any]:
    """The report's agent figures."""
    runs = [run["status"] for run in state.runs.values() if run["workflow"] == workload.AGENT_WORKFLOW]
    outcomes = [submission["outcome"] for submission in state.submissions]
    messages = [message["state"] for message in state.messages.values()]
    return {
        "runs": len(runs),
        "ended": {status: runs.count(status) for status in sorted(agent_oracles.TERMINAL)},
        "requestsAccepted": sum(request["status"] == "accepted" for request in state.requests.values()),
        "submissions": {outcome: outcomes.count(outcome) for outcome in ("accepted", "rejected")},
        "stepMessages": {name: messages.count(name) for name in ("sent", "cancelled", "pending")},
        "sessionFiles": len(found.get("sessions", {})),
        "modelRequests": len(found.get("modelRequests", [])),
    }

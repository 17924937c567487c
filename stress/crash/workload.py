"""The load: one workflow with every node kind, one with agent steps, the ledger's scripts, and
the client processes.

A client process draws its operations from its own seeded random stream (``seed:index``), so a
run's schedule is reproducible from the seed; its timing is not. Each command carries a
deterministic idempotency key and is logged before it is sent (``sent``) and after its answer
(``ack``, fsynced before it is counted). A command still unanswered when the server stays gone
past the client's retry window is logged ``unanswered``; the harness retries those at the end.
Reads (``run.status``) choose what to control and are not evidence.

A client with agents keeps at most one ``crash-agent`` run going (one not yet ended, paused or
parked): the clients with agents bound the Pi processes the load starts. Agent runs are
paused, resumed and cancelled like the others, never restarted (a restart would start one more
beyond that bound).

With decisions (``--telegram``), a share of the starts is a ``crash-decision`` run: a protected
human decision for the audience ``operator`` (two choices, no input, no deadline), answered by the
harness's chat users through the fake Bot API (telegram.py), then a compute node. Decision runs
are paused, resumed, cancelled and restarted like the others; a client never answers them.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from piworkflows.client import ClientError, WorkflowClient
from stress.crash.evidence import EvidenceLog

WORKFLOW = "crash-mix"
AGENT_WORKFLOW = "crash-agent"
DECISION_WORKFLOW = "crash-decision"
AGENT_SHARE = 0.5  # of a client's run starts, when its agent run has ended
DECISION_SHARE = 0.2  # of a client's other run starts, with decisions
TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})
MANUAL_PATH, IDEMPOTENT_PATH = "/manual", "/idempotent"
SOURCE = """
from piworkflows.workflows import (checkpoint, compute, define_workflow, edge, http, idempotent_effect,
                                   include_workflow, manual_effect, notify, shell, switch)


def true_command(ctx):
    return {"command": "true", "args": [], "timeoutMs": 10_000}


def post(path):
    return lambda ctx: {"method": "POST", "url": ctx.input["ledger"] + path, "body": {"tag": ctx.input["tag"]}}


inner = define_workflow(
    name="crash-inner",
    start_at="double",
    nodes={"double": compute(run=lambda ctx: {"n": ctx.input["n"] * 2})},
    edges=[],
    exits={"done": {"from": "double"}},
)

workflow = define_workflow(
    name="crash-mix",
    start_at="count",
    nodes={
        "count": compute(run=lambda ctx: {"n": ctx.input["n"]}),
        "tell": notify(kind="progress", message=lambda ctx: f"crash-mix {ctx.input['tag']}"),
        "touch": shell(effect=idempotent_effect("crash.touch"), exec=true_command),
        "once": shell(effect=manual_effect("crash.once"), exec=true_command),
        "post": http(effect=idempotent_effect("crash.post"), request=post("/idempotent"), timeout_ms=3_000),
        "charge": http(effect=manual_effect("crash.charge"), request=post("/manual"), timeout_ms=3_000),
        "gate": compute(run=lambda ctx: {"ask": bool(ctx.input.get("ask"))}),
        "ask": checkpoint(summary="Continue? Answer {\\"go\\": true}."),
        "end": notify(kind="final", message="crash-mix done"),
    },
    includes={"inner": include_workflow(inner, input=lambda ctx: {"n": ctx.outputs["count"]["n"]})},
    edges=[
        edge("count", "tell"),
        edge("tell", "touch"),
        edge("touch", "once"),
        edge("once", "post"),
        edge("post", "charge"),
        edge("charge", "inner"),
        edge("inner.done", "gate"),
        switch("gate", on="$.ask", cases={"true": "ask", "false": "end"}),
        edge("ask", "end"),
    ],
    max_steps=30,
)
"""


# Two agent steps in the run's Pi session (stress/crash/agents.py scripts their model): a
# submission judged by schema and validate, then an assistant-message reply.
AGENT_SOURCE = """
from piworkflows.workflows import agent, assistant_message, compute, define_workflow, edge


def judge(output):
    return True if output["ok"] else "ok must be true: submit again with ok true"


workflow = define_workflow(
    name="crash-agent",
    start_at="plan",
    nodes={
        "plan": agent(
            prompt=lambda ctx: f"Plan the change {ctx.input['tag']}.",
            expected_output={"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}},
            validate=judge,
        ),
        "reply": agent(prompt="Say that you are done.", expected_output=assistant_message(max_chars=200),
                       model="scripted/reply"),
        "done": compute(run=lambda ctx: {"plan": ctx.outputs["plan"], "reply": ctx.outputs["reply"]}),
    },
    edges=[edge("plan", "reply"), edge("reply", "done")],
)
"""


# A protected decision for the audience the harness's channels.json routes to both chats: no
# input choice and no deadline, so that every press is one submission and only a press, a cancel or
# the operator resolves it.
DECISION_SOURCE = """
from piworkflows.workflows import choice, compute, define_workflow, edge, human_decision

workflow = define_workflow(
    name="crash-decision",
    start_at="decide",
    nodes={
        "decide": human_decision(
            audience="operator",
            choices={"ship": choice("Ship it"), "hold": choice("Hold")},
            request=lambda ctx: {"title": f"Release {ctx.input['tag']}?", "summary": "crash harness"},
        ),
        "done": compute(run=lambda ctx: {"choice": ctx.outputs["decide"]["choice"], "tag": ctx.input["tag"]}),
    },
    edges=[edge("decide", "done")],
)
"""


def write_project(project: Path) -> None:
    workflows = project / ".pi" / "workflows"
    workflows.mkdir(parents=True, exist_ok=True)
    (workflows / f"{WORKFLOW}.workflow.py").write_text(SOURCE, encoding="utf-8")
    (workflows / f"{AGENT_WORKFLOW}.workflow.py").write_text(AGENT_SOURCE, encoding="utf-8")
    (workflows / f"{DECISION_WORKFLOW}.workflow.py").write_text(DECISION_SOURCE, encoding="utf-8")


def agent_runs(sent: list[dict[str, Any]], acks: list[dict[str, Any]]) -> set[str]:
    """The runs the evidence shows started of the agent workflow."""
    keys = {
        (s["clientId"], s["key"])
        for s in sent
        if s["op"] == "run.start" and (s.get("payload") or {}).get("workflowName") == AGENT_WORKFLOW
    }
    return {a["runId"] for a in acks if (a["clientId"], a["key"]) in keys and a.get("runId")}


def ledger_script(seed: int, length: int = 20_000) -> dict[str, list[str]]:
    """What the ledger answers, per path, drawn from the seed: mostly 200, some 500s, slow
    answers, and rare hangs (longer than the nodes' 3 s timeout: no answer)."""
    rng = random.Random(f"{seed}:ledger")
    weights = {"200": 84, "500": 8, "delay:300": 6, "hang": 2}
    return {
        path: rng.choices(list(weights), list(weights.values()), k=length) for path in (IDEMPOTENT_PATH, MANUAL_PATH)
    }


class Client:
    def __init__(
        self,
        index: int,
        seed: int,
        state_dir: Path,
        project: Path,
        ledger_url: str,
        evidence: Path,
        retry_for: float,
        agents: bool = False,
        decisions: bool = False,
    ) -> None:
        self.rng = random.Random(f"{seed}:{index}")
        self.prefix = f"s{seed}-c{index}"
        self.client = WorkflowClient(state_dir, client_id=f"crash-{self.prefix}", retry_for=retry_for)
        self.project, self.ledger_url = project, ledger_url
        self.log = EvidenceLog(evidence / f"client-{index}.jsonl")
        self.sent = 0
        self.runs: list[str] = []  # started by this client (the ones its controls pick from)
        self.agents = agents  # this client keeps one agent run going
        self.agent_runs: set[str] = set()
        self.agent_run: str | None = None  # its latest
        self.decisions = decisions  # some of its starts are decision runs
        self.decision_runs: set[str] = set()  # never answered by a client (checkpoint.answer is refused there)

    def send(
        self,
        op: str,
        payload: Any = None,
        run_id: str | None = None,
        revision: int | None = None,
        key: str | None = None,
    ) -> Any:
        key = key or f"{self.prefix}-{self.sent}"
        self.sent += 1
        base = {"op": op, "key": key, "clientId": self.client.client_id, "runId": run_id}
        self.log.append({"t": "sent", **base, "payload": payload, "revision": revision})
        began = time.time()
        try:
            response = self.client.request(op, payload, run_id=run_id, expected_revision=revision, idempotency_key=key)
        except (ClientError, OSError, ConnectionError):
            self.log.append({"t": "unanswered", **base, "sentAt": began})
            return None
        receipt = response.receipt if isinstance(response.receipt, dict) else {}
        if op == "run.start":
            base["runId"] = receipt.get("runId")
        self.log.append({"t": "ack", **base, "outcome": response.outcome, "sentAt": began, "ackedAt": time.time()})
        return response

    def status(self, run_id: str) -> dict[str, Any] | None:
        try:
            response = self.client.request("run.status", run_id=run_id)
        except (ClientError, OSError, ConnectionError):
            return None
        return response.receipt if response.outcome == "accepted" else None

    def step(self) -> None:
        """One operation, drawn from this client's stream."""
        roll = self.rng.random()
        if roll < 0.5 or not self.runs:
            tag = f"{self.prefix}-{self.sent}"
            ask, agent = self.rng.random() < 0.3, self.rng.random() < AGENT_SHARE
            decision = False
            if agent and self.agents and self._agent_ended():
                payload = {"projectPath": str(self.project), "workflowName": AGENT_WORKFLOW, "input": {"tag": tag}}
            else:
                agent = False
                decision = self.decisions and self.rng.random() < DECISION_SHARE  # no draw without decisions
                if decision:
                    payload = {
                        "projectPath": str(self.project),
                        "workflowName": DECISION_WORKFLOW,
                        "input": {"tag": tag},
                    }
                else:
                    run_input = {"n": self.sent, "tag": tag, "ledger": self.ledger_url, "ask": ask}
                    payload = {"projectPath": str(self.project), "workflowName": WORKFLOW, "input": run_input}
            response = self.send("run.start", payload, key=tag)
            if response is not None and response.outcome in ("accepted", "adopted"):
                self.runs.append(response.receipt["runId"])
                if agent:
                    self.agent_run = response.receipt["runId"]
                    self.agent_runs.add(self.agent_run)
                if decision:
                    self.decision_runs.add(response.receipt["runId"])
            return
        run_id = self.rng.choice(self.runs[-50:])
        if roll < 0.7:
            answerable = run_id not in self.agent_runs and run_id not in self.decision_runs
            view = self.status(run_id) if answerable else None
            if view is not None and view["piworkflows"]["status"] == "waiting":
                self.send("checkpoint.answer", {"nodePath": "ask", "answer": {"go": True}}, run_id=run_id)
        elif roll < 0.8:
            self.send("run.pause", run_id=run_id)
        elif roll < 0.88:
            self.send("run.resume", run_id=run_id)
        elif roll < 0.93:
            self.send("run.cancel", run_id=run_id)
        else:
            view = self.status(run_id) if run_id not in self.agent_runs else None
            if view is not None and view["queue"]["finishedAt"] is not None:
                self.send("run.restart", {}, run_id=run_id, revision=view["runRevision"])

    def _agent_ended(self) -> bool:
        """This client's latest agent run no longer holds an agent: ended, paused or parked."""
        if self.agent_run is None:
            return True
        view = self.status(self.agent_run)
        if view is None:
            return False
        ours = view["piworkflows"]
        return ours["status"] in TERMINAL or view["state"]["paused"] or ours["parkReason"] is not None

    def close(self) -> None:
        self.client.close()
        self.log.close()


def client_main(
    index: int,
    seed: int,
    state_dir: str,
    project: str,
    ledger_url: str,
    evidence: str,
    retry_for: float,
    stop: Any,
    pace_ms: int,
    agents: bool,
    decisions: bool = False,
) -> None:
    """A client process: operations until ``stop`` is set, ``pace_ms`` apart."""
    client = Client(
        index, seed, Path(state_dir), Path(project), ledger_url, Path(evidence), retry_for, agents, decisions
    )
    try:
        while not stop.is_set():
            client.step()
            stop.wait(pace_ms / 1000)
    finally:
        client.close()

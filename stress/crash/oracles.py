"""The harness's oracles: each compares evidence with the database and names every breach.

Pure functions of the evidence (client logs, the ledger, the checks made after each
restart) and of the final ``snapshot.State``; each returns a list of findings (empty: held).
``judge`` groups them into the report's four classes: lost, duplicated, violations, stuck.
The agent runs' oracles are in ``agent_oracles.py``, the Telegram side's in ``telegram_oracles.py``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from stress.crash import agent_oracles, telegram_oracles
from stress.crash.snapshot import State

# Client operations whose answers the writer stores with the client's key (host_commands).
STORED_OPERATIONS = frozenset(
    {"run.start", "run.pause", "run.resume", "run.cancel", "run.restart", "checkpoint.answer"}
)
DONE = frozenset({"accepted", "adopted"})
TERMINAL = frozenset({"completed", "failed", "timed_out", "cancelled"})
# The park reasons a run may end a quiet period with (docs/workflows.md): each waits for a person.
DOCUMENTED_PARKS = frozenset({"paused", "effectAmbiguous", "runnerNoProgress", "workflowSourceChanged"})
_2XX = re.compile(r"2[0-9][0-9]\Z")


def answered_2xx(answer: str) -> bool:
    """A ledger answer that told the sender the request succeeded (``delay:MS`` answers 200)."""
    return bool(_2XX.match(answer)) or answer.startswith("delay:")


def acknowledged_missing(acks: list[dict[str, Any]], state: State) -> list[str]:
    """Every acknowledged command is in the database with its receipt (and a started run exists)."""
    found = []
    for ack in acks:
        if ack["op"] not in STORED_OPERATIONS or ack["outcome"] not in DONE:
            continue
        stored = state.receipts.get((ack["clientId"], ack["key"]))
        if stored is None or stored["outcome"] != "accepted":
            found.append(f"{ack['op']} {ack['key']} was acknowledged {ack['outcome']} but has no stored receipt")
        elif ack["op"] == "run.start":
            run_id = (stored["receipt"] or {}).get("runId")
            if run_id != ack.get("runId") or run_id not in state.runs:
                found.append(f"run.start {ack['key']} acknowledged run {ack.get('runId')}, the database has {run_id}")
    return found


def unanswered_commands(sent: list[dict[str, Any]], acks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sent records of the commands without a final answer (``unavailable`` is none), once each."""
    answered = {(a["clientId"], a["key"]) for a in acks if a["outcome"] != "unavailable"}
    return list({(s["clientId"], s["key"]): s for s in sent if (s["clientId"], s["key"]) not in answered}.values())


def unanswered(sent: list[dict[str, Any]], acks: list[dict[str, Any]]) -> list[str]:
    """Every command sent got a final answer: the harness retried each unanswered one with its
    key at the end, and an idempotent retry converges (adopted, or applied once)."""
    return [f"{s['op']} {s['key']} never got a final answer" for s in unanswered_commands(sent, acks)]


def applied_twice(state: State) -> list[str]:
    """A run.start was applied at most once, however often it was retried: one root run per key."""
    roots = Counter(run["tag"] for run in state.runs.values() if run["root"] and run["tag"] is not None)
    return [f"run.start {tag} made {n} runs" for tag, n in sorted(roots.items()) if n > 1]


def duplicated_manual(ledger: list[dict[str, Any]], state: State, manual_paths: frozenset[str]) -> list[str]:
    """No key of a manual effect reached the ledger more than once (the harness issues no
    operator retries)."""
    counts = Counter(r["idempotencyKey"] for r in ledger if r.get("idempotencyKey"))
    found = []
    for key, n in sorted(counts.items()):
        effect = state.effects.get(key)
        manual = (
            effect["policy"] == "manual"
            if effect
            else any(r["path"] in manual_paths for r in ledger if r.get("idempotencyKey") == key)
        )
        if manual and n > 1:
            found.append(f"manual effect {key} reached the ledger {n} times")
    return found


def unsettled_after_2xx(ledger: list[dict[str, Any]], state: State) -> list[str]:
    """Every effect the ledger answered with 2xx is applied or ambiguous, never pending."""
    keys = sorted({r["idempotencyKey"] for r in ledger if r.get("idempotencyKey") and answered_2xx(r["answer"])})
    found = []
    for key in keys:
        status = (state.effects.get(key) or {}).get("status")
        if status not in ("applied", "ambiguous"):
            found.append(f"effect {key} was answered 2xx by the ledger but is {status or 'missing'}")
    return found


def invariant_violations(checks: list[dict[str, Any]], state: State) -> list[str]:
    """The spec's invariants (fencing among them: no write accepted from a stale lease generation),
    integrity and foreign keys held after every restart and at the end."""
    found = []
    for check in [*checks, {"after": "the end", "integrity": state.integrity, "violations": state.violations}]:
        found += [f"after {check['after']}: integrity: {problem}" for problem in check["integrity"]]
        found += [
            f"after {check['after']}: {name}: {', '.join(ids)}" for name, ids in sorted(check["violations"].items())
        ]
    return found


def stuck_runs(state: State) -> list[str]:
    """After the quiet period every run is terminal, waiting for input, paused, or parked for a
    documented reason."""
    found = []
    for run_id, run in sorted(state.runs.items()):
        if run["status"] in TERMINAL or run["status"] == "waiting" or run["paused"]:
            continue
        if run["queue"] == "parked" and run["parkReason"] in DOCUMENTED_PARKS:
            continue
        found.append(f"{run_id} is {run['status']} (queue {run['queue']}, park {run['parkReason']})")
    return found


def judge(
    evidence: dict[str, Any],
    state: State,
    manual_paths: frozenset[str],
    agent_workflow: str | None = None,
    decision_workflow: str | None = None,
) -> dict[str, list[str]]:
    """The findings by class; the run passes only when every class is empty. ``agent_workflow``:
    the workflow of the agent runs (``agent_oracles``), if the load had any; ``decision_workflow``:
    the workflow of the decision runs answered through Telegram (``telegram_oracles``, judging
    ``evidence["telegram"]``), if the load had any."""
    acks, ledger = evidence["acks"], evidence["ledger"]
    found = {
        "lost": acknowledged_missing(acks, state) + unanswered(evidence["sent"], acks),
        "duplicated": duplicated_manual(ledger, state, manual_paths) + applied_twice(state),
        "violations": invariant_violations(evidence["checks"], state) + unsettled_after_2xx(ledger, state),
        "stuck": stuck_runs(state),
    }
    if agent_workflow is not None:
        for name, items in agent_oracles.judge(evidence, state, agent_workflow).items():
            found[name] += items
    if decision_workflow is not None:
        for name, items in telegram_oracles.judge(evidence["telegram"], state, decision_workflow).items():
            found[name] += items
    return found

"""``python -m stress.crash``: run the crash-recovery stress harness and report.

Exit code 0 only when nothing acknowledged was lost, no effect was duplicated, no invariant
was violated and no run is stuck (with --telegram, presses, Telegram messages, the channel's
cursor and the decision runs are judged in the same four classes); 1 otherwise (the state dir
is kept and the command that repeats the run is printed); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from piworkflows import faults
from stress.crash import agents
from stress.crash.harness import (
    AGENT_POINTS,
    AGENT_TARGETS,
    CRASH_POINTS,
    FAULT_KINDS,
    TARGETS,
    TELEGRAM_POINTS,
    TELEGRAM_TARGETS,
    Harness,
    Options,
)


def _names(known: frozenset[str] | tuple[str, ...], what: str):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        unknown = [name for name in names if name not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or '(none)'}; "
                f"use a comma-separated list of: {', '.join(sorted(known))}"
            )
        return names

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stress.crash", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long the load and the kills run")
    p.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one, printed)")
    p.add_argument("--clients", type=int, default=4, help="client processes")
    p.add_argument("--kill-every", type=int, default=1500, metavar="MS", help="mean time between two kills")
    p.add_argument(
        "--agents",
        type=int,
        default=2,
        metavar="N",
        help="clients that keep an agent run going (real Pi, scripted model); 0: no agent runs, no agent "
        "targets or fault points",
    )
    p.add_argument(
        "--telegram",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decision runs answered by simulated users through a fake Telegram Bot API on loopback, the "
        "adapter (channel) a kill target and its fault points armed (default: on); --no-telegram: none of it",
    )
    p.add_argument(
        "--targets",
        type=_names(TARGETS, "target"),
        default=None,
        help=f"{','.join(TARGETS)} (default: all that the load has)",
    )
    p.add_argument(
        "--faults",
        type=_names(faults.POINTS, "fault point"),
        default=None,
        help="fault points a restart may arm to crash at the Nth hit; default: every one the load reaches",
    )
    p.add_argument(
        "--fault-kinds",
        type=_names(FAULT_KINDS, "fault kind"),
        default=FAULT_KINDS,
        help="what an armed fault does: crash (a --faults point), enospc or eio (a disk write site "
        "fails for some hits); default: all",
    )
    p.add_argument("--state-dir", type=Path, default=None, help="default: a new temporary directory")
    p.add_argument(
        "--quiet-seconds",
        type=float,
        default=60.0,
        help="how long the kill-free settling period at the end waits without a run settling (it ends once "
        "no run moves on by itself and every agent run ended)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    return p


def human(report: dict[str, Any]) -> str:
    rows = [
        ("seed", report["seed"]),
        ("kills", ", ".join(f"{k} {v}" for k, v in report["kills"].items()) + f" (total {report['killsTotal']})"),
        (
            "faults armed",
            f"{report['faultsArmed']} (" + ", ".join(f"{k} {v}" for k, v in report["faultsByKind"].items()) + ")",
        ),
        (
            "server starts",
            f"{report['restarts']} (stopped by itself {report['serverExits']}, "
            f"verified after {report['verifiedStarts']})",
        ),
        ("commands", ", ".join(f"{k} {v}" for k, v in report["commands"].items())),
        ("runs", report["runs"]),
        ("effects", ", ".join(f"{k} {v}" for k, v in report["effects"].items())),
        ("violations", report["violations"]),
        ("stuck runs", report["stuck"]),
        ("agent runs", _agents(report["agents"])),
        ("telegram", _telegram(report.get("telegram"))),
        (
            "latency outside crash windows",
            f"p50 {report['latencyMs']['p50']} ms, p99 {report['latencyMs']['p99']} ms "
            f"({report['latencyMs']['count']} commands)",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    for name, items in report["findings"].items():
        lines += [f"{name}:"] + [f"  {item}" for item in items]
    lines.append("PASS" if report["ok"] else f"FAIL: state kept in {report['stateDir']}\nrepeat: {report['reproduce']}")
    return "\n".join(lines)


def _agents(counts: dict[str, Any] | None) -> str:
    if counts is None:
        return "none (--agents 0)"
    ended = ", ".join(f"{k} {v}" for k, v in counts["ended"].items())
    return (
        f"{counts['runs']} (ended: {ended}); requests accepted {counts['requestsAccepted']}, submissions "
        + ", ".join(f"{k} {v}" for k, v in counts["submissions"].items())
        + "; step messages "
        + ", ".join(f"{k} {v}" for k, v in counts["stepMessages"].items())
        + f"; {counts['sessionFiles']} session files, {counts['modelRequests']} model requests"
    )


def _telegram(counts: dict[str, Any] | None) -> str:
    if counts is None:
        return "none (--no-telegram)"
    ended = ", ".join(f"{k} {v}" for k, v in counts["ended"].items())
    return (
        f"{counts['decisionRuns']} decision runs (ended: {ended}); {counts['presses']} presses, submissions "
        + ", ".join(f"{k} {v}" for k, v in counts["submissions"].items())
        + f"; {counts['operatorAnswers']} answered by the operator; {counts['sendMessages']} sendMessage, "
        + "deliveries "
        + ", ".join(f"{k} {v}" for k, v in counts["deliveries"].items())
        + f"; {counts['ambiguousMessages']} ambiguous messages (never retried); cursor {counts['cursor']} "
        + f"(last update {counts['lastUpdate']})"
    )


def _used(path: Path) -> bool:
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seconds <= 0 or args.clients < 1 or args.kill_every < 50 or not 0 <= args.agents <= args.clients:
        parser().error("--seconds must be > 0, --clients >= 1, --kill-every >= 50 ms and --agents 0 to --clients")
    agent_only = set(AGENT_TARGETS) | set(AGENT_POINTS)
    telegram_only = set(TELEGRAM_TARGETS) | set(TELEGRAM_POINTS)
    left_out = (agent_only if not args.agents else set()) | (telegram_only if not args.telegram else set())
    targets = args.targets or tuple(t for t in TARGETS if t not in left_out)
    fault_points = args.faults or tuple(p for p in CRASH_POINTS if p not in left_out)
    if not args.agents and agent_only & {*targets, *fault_points}:
        parser().error(f"{', '.join(sorted(agent_only & {*targets, *fault_points}))} need agent runs: --agents > 0")
    if not args.telegram and telegram_only & {*targets, *fault_points}:
        parser().error(f"{', '.join(sorted(telegram_only & {*targets, *fault_points}))} need --telegram")
    if args.state_dir is not None and (
        _used(args.state_dir) or _used(args.state_dir.parent / f"{args.state_dir.name}.crash")
    ):
        parser().error(
            f"--state-dir {args.state_dir} is in use: name a new or empty directory (the oracles compare "
            "the whole database with this run's evidence)"
        )
    pi = agents.pi_command() if args.agents else None
    if args.agents and pi is None:
        parser().error(
            "agent runs need Pi: run 'pi-workflows setup pi' or set PI_WORKFLOWS_PI_COMMAND, or pass --agents 0"
        )
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    options = Options(
        seconds=args.seconds,
        seed=seed,
        clients=args.clients,
        kill_every_ms=args.kill_every,
        targets=targets,
        faults=fault_points,
        fault_kinds=args.fault_kinds,
        state_dir=args.state_dir,
        quiet_s=args.quiet_seconds,
        agents=args.agents,
        pi=pi,
        telegram=args.telegram,
    )
    report = Harness(options).run()
    print(json.dumps(report, sort_keys=True) if args.json else human(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

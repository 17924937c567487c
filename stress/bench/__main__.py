"""``python -m stress.bench NAME``: run one benchmark (or ``all``, one after another) and print one
JSON line per benchmark."""

from __future__ import annotations

import argparse
import json
import sys

from stress.bench import agents, cli, effects, idle, lists, logs, retention, runs, server, startup, views, wal, writer

BENCHMARKS = {
    "writer": writer,
    "server": server,
    "runs": runs,
    "effects": effects,
    "retention": retention,
    "startup": startup,
    "logs": logs,
    "agents": agents,
    "lists": lists,
    "views": views,
    "cli": cli,
    "wal": wal,
    "idle": idle,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stress.bench")
    sub = parser.add_subparsers(dest="name", required=True)
    for name, module in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    every = sub.add_parser("all", help="every benchmark with its defaults, one JSON line each")
    every.add_argument("--dir", help="where to create the temporary state dirs (a disk, not tmpfs)")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if args.name == "all" else [args.name]
    for name in names:
        own = args if args.name != "all" else _defaults(name, args.dir)
        print(json.dumps(BENCHMARKS[name].run(own), sort_keys=True), flush=True)
    return 0


def _defaults(name: str, directory: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    BENCHMARKS[name].add_arguments(parser)
    return parser.parse_args(["--dir", directory] if directory else [])


if __name__ == "__main__":
    sys.exit(main())

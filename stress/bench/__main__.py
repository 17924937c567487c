"""``python -m stress.bench NAME``: run one benchmark and print one JSON line."""

from __future__ import annotations

import argparse
import json
import sys

from stress.bench import effects, retention, runs, server, writer

BENCHMARKS = {"writer": writer, "server": server, "runs": runs, "effects": effects, "retention": retention}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stress.bench")
    sub = parser.add_subparsers(dest="name", required=True)
    for name, module in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    figures = BENCHMARKS[args.name].run(args)
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

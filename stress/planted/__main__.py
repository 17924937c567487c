"""``python -m stress.planted [NAME_OR_CHECK ...] [--suite] [--list]``: plant each known bug, run
the unit tests that must catch it, restore the file.

Exit code 0 when every planted bug was caught, 1 when one was missed or no longer applies (its
text changed: update ``mutants.py``), 2 for bad arguments or when the named tests fail unplanted.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from stress.planted.mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "piworkflows"


class Stale(Exception):
    """The mutant's text is not in the package exactly once."""


def locate(mutant: Mutant) -> Path:
    """The file that holds ``mutant.old`` exactly once: its ``path``, else the one package file."""
    path = ROOT / mutant.path
    if path.exists() and path.read_text(encoding="utf-8").count(mutant.old) == 1:
        return path
    counts = [(p, p.read_text(encoding="utf-8").count(mutant.old)) for p in sorted(PACKAGE.rglob("*.py"))]
    found = [(p, n) for p, n in counts if n]
    if len(found) != 1 or found[0][1] != 1:
        where = ", ".join(f"{p.relative_to(ROOT)} ({n}x)" for p, n in found) or "nowhere"
        raise Stale(f"{mutant.name}: its text is found {where}; update stress/planted/mutants.py")
    return found[0][0]


def where(mutant: Mutant) -> tuple[str, int, str]:
    """The file, line and enclosing definition (``Class.method``, a function, or a module-level
    name such as ``BLOCKERS``) of the mutant's text today."""
    path = locate(mutant)
    text = path.read_text(encoding="utf-8")
    line = text[: text.index(mutant.old)].count("\n") + 1
    names: list[str] = []
    body: list[ast.stmt] = ast.parse(text).body
    while body:
        node = next((n for n in body if n.lineno <= line <= (n.end_lineno or n.lineno)), None)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
            body = node.body
        else:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if not names and isinstance(target, ast.Name):
                names.append(target.id)
            body = []
    return str(path.relative_to(ROOT)), line, ".".join(names)


def markdown(mutants: list[Mutant]) -> str:
    """The table of docs/TESTING.md (no line numbers: they move with every edit)."""
    rows = ["| check | where | planted bug | fast unit test that fails |", "|---|---|---|---|"]
    for m in mutants:
        path, _, function = where(m)
        place = f"{path.removeprefix('piworkflows/')} `{function}`" if function else path.removeprefix("piworkflows/")
        tests = "<br>".join(f"`{t.removeprefix('tests/unit/')}`" for t in m.tests)
        rows.append(f"| {m.check} | {place} | `{m.name}`: {m.bug} | {tests} |")
    return "\n".join(rows)


@dataclass
class Verdict:
    mutant: Mutant
    status: str  # caught | missed | stale | error
    detail: str
    seconds: float


def pytest(targets: list[str]) -> tuple[int, str]:
    """Run pytest in a child (no bytecode written: a planted file must never leave a .pyc behind)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *targets]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def failed_tests(output: str) -> str:
    """The tests pytest names as failed, else its last line."""
    lines = [line.split(" - ")[0] for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    tail = output.strip().splitlines()
    return "; ".join(lines) or (tail[-1] if tail else "")


BACKUP_SUFFIX = ".planted-original"


def backup_of(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def restore_leftovers() -> list[Path]:
    """Put back every file a killed run left planted (its original waits beside it)."""
    restored = []
    for backup in sorted(PACKAGE.rglob("*" + BACKUP_SUFFIX)):
        path = backup.with_name(backup.name.removesuffix(BACKUP_SUFFIX))
        os.replace(backup, path)
        restored.append(path)
    return restored


def plant(mutant: Mutant, suite: bool) -> Verdict:
    started = time.monotonic()
    try:
        path = locate(mutant)
    except Stale as exc:
        return Verdict(mutant, "stale", str(exc), 0.0)
    original = path.read_bytes()
    stat = path.stat()
    backup = backup_of(path)
    backup.write_bytes(original)  # a run killed while planting is restored by the next one
    os.utime(backup, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    try:
        path.write_bytes(original.decode("utf-8").replace(mutant.old, mutant.new).encode("utf-8"))
        code, output = pytest(["tests/unit"] if suite else list(mutant.tests))
    finally:
        if backup.exists():  # (gone only if another run in this checkout restored it meanwhile)
            os.replace(backup, path)  # the original bytes and modification time: any .pyc of it stays valid
    seconds = time.monotonic() - started
    if code == 1:
        return Verdict(mutant, "caught", failed_tests(output), seconds)
    if code == 0:
        return Verdict(mutant, "missed", "every test passed", seconds)
    return Verdict(mutant, "error", f"pytest exit code {code}: {failed_tests(output)}", seconds)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stress.planted", description=__doc__.splitlines()[0])
    p.add_argument("select", nargs="*", help="mutant names or checks (default: all); a prefix works")
    p.add_argument("--suite", action="store_true", help="run all of tests/unit for each (slow) instead of its tests")
    p.add_argument("--list", action="store_true", help="print the mutants, where and their tests; plant nothing")
    p.add_argument("--markdown", action="store_true", help="print the table of docs/TESTING.md; plant nothing")
    return p


def selected(select: list[str]) -> list[Mutant]:
    if not select:
        return list(MUTANTS)
    return [m for m in MUTANTS if any(m.name.startswith(s) or m.check == s for s in select)]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for restored in restore_leftovers():
        print(f"restored {restored.relative_to(ROOT)}, left planted by a run that was killed", file=sys.stderr)
    mutants = selected(args.select)
    if not mutants:
        print(f"no mutant matches {' '.join(args.select)}", file=sys.stderr)
        return 2
    if args.list or args.markdown:
        try:
            if args.markdown:
                print(markdown(mutants))
            for m in mutants if args.list else []:
                file, line, function = where(m)
                print(f"{m.name}  [{m.check}]  {file}:{line} {function}\n    {m.bug}\n    {' '.join(m.tests)}")
        except Stale as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    if not args.suite:
        untested = [m.name for m in mutants if not m.tests]
        if untested:
            print(f"no tests named for: {', '.join(untested)}", file=sys.stderr)
            return 2
        code, output = pytest(sorted({t for m in mutants for t in m.tests}))
        if code != 0:
            print(f"the named tests fail with nothing planted:\n{output}", file=sys.stderr)
            return 2
    verdicts = []
    for mutant in mutants:
        verdict = plant(mutant, args.suite)
        verdicts.append(verdict)
        print(f"{verdict.status:6} {verdict.seconds:6.1f}s  {mutant.name}: {verdict.detail}", flush=True)
    bad = [v for v in verdicts if v.status != "caught"]
    print(f"{len(verdicts) - len(bad)} of {len(verdicts)} planted bugs caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

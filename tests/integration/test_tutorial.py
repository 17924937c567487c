"""docs/tutorial.md cannot rot: its workflow file and every shell block are run as written, on a real
server, with the exit codes the tutorial says (0 unless a line says "# exits N")."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_util import FAST_ENV

pytestmark = [pytest.mark.timeout(240), pytest.mark.integration]

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)
EXITS = re.compile(r"#\s*exits (\d+)")


def script(blocks: list[str]) -> str:
    """The tutorial's shell lines, each followed by a check of the exit code it promises."""
    lines = ["set -u"]
    for number, line in enumerate((line for block in blocks for line in block.splitlines()), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        expected = int(found[1]) if (found := EXITS.search(line)) else 0
        lines += [
            line,
            f'rc=$?; [ "$rc" -eq {expected} ] || {{ echo "tutorial command {number} exited $rc, '
            f'not {expected}: "{shlex.quote(line)} >&2; exit 90; }}',
        ]
    return "\n".join(lines) + "\n"


def test_the_tutorial_runs_as_written(tmp_path: Path, private_home: Path):
    blocks = BLOCK.findall(TUTORIAL.read_text())
    python = [code for kind, code in blocks if kind == "python"]
    bash = [code for kind, code in blocks if kind == "bash"]
    assert len(python) == 1 and len(bash) >= 5
    home, work = private_home, tmp_path / "work"
    work.mkdir()
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "pi-workflows").exists(), "the package's console script (pip install -e .)"
    env = {
        **os.environ,
        **FAST_ENV,
        "HOME": str(home),
        "PI_WORKFLOWS_STATE_DIR": str(tmp_path / "s"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    # The file the tutorial says to save, written once its first block made the project directory.
    first, rest = bash[0], bash[1:]
    save = f"mkdir -p .pi/workflows && cat > .pi/workflows/first.workflow.py <<'PYTHON'\n{python[0]}PYTHON\n"
    try:
        done = subprocess.run(
            ["bash", "-c", script([first]) + save + script(rest)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
    finally:
        subprocess.run(
            [str(bin_dir / "pi-workflows"), "server", "stop", "--timeout", "20", "--kill"],
            env=env,
            capture_output=True,
            timeout=60,
        )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "first" in out and "List the Python files" in out  # workflows
    assert "3 Python files found: report them?" in out  # the question, from run watch
    assert "answer" in out and " ask 'JSON'" in out  # the exact command to answer it
    for name in ("src/a.py", "src/b.py", "src/c.py"):
        assert name in out  # run logs
    assert "completed" in out

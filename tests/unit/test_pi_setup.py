"""``pi-workflows setup pi`` and how the server finds Pi (piworkflows/agents/pi.py), with stand-ins
for node and npm on PATH (the real install is npm's; these check what we decide around it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from piworkflows.agents import pi
from piworkflows.settings import Settings

pytestmark = pytest.mark.timeout(60)

# Stand-in npm: `npm ci --prefix DIR ...` lays out what npm would for the lockfile it finds there
# (the version it pins), and counts.
FAKE_NPM = """#!/bin/sh
echo "$@" >> "$NPM_CALLS"
if [ -n "$NPM_FAILS" ]; then echo "npm ERR! 404 Not Found - $NPM_FAILS" >&2; exit 1; fi
prefix="$3"
lock="$prefix/package-lock.json"
version=$(/bin/sed -n 's/.*"@mariozechner\\/pi-coding-agent": "\\(.*\\)".*/\\1/p' "$lock" | /usr/bin/head -1)
/bin/mkdir -p "$prefix/node_modules/.bin" "$prefix/node_modules/@mariozechner/pi-coding-agent"
printf '#!/bin/sh\\necho pi\\n' > "$prefix/node_modules/.bin/pi"
/bin/chmod +x "$prefix/node_modules/.bin/pi"
printf '{"version": "%s"}' "$version" > "$prefix/node_modules/@mariozechner/pi-coding-agent/package.json"
"""


def stand_ins(tmp_path: Path, node_version: str | None, npm: bool = True) -> dict[str, str]:
    """An environment whose PATH holds only the stand-ins (no real node or npm)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if node_version is not None:
        (bin_dir / "node").write_text(f"#!/bin/sh\necho {node_version}\n")
        (bin_dir / "node").chmod(0o755)
    if npm:
        (bin_dir / "npm").write_text(FAKE_NPM)
        (bin_dir / "npm").chmod(0o755)
    return {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "NPM_CALLS": str(tmp_path / "npm-calls"),
    }


def setup_pi(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "piworkflows.cli", "setup", "pi"],
        env={**env, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_setup_installs_the_pinned_pi_once_and_prints_its_command(tmp_path):
    env = stand_ins(tmp_path, "v20.20.2")
    first = setup_pi(env)
    assert first.returncode == 0, first.stderr
    command = tmp_path / "data" / "piworkflows" / "pi" / "node_modules" / ".bin" / "pi"
    assert first.stdout == f"{command}\n"
    (call,) = (tmp_path / "npm-calls").read_text().splitlines()
    prefix = tmp_path / "data" / "piworkflows" / "pi"
    assert call == f"ci --prefix {prefix} --no-audit --no-fund"  # the shipped lockfile's exact tree
    assert (prefix / "package-lock.json").read_bytes() == (pi.LOCKED / "package-lock.json").read_bytes()
    again = setup_pi(env)
    assert (again.returncode, again.stdout) == (0, first.stdout)
    assert len((tmp_path / "npm-calls").read_text().splitlines()) == 1  # already there: npm not run again


@pytest.mark.parametrize(
    "node_version, npm, found",
    [(None, True, ""), ("v18.19.0", True, " (found v18.19.0)"), ("v20.5.1", True, " (found v20.5.1)")],
)
def test_without_node_20_6_setup_exits_1_naming_the_fix(tmp_path, node_version, npm, found):
    done = setup_pi(stand_ins(tmp_path, node_version, npm))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"pi-workflows: {pi.NEEDS_NODE}{found}\n"
    assert not (tmp_path / "npm-calls").exists()


def test_without_npm_setup_exits_1_naming_the_fix(tmp_path):
    done = setup_pi(stand_ins(tmp_path, "v22.1.0", npm=False))
    assert (done.returncode, done.stderr) == (1, f"pi-workflows: {pi.NEEDS_NODE}\n")


def test_an_npm_failure_is_reported_with_its_last_lines(tmp_path):
    env = {**stand_ins(tmp_path, "v20.6.0"), "NPM_FAILS": "registry unreachable"}
    done = setup_pi(env)
    assert done.returncode == 1
    said = f"pi-workflows: npm ci could not install @mariozechner/pi-coding-agent@{pi.PI_VERSION}"
    assert done.stderr.startswith(said)
    assert "npm ERR! 404 Not Found - registry unreachable" in done.stderr


def test_the_server_finds_pi_by_the_setting_then_the_installed_copy_then_path(tmp_path, monkeypatch):
    directory = tmp_path / "pi"
    on_path = tmp_path / "bin"
    on_path.mkdir()
    monkeypatch.setenv("PATH", str(on_path))
    assert pi.find_pi(Settings(), directory) is None
    (on_path / "pi").write_text("#!/bin/sh\n")
    (on_path / "pi").chmod(0o755)
    assert pi.find_pi(Settings(), directory) == str(on_path / "pi")
    pi.installed_command(directory).parent.mkdir(parents=True)
    pi.installed_command(directory).write_text("#!/bin/sh\n")
    assert pi.find_pi(Settings(), directory) == str(pi.installed_command(directory))
    chosen = Settings.from_env({"PI_WORKFLOWS_PI_COMMAND": "/opt/pi/bin/pi"})
    assert pi.find_pi(chosen, directory) == "/opt/pi/bin/pi"


def test_the_install_dir_follows_xdg_data_home_else_home():
    assert pi.install_dir({"XDG_DATA_HOME": "/data", "HOME": "/home/u"}) == Path("/data/piworkflows/pi")
    assert pi.install_dir({"HOME": "/home/u"}) == Path("/home/u/.local/share/piworkflows/pi")

"""The Pi coding agent as a dependency: the pinned version, where ``setup pi`` installs it, and how
the server finds it.

::

    find_pi(settings)   PI_WORKFLOWS_PI_COMMAND ─ else the installed copy ─ else `pi` on PATH ─ else None
    install()           Node >= 20.6 and npm checked, then the shipped package.json and
                        package-lock.json (agents/pi/) copied to <data dir>/piworkflows/pi and
                        `npm ci --prefix` there: exactly the locked tree (nothing to do when
                        that version is there already)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piworkflows.settings import Settings  # only a type here: the CLI starts without pydantic


PI_PACKAGE = "@mariozechner/pi-coding-agent"
PI_VERSION = "0.73.1"
NODE_MINIMUM = (20, 6)
# package.json and package-lock.json of the install, shipped in the package: `npm ci` installs exactly
# the tree they pin (beside them: workflow.ts, the extension Pi loads for agent steps).
LOCKED = Path(__file__).with_name("pi")
NEEDS_NODE = (
    "Pi needs Node.js >= 20.6 with npm (https://nodejs.org); install it and run 'pi-workflows setup pi' again, "
    "or set PI_WORKFLOWS_PI_COMMAND to a pi you have"
)

NEEDS_PI = (
    "Pi (the coding agent that runs agent steps) was not found: run 'pi-workflows setup pi', "
    "or set PI_WORKFLOWS_PI_COMMAND to a pi you have; then resume the run"
)
# `pi-workflows doctor` asks the model this; the scripted model answers it without spending a step
# of its script (testing/scripted_model.py), so a probe never shifts an author's answers.
PROBE_PROMPT = "Reply with the single word OK. (pi-workflows doctor probe)"


class PiSetupError(Exception):
    """Pi cannot be installed here; the message says what to do."""


def install_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``${XDG_DATA_HOME:-~/.local/share}/piworkflows/pi``."""
    env = os.environ if environ is None else environ
    data = env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "share")
    return Path(data) / "piworkflows" / "pi"


def installed_command(directory: Path) -> Path:
    return directory / "node_modules" / ".bin" / "pi"


def installed_version(directory: Path) -> str | None:
    """The version of Pi installed in ``directory`` (None: none is)."""
    manifest = directory / "node_modules" / PI_PACKAGE / "package.json"
    try:
        version = json.loads(manifest.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) and installed_command(directory).exists() else None


def find_pi(settings: Settings, directory: Path | None = None) -> str | None:
    """The Pi command this server runs: the setting, else the installed copy, else ``pi`` on PATH."""
    if settings.pi_command:
        return settings.pi_command
    installed = installed_command(directory or install_dir())
    if installed.exists():
        return str(installed)
    return shutil.which("pi")


def check_node() -> None:
    """Node >= 20.6 and npm on PATH, else PiSetupError naming the fix."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        raise PiSetupError(NEEDS_NODE)
    try:
        said = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        said = ""
    found = re.match(r"v(\d+)\.(\d+)", said.strip())
    if found is None or (int(found[1]), int(found[2])) < NODE_MINIMUM:
        raise PiSetupError(f"{NEEDS_NODE} (found {said.strip() or 'no version'})")


def install(directory: Path, say: Callable[[str], None]) -> tuple[Path, bool]:
    """Install the pinned Pi into ``directory`` (``say`` tells what runs); its command and whether
    anything was installed."""
    if installed_version(directory) == PI_VERSION:
        return installed_command(directory), False
    check_node()
    directory.mkdir(parents=True, exist_ok=True)
    say(f"installing Pi {PI_VERSION} with npm into {directory} ...")
    npm = shutil.which("npm")
    assert npm is not None  # check_node found it
    for name in ("package.json", "package-lock.json"):  # the pinned tree: Pi and every dependency
        shutil.copyfile(LOCKED / name, directory / name)
    done = subprocess.run(
        [npm, "ci", "--prefix", str(directory), "--no-audit", "--no-fund"], capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise PiSetupError(f"npm ci could not install {PI_PACKAGE}@{PI_VERSION} (exit {done.returncode}):\n{tail}")
    if installed_version(directory) != PI_VERSION:
        raise PiSetupError(f"npm finished but {installed_command(directory)} is not Pi {PI_VERSION}")
    return installed_command(directory), True

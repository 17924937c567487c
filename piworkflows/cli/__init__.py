"""``pi-workflows``: the maintenance CLI. Thin wrappers over ``piworkflows.client``.

Exit codes: 0 success, 1 runtime error, 2 usage error (click prints the fix),
130 interrupted (Ctrl-C). Arguments and JSON are checked before anything
is sent; a payload the protocol's models refuse is a usage error too, found
once the server refused it (``validationFailed``, nothing written) or when
no server answers (``base.request``), so that a read command starts without
pydantic.
The CLI never executes workflow code and opens SQLite only read-only on
inactive files (``writer/offline.py``): to verify a backup (``state verify
BACKUP``) and, with the server stopped, to check the state ``state reset``
moves aside.

One module per command group adds its commands to the root group ``main``
(``cli/base.py``), loaded when one of its commands is first asked for (``COMMAND_MODULES``):
``server``, ``runs``, ``logs``, ``agent_steps`` (run transcript, submit), ``find``, ``state``,
``effects``, ``secrets``, ``protocol``, ``dev`` (an author's offline model), ``view`` (the
terminal viewer), ``completion`` (which then gives the parameters named run_id, workflow and
node of every loaded command their completion from the server). ``story`` (a run view as
lines for people), ``run_view`` (the parts of a view it renders, references read back) and
``watch`` (following a run) serve ``runs``.
"""

from piworkflows.cli.base import main

# Each top-level command, and the modules that add it and its subcommands (loaded on first use:
# base._Main). tests/unit/test_cli_help.py checks this against loading every module.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "answer": ("runs",),
    "channels": ("channels",),
    "completion": ("completion",),
    "decide": ("runs",),
    "dev": ("dev",),
    "doctor": ("doctor",),
    "effect": ("effects",),
    "effects": ("effects",),
    "protocol": ("protocol",),
    "run": ("runs", "logs", "agent_steps", "state"),
    "runs": ("find",),
    "secrets": ("secrets",),
    "server": ("server",),
    "setup": ("setup",),
    "state": ("state",),
    "submit": ("agent_steps",),
    "view": ("view",),
    "workflow": ("find",),
    "workflows": ("find",),
}
main.modules = COMMAND_MODULES

__all__ = ["COMMAND_MODULES", "main"]

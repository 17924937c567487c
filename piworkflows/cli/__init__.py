"""``pi-workflows``: the maintenance CLI. Thin wrappers over ``piworkflows.client``.

Exit codes: 0 success, 1 runtime error, 2 usage error (click prints the fix),
130 interrupted (Ctrl-C). Whatever the CLI can check itself (arguments, JSON,
the request against the protocol's models) is a usage error before anything
is sent.
The CLI never executes workflow code and opens SQLite only read-only on
inactive files (``writer/offline.py``): to verify a backup (``state verify
BACKUP``) and, with the server stopped, to check the state ``state reset``
moves aside.

One module per command group adds its commands to the root group ``main``
(``cli/base.py``): ``server``, ``runs``, ``logs``, ``agent_steps`` (run transcript, submit),
``find``, ``state``, ``effects``, ``secrets``, ``protocol``, ``view`` (the terminal viewer), ``completion``
(which then gives the parameters named run_id, workflow and node of every command their
completion from the server). ``story`` (a run view as lines for people), ``run_view`` (the parts
of a view it renders, references read back) and ``watch`` (following a run) serve ``runs``.
"""

from piworkflows.cli import (  # noqa: F401 (commands)
    agent_steps,
    channels,
    completion,
    doctor,
    effects,
    find,
    logs,
    protocol,
    runs,
    secrets,
    server,
    setup,
    state,
    view,
)
from piworkflows.cli.base import main

completion.attach(main)

__all__ = ["main"]

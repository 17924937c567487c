"""``python -m piworkflows.runner resolve|run``: the children that run workflow code."""

import sys

from piworkflows.runner import resolve, run

ROLES = {"resolve": resolve.main, "run": run.main}

if len(sys.argv) != 2 or sys.argv[1] not in ROLES:
    sys.exit("usage: python -m piworkflows.runner resolve|run")
sys.exit(ROLES[sys.argv[1]]())

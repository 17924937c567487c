"""``python -m piworkflows.runner resolve``: the resolver child (runners come next)."""

import sys

from piworkflows.runner.resolve import main

if sys.argv[1:] != ["resolve"]:
    sys.exit("usage: python -m piworkflows.runner resolve")
sys.exit(main())

"""``python -m piworkflows.outbox``: one outbox worker child (spawned by the supervisor)."""

import sys

from piworkflows.outbox.worker import main

sys.exit(main())

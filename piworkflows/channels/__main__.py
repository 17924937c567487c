"""``python -m piworkflows.channels``: one Telegram adapter child (spawned by the supervisor)."""

import sys

from piworkflows.channels.adapter import main

sys.exit(main())

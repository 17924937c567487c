"""``python -m piworkflows.agents``: one agent host child (spawned by the supervisor, in its own
process group, with Pi as its child)."""

import os

from piworkflows.agents.host import main

# Every frame and line is flushed when main returns: exit at once. The supervisor keeps stdin open
# until this process ended, so interpreter shutdown would wait a second for the reader thread's
# lock on stdin and then abort (SIGABRT): a second more per step, and neither the status nor the
# last stderr line would be this host's.
os._exit(main())

"""``python -m piworkflows.agents``: one agent host child (spawned by the supervisor, in its own
process group, with Pi as its child)."""

from piworkflows.agents.host import main

main()

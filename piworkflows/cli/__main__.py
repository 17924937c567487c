"""``python -m piworkflows.cli``: the ``pi-workflows`` command."""

from piworkflows.cli import main

main()

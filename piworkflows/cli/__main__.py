"""``python -m piworkflows.cli``: the ``pi-workflows`` command."""

from piworkflows.cli import main
from piworkflows.cli.completion import COMPLETE_VAR

main(prog_name="pi-workflows", complete_var=COMPLETE_VAR)

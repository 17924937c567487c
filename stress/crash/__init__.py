"""``python -m stress.crash``: the crash-recovery stress harness (see ``harness.py``)."""

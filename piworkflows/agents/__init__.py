"""Agent nodes on the Pi coding agent: finding and installing Pi (``pi.py``)."""

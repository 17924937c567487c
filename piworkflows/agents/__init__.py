"""Agent nodes on the Pi coding agent: finding and installing Pi (``pi.py``), the agent host child
that drives Pi in RPC mode (``host.py``, with ``rpc.py``, ``session.py`` and ``capture.py``), and
the ``workflow`` tool Pi loads (``pi/workflow.ts``)."""

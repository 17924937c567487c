"""The Telegram channel's adapter child (transport only): ``adapter`` is the child program; the
supervisor side (leases, effect claims, restarts) is ``piworkflows.supervisor.channels``, and the
writer owns what updates cause (``piworkflows.writer.commands.channels``).

::

    supervisor channel manager ── configure / ack / perform ──> adapter ── Bot API (HTTPS)
                               <── updates / performed / fault ──
"""

"""The outbox worker pool: external effects performed by supervised worker children.

::

    commit that reserved an effect ── (post-commit notice) ── pool wakes an idle slot
    slot ── effect.claim (writer: new claim generation + numbered attempt, before anything acts)
         ── perform ──> worker child ── spawned {pid} (host.json) ── settle ──> slot
         ── effect.settle (fenced by the claim; retry: pending again at a backoff time)
    worker died applying ── its command group killed ── effect.abandon (idempotent: pending
         at a backoff time; manual: ambiguous, the run parks effectAmbiguous)

``worker`` is the child program; ``retry`` the backoff; the supervisor side
(slots, claims, renewal, restarts) is ``piworkflows.supervisor.outbox``.
"""

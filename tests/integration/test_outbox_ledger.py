"""The outbox under random worker kills, checked against the outside world's ledger.

50 runs of ten ``http`` nodes (500 effects: idempotent and manual ones
alternating) post to a local ledger server that records every request before
it answers (after a short delay, so kills land while requests are in flight).
Meanwhile a killer sends SIGKILL to a random outbox worker again and again.
An operator (this test) reviews every effect that becomes ambiguous: confirm
when the ledger shows its key (it acted), retry when it does not (logged).

At the end: every effect is ``applied`` (none stuck ``pending``/``applying``
after recovery), every run completed, the ledger shows no manual key more
often than once plus the operator's retries of it, and every key the ledger
answered is an applied effect.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from stress.ledger import LedgerServer
from tests.engine_util import write
from tests.server_util import SCHEDULER_TICK, ServerProcess, check_state, query, wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.integration]

RUNS, NODES = 50, 10
POSTS = f"""
from piworkflows.workflows import define_workflow, edge, http, idempotent_effect, manual_effect
def post(i):
    return lambda ctx: {{"method": "POST", "url": ctx.input["url"], "body": {{"run": ctx.input["n"], "node": i}}}}
def effect(i):
    return idempotent_effect("ledger.idem", max_attempts=50) if i % 2 == 0 else manual_effect("ledger.manual")
workflow = define_workflow("posts", "h0", {{f"h{{i}}": http(effect=effect(i), request=post(i), timeout_ms=10_000)
                                            for i in range({NODES})}},
                           [edge(f"h{{i}}", f"h{{i + 1}}") for i in range({NODES} - 1)], max_steps=200)
"""


def test_500_effects_under_random_worker_kills_match_the_ledger(tmp_path: Path, project: Path):
    rng = random.Random(20261202)
    env = {**SCHEDULER_TICK, "PI_WORKFLOWS_MAX_RUNNERS": "8"}
    server = ServerProcess(tmp_path / "s", env=env).start()
    stop_killing = threading.Event()
    kills: list[int] = []

    def killer() -> None:
        while not stop_killing.wait(rng.uniform(0.15, 0.4)):
            workers = server.child_pids("outbox")
            if workers and len(kills) < 40:
                victim = rng.choice(workers)
                try:
                    os.kill(victim, signal.SIGKILL)
                    kills.append(victim)
                except ProcessLookupError:
                    pass

    operator_retries: Counter[str] = Counter()
    with LedgerServer(script={"/post": ["delay:30"]}) as ledger:
        try:
            write(project, "posts", POSTS)
            with server.client() as client:
                run_ids = []
                for n in range(RUNS):
                    started = client.request(
                        "run.start",
                        {
                            "projectPath": str(project),
                            "workflowName": "posts",
                            "input": {"url": ledger.url + "/post", "n": n},
                        },
                    )
                    assert started.outcome == "accepted", started
                    run_ids.append(started.receipt["runId"])
                thread = threading.Thread(target=killer, daemon=True)
                thread.start()

                def review() -> bool:
                    """The operator: each ambiguous effect confirmed (the ledger has its key) or retried."""
                    listed = client.request("effect.list", {"statuses": ["ambiguous"]})
                    assert listed.outcome == "accepted", listed
                    for item in listed.receipt["items"]:
                        (key,) = query(
                            server, "SELECT idempotency_key FROM effects WHERE effect_id = ?", item["effectId"]
                        )[0]
                        if ledger.count(key) > operator_retries[key]:
                            answer = client.request(
                                "effect.confirm", {"effectId": item["effectId"], "note": "the ledger has it"}
                            )
                        else:
                            operator_retries[key] += 1
                            answer = client.request("effect.retry", {"effectId": item["effectId"]})
                        assert answer.outcome == "accepted", answer
                    done = query(server, "SELECT count(*) FROM runs WHERE status = 'completed'")[0][0]
                    if len(kills) >= 40 or done >= RUNS * 0.8:
                        stop_killing.set()
                    return done == RUNS

                try:
                    wait_until(review, timeout=200, interval=0.2, what="every run completed")
                except AssertionError:
                    stuck = query(
                        server,
                        "SELECT r.run_id, r.status, r.park_reason, q.queue_status FROM runs r "
                        "JOIN run_queue q USING (run_id) WHERE r.status != 'completed'",
                    )
                    effects = query(
                        server,
                        "SELECT run_id, effect_status, recovery_policy, attempt_count "
                        "FROM effects WHERE effect_status != 'applied'",
                    )
                    raise AssertionError(
                        f"kills {len(kills)}; runs {stuck}; effects {effects}; log {server.output()[-3000:]}"
                    ) from None
        finally:
            stop_killing.set()
            assert server.stop() == 0, server.output()
        check_state(server.state_dir)

        assert len(kills) >= 5, kills  # the kills really happened
        effects = query(
            server,
            "SELECT idempotency_key, recovery_policy, effect_status FROM effects WHERE performer = 'http.request'",
        )
        assert len(effects) == RUNS * NODES
        assert {status for _, _, status in effects} == {"applied"}  # none stuck pending or applying
        counts = Counter(ledger.keys())
        policy = {key: p for key, p, _ in effects}
        assert set(counts) == set(policy)  # every effect reached the ledger, and nothing else did
        for key, seen in counts.items():
            if policy[key] == "manual":
                assert seen <= 1 + operator_retries[key], (key, seen, operator_retries[key])
        # Every attempt ended, and the effects' attempt counts are their numbered attempts.
        assert query(server, "SELECT count(*) FROM effect_attempts WHERE attempt_status = 'applying'") == [(0,)]
        assert query(
            server,
            "SELECT count(*) FROM effects e WHERE e.performer = 'http.request' AND e.attempt_count "
            "!= (SELECT count(*) FROM effect_attempts a WHERE a.effect_id = e.effect_id)",
        ) == [(0,)]

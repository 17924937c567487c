"""A worker killed at a named fault point: before it acted, and after the request was sent.

``PIW_FAULTS`` crashes the first worker (SIGKILL, like ``kill -9``) right after
it received an effect whose attempt is recorded (``outbox.after_attempt_recorded``:
nothing was sent) or right after the http request went out, before its answer
was read (``outbox.after_request_sent``). One worker, so the fault hits the
run's only effect; the restarted worker runs without the fault.
"""

from __future__ import annotations

import pytest

from tests.engine_util import effect_attempts, effect_row, http_workflow, parked_ambiguous, request, start, wait_status
from tests.server_util import stays

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

BEFORE_SENDING = {"PIW_FAULTS": "outbox.after_attempt_recorded=crash", "PI_WORKFLOWS_OUTBOX_WORKERS": "1"}
AFTER_SENDING = {"PIW_FAULTS": "outbox.after_request_sent=crash", "PI_WORKFLOWS_OUTBOX_WORKERS": "1"}


@pytest.mark.server_env(**BEFORE_SENDING)
def test_an_idempotent_effect_whose_worker_died_before_sending_gets_exactly_one_more_attempt(ledger, server, project):
    http_workflow(project, "idem")
    run_id = start(server, project, "idem", {"url": ledger.url + "/idem"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert effect_attempts(server, run_id) == [(1, "ambiguous"), (2, "applied")]
    assert ledger.keys() == [effect_row(server, run_id)["key"]]  # sent once: by attempt 2


@pytest.mark.server_env(**AFTER_SENDING)
def test_an_idempotent_effect_whose_worker_died_after_sending_is_sent_again_under_the_same_key(ledger, server, project):
    http_workflow(project, "idem")
    run_id = start(server, project, "idem", {"url": ledger.url + "/idem"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert effect_attempts(server, run_id) == [(1, "ambiguous"), (2, "applied")]
    key = effect_row(server, run_id)["key"]
    assert ledger.keys() == [key, key]  # the outside system dedups by the key


@pytest.mark.server_env(**BEFORE_SENDING)
def test_a_manual_effect_whose_worker_died_before_sending_is_ambiguous_and_an_operator_retry_sends_it(
    ledger, server, project
):
    http_workflow(project, "manual", effect='manual_effect("test.manual")')
    run_id = start(server, project, "manual", {"url": ledger.url + "/manual"})
    parked = parked_ambiguous(server, run_id)
    assert parked["display"]["controls"] == ["review"]
    effect = effect_row(server, run_id)
    assert effect["status"] == "ambiguous" and effect_attempts(server, run_id) == [(1, "ambiguous")]
    stays(lambda: ledger.keys() == [], 0.5, "nothing sent without an operator")

    retried = request(server, "effect.retry", {"effectId": effect["effectId"]}, idempotency_key="retry-1")
    again = request(server, "effect.retry", {"effectId": effect["effectId"]}, idempotency_key="retry-1")
    assert retried.outcome == "accepted" and again.outcome == "adopted", (retried, again)
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert effect_attempts(server, run_id) == [(1, "ambiguous"), (2, "applied")]
    assert ledger.keys() == [effect["key"]]


@pytest.mark.server_env(**AFTER_SENDING)
def test_a_manual_effect_whose_worker_died_after_sending_is_ambiguous_and_an_operator_confirms_it(
    ledger, server, project
):
    http_workflow(project, "manual", effect='manual_effect("test.manual")')
    run_id = start(server, project, "manual", {"url": ledger.url + "/manual"})
    parked_ambiguous(server, run_id)
    effect = effect_row(server, run_id)
    assert ledger.keys() == [effect["key"]]  # it reached the outside: the operator sees it there
    confirmed = request(
        server,
        "effect.confirm",
        {"effectId": effect["effectId"], "note": "in the ledger", "output": {"status": 200}},
        idempotency_key="confirm-1",
    )
    assert confirmed.outcome == "accepted", confirmed
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"call": {"status": 200}}
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]  # confirmed: no second attempt
    stays(lambda: len(ledger.keys()) == 1, 0.3, "one request only")

"""``http`` nodes end to end: the outbox pool sends the request, a local ledger answers as scripted.

Each run's ``http`` node reserves one effect; an outbox worker child claims it (a
numbered ``effect_attempts`` row) and sends the request with the effect's
idempotency key as ``Idempotency-Key``. The ledger (``stress.ledger``) records
every request before answering it, so a test sees what reached the outside
world; the SQLite rows (read-only) and the run view show what the server made
of it. Workers are killed with SIGKILL while a request hangs, runs are
cancelled mid-request, and ambiguous effects are settled through the client
and the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from piworkflows.writer.views.display import AMBIGUOUS
from stress.ledger import LedgerServer
from tests.engine_util import (
    effect_attempts,
    effect_content,
    effect_row,
    http_workflow,
    node_attempts,
    parked_ambiguous,
    request,
    run_phases,
    start,
    view,
    wait_status,
    write,
)
from tests.server_util import ServerProcess, query, stays, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]

# --- workflows -------------------------------------------------------------------

# A literal Authorization header in a request dict: refused when the workflow is compiled.
STATIC_AUTH = """
from piworkflows.workflows import define_workflow, http, idempotent_effect
workflow = define_workflow("staticauth", "fetch", {
    "fetch": http(effect=idempotent_effect("test.auth"),
                  request={"method": "GET", "url": "http://x", "headers": {"Authorization": "Bearer abc"}}),
})
"""

# The same header built by a lambda: only known at run time, when the node builds its request.
LAMBDA_AUTH = """
from piworkflows.workflows import define_workflow, http, idempotent_effect
workflow = define_workflow("lambdaauth", "fetch", {
    "fetch": http(effect=idempotent_effect("test.auth"),
                  request=lambda ctx: {"method": "GET", "url": ctx.input["url"],
                                       "headers": {"Authorization": "Bearer abc"}}),
})
"""


# --- helpers -----------------------------------------------------------------------


def attempt_rows(server: ServerProcess, run_id: str) -> list[dict[str, Any]]:
    """The run's outside effect's numbered attempts, with what each recorded."""
    rows = query(
        server,
        "SELECT a.attempt_number, a.attempt_status, a.error_code, a.retry_at, a.started_at, "
        "a.ended_at FROM effect_attempts a JOIN effects e USING (effect_id) "
        "WHERE e.run_id = ? AND e.effect_class = 'external' ORDER BY a.attempt_number",
        run_id,
    )
    keys = ("n", "status", "errorCode", "retryAt", "startedAt", "endedAt")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def effect_error(server: ServerProcess, run_id: str) -> str:
    return effect_content(server, run_id, "error")[1].decode()


def requests_to(ledger: LedgerServer, path: str) -> list[dict[str, Any]]:
    return [r for r in list(ledger.requests) if r["path"] == path]


def talking_to(pid: int, port: int) -> bool:
    """The process holds an open TCP connection to the ledger's port."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED for c in conns)


def port_of(ledger: LedgerServer) -> int:
    return int(ledger.url.rsplit(":", 1)[1])


def hanging_request(server: ServerProcess, ledger: LedgerServer, run_id: str, path: str) -> int:
    """Wait until the run's request hangs at the ledger under attempt 1; returns the worker sending it."""
    wait_until(lambda: len(requests_to(ledger, path)) == 1, what="the request at the ledger")
    wait_until(lambda: effect_attempts(server, run_id) == [(1, "applying")], what="effect attempt 1 applying")
    performers = wait_until(
        lambda: [p for p in server.child_pids("outbox") if talking_to(p, port_of(ledger))],
        what="the worker connected to the ledger",
    )
    assert len(performers) == 1, performers
    return performers[0]


# --- answers: 2xx, 5xx retried, 4xx, retries exhausted -------------------------------


@pytest.mark.server_env(PI_WORKFLOWS_EFFECT_RETRY_BASE_MS="300", PI_WORKFLOWS_EFFECT_RETRY_MAX_MS="2000")
def test_a_flaky_server_is_retried_under_the_same_key_until_it_answers(ledger, server, project):
    ledger.set_script("/flaky", ["500", "500", "200"])
    http_workflow(project, "flaky")
    run_id = start(server, project, "flaky", {"url": ledger.url + "/flaky"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")

    effect = effect_row(server, run_id)
    key = effect["key"]
    assert (effect["status"], effect["policy"], effect["attempts"], effect["errorCode"]) == (
        "applied",
        "idempotent",
        3,
        None,
    )
    call = done["state"]["finalOutput"]["call"]
    assert (call["status"], call["body"]) == (200, {"ok": True, "key": key, "n": 3})
    assert call["headers"]["content-type"] == "application/json"
    # Three requests reached the outside world, all under the effect's key, with the same body.
    sent = requests_to(ledger, "/flaky")
    assert [(r["method"], r["idempotencyKey"], json.loads(r["body"])) for r in sent] == [
        ("POST", key, {"order": 1})
    ] * 3
    assert ledger.count(key) == 3

    attempts = attempt_rows(server, run_id)
    assert [(a["n"], a["status"], a["errorCode"]) for a in attempts] == [
        (1, "failed", "httpServerError"),
        (2, "failed", "httpServerError"),
        (3, "applied", None),
    ]
    first, second, last = attempts
    assert first["endedAt"] <= first["retryAt"] < second["retryAt"]
    assert second["endedAt"] <= second["retryAt"]
    assert first["retryAt"] <= second["startedAt"] and second["retryAt"] <= last["startedAt"]  # none came early
    assert last["retryAt"] is None
    assert query(server, "SELECT available_at FROM effects WHERE effect_id = ?", effect["effectId"]) == [
        (second["retryAt"],)
    ]
    assert node_attempts(server, run_id, "call") == [(1, "completed")]  # the runner only waited


def test_a_4xx_answer_rejects_the_effect_and_fails_the_run(ledger, server, project):
    ledger.set_script("/missing", ["404"])
    http_workflow(project, "missing")
    run_id = start(server, project, "missing", {"url": ledger.url + "/missing"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "failed"
    assert done["piworkflows"]["errorCode"] == "httpClientError"
    assert "404" in done["state"].get("error")
    assert [(s["nodeId"], s["status"], s["errorCode"]) for s in done["state"]["steps"]] == [
        ("call", "failed", "httpClientError")
    ]
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"], effect["errorCode"]) == ("rejected", 1, "httpClientError")
    assert "404" in effect_error(server, run_id)
    assert [(a["n"], a["status"], a["errorCode"]) for a in attempt_rows(server, run_id)] == [
        (1, "rejected", "httpClientError")
    ]
    assert len(ledger.requests) == 1 and ledger.keys() == [effect["key"]]


def test_retries_exhausted_rejects_the_effect_after_max_attempts(ledger, server, project):
    ledger.set_script("/down", ["500"])
    http_workflow(project, "down", effect='idempotent_effect("test.http", max_attempts=2)')
    run_id = start(server, project, "down", {"url": ledger.url + "/down"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "failed"
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"], effect["errorCode"]) == ("rejected", 2, "retriesExhausted")
    assert [(a["n"], a["status"], a["errorCode"]) for a in attempt_rows(server, run_id)] == [
        (1, "failed", "httpServerError"),
        (2, "rejected", "httpServerError"),
    ]
    assert attempt_rows(server, run_id)[1]["retryAt"] is None  # no third attempt is planned
    assert ledger.keys() == [effect["key"]] * 2
    stays(lambda: len(ledger.requests) == 2, 0.5, "two requests")


# --- manual effects: never repeated without an operator --------------------------------------


def test_a_manual_effect_answered_5xx_is_rejected_without_a_retry(ledger, server, project):
    ledger.set_script("/once", ["500", "200"])
    http_workflow(project, "once", effect='manual_effect("test.http")')
    run_id = start(server, project, "once", {"url": ledger.url + "/once"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "failed"
    assert "500" in done["state"].get("error")
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["policy"], effect["attempts"], effect["errorCode"]) == (
        "rejected",
        "manual",
        1,
        "httpServerError",
    )
    assert effect_attempts(server, run_id) == [(1, "rejected")]
    stays(lambda: len(ledger.requests) == 1, 0.5, "one request")


def test_a_manual_request_without_an_answer_parks_the_run_until_confirmed(ledger, server, project):
    ledger.set_script("/slow", ["hang"])
    http_workflow(project, "slow", effect='manual_effect("test.http")', timeout_ms=500)
    run_id = start(server, project, "slow", {"url": ledger.url + "/slow"})
    parked = parked_ambiguous(server, run_id)
    assert parked["display"]["status"] == "ambiguous" and parked["display"]["reason"] == AMBIGUOUS
    assert parked["display"]["controls"] == ["review"]
    assert run_phases(server, run_id) == ("running", "effectAmbiguous", "parked")
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["policy"], effect["attempts"], effect["errorCode"]) == (
        "ambiguous",
        "manual",
        1,
        "noAnswer",
    )
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]
    assert ledger.keys() == [effect["key"]]

    listed = request(server, "effect.list", {}, run_id=run_id)
    assert listed.outcome == "accepted", listed
    [item] = listed.receipt["items"]
    assert (item["effectId"], item["effectType"], item["status"], item["runId"]) == (
        effect["effectId"],
        "test.http",
        "ambiguous",
        run_id,
    )
    assert (item["nodePath"], item["visit"], item["attempts"], item["maxAttempts"]) == ("call", 1, 1, 1)
    assert (item["nextAttemptAt"], item["errorCode"]) == (None, "noAnswer")

    evidence = {"status": 201, "body": {"seen": "in the partner's dashboard"}}
    payload = {"effectId": effect["effectId"], "note": "the partner saw it", "output": evidence}
    confirmed = request(server, "effect.confirm", payload, idempotency_key="confirm-1")
    assert confirmed.outcome == "accepted", confirmed
    assert confirmed.receipt == {"effectId": effect["effectId"], "effectStatus": "applied"}
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"call": evidence}  # the confirmed output is the node's output

    again = request(server, "effect.confirm", payload, idempotency_key="confirm-1")
    assert again.outcome == "adopted" and again.receipt == confirmed.receipt, again
    late = request(server, "effect.confirm", {"effectId": effect["effectId"]}, idempotency_key="confirm-2")
    assert late.outcome == "conflict" and late.receipt["code"] == "winnerDecided", late
    assert effect_row(server, run_id)["status"] == "applied"
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]  # the operator settled it, no new attempt
    assert len(ledger.requests) == 1


def test_an_operator_retry_of_an_ambiguous_request_sends_it_again_under_the_same_key(ledger, server, project):
    ledger.set_script("/slow", ["hang"])
    http_workflow(project, "slow", effect='manual_effect("test.http")', timeout_ms=500)
    run_id = start(server, project, "slow", {"url": ledger.url + "/slow"})
    parked_ambiguous(server, run_id)
    effect = effect_row(server, run_id)

    ledger.set_script("/slow", ["200"])
    retried = request(server, "effect.retry", {"effectId": effect["effectId"]}, idempotency_key="retry-1")
    assert retried.outcome == "accepted", retried
    assert retried.receipt == {"effectId": effect["effectId"], "effectStatus": "pending"}
    again = request(server, "effect.retry", {"effectId": effect["effectId"]}, idempotency_key="retry-1")
    assert again.outcome == "adopted" and again.receipt == retried.receipt

    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"]["finalOutput"]["call"]["status"] == 200
    assert done["state"]["finalOutput"]["call"]["body"] == {"ok": True, "key": effect["key"], "n": 2}
    assert ledger.keys() == [effect["key"]] * 2
    assert [(a["n"], a["status"]) for a in attempt_rows(server, run_id)] == [(1, "ambiguous"), (2, "applied")]
    assert effect_row(server, run_id)["status"] == "applied"

    repeat = request(server, "effect.retry", {"effectId": effect["effectId"]}, idempotency_key="retry-1")
    assert repeat.outcome == "adopted"
    stays(lambda: len(ledger.requests) == 2 and len(effect_attempts(server, run_id)) == 2, 0.5, "two attempts")


# --- the worker killed while its request hangs ------------------------------------------------


@pytest.mark.server_env(PI_WORKFLOWS_EFFECT_RETRY_BASE_MS="300", PI_WORKFLOWS_EFFECT_RETRY_MAX_MS="2000")
def test_kill_9_of_the_worker_retries_an_idempotent_request_under_the_same_key(ledger, server, project):
    ledger.set_script("/slow", ["hang", "200"])
    http_workflow(project, "slow", timeout_ms=30_000)
    run_id = start(server, project, "slow", {"url": ledger.url + "/slow"})
    worker = hanging_request(server, ledger, run_id, "/slow")

    os.kill(worker, signal.SIGKILL)
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    effect = effect_row(server, run_id)
    assert done["state"]["finalOutput"]["call"]["body"] == {"ok": True, "key": effect["key"], "n": 2}
    attempts = attempt_rows(server, run_id)
    assert [(a["n"], a["status"], a["errorCode"]) for a in attempts] == [
        (1, "ambiguous", "uncertainAttempt"),
        (2, "applied", None),
    ]
    assert attempts[0]["endedAt"] <= attempts[0]["retryAt"] <= attempts[1]["startedAt"]
    assert ledger.keys() == [effect["key"]] * 2
    assert (effect["status"], effect["attempts"]) == ("applied", 2)
    assert node_attempts(server, run_id, "call") == [(1, "completed")]
    assert worker not in server.child_pids("outbox")
    assert len(server.child_pids("outbox")) == 1  # the retry's worker: none replaced the dead one before


def test_kill_9_of_the_worker_parks_a_manual_request_as_ambiguous(ledger, server, project):
    ledger.set_script("/slow", ["hang", "200"])
    http_workflow(project, "slow", effect='manual_effect("test.http")', timeout_ms=30_000)
    run_id = start(server, project, "slow", {"url": ledger.url + "/slow"})
    worker = hanging_request(server, ledger, run_id, "/slow")

    os.kill(worker, signal.SIGKILL)
    parked = parked_ambiguous(server, run_id)
    assert parked["display"]["status"] == "ambiguous" and parked["display"]["controls"] == ["review"]
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["policy"], effect["attempts"]) == ("ambiguous", "manual", 1)
    assert [(a["n"], a["status"], a["errorCode"]) for a in attempt_rows(server, run_id)] == [
        (1, "ambiguous", "uncertainAttempt")
    ]

    def still_parked() -> bool:
        return len(ledger.requests) == 1 and run_phases(server, run_id) == ("running", "effectAmbiguous", "parked")

    stays(still_parked, 1.0, "the parked run with one request")  # no second request without an operator
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]


# The first outbox worker dies before it says it is ready (a later one starts normally).
DIES_BEFORE_READY = """
import os, sys
if "piworkflows.outbox" in sys.orig_argv and not os.path.exists({flag!r}):
    open({flag!r}, "w").close()
    os._exit(3)
"""


def test_a_worker_that_dies_before_it_is_ready_was_handed_nothing_and_the_next_one_sends_the_request(
    ledger, project, tmp_path
):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DIES_BEFORE_READY.format(flag=str(tmp_path / "died")))
    env = {"PYTHONPATH": str(site), "PI_WORKFLOWS_OUTBOX_WORKERS": "1"}
    server = ServerProcess(tmp_path / "s", env=env).start()
    try:
        http_workflow(project, "manual", effect='manual_effect("test.http")')
        run_id = start(server, project, "manual", {"url": ledger.url + "/manual"})
        done = wait_status(server, run_id, "completed", "failed", "ambiguous")
        assert done["display"]["status"] == "completed", done["state"].get("error")
        assert (tmp_path / "died").exists()
        # a worker starts before the claim: the one that died had been handed nothing
        assert [(a["n"], a["status"]) for a in attempt_rows(server, run_id)] == [(1, "applied")]
        assert len(ledger.requests) == 1
        assert "outbox worker 0 (pid " in server.server_log()  # how the first one ended
    finally:
        server.stop()


# --- secrets ----------------------------------------------------------------------------------


def test_a_secret_header_reaches_the_server_and_never_the_state(ledger, server, project, config_dir):
    secret = "s3cr3t-" + uuid.uuid4().hex
    credentials = config_dir / "credentials.json"
    credentials.write_text(json.dumps({"secrets": {"TOKEN": secret}}))
    credentials.chmod(0o600)
    http_workflow(project, "token", headers={"X-Token": {"secret": "TOKEN"}, "X-Plain": "visible"})
    run_id = start(server, project, "token", {"url": ledger.url + "/token"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    [sent] = ledger.requests
    assert sent["headers"]["x-token"] == secret and sent["headers"]["x-plain"] == "visible"
    assert sent["idempotencyKey"] == effect_row(server, run_id)["key"]

    needle = secret.encode()

    def leaked() -> list[str]:
        files = [p for p in server.state_dir.rglob("*") if p.is_file()]
        assert server.state_dir / "state.sqlite" in files and server.state_dir / "host" / "server.log" in files
        return [str(p) for p in [*files, server.log_path] if needle in p.read_bytes()]

    assert (server.state_dir / "state.sqlite-wal").exists()  # the run's rows may still be in the WAL only
    assert leaked() == []
    assert server.stop() == 0, server.output()
    assert leaked() == []
    assert needle not in json.dumps(done).encode()


def test_a_secret_a_remote_echoes_back_is_stored_nowhere(ledger, server, project, config_dir, tmp_path):
    """The remote reflects the Authorization header in its body and its answer headers, in a 2xx
    answer and in a 4xx one: the database, its WAL, a backup and the logs never hold its value."""
    secret = "Bearer s3cr3t-" + uuid.uuid4().hex
    credentials = config_dir / "credentials.json"
    credentials.write_text(json.dumps({"secrets": {"TOKEN": secret}}))
    credentials.chmod(0o600)
    http_workflow(project, "echoed", headers={"Authorization": {"secret": "TOKEN"}})
    ledger.set_script("/ok", ["echo:200"])
    ledger.set_script("/no", ["echo-text:400"])
    ok = start(server, project, "echoed", {"url": ledger.url + "/ok"})
    no = start(server, project, "echoed", {"url": ledger.url + "/no"})
    done = wait_status(server, ok, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    answer = done["state"]["finalOutput"]["call"]
    assert answer["headers"]["x-echo-authorization"] == "[secret:TOKEN]"
    assert answer["body"]["headers"]["authorization"] == "[secret:TOKEN]"
    failed = wait_status(server, no, "completed", "failed")
    assert failed["display"]["status"] == "failed"
    assert "authorization: [secret:TOKEN]" in effect_error(server, no)
    assert [r["headers"]["authorization"] for r in ledger.requests] == [secret, secret]  # sent, and reflected
    backup = tmp_path / "backups" / "state.sqlite"
    copied = server.cli("state", "backup", str(backup))
    assert copied.returncode == 0, copied.stderr

    needle = secret.encode()

    def leaked() -> list[str]:
        files = [p for p in server.state_dir.rglob("*") if p.is_file()]
        assert server.state_dir / "state.sqlite" in files and server.state_dir / "host" / "server.log" in files
        return [str(p) for p in [*files, backup, server.log_path] if needle in p.read_bytes()]

    assert (server.state_dir / "state.sqlite-wal").exists()  # the runs' rows may still be in the WAL only
    assert leaked() == []
    assert server.stop() == 0, server.output()
    assert leaked() == []
    assert needle not in json.dumps([done, failed]).encode()


# --- requests refused before anything is sent ------------------------------------------------


def test_a_literal_authorization_header_in_a_request_dict_refuses_the_start(server, project):
    write(project, "staticauth", STATIC_AUTH)
    response = request(server, "run.start", {"projectPath": str(project), "workflowName": "staticauth"})
    assert response.outcome == "rejected", response
    assert response.receipt["code"] == "invalidDefinition"
    assert "Authorization" in response.error and "fetch" in response.error
    assert query(server, "SELECT count(*) FROM runs") == [(0,)]
    assert query(server, "SELECT count(*) FROM effects") == [(0,)]


def test_a_literal_authorization_header_from_a_lambda_fails_the_node_before_anything_is_reserved(
    ledger, server, project
):
    write(project, "lambdaauth", LAMBDA_AUTH)
    run_id = start(server, project, "lambdaauth", {"url": ledger.url + "/auth"})
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "failed"
    assert "Authorization" in done["state"].get("error")
    assert query(server, "SELECT count(*) FROM effects WHERE run_id = ? AND effect_class = 'external'", run_id) == [
        (0,)
    ]
    assert ledger.requests == []


# --- cancel while a request hangs ------------------------------------------------------------


def cancel_hanging_request(server: ServerProcess, ledger: LedgerServer, project: Path) -> str:
    """A run whose request hangs at /slow (30 s timeout), cancelled: checked right after the answer."""
    ledger.set_script("/slow", ["hang"])
    ledger.set_script("/fast", ["200"])
    http_workflow(project, "slow", timeout_ms=30_000)
    run_id = start(server, project, "slow", {"url": ledger.url + "/slow"})
    hanging_request(server, ledger, run_id, "/slow")

    cancelled = request(server, "run.cancel", {}, run_id=run_id)
    assert cancelled.outcome == "accepted", cancelled
    assert (cancelled.receipt["runId"], cancelled.receipt["status"]) == (run_id, "cancelled")
    # One transaction: the run is cancelled and its applying effect ambiguous, both already.
    assert query(server, "SELECT status FROM runs WHERE run_id = ?", run_id) == [("cancelled",)]
    effect = effect_row(server, run_id)
    assert (effect["status"], effect["attempts"]) == ("ambiguous", 1)
    assert effect_attempts(server, run_id) == [(1, "ambiguous")]
    assert view(server, run_id)["display"]["status"] == "cancelled"
    return run_id


def finishes_soon(server: ServerProcess, run_id: str, seconds: float) -> dict[str, Any]:
    return wait_until(
        lambda: (v := view(server, run_id))["display"]["status"] in ("completed", "failed") and v,
        timeout=seconds,
        what=f"run {run_id} finished",
    )


def test_cancel_while_a_request_hangs_makes_its_effect_ambiguous(ledger, server, project):
    run_id = cancel_hanging_request(server, ledger, project)
    other = start(server, project, "slow", {"url": ledger.url + "/fast"})  # the pool goes on serving
    done = finishes_soon(server, other, 20)
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"]["finalOutput"]["call"]["status"] == 200
    assert len(requests_to(ledger, "/slow")) == 1 and len(requests_to(ledger, "/fast")) == 1
    stays(lambda: effect_row(server, run_id)["status"] == "ambiguous", 0.3, "the cancelled run's effect ambiguous")


@pytest.mark.server_env(PI_WORKFLOWS_OUTBOX_WORKERS="1")
def test_cancel_while_a_request_hangs_frees_the_only_worker(ledger, server, project):
    cancel_hanging_request(server, ledger, project)
    other = start(server, project, "slow", {"url": ledger.url + "/fast"})
    done = finishes_soon(server, other, 8)  # well before the hanging request's 30 s timeout
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert len(requests_to(ledger, "/fast")) == 1


# --- the CLI ------------------------------------------------------------------------------------


def ambiguous_manual_request(server: ServerProcess, ledger: LedgerServer, project: Path) -> tuple[str, str]:
    """A manual request that got no answer within 500 ms: (run id, effect id), the run parked."""
    ledger.set_script("/slow", ["hang"])
    http_workflow(project, "slow", effect='manual_effect("test.http")', timeout_ms=500)
    run_id = start(server, project, "slow", {"url": ledger.url + "/slow"})
    parked_ambiguous(server, run_id)
    return run_id, effect_row(server, run_id)["effectId"]


CONFIRM_NOTE = ["--note", "seen in the partner's log", "--output", '{"ok": true}']


def test_the_cli_lists_and_confirms_an_ambiguous_request(ledger, server, project):
    run_id, effect_id = ambiguous_manual_request(server, ledger, project)

    listed = server.cli("effects", "--json")
    assert listed.returncode == 0, listed.stderr
    items = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(items) == 1, listed.stdout
    [item] = items
    assert (item["effectId"], item["effectType"], item["status"], item["runId"], item["attempts"]) == (
        effect_id,
        "test.http",
        "ambiguous",
        run_id,
        1,
    )
    by_run = server.cli("effects", "--json", "--all", "--run", run_id)
    assert by_run.returncode == 0, by_run.stderr
    assert [json.loads(line)["effectId"] for line in by_run.stdout.splitlines()] == [effect_id]
    table = server.cli("effects")
    assert table.returncode == 0 and effect_id in table.stdout and "ambiguous" in table.stdout

    confirmed = server.cli("effect", "confirm", effect_id, *CONFIRM_NOTE)
    assert confirmed.returncode == 0, confirmed.stderr
    assert "confirmed applied" in confirmed.stdout and "already" not in confirmed.stdout
    done = wait_status(server, run_id, "completed", "failed")
    assert done["display"]["status"] == "completed", done["state"].get("error")
    assert done["state"].get("finalOutput") == {"call": {"ok": True}}
    assert server.cli("effects", "--json").stdout == ""  # nothing left to review

    usage = server.cli("effect", "confirm")
    assert usage.returncode == 2, usage
    assert "EFFECT_ID" in usage.stderr
    assert len(ledger.requests) == 1


def test_a_repeated_cli_confirm_is_harmless(ledger, server, project):
    run_id, effect_id = ambiguous_manual_request(server, ledger, project)
    confirmed = server.cli("effect", "confirm", effect_id, *CONFIRM_NOTE)
    assert confirmed.returncode == 0, confirmed.stderr
    assert wait_status(server, run_id, "completed", "failed")["display"]["status"] == "completed"
    again = server.cli("effect", "confirm", effect_id, *CONFIRM_NOTE)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"{effect_id} was already confirmed applied"
    other = server.cli("effect", "confirm", effect_id, "--note", "another look at the log")
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == f"{effect_id} is already applied"

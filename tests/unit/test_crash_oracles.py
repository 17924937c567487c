"""The harness's oracles can fail: each is fed doctored evidence (or a doctored database) for its
class of bug, reports it, and the harness exits non-zero. Consistent evidence passes."""

from __future__ import annotations

from pathlib import Path

import pytest

import piworkflows
from piworkflows import faults
from stress.crash import __main__ as crash_main
from stress.crash import oracles, snapshot
from stress.crash.harness import AGENT_POINTS, CRASH_POINTS, TELEGRAM_POINTS, Harness, Options
from tests.support import client_receipt, effect_request, reserve, run_create, run_group, take_epoch

pytestmark = pytest.mark.timeout(60)
CLIENT = "crash-s1-c0"
MANUAL = frozenset({"/manual"})


@pytest.fixture
def database(executor, paths):
    """One finished run started with key k1 (its receipt stored), as the harness would leave it."""
    receipt = client_receipt("k1", "start k1", client_id=CLIENT, operation="run.start")
    run_group(executor, take_epoch(), run_create("run-1", input_value={"tag": "k1"}, receipt=receipt))
    executor.conn.execute("UPDATE runs SET status = 'completed', finished_at = 1 WHERE run_id = 'run-1'")
    executor.conn.execute("UPDATE run_queue SET queue_status = 'done' WHERE run_id = 'run-1'")
    return executor.conn


def evidence(**doctored):
    sent = {"t": "sent", "op": "run.start", "key": "k1", "clientId": CLIENT, "runId": None}
    ack = {**sent, "t": "ack", "outcome": "accepted", "runId": "run-1", "sentAt": 1.0, "ackedAt": 1.01}
    return {"sent": [sent], "acks": [ack], "ledger": [], "checks": [], **doctored}


def judge(paths, found):
    return oracles.judge(found, snapshot.read(paths.database, 10), MANUAL)


def test_consistent_evidence_passes(database, paths):
    assert judge(paths, evidence()) == {"lost": [], "duplicated": [], "violations": [], "stuck": []}


def test_an_acknowledged_command_missing_from_the_database_is_lost(database, paths):
    found = evidence()
    found["acks"].append({**found["acks"][0], "key": "k2", "runId": "run-2"})  # acknowledged, never stored
    assert judge(paths, found)["lost"] == ["run.start k2 was acknowledged accepted but has no stored receipt"]


def test_a_command_never_answered_is_lost(database, paths):
    found = evidence()
    found["sent"].append({**found["sent"][0], "key": "k3"})
    assert judge(paths, found)["lost"] == ["run.start k3 never got a final answer"]


def test_a_manual_effect_key_twice_in_the_ledger_is_duplicated(database, paths):
    request = {"idempotencyKey": "e1", "path": "/manual", "answer": "200"}
    found = judge(paths, evidence(ledger=[request, {**request, "answer": "500"}]))
    assert found["duplicated"] == ["manual effect e1 reached the ledger 2 times"]
    idempotent = {**request, "path": "/idempotent"}  # an idempotent key may come again
    assert judge(paths, evidence(ledger=[idempotent, idempotent]))["duplicated"] == []


def test_a_start_applied_twice_is_duplicated(executor, database, paths):
    run_group(executor, run_create("run-again", input_value={"tag": "k1"}))
    assert "run.start k1 made 2 runs" in judge(paths, evidence())["duplicated"]


def test_an_effect_answered_2xx_but_left_pending_is_a_violation(executor, database, paths):
    revision = database.execute("SELECT revision FROM resources WHERE resource_id = 'run-1'").fetchone()[0]
    run_group(executor, reserve(revision, effect_request("e1"), source="run-1"))
    ledger = [{"idempotencyKey": "e1", "path": "/idempotent", "answer": "delay:300"}]
    assert judge(paths, evidence(ledger=ledger))["violations"] == [
        "effect e1 was answered 2xx by the ledger but is pending"
    ]


def test_a_planted_invariant_violation_is_reported(database, paths):
    database.execute("UPDATE run_queue SET queue_status = 'queued' WHERE run_id = 'run-1'")
    assert judge(paths, evidence())["violations"] == ["after the end: terminalQueueMismatch: run-1"]


def test_a_violation_seen_after_a_restart_is_reported(database, paths):
    check = {"after": "start 3", "integrity": [], "violations": {"settledQueueOfLiveRun": ["run-9"]}}
    assert judge(paths, evidence(checks=[check]))["violations"] == ["after start 3: settledQueueOfLiveRun: run-9"]


def test_a_write_accepted_from_a_stale_generation_is_reported(database, paths):
    database.execute(
        "INSERT INTO events (resource_id, resource_revision, event_type, actor_class, lease_generation, committed_at) "
        "VALUES ('run-1', 10, 'node.started', 'runner', 5, 2), ('run-1', 11, 'node.finished', 'runner', 4, 3)"
    )
    assert judge(paths, evidence())["violations"] == ["after the end: staleGenerationWrite: run-1"]


def test_a_run_left_stuck_is_reported(database, paths):
    database.execute("UPDATE runs SET status = 'queued', finished_at = NULL WHERE run_id = 'run-1'")
    database.execute("UPDATE run_queue SET queue_status = 'queued' WHERE run_id = 'run-1'")
    assert judge(paths, evidence())["stuck"] == ["run-1 is queued (queue queued, park None)"]
    database.execute("UPDATE run_queue SET queue_status = 'parked' WHERE run_id = 'run-1'")
    database.execute("UPDATE runs SET park_reason = 'effectAmbiguous' WHERE run_id = 'run-1'")
    assert judge(paths, evidence())["stuck"] == []  # parked for a documented reason: waits for an operator


@pytest.mark.parametrize("bug", ["lost", "duplicated", "violations", "stuck"])
def test_any_finding_fails_the_run_with_the_command_that_repeats_it(
    database, paths, tmp_path, monkeypatch, capsys, bug
):
    options = Options(seconds=1, seed=5, state_dir=paths.state_dir)
    findings = {"lost": [], "duplicated": [], "violations": [], "stuck": [], bug: ["planted"]}
    report = Harness(options)._report(evidence(), snapshot.read(paths.database, 10), findings)

    class Doctored:
        def __init__(self, given: Options) -> None:
            pass

        def run(self) -> dict:
            return report

    monkeypatch.setattr(crash_main, "Harness", Doctored)
    assert crash_main.main(["--seconds", "1", "--seed", "5", "--agents", "0"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "--seed 5" in out and str(paths.state_dir) in out and "planted" in out


def test_bad_arguments_exit_2_naming_the_fix(capsys):
    with pytest.raises(SystemExit) as exit_info:
        crash_main.main(["--targets", "writer,printer"])
    assert exit_info.value.code == 2
    assert "unknown target printer" in capsys.readouterr().err


def test_agent_targets_and_points_need_agent_runs_and_agent_runs_need_pi(capsys, monkeypatch):
    for argv, said in (
        (["--agents", "0", "--targets", "writer,pi"], "pi need agent runs"),
        (["--agents", "0", "--faults", "agent.after_prompt"], "agent.after_prompt need agent runs"),
        (["--agents", "5", "--clients", "4"], "--agents 0 to --clients"),
        (["--agents", "0", "--no-telegram", "--targets", "writer,channel"], "channel need --telegram"),
        (["--agents", "0", "--no-telegram", "--faults", "channel.after_request_sent"], "need --telegram"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            crash_main.main(argv)
        assert exit_info.value.code == 2 and said in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")  # no pi anywhere (HOME is private: no installed copy)
    monkeypatch.delenv("PI_WORKFLOWS_PI_COMMAND", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        crash_main.main(["--seconds", "1"])
    assert exit_info.value.code == 2 and "agent runs need Pi" in capsys.readouterr().err


def test_the_default_fault_points_are_the_ones_the_load_reaches(monkeypatch):
    """Every point but the backup's (the harness makes none) has its hit in the code; without agent
    runs, the agent host's and the workflow tool's points and the agent targets are left out;
    without Telegram (--no-telegram), the adapter's points and the channel target."""
    assert set(faults.POINTS) - set(CRASH_POINTS) == {faults.WRITER_BACKUP_STEP}
    code = "".join(path.read_text() for path in Path(piworkflows.__file__).parent.rglob("*.py"))
    tool = (Path(piworkflows.__file__).parent / "agents" / "pi" / "workflow.ts").read_text()
    names = {value: name for name, value in vars(faults).items() if isinstance(value, str) and value in faults.POINTS}
    for point in CRASH_POINTS:
        assert f"faults.hit(faults.{names[point]})" in code or f'"{point}"' in tool, point
    agent_only = {p for p in CRASH_POINTS if p.startswith(("agent.", "tool."))}
    agent_only |= {faults.SUPERVISOR_AFTER_SUBMISSION_RECORDED, faults.VALIDATOR_BEFORE_VERDICT}
    assert set(AGENT_POINTS) == agent_only and len(AGENT_POINTS) == 11
    assert set(TELEGRAM_POINTS) == {p for p in CRASH_POINTS if p.startswith("channel.")} and len(TELEGRAM_POINTS) == 4
    given = []

    class Capture:
        def __init__(self, options: Options) -> None:
            given.append(options)

        def run(self) -> dict:
            raise SystemExit(0)

    monkeypatch.setattr(crash_main, "Harness", Capture)
    for argv in (["--agents", "0"], ["--agents", "0", "--no-telegram"]):
        with pytest.raises(SystemExit):
            crash_main.main(argv)
    assert set(given[0].faults) == set(CRASH_POINTS) - set(AGENT_POINTS) and given[0].telegram
    assert given[0].targets == ("supervisor", "writer", "outbox", "runner", "group", "channel")
    assert given[0].pi is None
    assert set(given[1].faults) == set(CRASH_POINTS) - set(AGENT_POINTS) - set(TELEGRAM_POINTS)
    assert given[1].targets == ("supervisor", "writer", "outbox", "runner", "group") and not given[1].telegram
    assert "--no-telegram" in given[1].command() and "--telegram" in given[0].command().split()


def test_a_state_dir_in_use_is_refused(tmp_path, capsys):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "state.sqlite").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        crash_main.main(["--state-dir", str(tmp_path / "used")])
    assert exit_info.value.code == 2 and "name a new or empty directory" in capsys.readouterr().err

"""The command executor's pure parts (agents/command_output.py): the output a finished command
gives, the entries captured of its run, the server's verdict; the step message it reads
(protocol/step_contract.py) and the samples of its turn (agents/capture.py)."""

from __future__ import annotations

import json
import re
import signal

import pytest

from piworkflows.agents.capture import ENTRY_BYTES_PER_RECORD, next_sample_ns
from piworkflows.agents.command_output import (
    MAX_OUTPUT_BYTES,
    Finished,
    Output,
    entry_id,
    entry_of,
    exit_problem,
    output_of,
    submission_key,
    verdict_of,
)
from piworkflows.protocol import client_v1, step_contract
from piworkflows.protocol.internal.agents import PI_ENTRY_ID, AgentContract, Executor, ExpectedOutput, request_id_of

pytestmark = pytest.mark.timeout(30)

SCHEMA = ExpectedOutput(kind="schema", json_schema={"type": "object"})
DESCRIPTION = ExpectedOutput(kind="description", description="a summary")
REPLY = ExpectedOutput(kind="assistant-message", max_chars=100)


def ok(stdout: bytes) -> Finished:
    return Finished(0, stdout)


@pytest.mark.parametrize(
    ("expected", "stdout", "output"),
    [
        pytest.param(SCHEMA, b'{"steps": 3}\n', Output(value={"steps": 3}), id="json"),
        pytest.param(SCHEMA, b'  [1, "two"]  ', Output(value=[1, "two"]), id="json-with-blanks"),
        pytest.param(DESCRIPTION, b"changed 3 files\n\n", Output(value="changed 3 files"), id="text"),
        pytest.param(DESCRIPTION, b'{"a": 1}\n', Output(value='{"a": 1}'), id="text-is-never-parsed"),
        pytest.param(REPLY, b"Fixed it.\r\n", Output(reply="Fixed it."), id="reply"),
    ],
)
def test_stdout_is_json_with_a_schema_and_text_otherwise(expected, stdout, output):
    assert output_of(expected, ok(stdout)) == output


@pytest.mark.parametrize(
    ("expected", "finished", "problem"),
    [
        pytest.param(SCHEMA, Finished(3, b"{}", last_stderr="boom"), "the command exited with status 3: boom", id="3"),
        pytest.param(SCHEMA, Finished(-signal.SIGKILL, b""), "the command was killed by SIGKILL", id="signal"),
        pytest.param(
            SCHEMA,
            ok(b"Sure! Here it is."),
            "the command's stdout is not a JSON value a run can keep ($: not JSON: Expecting value",
            id="prose",
        ),
        pytest.param(
            SCHEMA,
            ok(b'{"a": 1, "a": 2}'),
            "the command's stdout is not a JSON value a run can keep ($: duplicate",
            id="dup-key",
        ),
        pytest.param(
            SCHEMA, ok(b"[1e999]"), "the command's stdout is not a JSON value a run can keep ($: number", id="overflow"
        ),
        pytest.param(SCHEMA, ok(b"[" * 600 + b"]" * 600), "nests deeper than 256 levels", id="deep"),
        pytest.param(SCHEMA, ok(b'{"a": "\\ud800"}'), "$.a: a string holds the lone surrogate U+D800", id="surrogate"),
        pytest.param(DESCRIPTION, ok(b" \n\t\n"), "the command printed nothing on stdout", id="blank"),
        pytest.param(REPLY, ok(b"\xff\xfe"), "the command's stdout is not UTF-8 text", id="not-utf8"),
        pytest.param(
            DESCRIPTION,
            Finished(0, b"x", overflowed=True),
            f"printed more than {MAX_OUTPUT_BYTES // 1024} KiB on stdout",
            id="too-much",
        ),
    ],
)
def test_a_command_that_gives_no_usable_stdout_names_why(expected, finished, problem):
    output = output_of(expected, finished)
    assert output.value is None and output.reply is None and output.problem is not None
    assert problem in output.problem, output.problem


def test_an_exit_is_named_by_its_status_or_its_signal():
    assert exit_problem(0, "warning: ignored") is None
    assert exit_problem(1) == "the command exited with status 1"
    assert exit_problem(-signal.SIGTERM, "Terminated") == "the command was killed by SIGTERM: Terminated"
    assert exit_problem(-200) == "the command was killed by signal 200"


def test_entry_ids_are_pi_shaped_per_segment_and_role():
    ids = {entry_id(segment, role) for segment in ("segment-1", "segment-2") for role in ("prompt", "output")}
    assert len(ids) == 4 and all(re.fullmatch(PI_ENTRY_ID, i) for i in ids)
    assert entry_id("segment-1", "prompt") == entry_id("segment-1", "prompt")
    assert submission_key("segment-1") == "command-segment-1"


def test_an_entry_is_a_pi_message_line_and_a_huge_text_is_cut_to_fit_one_record():
    entry = entry_of("0a1b2c3d", "ffffffff", "assistant", "done\n", 1_700_000_000_123, stopReason="stop", exitCode=0)
    line = json.loads(entry.content.data)
    assert (entry.pi_entry_id, entry.entry_role) == ("0a1b2c3d", "assistant")
    assert line == {
        "type": "message",
        "id": "0a1b2c3d",
        "parentId": "ffffffff",
        "timestamp": "2023-11-14T22:13:20.123Z",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": "done\n"}],
            "stopReason": "stop",
            "exitCode": 0,
            "timestamp": 1_700_000_000_123,
        },
    }
    huge = entry_of("0a1b2c3d", None, "user", "\x01" * 200_000, 0)  # each escapes to six bytes
    assert len(huge.content.data) <= ENTRY_BYTES_PER_RECORD
    cut = json.loads(huge.content.data)
    assert cut["truncated"] is True and 0 < len(cut["message"]["content"][0]["text"]) < 200_000


def response(outcome: str, code: str | None = None, error: str | None = None) -> client_v1.Response:
    return client_v1.Response(
        requestId="req-1", outcome=outcome, receipt={"code": code} if code else {"status": "accepted"}, error=error
    )


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        pytest.param(response("accepted"), None, id="accepted"),
        pytest.param(response("adopted"), None, id="adopted"),
        pytest.param(response("conflict", "winnerDecided", "already"), None, id="decided"),
        pytest.param(
            response("rejected", "validationFailed", "'x' is a required property"),
            ("validationFailed", "'x' is a required property"),
            id="rejected",
        ),
        pytest.param(
            response("rejected", "validatorFailed", "the validator timed out"),
            ("validatorFailed", "the validator timed out"),
            id="validator-broke",
        ),
        pytest.param(
            response("conflict", "notWaiting", "the request is cancelled"),
            ("commandFailed", "the server did not take the command's output (notWaiting: the request is cancelled)"),
            id="not-waiting",
        ),
    ],
)
def test_the_servers_answer_is_accepted_or_the_reason_the_run_failed(answer, verdict):
    assert verdict_of(answer) == verdict


def contract(expected: ExpectedOutput, executor: Executor) -> AgentContract:
    return AgentContract(
        workflow_name="demo",
        node_path="fix",
        attempt_id="attempt-1",
        request_id=request_id_of("attempt-1"),
        visit_number=1,
        attempt_number=1,
        prompt="Fix the failing test.",
        expected_output=expected,
        executor=executor,
    )


COMMAND = Executor(kind="command", argv=["my-agent"])


@pytest.mark.parametrize(
    ("expected", "says"),
    [
        (SCHEMA, 'as one JSON value, and nothing else.\nExpected output (JSON Schema): {"type": "object"}'),
        (DESCRIPTION, "on standard output: the text is the output.\nExpected output: a summary"),
        (REPLY, "printing your reply of at most 100 characters on standard output"),
    ],
)
def test_a_command_steps_message_asks_for_stdout_not_the_workflow_tool(expected, says):
    text = step_contract.initial(contract(expected, COMMAND), "wm-" + "0" * 32)
    assert says in text and "status 0" in text
    assert "workflow` tool" not in text and "Do not call the workflow tool" not in text
    assert text.startswith("Workflow step: demo / fix") and "Fix the failing test." in text
    assert step_contract.message_of(text) == "wm-" + "0" * 32
    resumed = step_contract.resumed(contract(expected, COMMAND), "wm-" + "1" * 32, "too short")
    assert says in resumed and "Your last submission was rejected: too short" in resumed
    assert "workflow` tool" in step_contract.initial(contract(SCHEMA, Executor()), "wm-" + "0" * 32)


def test_samples_fall_on_the_turns_period_or_where_the_budget_ends():
    ms = 1_000_000
    assert next_sample_ns(now_ns=250 * ms, started_ns=0, sample_ms=100, timeout_ms=0, spent_ms=0) == 300 * ms
    assert next_sample_ns(now_ns=300 * ms, started_ns=0, sample_ms=100, timeout_ms=0, spent_ms=0) == 400 * ms
    # 1000 ms budget, 950 spent by earlier turns: this turn's budget ends at 50 ms
    assert next_sample_ns(now_ns=10 * ms, started_ns=0, sample_ms=100, timeout_ms=1000, spent_ms=950) == 50 * ms
    # past the budget's end: the period again (the sample that reached it is in flight)
    assert next_sample_ns(now_ns=60 * ms, started_ns=0, sample_ms=100, timeout_ms=1000, spent_ms=950) == 100 * ms

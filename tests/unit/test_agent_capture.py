"""How an agent host starts Pi (agents/rpc.py) and what it records of Pi's events (agents/capture.py)."""

from __future__ import annotations

import json

from piworkflows.agents import capture, rpc
from piworkflows.agents.session import Line
from piworkflows.protocol.internal.agents import (
    MAX_EVENTS_PER_RECORD,
    ActiveSample,
    AgentContract,
    AgentLaunch,
    ExpectedOutput,
)

CONTRACT = AgentContract(
    workflow_name="w",
    node_path="n",
    attempt_id="attempt-1",
    request_id="request-1",
    visit_number=1,
    attempt_number=1,
    prompt="p",
    expected_output=ExpectedOutput(kind="description", description="d"),
)


def launch(**changes: object) -> AgentLaunch:
    base = AgentLaunch(
        segment_id="segment-1",
        run_id="run-1",
        attempt_id="attempt-1",
        request_id="request-1",
        session_id="pis-1",
        project_path="/p",
        contract=CONTRACT,
        pi_command=["node", "/opt/pi/cli.js"],
        socket_path="/s/host.sock",
        coordinator_epoch=4,
        timeout_ms=0,
        elapsed_ms=0,
        sample_ms=1000,
        flush_ms=250,
        start_timeout_ms=30_000,
        abort_grace_ms=10_000,
        retry_settle_ms=500,
    )
    return base.model_copy(update=changes)


def test_pi_is_started_in_rpc_mode_with_the_contracts_model_tools_and_the_workflow_tool():
    tool = rpc.WORKFLOW_TOOL
    assert tool.is_file() and tool.name == "workflow.ts"
    assert rpc.pi_argv(launch()) == ["node", "/opt/pi/cli.js", "--mode", "rpc", "--no-extensions", "-e", str(tool)]
    contract = CONTRACT.model_copy(update={"model": "anthropic/claude-x:high", "allowed_tools": ["read", "bash"]})
    argv = rpc.pi_argv(launch(contract=contract, pi_session_file="/f.jsonl", pi_args=["--skill", "s"]))
    assert argv == [
        *["node", "/opt/pi/cli.js", "--mode", "rpc", "--session", "/f.jsonl"],
        *["--provider", "anthropic", "--model", "claude-x:high", "--no-extensions", "-e", str(tool)],
        *["--tools", "read,bash,workflow", "--skill", "s"],
    ]
    assert rpc.model_args("gpt-x") == ["--model", "gpt-x"] and rpc.model_args(None) == []
    env = rpc.pi_env(launch(), {"HOME": "/h", "PI_CODING_AGENT_DIR": "/a"})
    assert env == {
        "HOME": "/h",
        "PI_CODING_AGENT_DIR": "/a",
        "PI_OFFLINE": "1",
        "PI_WORKFLOWS_SOCKET": "/s/host.sock",
        "PI_WORKFLOWS_SESSION_ID": "pis-1",
        "PI_WORKFLOWS_EPOCH": "4",
    }


def test_events_keep_type_ids_role_status_and_times_never_content():
    secret = "the model's private words"
    assistant = {"role": "assistant", "content": [{"type": "text", "text": secret}], "stopReason": "toolUse"}
    assert capture.compact({"type": "message_update", "message": assistant, "delta": secret}, 5) is None
    assert capture.compact({"type": "tool_execution_update", "toolCallId": "c1", "partialResult": secret}, 5) is None
    assert capture.compact({"type": "queue_update", "steering": [secret]}, 5) is None
    assert capture.compact({"type": "extension_ui_request", "title": secret}, 5) is None
    ended = capture.compact({"type": "message_end", "message": {**assistant, "timestamp": 3}}, 9)
    assert ended is not None and ended.model_dump() == {
        "event_type": "message_end",
        "pi_event_id": None,
        "event_role": "assistant",
        "event_status": "toolUse",
        "started_at": None,
        "ended_at": 9,
    }
    started = capture.compact({"type": "message_start", "message": {**assistant, "timestamp": 3}}, 9)
    assert started is not None and started.started_at == 3
    tool = capture.compact({"type": "tool_execution_end", "toolCallId": "c1", "toolName": "bash", "result": secret}, 7)
    assert tool is not None and (tool.pi_event_id, tool.event_role, tool.event_status) == ("c1", "bash", "ok")
    retry = capture.compact({"type": "auto_retry_end", "success": False, "finalError": secret}, 7)
    assert retry is not None and retry.event_status == "failed"
    for event in (ended, started, tool, retry):
        assert secret not in json.dumps(event.model_dump())


def line(entry_id: str, size: int = 10) -> Line:
    entry = {"type": "message", "id": entry_id, "parentId": None, "message": {"role": "user", "content": "x" * size}}
    return Line(entry, json.dumps(entry))


def test_a_record_takes_at_most_64_events_and_the_entries_that_fit_links_after_them():
    kept = capture.Capture()
    for index in range(MAX_EVENTS_PER_RECORD + 6):
        kept.add_event({"type": "turn_start"}, index)
    for entry_id in ("0000000a", "0000000b", "0000000c"):
        kept.add_entry(line(entry_id, size=capture.ENTRY_BYTES_PER_RECORD // 3))
    kept.add_entry(line("not-pi-id"))
    kept.add_entry(line("0000000d", size=capture.ENTRY_BYTES_PER_RECORD))  # too large for a record
    kept.link(prompt_entry_id="0000000a", response_entry_id="0000000c")
    first = kept.take(ActiveSample(elapsed_ms=5), "turn-1", "wm-1")
    assert first.first_event_index == 0 and len(first.events) == MAX_EVENTS_PER_RECORD
    assert [e.pi_entry_id for e in first.entries] == ["0000000a", "0000000b"] and first.links is None
    assert first.sample == ActiveSample(elapsed_ms=5) and kept.waiting
    second = kept.take(None, None, None)
    assert second.first_event_index == MAX_EVENTS_PER_RECORD and len(second.events) == 6
    assert [e.pi_entry_id for e in second.entries] == ["0000000c"]
    assert second.links is not None and second.links.response_entry_id == "0000000c"
    assert not kept.waiting
    kept.link(prompt_entry_id="0000000a")  # unchanged: nothing to send
    assert not kept.waiting


def test_a_record_that_reaches_a_multiple_of_256_events_carries_a_checkpoint():
    kept = capture.Capture(event_count=250)
    kept.add_event({"type": "tool_execution_start", "toolCallId": "c1", "toolName": "bash"}, 1)
    for _ in range(9):
        kept.add_event({"type": "turn_start"}, 1)
    record = kept.take(None, "turn-1", "wm-1")
    assert record.first_event_index == 250 and record.checkpoint is not None
    assert json.loads(record.checkpoint.data) == {"activeMessage": "wm-1", "openTools": ["c1"], "openTurn": "turn-1"}
    kept.add_event({"type": "turn_start"}, 1)
    assert kept.take(None, None, None).checkpoint is None

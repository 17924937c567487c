"""Reading Pi session files (piworkflows/agents/session.py): the active branch, the step messages on
it and a settled reply, on a file the real Pi wrote and on hand-written edge cases."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from piworkflows.agents import session
from piworkflows.protocol import step_contract
from piworkflows.protocol.internal.agents import AgentContract, ExpectedOutput, message_id_of
from piworkflows.testing.scripted_model import ScriptedModel
from tests.pi_util import PROVIDER, agent_dir, pi_env

FIRST, SECOND, OTHER = message_id_of("step:first"), message_id_of("step:second"), message_id_of("step:other")
CONTRACT = AgentContract(
    workflow_name="fix-tests",
    node_path="fix",
    attempt_id="attempt-1",
    request_id="request-1",
    visit_number=1,
    attempt_number=1,
    prompt="Say what you found.",
    expected_output=ExpectedOutput(kind="assistant-message", max_chars=100),
)


@pytest.fixture(scope="module")
def pi_session(pi_command: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session file the real Pi wrote: two step messages, each answered by the scripted model."""
    root = tmp_path_factory.mktemp("pi-session")
    file = root / "session.jsonl"
    scripts = {"m": [{"text": "Looking \u2028 around."}, {"text": "All tests pass."}]}
    with ScriptedModel(scripts) as model:
        env = pi_env(agent_dir(root / "agent", model), root)
        for text in (step_contract.initial(CONTRACT, FIRST), step_contract.reminder(CONTRACT, SECOND, 1)):
            argv = [*pi_command, "--provider", PROVIDER, "--model", "m", "--no-extensions", "--session", str(file)]
            subprocess.run([*argv, "-p", text], cwd=root, env=env, check=True, capture_output=True, timeout=60)
    return file


def test_the_branch_of_a_file_pi_wrote_holds_both_steps_and_the_settled_reply(pi_session: Path):
    raw = pi_session.read_bytes().split(b"\n")
    lines = session.read_lines(str(pi_session))
    assert json.loads(raw[0])["type"] == "session"  # the header is not an entry
    assert [line.text.encode() for line in lines] == [r for r in raw[1:] if r]
    branch = session.active_branch(lines)
    assert branch == lines  # one prompt after the other: a single chain
    assert all(session.is_entry_id(line.entry["id"]) for line in lines)
    found = session.steps_on(branch, {FIRST, SECOND, OTHER})
    users = [line.entry["id"] for line in lines if session.role_of(line.entry) == "user"]
    assert found == [(FIRST, users[0]), (SECOND, users[1])]
    assert session.step_of(lines[-1].entry) is None
    last = session.last_assistant(branch)
    assert last is not None and last["id"] == lines[-1].entry["id"]
    assert session.settled_reply(branch, {FIRST, SECOND}) == (SECOND, last["id"], "All tests pass.")
    assert session.settled_reply(branch, {FIRST}) == (FIRST, last["id"], "All tests pass.")
    # U+2028 inside a JSON string did not split an entry.
    first_reply = [line for line in lines if session.role_of(line.entry) == "assistant"][0]
    assert session.assistant_text(first_reply.entry) == "Looking \u2028 around."


def entry(entry_id: str, parent: str | None, role: str, content: Any, **message: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "id": entry_id,
        "parentId": parent,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "message": {"role": role, "content": content, **message},
    }


def user(entry_id: str, parent: str | None, message_id: str, extra: str = "") -> dict[str, Any]:
    return entry(
        entry_id, parent, "user", [{"type": "text", "text": f"Step\n{step_contract.MARKER}{message_id}{extra}"}]
    )


def reply(entry_id: str, parent: str, text: str, stop: str = "stop") -> dict[str, Any]:
    return entry(entry_id, parent, "assistant", [{"type": "text", "text": text}], stopReason=stop)


def write(path: Path, entries: list[dict[str, Any]], tail: bytes = b"") -> None:
    header = {"type": "session", "version": 3, "id": "uuid", "cwd": "/p"}
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in [header, *entries]) + tail)


def test_only_the_active_branch_counts_and_a_marker_must_end_the_text(tmp_path: Path):
    file = tmp_path / "s.jsonl"
    write(
        file,
        [
            user("0000000a", None, FIRST),
            reply("0000000b", "0000000a", "first answer"),
            user("0000000c", "0000000b", SECOND),  # abandoned branch
            reply("0000000d", "0000000c", "abandoned"),
            user("0000000e", "0000000b", OTHER, extra="\nand more text"),  # marker not on the last line
            entry("0000000f", "0000000e", "user", f"Plain string\n{step_contract.MARKER}{SECOND}\n"),
            {"type": "model_change", "id": "00000010", "parentId": "0000000f", "provider": "p", "modelId": "m"},
        ],
    )
    branch = session.active_branch(session.read_lines(str(file)))
    assert [line.entry["id"] for line in branch] == ["0000000a", "0000000b", "0000000e", "0000000f", "00000010"]
    assert session.steps_on(branch, {FIRST, SECOND, OTHER}) == [(FIRST, "0000000a"), (SECOND, "0000000f")]
    assert session.steps_on(branch, {OTHER}) == []
    assert session.role_of(branch[-1].entry) == "model_change"
    assert session.settled_reply(branch, {FIRST, SECOND}) is None  # the branch does not end with a reply


@pytest.mark.parametrize(
    ("last", "settled"),
    [
        (reply("0000000b", "0000000a", "Done."), True),
        (reply("0000000b", "0000000a", "calling a tool", stop="toolUse"), False),
        (reply("0000000b", "0000000a", "partial", stop="error"), False),
        (reply("0000000b", "0000000a", "  \n"), False),
        (None, False),
    ],
)
def test_a_settled_reply_is_a_non_empty_stop_reply_after_the_latest_step(tmp_path: Path, last, settled):
    file = tmp_path / "s.jsonl"
    write(file, [user("0000000a", None, FIRST), *([last] if last else [])])
    branch = session.active_branch(session.read_lines(str(file)))
    assert session.settled_reply(branch, {FIRST}) == ((FIRST, "0000000b", "Done.") if settled else None)
    assert session.settled_reply(branch, {SECOND}) is None  # not one of the request's steps


def test_the_file_is_read_as_it_grows_a_partial_line_waits_and_a_rewrite_starts_over(tmp_path: Path):
    file = tmp_path / "s.jsonl"
    tracked = session.SessionFile(str(file))
    assert tracked.read() == [] and tracked.branch() == []  # Pi writes the file at its first reply
    first = json.dumps(user("0000000a", None, FIRST)).encode() + b"\n"
    second = json.dumps(reply("0000000b", "0000000a", "ok")).encode()
    write(file, [], tail=first + second[:20])
    assert [line.entry["id"] for line in tracked.read()] == ["0000000a"]
    with file.open("ab") as handle:
        handle.write(second[20:] + b"\n" + b"not json\n\n")
    assert [line.entry["id"] for line in tracked.read()] == ["0000000b"]
    assert tracked.read() == []
    write(file, [user("0000000c", None, SECOND)])  # shorter: rewritten
    assert [line.entry["id"] for line in tracked.read()] == ["0000000c"]
    assert list(tracked.by_id) == ["0000000c"]


def test_a_parent_cycle_or_a_missing_parent_ends_the_walk(tmp_path: Path):
    file = tmp_path / "s.jsonl"
    write(
        file,
        [user("0000000a", "0000000b", FIRST), reply("0000000b", "0000000a", "loop"), user("0000000c", "gone", SECOND)],
    )
    lines = session.read_lines(str(file))
    assert [line.entry["id"] for line in session.active_branch(lines)] == ["0000000c"]
    assert [line.entry["id"] for line in session.active_branch(lines[:2])] == ["0000000a", "0000000b"]

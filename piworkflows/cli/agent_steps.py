"""``pi-workflows run transcript`` and ``submit``: what an agent step's Pi said, and an operator's
output for a waiting agent step.

::

    run transcript RUN [NODE]   run.status (NODE must be an agent step of the run) ── run.transcript
        {after: cursor, nodePath?} pages ── each entry's JSON line (a large one read in parts with
        run.logs content, verified) ── user and assistant text whole, tool calls by name with
        short arguments, tool results and other entries shortened
    submit RUN NODE JSON        run.status: the pending request of NODE (else exit 2, naming the
        node the run waits at) ── interaction.submit {operator: true, no coordinatorEpoch} ── the
        answer stays open until the step's validator judged it: accepted (exit 0) or rejected
        with the validator's error (exit 1)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import click

from piworkflows import canonical
from piworkflows.cli import story
from piworkflows.cli.base import OPERATOR_CLIENT_ID, accepted, check, fail, json_argument, main, request, say
from piworkflows.cli.logs import Ask, asker, read_content
from piworkflows.cli.runs import run_group
from piworkflows.client import ServerNotRunning, ServerRefused, WorkflowClient
from piworkflows.paths import StatePaths
from piworkflows.states import AGENT_NODE_KINDS, MEDIA_TEXT, SUBMISSION_REJECTIONS

ARGUMENT_CHARS = 160  # a tool call's arguments, as one line of JSON
RESULT_LINES = 4  # of a tool result or another entry's text
RESULT_CHARS = 160  # of each of those lines


@run_group.command("transcript")
@click.argument("run_id")
@click.argument("node", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry per line, its Pi line whole.")
@click.pass_obj
def run_transcript(paths: StatePaths, run_id: str, node: str | None, as_json: bool) -> None:
    """Print the Pi conversation of a run's agent steps (of NODE only, if given): user and
    assistant text, tool calls by name with short arguments, tool results shortened.

    Example: pi-workflows run transcript run-0123abcd fix
    """
    check("run.transcript", {"nodePath": node} if node else {}, run_id)
    with WorkflowClient(paths.state_dir, retry_for=0) as client:
        ask = asker(client, paths, run_id)
        if node is not None:
            _agent_node(ask("run.status", {}), node)
        printed = False
        step: str | None = None
        for item in _entries(ask, node):
            if as_json:
                click.echo(canonical.dumps(item))
            else:
                if item["attemptId"] != step or not printed:
                    step = item["attemptId"]
                    say(f"== {item['nodePath']} ({step})" if step else "== outside any agent step")
                for line in entry_lines(item):
                    say(line)
            printed = True
    if not printed and not as_json:
        say("no conversation captured" + (f" for {node}" if node else "") + " yet")


def _agent_node(view: dict[str, Any], node: str) -> None:
    """NODE is an agent step of the run's workflow, else a usage error that names those it has."""
    if "content" in view["workflow"]:  # a definition too big to show: the server checks the node
        return
    nodes = view["workflow"]["nodes"]
    agents = sorted(path for path, spec in nodes.items() if spec.get("kind") in AGENT_NODE_KINDS)
    known = f"its agent steps: {', '.join(agents)}" if agents else "it has no agent steps"
    if node not in nodes:
        raise click.BadParameter(f"{view['runId']} has no node {node!r} ({known})", param_hint="NODE")
    if nodes[node].get("kind") not in AGENT_NODE_KINDS:
        raise click.BadParameter(f"{node!r} is a {nodes[node].get('kind')} node, not an agent step ({known})")


def _entries(ask: Ask, node: str | None) -> Iterator[dict[str, Any]]:
    """Every entry in order, page by page; a large one's line read whole (and verified)."""
    after = None
    while True:
        payload: dict[str, Any] = {} if node is None else {"nodePath": node}
        if after is not None:
            payload["after"] = after
        page = ask("run.transcript", payload)
        for item in page["items"]:
            entry = item["entry"]
            if not isinstance(entry, str):  # {"omitted": {byteLength, digest}}
                reference = {"digest": entry["omitted"]["digest"], "mediaType": MEDIA_TEXT}
                item = {**item, "entry": read_content(ask, reference).decode("utf-8")}
            yield item
        after = page["cursor"]
        if after is None:
            return


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _short(text: str, indent: str) -> list[str]:
    """At most RESULT_LINES lines of RESULT_CHARS, with how many more there were."""
    rows = text.rstrip("\n").splitlines() or [""]
    shown = [story.cut(indent + row.expandtabs(), len(indent) + RESULT_CHARS) for row in rows[:RESULT_LINES]]
    if len(rows) > RESULT_LINES:
        shown.append(f"{indent}... ({len(rows) - RESULT_LINES} more lines)")
    return shown


def _whole(text: str, indent: str) -> list[str]:
    return [indent + row for row in (text.rstrip("\n").splitlines() or [""])]


def entry_lines(item: dict[str, Any]) -> list[str]:
    """One settled entry for people: ``#seq role time``, then what it holds, indented."""
    try:
        entry = json.loads(item["entry"])
    except ValueError:
        entry = None
    at, seq = story.clock(item["settledAt"]), item["runSeq"]
    if not isinstance(entry, dict):
        return [f"#{seq} {item['role']} {at} (not a JSON object)"]
    head = f"#{seq} {item['role']} {at}"
    message = entry.get("message")
    if entry.get("type") != "message" or not isinstance(message, dict):
        detail = {k: v for k, v in entry.items() if k not in ("type", "id", "parentId", "timestamp")}
        return [f"#{seq} [{entry.get('type')}] {at}", *_short(canonical.dumps(detail), "  ")]
    role = message.get("role")
    if role == "assistant":
        return [head, *_assistant(message)]
    if role == "toolResult":
        error = " (error)" if message.get("isError") else ""
        return [f"#{seq} {role} {message.get('toolName')}{error} {at}", *_short(_text(message.get("content")), "  ")]
    if role == "user":
        return [head, *_whole(_text(message.get("content")), "  ")]
    text = _text(message.get("content")) or str(message.get("summary") or message.get("command") or "")
    return [head, *_short(text, "  ")]


def _assistant(message: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    content = message.get("content")
    for block in content if isinstance(content, list) else [{"type": "text", "text": _text(content)}]:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and block.get("text"):
            lines += _whole(str(block["text"]), "  ")
        elif block.get("type") == "thinking":
            lines.append(f"  (thinking, {len(str(block.get('thinking', '')))} characters)")
        elif block.get("type") == "toolCall":
            arguments = story.cut(canonical.dumps(block.get("arguments")), ARGUMENT_CHARS)
            lines.append(f"  -> {block.get('name')} {arguments}")
    if message.get("stopReason") in ("error", "aborted", "length"):
        reason = message.get("errorMessage") or message["stopReason"]
        lines.append(story.cut(f"  (ended: {reason})", story.WIDTH))
    return lines


@main.command("submit")
@click.argument("run_id")
@click.argument("node")
@click.argument("output_json")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one line of JSON.")
@click.pass_obj
def submit(paths: StatePaths, run_id: str, node: str, output_json: str, as_json: bool) -> None:
    """Provide, as an operator, the output of the agent step NODE that a run waits at. The step's
    own validation judges it: accepted, the run continues; rejected, exit 1 with the error.

    Example: pi-workflows submit run-0123abcd fix '{"summary": "fixed by hand"}'
    """
    output = json_argument(output_json, '{"summary": "done"}', "OUTPUT_JSON")
    view = accepted(request(paths, "run.status", {}, run_id=run_id))
    pending = view["piworkflows"]["pending"]
    if pending is None or pending["kind"] in ("checkpoint", "human_decision") or pending["nodePath"] != node:
        fail(story.not_here(run_id, node, "agent", pending))  # the run's state, like answer and decide: exit 1
    wanted = pending["request"]
    if wanted["expectedOutput"]["kind"] == "assistant-message":
        fail(
            f"{node!r} takes the agent's visible reply, not a submitted output; see 'pi-workflows run status {run_id}'"
        )
    submission_id = "operator-" + uuid.uuid4().hex
    payload = {
        "targetSessionId": wanted["targetSessionId"],
        "requestId": wanted["requestId"],
        "submissionId": submission_id,
        "value": {"output": output},
        "operator": True,
    }
    check("interaction.submit", payload, run_id)
    from piworkflows.settings import Settings  # pydantic: only where a setting is read

    timeout = Settings.from_env().validate_timeout_ms / 1000 + 30  # the answer waits for the validator
    try:
        with WorkflowClient(paths.state_dir, client_id=OPERATOR_CLIENT_ID, timeout=timeout) as client:
            response = client.request("interaction.submit", payload, run_id=run_id, idempotency_key=submission_id)
    except ServerRefused as exc:
        fail(str(exc))
    except (ServerNotRunning, OSError, ConnectionError) as exc:
        fail(f"the server did not answer ({exc}); see the step with 'pi-workflows run status {run_id}'")
    code = (response.receipt or {}).get("code") if isinstance(response.receipt, dict) else None
    if response.outcome == "rejected" and code in SUBMISSION_REJECTIONS:
        fail(f"the output was rejected ({code}): {response.error}\n  fix it and submit again")
    receipt = accepted(response)
    click.echo(canonical.dumps(receipt) if as_json else f"accepted; {run_id} continues after {node}")

"""A run's story for people: the run view (``pi-workflows.run-view.v1``) as lines of at most 80 columns.

The view holds the facts; this module only renders them (``run status``, ``run watch``, ``run start
--wait``): times in local time, durations, JSON values as canonical JSON text, missing values as "-",
texts wrapped and bounded, and the exact commands an operator runs next (``base.command_line``, with
--state-dir when one was given). Never a Python repr. Paths and commands are printed whole, so a long
state directory or project path makes its own line wider.
"""

from __future__ import annotations

import datetime
import textwrap
import time
from typing import Any

from piworkflows import canonical
from piworkflows.cli import run_view
from piworkflows.cli.base import command_line, visible
from piworkflows.states import ACTIVE_ATTEMPT_STATUSES

WIDTH = 80
SHOWN_LINES = 5  # of a shell node's stdout and stderr: the last ones
TEXT_LINES = 4  # of a value, an error or a question

# A display activity in words (docs/protocol.md, Run views); others show as they are.
ACTIVITY_WORDS = {"origin_turn": "agent turn", "supervised_runner": "runner"}


def status_text(display: dict[str, Any]) -> str:
    """``waiting (agent turn)``: the display status, with its activity when it has one."""
    activity = display["activity"]
    return f"{display['status']} ({ACTIVITY_WORDS.get(activity, activity)})" if activity else display["status"]


def epoch_ms(at: str | int) -> int:
    """A time as epoch milliseconds: a view's (ISO-8601) or a log page's (already epoch ms)."""
    return at if isinstance(at, int) else int(datetime.datetime.fromisoformat(at).timestamp() * 1000)


def moment(at: str | int | None) -> str:
    """A time (ISO-8601 or epoch ms) as a local date and time, or "-"."""
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_ms(at) / 1000))


def clock(at: str | int | None) -> str:
    """A time (ISO-8601 or epoch ms) as a local time of day, or "-"."""
    return "-" if at is None else time.strftime("%H:%M:%S", time.localtime(epoch_ms(at) / 1000))


def duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds // 60 % 60:02d}m"


def omitted(value: Any) -> int | None:
    """The size of a value the view left out (a content reference ``{"$artifact": {bytes, ...}}``
    too big to show, or ``{"omitted": {byteLength, digest}}``), else None."""
    if run_view.is_reference(value):
        length = value["$artifact"].get("bytes")
    elif isinstance(value, dict) and set(value) == {"omitted"} and isinstance(value["omitted"], dict):
        length = value["omitted"].get("byteLength")
    else:
        return None
    return length if isinstance(length, int) else None


def json_text(value: Any) -> str:
    size = omitted(value)
    return f"{size} bytes, too large to show here" if size is not None else canonical.dumps(value)


def cut(text: str, width: int) -> str:
    text = visible(text)  # first: a cut never leaves half an escape sequence
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def block(label: str, text: str, indent: int, max_lines: int = TEXT_LINES) -> list[str]:
    """``label: text`` wrapped to WIDTH under ``indent`` spaces, at most ``max_lines`` lines ("..." when cut).
    A word longer than a line (a path) stays whole on its own line, so it can be copied."""
    pad = " " * indent
    lines: list[str] = []
    for paragraph in text.split("\n") if text else [""]:
        if lines and not paragraph.strip():
            continue  # a blank line spends one of max_lines on nothing
        lead = pad + "  " if lines else f"{pad}{label}: "
        lines += textwrap.wrap(
            visible(paragraph.expandtabs()),
            WIDTH,
            initial_indent=lead,
            subsequent_indent=pad + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        ) or [lead.rstrip()]
    if len(lines) > max_lines:  # whole lines only (a cut line could cut a path): the rest is "..."
        lines = lines[: max_lines - 1] + [pad + "  ..."]
    return lines


def command(label: str, text: str, indent: int) -> list[str]:
    """``label: command``, never wrapped (it is copied whole); on its own line when it does not fit."""
    pad = " " * indent
    text = visible(text)
    line = f"{pad}{label}: {text}"
    return [line] if len(line) <= WIDTH else [f"{pad}{label}:", f"{pad}  {text}"]


def answer_command(run_id: str, node_path: str) -> str:
    """The command that answers a waiting checkpoint; 'JSON' stands for the answer."""
    return command_line("answer", run_id, node_path) + " 'JSON'"


# What a run's pending step is, in words, by the view's pending kind.
WAIT_KINDS = {
    "checkpoint": "a checkpoint",
    "human_decision": "a protected human decision",
    "agent": "an agent step",
    "decision": "an agent's decision",
}


def wait_command(run_id: str, pending: dict[str, Any]) -> str:
    """The one command that moves a waiting step on, by its kind: ``answer`` a checkpoint,
    ``decide`` a protected human decision (its choices named), ``submit`` an agent step's output."""
    kind, node = pending["kind"], pending["nodePath"]
    if kind == "checkpoint":
        return answer_command(run_id, node)
    if kind == "human_decision":
        choices = pending["decision"]["choices"]
        text = " [--input TEXT]" if any(choice["input"] for choice in choices.values()) else ""
        return command_line("decide", run_id, node) + f" CHOICE{text} (CHOICE: {', '.join(choices)})"
    return command_line("submit", run_id, node) + " 'JSON'"


def not_here(run_id: str, node: str, wanted: str, pending: dict[str, Any] | None) -> str:
    """Why a command for ``wanted`` (a kind of WAIT_KINDS) at NODE does not apply, naming where the
    run waits and the command that does apply there."""
    if pending is None:
        return f"{run_id} waits at no step now; see it with '{command_line('run', 'status', run_id)}'"
    what = WAIT_KINDS.get(pending["kind"], pending["kind"])
    if pending["nodePath"] == node:
        where = f"'{node}' is {what}, not {WAIT_KINDS[wanted]}"
    else:
        where = f"{run_id} waits at {what}, '{pending['nodePath']}', not at '{node}'"
    return f"{where}; use: {wait_command(run_id, pending)}"


def question(run_id: str, step: dict[str, Any], indent: int) -> list[str]:
    """A checkpoint's request (its summary and details); while it waits, the command that answers it."""
    request = step.get("request")
    lines: list[str] = []
    if isinstance(request, dict) and omitted(request) is None:
        summary = request.get("summary")
        lines += block("question", summary if isinstance(summary, str) and summary else json_text(summary), indent)
        if request.get("details") is not None:
            lines += block("details", json_text(request["details"]), indent)
    elif request is not None:
        lines += block("question", json_text(request), indent)
    if step["status"] == "waiting":
        lines += command("answer it", answer_command(run_id, step["nodeId"]), indent)
    return lines


def review(effect: dict[str, Any], indent: int) -> list[str]:
    """An ambiguous effect: its id, and the commands that settle it."""
    effect_id = effect["effectId"]
    line = f"{' ' * indent}ambiguous effect {effect_id}"
    if len(line) + len(effect["effectType"]) + 3 <= WIDTH:
        line += f" ({effect['effectType']})"
    lines = [line, *command("it acted", command_line("effect", "confirm", effect_id), indent + 2)]
    if "retry" in effect.get("controls", ("retry",)):
        lines += command("run again", command_line("effect", "retry", effect_id), indent + 2)
    else:  # its run ended: nothing attempts it again, only the evidence can be recorded
        lines.append(f"{' ' * (indent + 2)}(its run ended: it is not attempted again)")
    return lines


def step_label(step: dict[str, Any]) -> str:
    """``node (kind)``, with the visit and attempt when they are not the first."""
    extra = "".join(f", {name} {step[name]}" for name in ("visit", "attempt") if step[name] != 1)
    return f"{step['nodeId']} ({step['nodeType']}{extra})"


def _shell(output: dict[str, Any], indent: int) -> list[str]:
    """A shell node's output: how the command ended, then the last lines of stdout and stderr."""
    pad = " " * indent
    code, signal = output.get("exitCode"), output.get("signal")
    ended = f"exit code {code}" if code is not None else f"signal {signal or '-'}"
    lines = [f"{pad}{ended} after {duration(output.get('durationMs'))}"]
    for stream in ("stdout", "stderr"):
        text = output.get(stream) or ""
        if not isinstance(text, str):
            lines += block(stream, json_text(text), indent)
            continue
        rows = text.rstrip("\n").split("\n") if text.strip("\n") else []
        if not rows:
            lines.append(f"{pad}{stream}: (empty)")
            continue
        shown = rows[-SHOWN_LINES:]
        more = f" (last {len(shown)} of {len(rows)} lines)" if len(rows) > len(shown) else ""
        lines.append(f"{pad}{stream}{more}:")
        lines += [cut(f"{pad}  {row.expandtabs()}", WIDTH) for row in shown]
    return lines


def _is_shell_output(step: dict[str, Any]) -> bool:
    output = step.get("output")
    return step["nodeType"] == "shell" and isinstance(output, dict) and {"stdout", "stderr", "exitCode"} <= set(output)


def agent_wait(run_id: str, pending: dict[str, Any], indent: int) -> list[str]:
    """A waiting agent step: its prompt, what it expects, its active time, the submissions and
    their verdicts, and the commands that show its conversation and submit for it."""
    request, node = pending["request"], pending["nodePath"]
    lines = block("prompt", request["prompt"], indent)
    expected = request["expectedOutput"]
    if expected["kind"] == "assistant-message":
        limit = f" of at most {expected['maxChars']} characters" if expected["maxChars"] else ""
        lines += block("expects", f"the agent's visible reply{limit}", indent)
    elif expected["schema"] is not None:
        lines += block("expects", json_text(expected["schema"]), indent)
    elif expected["description"]:
        lines += block("expects", expected["description"], indent)
    spent = request["activeTime"]
    budget = spent["timeoutMs"]
    left = f" of {duration(budget)} ({duration(spent['leftMs'])} left)" if budget else ", no limit"
    lines.append(f"{' ' * indent}active time: {duration(spent['usedMs'])}{left}")
    submissions = request["submissions"]
    for number, item in enumerate(submissions["items"], start=submissions["start"] + 1):
        verdict = item["status"] + (f" ({item['errorCode']})" if item["errorCode"] else "")
        lines += block(f"submission {number}", verdict + (f": {item['error']}" if item["error"] else ""), indent)
    lines += command("conversation", command_line("run", "transcript", run_id, node), indent)
    if expected["kind"] != "assistant-message":
        lines += command("submit for it", command_line("submit", run_id, node) + " 'JSON'", indent)
    return lines


def decision_wait(run_id: str, pending: dict[str, Any], indent: int) -> list[str]:
    """A waiting protected human decision: what it asks, its choices, its deadline and what happens
    then, and the command that decides it."""
    decision, node = pending["decision"], pending["nodePath"]
    asked = decision["request"]
    lines = block("asks", _asked(asked), indent)
    for key, choice in decision["choices"].items():
        needs = f" (with {choice['input']['name']}: {choice['input']['prompt']})" if choice["input"] else ""
        lines.append(f"{' ' * indent}choice {key}: {choice['label']}{needs}")
    if decision["deadline"] is not None:
        then = "expires" if decision["onDeadline"] == "expiry" else f"takes {decision['onDeadline']}"
        lines.append(f"{' ' * indent}deadline: {decision['deadline']}, then it {then}")
    lines += command("decide it", command_line("decide", run_id, node) + " CHOICE [--input TEXT]", indent)
    return lines


def _asked(asked: Any) -> str:
    """A decision's request as a line: its title and summary, else its JSON."""
    if not isinstance(asked, dict) or "omitted" in asked:
        return json_text(asked)
    shown = [str(asked[key]) for key in ("title", "summary") if asked.get(key)]
    return " - ".join(shown) if shown else json_text(asked)


def step_details(
    run_id: str,
    step: dict[str, Any],
    effects: list[dict[str, Any]],
    indent: int,
    pending: dict[str, Any] | None = None,
) -> list[str]:
    """What happened inside a step: its output, error, question, a waiting agent step's request
    (``pending``, the view's, when it is this step's) and ambiguous effects."""
    lines: list[str] = []
    if pending is not None and pending["kind"] == "human_decision":
        if pending["decision"]["attemptId"] == step["attemptId"]:
            lines += decision_wait(run_id, pending, indent)
    elif pending is not None and pending["kind"] != "checkpoint":
        if pending["request"]["attemptId"] == step["attemptId"]:
            lines += agent_wait(run_id, pending, indent)
    if step["nodeType"] == "checkpoint":
        lines += question(run_id, step, indent)
        if step["status"] not in ACTIVE_ATTEMPT_STATUSES and step.get("output") is not None:
            lines += block("answer", json_text(step["output"]), indent)
    elif _is_shell_output(step):
        lines += _shell(step["output"], indent)
    elif step.get("output") is not None:
        lines += block("output", json_text(step["output"]), indent)
    if step.get("error") is not None:
        error = step["error"] if isinstance(step["error"], str) else json_text(step["error"])
        lines += block(_error_label(step["errorCode"]), error, indent)
    for effect in effects:
        lines += review(effect, indent)
    return lines


def _error_label(code: str | None) -> str:
    return f"error ({code})" if code else "error"


def _steps_table(
    run_id: str, steps: list[dict[str, Any]], effects: list[dict[str, Any]], pending: dict[str, Any] | None
) -> list[str]:
    """One line per step (index, node, kind, visit/attempt, status, started, duration), its details under it.
    An ambiguous effect shows under the last step of its node visit."""
    node_width = max([4, *(len(s["nodeId"]) for s in steps)])
    kind_width = max([4, *(len(s["nodeType"]) for s in steps)])
    lines = [f"  {'#':>3}  {'node':<{node_width}}  {'kind':<{kind_width}}  try  {'status':<11}  started   duration"]
    last_of_visit = {(s["nodeId"], s["visit"]): s["index"] for s in steps}
    for step in steps:
        tries = f"{step['visit']}/{step['attempt']}"
        lines.append(
            f"  {step['index']:>3}  {step['nodeId']:<{node_width}}  {step['nodeType']:<{kind_width}}  "
            f"{tries:<3}  {step['status']:<11}  {clock(step['startedAt']):<8}  "
            f"{duration(step['durationMs']):>8}".rstrip()
        )
        mine = [e for e in effects if last_of_visit.get((e["nodePath"], e["visit"])) == step["index"]]
        lines += step_details(run_id, step, mine, indent=8, pending=pending)
    return lines


def _source(view: dict[str, Any]) -> str:
    source, project = view["state"]["workflowSource"], view["piworkflows"]["projectPath"]
    if source["kind"] == "builtin":
        return f"{source['id']}, revision {source['revision']}"
    path = source["path"] or "-"
    if path.startswith(project.rstrip("/") + "/"):
        path = path[len(project.rstrip("/")) + 1 :]
    return f"{path}, sha256 {source['hash'].removeprefix('sha256:')[:12]}"


def _times(view: dict[str, Any]) -> list[str]:
    queue = view["queue"]
    created = moment(queue["createdAt"])
    day = created.partition(" ")[0]

    def when(at: str | None) -> str:  # a time of the creation day without its date
        text = moment(at)
        return text[len(day) + 1 :] if text.startswith(day + " ") else text

    return [
        f"  created {created}, started {when(queue['startedAt'])}",
        f"  finished {when(queue['finishedAt'])}, duration {duration(view['piworkflows']['durationMs'])}",
    ]


def _reason(view: dict[str, Any]) -> list[str]:
    """Why the run stands still (parked, or an effect to review), in words, with what a dead runner left."""
    display, detail = view["display"], view["piworkflows"]["parkDetail"]
    if not display["reason"]:
        return []
    parked = "parked" if view["piworkflows"]["parkReason"] and display["status"] == "queued" else None
    label = ACTIVITY_WORDS.get(display["activity"], display["activity"]) or parked or display["status"]
    run_id, reason = view["runId"], view["piworkflows"]["parkReason"]
    if reason == "workflowSourceChanged":  # the way on: the old file back, or a new run of the new one
        lines = block(label, detail or display["reason"], 2)
        lines += command("restore the file, then", command_line("run", "resume", run_id), 2)
        source = view["state"]["workflowSource"]
        name = source["id"] if source["kind"] == "builtin" else view["state"]["workflowName"]
        start = command_line("run", "start", name, "--project", view["piworkflows"]["projectPath"])
        lines += command("or start anew", f"{command_line('run', 'cancel', run_id)}; {start} --input JSON", 2)
        return lines
    lines = block(label, display["reason"], 2) + (block("runner", detail, 4) if detail else [])
    if parked and "resume" in display["controls"]:
        lines += command("once that is fixed", command_line("run", "resume", run_id), 2)
    return lines


def _result(view: dict[str, Any]) -> list[str]:
    """The run's final output or error."""
    state, lines = view["state"], []
    if "finalOutput" in state:
        lines += block("output", json_text(state["finalOutput"]), 2)
    if state.get("error") is not None:
        error = state["error"] if isinstance(state["error"], str) else json_text(state["error"])
        lines += block(_error_label(view["piworkflows"]["errorCode"]), error, 2)
    return lines


def outcome(view: dict[str, Any]) -> list[str]:
    """How the run stands: status and reason in words, the run's output or error, effects to review."""
    display, run_id = view["display"], view["runId"]
    lines = [f"{run_id} {display['status']}", *_reason(view), *_result(view)]
    for effect in view["piworkflows"]["effects"]:
        lines += review(effect, 2)
    return lines


def story(view: dict[str, Any]) -> list[str]:
    """``run status``: header, times, every step with what happened inside it (a waiting agent step's
    request), the controls allowed now."""
    ours, display, run_id = view["piworkflows"], view["display"], view["runId"]
    lines = [f"{run_id}  {view['state']['workflowName']}  {status_text(display)}"]
    lines += _reason(view)
    if ours["title"]:
        lines += block("title", ours["title"], 2)
    lines += [f"  source: {_source(view)}", f"  project: {ours['projectPath']}"]
    lines += block("input", json_text(view["state"]["input"]), 2)
    lines += [*_times(view), *_result(view)]
    steps, effects, total = run_view.steps(view), ours["effects"], view["stepTotal"]
    earlier = f" (the last {len(steps)}; run logs shows all)" if len(steps) < total else ""
    lines.append(f"  steps: {total}{earlier}" if steps else "  steps: none yet")
    if steps:
        lines += _steps_table(run_id, steps, effects, ours["pending"])
    shown = {(s["nodeId"], s["visit"]) for s in steps}
    for effect in effects:
        if (effect["nodePath"], effect["visit"]) not in shown:
            lines += review(effect, 2)
    lines.append(f"  controls: {', '.join(display['controls']) or '-'}")
    return lines

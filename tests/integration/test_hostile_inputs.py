"""Hostile inputs change nothing and never stop the server (docs/STRESS.md, Hostile inputs).

Through the CLI and the client on real servers: a lone surrogate, NaN, Infinity, a number past a
double, a duplicate key or a value nested too deep is a usage error (exit 2, nothing sent) or
``invalidRequest`` (nothing committed); workflow code that returns one fails its node naming the
value's path; a database an older build let such a value into is served (U+FFFD) and
``state verify`` names it; a node that ends its runner's process parks its run after a few deaths.
The writer is never restarted by any of it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piworkflows import canonical
from piworkflows.protocol import domain
from tests.engine_util import CHECKPOINT, start, start_blocked, start_waiting, view, wait_status, write
from tests.server_util import ServerProcess, check_state, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]

# Returns what the input says: a surrogate, a value nested `depth` deep, or the input itself.
POISON = """
import os
from piworkflows.workflows import compute, define_workflow

def deep(n):
    value = 1
    for _ in range(n):
        value = [value]
    return value

def make(ctx):
    what = ctx.input.get("what")
    if what == "surrogate":
        return {"x": "\\ud800"}
    if what == "deep":
        return {"d": deep(ctx.input["depth"])}
    if what == "exit":
        os._exit(3)
    return ctx.input

workflow = define_workflow(
    "poison", "make", {"make": compute(make)},
    title=lambda ctx: "t\\ud800" if ctx.input.get("title") else "fine",
)
"""


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def usage_error(result: Any, *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def still_serving(server: ServerProcess, writer: int | None) -> None:
    """The same writer serves reads and writes: no restart, no dead reader thread."""
    assert server.child_pid("writer") == writer
    listed = server.cli("runs", "--json", timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert "writer exited" not in server.server_log()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ('{"continue": "\\ud800"}', "$.continue: a string holds the lone surrogate U+D800"),
        ('{"go": true, "go": false}', "duplicate object key 'go'"),
        ('{"go": NaN}', "NaN is not allowed in JSON"),
        ('{"go": Infinity}', "Infinity is not allowed in JSON"),
        ('{"go": 1e400}', "number 1e400 overflows a double"),
        (nested(600), "nests deeper than 256 levels"),
        (nested(10_000), "nests deeper than 256 levels"),
    ],
)
def test_an_answer_outside_the_domain_is_a_usage_error_and_the_run_still_waits(server, project, answer, reason):
    run_id = start_waiting(server, project)
    writer = server.child_pid("writer")
    usage_error(server.cli("answer", run_id, "ask", answer), reason, "pass e.g.")
    assert view(server, run_id)["display"]["status"] == "waiting"
    still_serving(server, writer)


def test_input_outside_the_domain_is_a_usage_error_and_starts_nothing(server, project):
    write(project, "poison", POISON)
    for text, reason in [
        ('{"x": "\\udfff"}', "$.x: a string holds the lone surrogate U+DFFF"),
        ('{"x": -Infinity}', "-Infinity is not allowed"),
        (nested(257), "nests deeper than 256 levels"),
    ]:
        usage_error(server.cli("run", "start", "poison", "--project", str(project), "--input", text), reason)
    assert json.loads(server.cli("runs", "--json").stdout)["total"] == 0


def test_the_client_protocol_answers_invalid_request_and_commits_nothing(server, project):
    run_id = start_waiting(server, project)
    writer = server.child_pid("writer")
    with server.client() as client:
        answered = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": "\ud800"}}, run_id=run_id)
        bad_id = client.request("run.status", {}, run_id="run-\udcff")
        deep = client.request("run.start", {"projectPath": str(project), "workflowName": "ask", "input": [[[[1]]]]})
    assert answered.outcome == "rejected" and answered.receipt["code"] == "invalidRequest", answered
    assert "$.payload.answer.go" in answered.error
    assert bad_id.outcome == "rejected" and bad_id.receipt["code"] == "invalidRequest", bad_id
    assert "$.runId" in bad_id.error
    assert deep.outcome == "accepted"  # shallow enough: only the domain's limits are refused
    assert view(server, run_id)["display"]["status"] == "waiting"
    assert "Traceback" not in server.server_log()
    still_serving(server, writer)


def test_an_argument_that_is_not_utf8_and_an_unusable_run_id_are_usage_errors(server):
    writer = server.child_pid("writer")
    result = server.cli("run", "status", "run-\udcff")  # what Python makes of the bytes run-\xff in argv
    usage_error(result, "argument 5 is not UTF-8 text")
    for command in (["run", "watch", ""], ["run", "watch", "r" * 100_000], ["run", "status", ""]):
        usage_error(server.cli(*command), "an id is a non-empty string of at most 256 bytes")
    assert "Traceback" not in server.server_log()
    still_serving(server, writer)


def test_workflow_code_returning_a_value_outside_the_domain_fails_its_node_naming_the_path(server, project):
    write(project, "poison", POISON)
    writer = server.child_pid("writer")
    result = server.cli(
        "run", "start", "poison", "--project", str(project), "--input", '{"what": "surrogate"}', "--wait"
    )
    assert result.returncode == 1 and " failed" in result.stdout, result.stdout + result.stderr
    run_id = result.stdout.splitlines()[0]
    error = view(server, run_id)["state"]["steps"][0]["error"]
    assert error == "the output is outside the protocol's value domain: $.x: a string holds the lone surrogate U+D800"
    status = server.cli("run", "status", run_id)
    assert status.returncode == 0 and "value domain: $.x:" in status.stdout, status.stderr
    deep = start(server, project, "poison", {"what": "deep", "depth": 300})
    failed = wait_status(server, deep, "failed")
    assert "nests deeper than 256 levels" in failed["state"]["error"]
    titled = start(server, project, "poison", {"title": True})
    assert wait_status(server, titled, "completed")["piworkflows"]["title"] == "t\ufffd"
    still_serving(server, writer)


def test_the_deepest_value_a_run_keeps_renders_everywhere(server, project):
    write(project, "poison", POISON)
    run_id = start(server, project, "poison", {"what": "deep", "depth": domain.MAX_VALUE_NESTING - 2})
    wait_status(server, run_id, "completed")
    for command in (["run", "status", run_id], ["run", "status", run_id, "--json"], ["view", run_id, "--once"]):
        shown = server.cli(*command)
        assert shown.returncode == 0 and "[[[[" in shown.stdout, command + [shown.stderr]
    logs = server.cli("run", "logs", run_id)
    assert logs.returncode == 0, logs.stderr


@pytest.mark.server_env(PI_WORKFLOWS_RUNNER_CRASH_BACKOFF_MS="50", PI_WORKFLOWS_RUNNER_CRASH_LIMIT="3")
def test_a_node_that_ends_its_runner_parks_the_run_after_a_few_deaths_naming_how(server, project):
    write(project, "poison", POISON)
    result = server.cli("run", "start", "poison", "--project", str(project), "--input", '{"what": "exit"}', "--wait")
    assert result.returncode == 1, result.stdout + result.stderr
    run_id = result.stdout.splitlines()[0]
    parked = wait_until(lambda: (v := view(server, run_id))["piworkflows"]["parkDetail"] and v, what="park detail")
    assert parked["piworkflows"]["parkReason"] == "runnerNoProgress"
    assert parked["piworkflows"]["parkDetail"] == "the runner exited with code 3 (3 times in a row at node 'make')"
    assert [s["status"] for s in parked["state"]["steps"]] == ["interrupted"] * 3
    log = server.server_log()
    assert "death 1 of 3 at one node" in log and "death 2 of 3 at one node" in log
    status = server.cli("run", "status", run_id)
    assert "runner: the runner exited with code 3 (3 times in a row at node 'make')" in status.stdout


# An older build: the domain's checks off in every process of the server (and its CLI).
OLDER_BUILD = """
import piworkflows.protocol.domain as domain
domain.problem = lambda *args, **kwargs: None
domain.check_json_bytes = lambda *args, **kwargs: None
"""


def test_a_database_an_older_build_let_a_lone_surrogate_into_is_served(tmp_path, project):
    shim = tmp_path / "older-build"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(OLDER_BUILD)
    write(project, "ask", CHECKPOINT)
    state_dir = tmp_path / "s"
    older = ServerProcess(state_dir, env={"PYTHONPATH": str(shim), "PI_WORKFLOWS_SCHEDULER_TICK_MS": "100"}).start()
    try:
        run_id = start(older, project, "ask")
        wait_status(older, run_id, "waiting")
        with older.client() as client:
            stored = client.request("checkpoint.answer", {"nodePath": "ask", "answer": {"go": "\ud800"}}, run_id=run_id)
        assert stored.outcome == "accepted", stored
    finally:
        older.stop()
    server = ServerProcess(state_dir, env={"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100"}).start()
    try:
        writer = server.child_pid("writer")
        shown = wait_until(lambda: (v := view(server, run_id))["state"]["steps"][-1].get("output") and v, what="steps")
        assert shown["state"]["steps"][-1]["output"] == {"go": "\ufffd"}
        status = server.cli("run", "status", run_id)
        assert status.returncode == 0 and '"go":"\ufffd"' in status.stdout, status.stderr
        verified = server.cli("state", "verify")
        assert verified.returncode == 1 and "valueOutsideDomain: sha256:" in verified.stdout, verified.stdout
        assert "could not be encoded" in server.server_log()
        still_serving(server, writer)
    finally:
        assert server.stop() == 0, server.output()


# Any JSON value, lone surrogates, non-finite numbers and duplicate keys included, as the text a
# user would pass: in the domain it comes back unchanged as the run's output; outside it the CLI
# refuses it (exit 2) and the server never sees it.
texts = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()), max_size=12)
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats() | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=12,
)


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=values, duplicate=st.booleans())
def test_property_any_json_text_through_cli_server_runner_and_view(hostile_server, value, duplicate):
    server, project = hostile_server
    text = json.dumps({"v": value}, ensure_ascii=True)  # NaN and Infinity as JavaScript-ish literals
    if duplicate:
        text = text[:-1] + ', "v": 0}'
    result = server.cli("run", "start", "poison", "--project", str(project), "--input", text, "--wait", "--json")
    try:
        expected = domain.loads(text)
    except domain.OutsideDomain:
        usage_error(result)
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        final = canonical.loads(result.stdout.rstrip("\n").split("\n")[-1])  # not splitlines: U+0085 is no line end
        assert final["state"]["finalOutput"] == expected
    assert server.client(retry_for=0).running()


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One server for every example of the property test (starting one per example would take minutes)."""
    root = tmp_path_factory.mktemp("hostile")
    project = root / "proj"
    (project / ".pi" / "workflows").mkdir(parents=True)
    write(project, "poison", POISON)
    server = ServerProcess(root / "s", env={"PI_WORKFLOWS_SCHEDULER_TICK_MS": "100", "HOME": str(root)}).start()
    writer = server.child_pid("writer")
    try:
        yield server, project
        still_serving(server, writer)
    finally:
        assert server.stop() == 0, server.output()
    check_state(server.state_dir)


def test_the_live_viewer_without_a_terminal_is_a_usage_error_naming_once(server, project):
    run_id = start_waiting(server, project)
    for args in (["view"], ["view", run_id]):
        result = server.cli(*args, timeout=30)  # stdin /dev/null, stdout a pipe: no terminal
        usage_error(result, "the live viewer needs a terminal", "--once")
    assert run_id in server.cli("view", run_id, "--once").stdout


# Run data that a terminal would act on: a title that retitles the window, an output that moves
# the cursor, a shell step that prints a forged row and colours, and a node output of 900 KB.
INJECTS = r"""
from piworkflows.workflows import compute, define_workflow, edge, idempotent_effect, shell

workflow = define_workflow(
    "injects", "say",
    {
        "say": compute(lambda ctx: {"text": "ok\x1b[2J\rforged row\n\x9b31m\u202eevil"}),
        "print": shell(
            idempotent_effect("test.print"),
            lambda ctx: {"command": "printf", "args": ["line\\033]0;pwned\\007\\r\\nrun-fake  demo  completed\\n"]},
        ),
        "big": compute(lambda ctx: {"big": "x" * 900_000}),
    },
    [edge("say", "print"), edge("print", "big")],
    title=lambda ctx: "t\x1b]0;owned\x07itle\r\nrun-forged",
)
"""

RAW_CONTROLS = ("\x1b", "\x07", "\r", "\x9b", "\u202e")


def test_control_characters_in_run_data_reach_no_terminal_raw(server, project):
    write(project, "injects", INJECTS)
    run_id = start(server, project, "injects")
    wait_status(server, run_id, "completed")
    outputs = {}
    for command in (
        ["runs"],
        ["run", "status", run_id],
        ["view", run_id, "--once"],
        ["view", "--once"],
        ["run", "logs", run_id],
        ["run", "watch", run_id],
    ):
        shown = server.cli(*command, text=False)
        assert shown.returncode == 0, command + [shown.stderr]
        text = shown.stdout.decode("utf-8")
        for char in RAW_CONTROLS:
            assert char not in text, (command, char, text[:2000])
        outputs[" ".join(command[:2])] = text
    listed = outputs["runs"]
    assert "t\\e]0;owned" in listed  # cut to the column after it became visible
    assert not any(line.startswith("run-forged") for line in listed.split("\n"))
    status = outputs["run status"]
    assert "ok\\u001b[2J\\rforged row\\n\\x9b31m\\u202eevil" in status  # JSON's escapes, then C1 and bidi
    logs = outputs["run logs"]
    assert "line\\e]0;pwned\\x07\\r" in logs and "\nrun-fake  demo  completed\n" in logs  # its own line, shown
    assert '{"big":"' + "x" * 900_000 + '"}' in logs  # read whole, in parts
    raw = server.cli("run", "logs", run_id, "print", "--stdout", text=False)
    assert raw.stdout == b"line\x1b]0;pwned\x07\r\nrun-fake  demo  completed\n"  # --stdout stays raw, for piping


def test_a_runner_the_server_stopped_is_never_called_dead(server, project, tmp_path):
    for control in ("pause", "cancel"):
        run_id = start_blocked(server, project, tmp_path / f"flag-{control}")
        result = server.cli("run", control, run_id)
        assert result.returncode == 0, result.stderr
        wait_status(server, run_id, "paused" if control == "pause" else "cancelled")
        wait_until(lambda run_id=run_id: run_id not in _busy_runs(server), what="its runner gone")
        log = server.server_log()
        assert f"the runner of {run_id} died" not in log and "ended before it was done" not in log, log


def _busy_runs(server: ServerProcess) -> str:
    return "".join(child.get("runId") or "" for child in server.registry()["children"])


def test_a_workflow_file_that_is_a_link_loop_is_listed_as_a_load_error(server, project):
    link = project / ".pi" / "workflows" / "loop.workflow.py"
    link.symlink_to(link)
    write(project, "poison", POISON)
    listed = server.cli("workflows", "--project", str(project))
    assert listed.returncode == 1 and "did not load: loop" in listed.stderr, listed.stderr  # listed, then a check
    assert "loop " in listed.stdout and "does not load" in listed.stdout, listed.stdout
    assert "Too many levels of symbolic links" in listed.stdout
    assert "poison " in listed.stdout


def test_an_ambiguous_effect_of_an_ended_run_offers_only_what_works(server, project):
    from tests.integration.test_run_story import NAP

    write(project, "nap", NAP)
    run_id = start(server, project, "nap")
    wait_status(server, run_id, "ambiguous")
    assert server.cli("run", "cancel", run_id).returncode == 0
    ended = wait_status(server, run_id, "cancelled")
    (effect,) = ended["piworkflows"]["effects"]
    assert effect["controls"] == ["confirm"]
    shown = server.cli("run", "status", run_id)
    assert "effect retry" not in shown.stdout and "its run ended: it is not attempted again" in shown.stdout
    assert "effect confirm " + effect["effectId"] in shown.stdout
    # counted apart, and labelled where it is listed: nothing will attempt it again
    status = server.cli("server", "status")
    assert "ambiguous effects: 1 (1 of ended runs: list them with " in status.stdout, status.stdout
    listed = server.cli("effects")
    assert effect["effectId"] in listed.stdout and "(run ended: confirm only)" in listed.stdout, listed.stdout
    assert json.loads(server.cli("effects", "--json").stdout)["controls"] == ["confirm"]
    confirmed = server.cli("effect", "confirm", effect["effectId"], "--note", "checked by hand")
    assert confirmed.returncode == 0, confirmed.stderr
    after = json.loads(server.cli("server", "status", "--json").stdout)
    assert (after["ambiguousEffects"], after["ambiguousEffectsOfEndedRuns"]) == (0, 0)


HANGS = """
import time
time.sleep(600)
"""


@pytest.mark.server_env(PI_WORKFLOWS_RESOLVE_TIMEOUT_MS="3000")
def test_a_module_that_hangs_at_import_is_listed_and_the_others_still_are(server, project):
    write(project, "hangs", HANGS)
    write(project, "poison", POISON)
    listed = server.cli("workflows", "--project", str(project), env={"PI_WORKFLOWS_RESOLVE_TIMEOUT_MS": "3000"})
    assert listed.returncode == 1, listed.stdout + listed.stderr  # listed, then the check fails
    assert "hangs: did not load within 1 s" in listed.stdout, listed.stdout
    assert "poison " in listed.stdout and "builtin:demo" in listed.stdout
    assert "no server is running" not in listed.stderr

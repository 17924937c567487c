"""``pi-workflows view`` on a real server: Textual pilot tests of the run list, the run screen and
every key, ``--once``, and one run under a real terminal (tmux)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.widgets import DataTable, Input, Static

from piworkflows.paths import StatePaths
from piworkflows.viewer.app import Ask, Confirm, RunListScreen, RunScreen, Viewer
from tests.engine_util import CHECKPOINT, start, view, wait_status, write
from tests.server_util import ServerProcess, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


async def until(pilot: Any, check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Let the app run until ``check()`` holds (a deadline, never a fixed wait)."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await pilot.pause(0.05)
    return found


def drive(server: ServerProcess, run_id: str | None, script: Callable[[Viewer, Any], Awaitable[None]]) -> None:
    async def main() -> None:
        app = Viewer(StatePaths.resolve(server.state_dir), run_id)
        async with app.run_test(size=(140, 45)) as pilot:
            await script(app, pilot)

    asyncio.run(main())


def head(app: Viewer) -> str:
    return str(app.screen.query_one("#head", Static).render())


def story(app: Viewer) -> str:
    return str(app.screen.query_one("#story", Static).render())


def test_the_run_list_shows_runs_filters_them_and_opens_one(server, project):
    write(project, "ask", CHECKPOINT)
    waiting = start(server, project, "ask")
    wait_status(server, waiting, "waiting")
    cancelled = start(server, project, "ask")
    with server.client() as client:
        assert client.request("run.cancel", {}, run_id=cancelled).outcome == "accepted"

    async def script(app: Viewer, pilot: Any) -> None:
        table = await until(
            pilot,
            lambda: app.screen.query_one(DataTable).row_count == 2 and app.screen.query_one(DataTable),
            "two rows",
        )
        rows = [table.get_row_at(i) for i in range(2)]
        assert {row[1] for row in rows} == {"waiting", "cancelled"} and {row[2] for row in rows} == {"ask"}
        assert {row[0] for row in rows} == {waiting, cancelled}  # the id first: whole at 80 columns
        await pilot.press("s")  # status: cancelled (the first filter after "all")
        await until(pilot, lambda: table.row_count == 1 and table.get_row_at(0)[0] == cancelled, "cancelled only")
        for _ in range(len(("cancelled", "completed", "failed", "queued", "running", "timed_out"))):
            await pilot.press("s")
        await until(pilot, lambda: table.row_count == 1 and table.get_row_at(0)[0] == waiting, "waiting only")
        await pilot.press("s")  # back to all
        await until(pilot, lambda: table.row_count == 2, "all again")
        await pilot.press("w")
        await until(pilot, lambda: isinstance(app.screen, Ask), "the question")
        await pilot.press(*"nothing-like-it", "enter")
        await until(pilot, lambda: table.row_count == 0, "no run of that workflow")
        await pilot.press("w", *"ask", "enter")
        await until(pilot, lambda: table.row_count == 2, "the ask runs")
        table.move_cursor(row=[table.get_row_at(i)[0] for i in range(2)].index(waiting))
        await pilot.press("enter")
        assert isinstance(app.screen, RunScreen)
        await until(pilot, lambda: "waiting" in head(app), "the run's header")
        assert "The workflow needs a checkpoint answer." in head(app) and "current node: ask" in head(app)
        await pilot.press("escape")
        assert isinstance(app.screen, RunListScreen)

    drive(server, None, script)


def test_every_key_of_the_run_screen(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")

    async def script(app: Viewer, pilot: Any) -> None:
        await until(pilot, lambda: "waiting" in head(app), "waiting")
        assert "question: go on?" in story(app) and "prepare" in story(app)
        await pilot.press("r")  # not a control of a waiting run: nothing is sent
        await pilot.press("p")
        await until(pilot, lambda: view(server, run_id)["state"]["paused"], "paused on the server")
        await until(pilot, lambda: "paused" in head(app), "paused in the viewer")
        await pilot.press("a")  # a paused run's question can be answered: it stays paused
        await until(pilot, lambda: isinstance(app.screen, Ask), "the question while paused")
        await pilot.press(*'{"go": tru', "enter")  # not JSON: asked again with what was typed
        await until(pilot, lambda: isinstance(app.screen, Ask) and app.screen.query_one(Input).value, "asked again")
        assert app.screen.query_one(Input).value == '{"go": tru'
        await pilot.press("e", "}", "enter")
        await until(pilot, lambda: view(server, run_id)["state"].get("waitingOn") is None, "answered while paused")
        assert view(server, run_id)["display"]["status"] == "paused"
        await pilot.press("r")
        await until(pilot, lambda: "completed" in head(app), "completed after the answer and the resume")
        assert view(server, run_id)["state"]["outputs"]["yes"] == {"answered": True}
        await pilot.press("c")  # a completed run has no cancel
        assert isinstance(app.screen, RunScreen)
        for tab in ("trace-tab", "transcript-tab"):
            app.screen.query_one("TabbedContent").active = tab
        trace = str(app.screen.query_one("#trace", Static).render())
        assert "checkpoint.answered at ask" in trace and "node.started at prepare" in trace  # the node named
        assert "run.claimed  (" in trace  # a run's own event names none
        items = view(server, run_id)["tracePage"]["items"]
        answered = next(item for item in items if item["type"] == "checkpoint.answered")
        ask = next(step for step in view(server, run_id)["state"]["steps"] if step["nodeId"] == "ask")
        assert (answered["nodeId"], answered["attemptId"]) == ("ask", ask["attemptId"])  # upstream's fields
        controls = [item for item in items if item["type"] in ("run.queued", "run.claimed", "run.paused")]
        assert controls and all("nodeId" not in item for item in controls)
        assert items[-1]["type"] == "run.finished" and items[-1]["nodeId"] == "yes"  # it ended at that node

    drive(server, run_id, script)


SEVENTY = """
from piworkflows.workflows import compute, define_workflow, edge
nodes = {f"n{i}": compute(lambda ctx, i=i: {"i": i}) for i in range(70)}
workflow = define_workflow("seventy", "n0", nodes, [edge(f"n{i}", f"n{i + 1}") for i in range(69)])
"""


def test_older_steps_come_page_by_page_in_the_history_tab(server, project):
    """A run longer than the view's window: o reads the steps before it with view.page."""
    write(project, "seventy", SEVENTY)
    run_id = start(server, project, "seventy")
    shown = wait_status(server, run_id, "completed")
    assert (shown["stepStart"], shown["stepTotal"]) == (6, 70)

    async def script(app: Viewer, pilot: Any) -> None:
        await until(pilot, lambda: "completed" in head(app), "completed")
        await pilot.press("o")
        history = app.screen.query_one("#history", Static)
        await until(pilot, lambda: "steps 1-6 of 70" in str(history.render()), "the older steps")
        lines = str(history.render()).splitlines()
        assert [line.split()[1] for line in lines[1:]] == [f"n{i}" for i in range(6)]
        await pilot.press("o")  # nothing older: the tab stays as it is
        assert "steps 1-6 of 70" in str(history.render())

    drive(server, run_id, script)


def test_cancel_asks_first(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")

    async def script(app: Viewer, pilot: Any) -> None:
        await until(pilot, lambda: "waiting" in head(app), "waiting")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")  # pushed on a later refresh
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run screen again")
        assert view(server, run_id)["display"]["status"] == "waiting"
        await pilot.press("c", "y")
        await until(pilot, lambda: "cancelled" in head(app), "cancelled")

    drive(server, run_id, script)


def test_view_once_prints_the_list_and_a_run(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    listed = server.cli("view", "--once")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["run", "status", "workflow", "title", "age", "duration"]
    assert run_id in listed.stdout and "waiting" in listed.stdout
    shown = server.cli("view", run_id, "--once")
    assert shown.returncode == 0 and f"{run_id}  ask  waiting" in shown.stdout and "question: go on?" in shown.stdout
    unknown = server.cli("view", "run-unknown", "--once")
    assert unknown.returncode == 1 and "runNotFound" in unknown.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real terminal")
def test_the_viewer_in_a_real_terminal_answers_a_checkpoint(server, project):
    write(project, "ask", CHECKPOINT)
    run_id = start(server, project, "ask")
    wait_status(server, run_id, "waiting")
    tmux = ["tmux", "-L", "piw-" + uuid.uuid4().hex[:8]]
    command = " ".join(server.cli_command("view", run_id))
    env = {**server.env, "TERM": "xterm-256color"}
    subprocess.run([*tmux, "new-session", "-d", "-x", "140", "-y", "45", command], check=True, env=env, timeout=30)
    try:

        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True, timeout=30).stdout

        wait_until(lambda: f"{run_id}  ask  waiting" in screen() and "go on?" in screen(), what="the waiting run")
        subprocess.run([*tmux, "send-keys", "a"], check=True, timeout=30)
        wait_until(lambda: "Your answer (JSON)" in screen(), what="the answer form")
        subprocess.run([*tmux, "send-keys", "-l", '{"go": true}'], check=True, timeout=30)
        subprocess.run([*tmux, "send-keys", "Enter"], check=True, timeout=30)
        wait_until(lambda: f"{run_id}  ask  completed" in screen(), what="the completed run on screen")
        assert view(server, run_id)["display"]["status"] == "completed"
    finally:
        subprocess.run([*tmux, "kill-server"], timeout=30)


def test_d_decides_a_protected_human_decision(server, project):
    from tests.integration.test_human_decisions import APPROVE

    write(project, "approve", APPROVE.format(on_timeout=None))
    run_id = start(server, project, "approve")
    wait_status(server, run_id, "waiting")

    async def script(app: Viewer, pilot: Any) -> None:
        await until(pilot, lambda: "waiting" in head(app), "waiting")
        await pilot.press("a")  # a checkpoint's answer is not this run's control
        assert isinstance(app.screen, RunScreen)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, Ask), "the question")
        await pilot.press(*"replan: Split the change", "enter")
        await until(pilot, lambda: "completed" in head(app), "completed after the decision")
        outputs = view(server, run_id)["state"]["outputs"]
        assert outputs["approve"] == {"choice": "replan", "input": "Split the change", "resolution": "human"}
        await pilot.press("d")  # decided: no longer a control
        assert isinstance(app.screen, RunScreen)

    drive(server, run_id, script)


def test_the_live_viewer_of_an_unknown_run_says_so_instead_of_a_blank_screen(server):
    unknown = "run-" + "0" * 32
    done = server.cli("view", unknown)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"no run {unknown}" in done.stderr and "list the runs with 'pi-workflows" in done.stderr

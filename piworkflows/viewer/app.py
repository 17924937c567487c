"""``pi-workflows view``: a terminal viewer of the server's live views (Textual).

::

    RunListScreen   a RunsWatch (view.runs.watch) in a worker thread: one row per run (status,
                    workflow, title, age, duration); s: filter by status, w: by workflow,
                    enter: the run
    RunScreen       a RunWatch (view.run.watch) in a worker thread, its references read back
                    (cli/run_view.py): display status, activity and reason in the header; tabs
                    Story (steps with timings, outputs, shell stdout/stderr, the question, effects,
                    controls), Transcript (settled Pi entries), Trace (events), History (steps
                    older than the view's window, read with view.page: o reads more)
                    keys p pause, r resume, c cancel (confirmed), a answer (a form), d decide a
                    protected human decision (a choice and its text, as the operator): each only
                    while the view's display.controls lists it; escape: back to the list

It renders only what the server sends and changes state only through the client protocol.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Label, Static, TabbedContent, TabPane
from textual.worker import get_current_worker

from piworkflows.cli import run_view, story
from piworkflows.cli.base import visible
from piworkflows.client import ClientError, WorkflowClient
from piworkflows.paths import StatePaths
from piworkflows.protocol import envelope
from piworkflows.states import RUN_STATUSES
from piworkflows.viewer import text
from piworkflows.views.watch import RunsWatch, RunWatch, WatchEnded

TICK_S = 0.5  # a worker looks whether the screen still wants it this often; the list's ages too
PAGE_STEPS = 256  # the History tab reads this many older steps a time (view.page's most)
STATUS_FILTERS = (None, *sorted(RUN_STATUSES))
# a key's action -> the control the view must allow for it
# a key's action -> the control of display.controls it needs
CONTROLS = {"pause": "pause", "resume": "resume", "cancel": "cancel", "answer": "answer", "decide": "human-answer"}


class Confirm(ModalScreen[bool]):
    """A yes/no question: y confirms, n or escape does not."""

    BINDINGS = [Binding("y", "yes", "Yes"), Binding("n,escape", "no", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Vertical(Label(visible(self.question), markup=False), Label("y: yes   n: no"), id="dialog")

    def action_yes(self) -> None:
        self.dismiss(True)

    def action_no(self) -> None:
        self.dismiss(False)


class Ask(ModalScreen[str | None]):
    """One line of text (enter submits it, escape gives up)."""

    BINDINGS = [Binding("escape", "cancel", "Back")]

    def __init__(self, prompt: str, placeholder: str = "", value: str = "") -> None:
        super().__init__()
        self.prompt, self.placeholder, self.value = prompt, placeholder, value

    def compose(self) -> ComposeResult:
        prompt = Static("\n".join(map(visible, self.prompt.split("\n"))), markup=False)  # a run's question
        yield Vertical(prompt, Input(self.value, placeholder=self.placeholder, id="answer"), id="dialog")

    def on_mount(self) -> None:
        field = self.query_one(Input)
        field.cursor_position = len(field.value)  # what was typed before goes on where it ended

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class RunListScreen(Screen[None]):
    BINDINGS = [
        Binding("s", "status", "Status filter"),
        Binding("w", "workflow", "Workflow filter"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.status: str | None = None
        self.workflow: str | None = None
        self.page: dict[str, Any] | None = None

    def compose(self) -> ComposeResult:
        yield Static(self._filters(), id="filters")
        table: DataTable[str] = DataTable(cursor_type="row", id="runs")
        table.add_columns(*text.COLUMNS)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.watch_list()

    def _filters(self) -> str:
        return f"runs   status: {self.status or 'all'}   workflow: {self.workflow or 'all'}"

    @work(thread=True, exclusive=True, group="runs")
    def watch_list(self) -> None:
        viewer = self.app
        assert isinstance(viewer, Viewer)
        filters: dict[str, Any] = {}
        if self.status is not None:
            filters["status"] = [self.status]
        if self.workflow is not None:
            filters["workflowName"] = self.workflow
        worker = get_current_worker()
        try:
            with RunsWatch(viewer.paths.state_dir, filters) as watch:
                while not worker.is_cancelled:
                    page = watch.next(timeout=TICK_S)
                    if not worker.is_cancelled:
                        viewer.call_from_thread(self.show, page)
        except (ClientError, OSError) as exc:
            viewer.call_from_thread(viewer.notify, f"the run list is not available: {exc}", severity="error")

    def show(self, page: dict[str, Any] | None) -> None:
        """A new first page (None: the same one, its ages redrawn)."""
        self.page = page or self.page
        if self.page is None:
            return
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        now = int(time.time() * 1000)
        for item in self.page["items"]:
            table.add_row(*map(escape, text.list_row(item, now)), key=item["runId"])  # cells are markup
        if self.page["items"]:
            table.move_cursor(row=min(row, len(self.page["items"]) - 1))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.push_screen(RunScreen(event.row_key.value))

    def action_status(self) -> None:
        self.status = STATUS_FILTERS[(STATUS_FILTERS.index(self.status) + 1) % len(STATUS_FILTERS)]
        self._refilter()

    def action_workflow(self) -> None:
        def chosen(name: str | None) -> None:
            if name is not None:
                self.workflow = name.strip() or None
                self._refilter()

        self.app.push_screen(Ask("Workflow name (empty: all):", self.workflow or ""), chosen)

    def _refilter(self) -> None:
        self.query_one("#filters", Static).update(self._filters())
        self.page = None
        self.query_one(DataTable).clear()
        self.watch_list()  # exclusive: the watch of the old filters ends


class RunScreen(Screen[None]):
    BINDINGS = [
        Binding("p", "pause", "Pause"),
        Binding("r", "resume", "Resume"),
        Binding("c", "cancel", "Cancel"),
        Binding("a", "answer", "Answer"),
        Binding("d", "decide", "Decide"),
        Binding("o", "older", "Older steps"),
        Binding("escape", "back", "Runs"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.view: dict[str, Any] | None = None
        self.older: list[dict[str, Any]] = []  # steps before the view's window, read with view.page
        self.older_start: int | None = None  # the position of the first of them

    def compose(self) -> ComposeResult:
        yield Static(f"{self.run_id}: waiting for its view", id="head", markup=False)
        with TabbedContent():
            with TabPane("Story", id="story-tab"):
                yield VerticalScroll(Static(id="story", markup=False))
            with TabPane("Transcript", id="transcript-tab"):
                yield VerticalScroll(Static(id="transcript", markup=False))
            with TabPane("Trace", id="trace-tab"):
                yield VerticalScroll(Static(id="trace", markup=False))
            with TabPane("History", id="history-tab"):
                yield VerticalScroll(Static("o: the steps before the Story tab's", id="history", markup=False))
        yield Footer()

    def on_mount(self) -> None:
        self.watch_run()

    @work(thread=True, exclusive=True, group="run")
    def watch_run(self) -> None:
        viewer = self.app
        assert isinstance(viewer, Viewer)
        worker = get_current_worker()
        try:
            with (
                WorkflowClient(viewer.paths.state_dir) as client,
                RunWatch(viewer.paths.state_dir, self.run_id) as watch,
            ):
                contents = run_view.Contents(client, self.run_id)
                while not worker.is_cancelled:
                    sent = watch.next(timeout=TICK_S)
                    if sent is None or worker.is_cancelled:
                        continue
                    view = run_view.shown(contents, sent)
                    entries = view["session"]["entryPage"]
                    items = [{**item, "entry": contents.resolve(item["entry"])} for item in entries["items"]]
                    view = {**view, "session": {**view["session"], "entryPage": {**entries, "items": items}}}
                    viewer.call_from_thread(self.show, view)
        except WatchEnded as exc:
            viewer.call_from_thread(self.ended, f"{exc.outcome} ({exc.code}): {exc}")
        except (ClientError, OSError) as exc:
            viewer.call_from_thread(self.ended, f"the run's view is not available: {exc}")

    def ended(self, why: str) -> None:
        self.query_one("#head", Static).update(visible(f"{self.run_id}: {why}"))

    def show(self, view: dict[str, Any]) -> None:
        self.view = view
        display = view["display"]
        head = visible(f"{view['runId']}  {view['state']['workflowName']}  {story.status_text(display)}")
        if view["piworkflows"]["title"]:
            head += f"\n{visible(view['piworkflows']['title'])}"
        if display["reason"]:
            head += f"\n{visible(display['reason'])}"
        current = run_view.current_step(view)
        if current is not None:
            head += f"\ncurrent node: {current['nodeId']} ({current['nodeType']}, {current['status']})"
        self.query_one("#head", Static).update(head)
        self.query_one("#story", Static).update("\n".join(text.run_lines(view)))
        self.query_one("#transcript", Static).update("\n".join(text.transcript_lines(view)))
        self.query_one("#trace", Static).update("\n".join(text.trace_lines(view)))
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A control's key works only while the view allows that control; a paused run's question
        can be answered too (the run stays paused until resumed)."""
        if action in CONTROLS:
            if self.view is None:
                return False
            if CONTROLS[action] in self.view["display"]["controls"]:
                return True
            pending = self.view["piworkflows"]["pending"] or {}
            paused = self.view["display"]["status"] == "paused"
            return paused and pending.get("kind") == {"answer": "checkpoint", "decide": "human_decision"}.get(action)
        return True

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_older(self) -> None:
        """The PAGE_STEPS steps before the oldest shown (view.page), in the History tab."""
        view = self.view
        first = self.older_start if self.older_start is not None else view["stepStart"] if view else 0
        if view is None or first == 0:
            self.query_one(TabbedContent).active = "history-tab"
            return
        start = max(0, first - PAGE_STEPS)
        self.read_older(start, first - start, view["stepTotal"])

    @work(thread=True, exclusive=True, group="older")
    def read_older(self, start: int, limit: int, total: int) -> None:
        viewer = self.app
        assert isinstance(viewer, Viewer)
        try:
            with WorkflowClient(viewer.paths.state_dir, retry_for=5) as client:
                response = client.request(
                    "view.page", {"kind": "steps", "cursor": start, "limit": limit}, run_id=self.run_id
                )
        except (ClientError, OSError) as exc:
            viewer.call_from_thread(viewer.notify, f"view.page: {exc}", severity="error")
            return
        if response.outcome != "accepted" or not isinstance(response.receipt, dict):
            viewer.call_from_thread(viewer.notify, _refused("view.page", response), severity="error")
            return
        viewer.call_from_thread(self.show_older, start, response.receipt["items"], total)

    def show_older(self, start: int, steps: list[dict[str, Any]], total: int) -> None:
        self.older, self.older_start = steps + self.older, start
        self.query_one("#history", Static).update("\n".join(text.history_lines(self.older, start, total)))
        self.query_one(TabbedContent).active = "history-tab"

    def action_pause(self) -> None:
        self.control("run.pause", {}, "paused")

    def action_resume(self) -> None:
        self.control("run.resume", {}, "resumed")

    def action_cancel(self) -> None:
        def confirmed(yes: bool | None) -> None:
            if yes:
                self.control("run.cancel", {}, "cancelled")

        self.app.push_screen(Confirm(f"Cancel {self.run_id}?"), confirmed)

    def action_answer(self) -> None:
        view = self.view
        if view is None or "waitingOn" not in view["state"]:
            return
        node, revision = view["state"]["waitingOn"], view["runRevision"]
        asked = view["piworkflows"]["pending"]
        question = asked.get("request") if isinstance(asked, dict) else None
        summary = question.get("summary") if isinstance(question, dict) else None
        prompt = f"{node} asks: {summary or json.dumps(question)}\nYour answer (JSON):"

        def answered(value: str | None) -> None:
            if value is None:
                return
            try:
                answer = json.loads(value)
            except ValueError as exc:  # asked again with what was typed, to fix it
                self.app.notify(f"the answer is not JSON ({exc}); fix it and press enter", severity="error")
                self.app.push_screen(Ask(prompt, '{"continue": true}', value), answered)
                return
            self.control("checkpoint.answer", {"nodePath": node, "answer": answer}, "answered", revision)

        self.app.push_screen(Ask(prompt, '{"continue": true}'), answered)

    def action_decide(self) -> None:
        """A protected human decision, answered by the person at this terminal (the operator): a
        choice, and after a colon the text it asks for."""
        view = self.view
        pending = view["piworkflows"]["pending"] if view is not None else None
        if view is None or not isinstance(pending, dict) or pending.get("kind") != "human_decision":
            return
        decision, node = pending["decision"], pending["nodePath"]
        asked = decision["request"] if isinstance(decision["request"], dict) else {}
        title = asked.get("title") or asked.get("summary") or node
        lines = [f"{node} asks: {title}"]
        for key, choice in decision["choices"].items():
            needs = f" (then ': {choice['input']['prompt']}')" if choice["input"] else ""
            lines.append(f"  {key}: {choice['label']}{needs}")
        lines.append("Your choice (a key, then ': text' when it asks for one):")

        def decided(value: str | None) -> None:
            if not value:
                return
            choice, _, written = (part.strip() for part in value.partition(":"))
            payload = {"nodePath": node, "choice": choice, "decisionId": decision["decisionId"], "source": "operator"}
            if written:
                payload["input"] = written
            self.control("decision.answer", payload, f"decided {choice}")

        self.app.push_screen(Ask("\n".join(lines), next(iter(decision["choices"]))), decided)

    def control(self, operation: str, payload: dict[str, Any], done: str, revision: int | None = None) -> None:
        viewer = self.app
        assert isinstance(viewer, Viewer)
        viewer.send(operation, self.run_id, payload, revision, lambda: viewer.notify(f"{self.run_id} {done}"))


class Viewer(App[None]):
    """The viewer of one server's state dir: the run list, and a run's screen."""

    TITLE = "pi-workflows view"
    CSS = "#dialog { width: 80%; height: auto; border: round $accent; padding: 1 2; } #head { padding: 0 1; }"

    def __init__(self, paths: StatePaths, run_id: str | None = None) -> None:
        super().__init__()
        self.paths = paths
        self.run_id = run_id

    def on_mount(self) -> None:
        self.push_screen(RunListScreen())
        if self.run_id is not None:
            self.push_screen(RunScreen(self.run_id))

    def send(
        self, operation: str, run_id: str, payload: dict[str, Any], revision: int | None, done: Callable[[], None]
    ) -> None:
        """A control request, off the event loop; its refusal is shown as it came."""

        def request() -> None:
            try:
                with WorkflowClient(self.paths.state_dir, retry_for=5) as client:
                    response = client.request(operation, payload, run_id=run_id, expected_revision=revision)
            except (ClientError, OSError) as exc:
                self.call_from_thread(self.notify, f"{operation}: {exc}", severity="error")
                return
            if response.outcome in ("accepted", "adopted"):
                self.call_from_thread(done)
            else:
                self.call_from_thread(self.notify, _refused(operation, response), severity="error")

        self.run_worker(request, thread=True, group="controls")


def _refused(operation: str, response: envelope.Response) -> str:
    code = response.receipt.get("code") if isinstance(response.receipt, dict) else None
    return f"{operation}: {response.outcome} ({code}): {response.error}"

"""An agent host child: drives Pi (RPC mode) through one recording segment of an agent step (a
command step's command instead: agents/command.py).

::

    supervisor ── launch AgentLaunch ──> host ── starts pi --mode rpc ... (its child, same group)
    host ── get_state ──> Pi: the session file and id
    host ── agent.bind_session (C4, a new session) ── agent.branch (C5: the steps found on the
            active branch; its receipt lists the steps to send) ──> supervisor ── reply
    for each step: RPC prompt; agent.message_sent (C6) once its user entry is on the branch;
            agent_start ── agent.turn started (C7); agent.record (C8: samples, compact events,
            settled entries, links) every flush_ms / sample_ms; agent_end ── agent.turn ended (C9;
            its receipt may hold a reminder to send)
    the request settled (a receipt's requestStatus), its budget spent ({"timedOut": true}), or
            nothing left to send: RPC abort if a turn is open (else an idle Pi is killed: it
            writes nothing more), agent.close (C12), Pi's input closed (killed after
            abort_grace_ms), exit 0

Every report is a frame of HOST_FRAMES (protocol/internal/agents.py), forwarded by the supervisor
under the segment's claim; a reply that is not accepted or adopted ends the host at once (Pi
killed, exit HOST_EXIT_FAILED). The host never opens SQLite and holds no token. Threads read the
supervisor's frames and Pi's output into one queue; one loop acts on it. Active time is
``time.monotonic_ns()``, so wall-clock changes neither spend nor restore the budget.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from piworkflows import faults
from piworkflows.agents.capture import Capture, next_sample_ns, now_ms, prompt_event
from piworkflows.agents.command import CommandStep
from piworkflows.agents.pi import NEEDS_NODE
from piworkflows.agents.rpc import WORKFLOW_TOOL, PiProcess, pi_argv, pi_env
from piworkflows.agents.session import SessionFile, assistant_text, role_of, settled_reply, steps_on, stop_reason
from piworkflows.protocol import frames
from piworkflows.protocol.child_log import relay_logs
from piworkflows.protocol.internal.agents import (
    HOST_EXIT_DONE,
    HOST_EXIT_FAILED,
    HOST_EXIT_PI_EXITED,
    HOST_EXIT_PI_REFUSED,
    HOST_EXIT_PI_UNAVAILABLE,
    MAX_FAILURE_CHARS,
    ActiveSample,
    AgentBindSessionFrame,
    AgentBranchFrame,
    AgentCloseFrame,
    AgentLaunch,
    AgentMessageSentFrame,
    AgentTurnFrame,
    BranchStep,
    HostFailure,
    PendingStep,
    SettledReply,
)
from piworkflows.protocol.internal.base import BlobValue, Frame
from piworkflows.protocol.internal.writer import Reply

log = logging.getLogger("piworkflows.agents")

OPEN_REQUEST = ("pending", "validating")
# A segment's start-up points, logged with its close (stress/bench/agents.py reads them): the host
# read its launch; Pi's process started; Pi answered get_state; the first step's RPC prompt written.
LAUNCH_READ, PI_STARTED, PI_READY, PROMPT_WRITTEN = "launch read", "Pi started", "Pi ready", "first prompt written"
TIMING = (LAUNCH_READ, PI_STARTED, PI_READY, PROMPT_WRITTEN)
SETUP_PI = "run 'pi-workflows setup pi', or set PI_WORKFLOWS_PI_COMMAND to a pi you have"
UI_DIALOGS = frozenset({"select", "confirm", "input", "editor"})

Item = tuple[str, Any]  # ("frame", a supervisor frame) | ("eof", None) | ("pi", a record) | ("pi_exit", code)
# (a command step adds ("command_ended", command.Finished) and ("submitted", a client.v1 Response | None))


class _Ended(Exception):
    """The host ends now with this exit status (Pi is killed on the way out)."""

    def __init__(self, status: int, why: str | None = None) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


@dataclass
class Turn:
    """An open turn: the interval it measures and what its end reports."""

    turn_id: str
    message_id: str
    started_ns: int
    response_entry_id: str | None = None
    stop_reason: str | None = None
    error: str | None = None  # Pi's errorMessage of the turn's last assistant message
    end_due_ns: int | None = None  # an `error` end waits until then for Pi's auto-retry

    def elapsed_ms(self) -> int:
        return (time.monotonic_ns() - self.started_ns) // 1_000_000


class Host:
    def __init__(self, stdin: BinaryIO, stdout: BinaryIO, workflow_tool: Path = WORKFLOW_TOOL) -> None:
        self.stdout = stdout
        self.workflow_tool = workflow_tool
        self.inbox: queue.Queue[Item] = queue.Queue()
        self.deferred: deque[Item] = deque()  # items that arrived while a reply was awaited
        self.ids = 0
        self.failure: str | None = None  # why the host ended early (main sends it: HostFailure)
        self.pi: PiProcess | None = None
        self.stopping: str | None = None  # why the segment closes now
        self.timed_out = False
        self.timing: dict[str, int] = {}  # epoch ms of the segment's start-up points (TIMING), for its log line
        threading.Thread(target=self._read, args=(stdin,), daemon=True).start()

    # --- channels ---------------------------------------------------------------------------

    def _read(self, stdin: BinaryIO) -> None:
        decoder = frames.FrameDecoder()
        try:
            while data := stdin.read1(1 << 16):  # type: ignore[attr-defined]
                for frame in decoder.feed(data):
                    self.inbox.put(("frame", frame))
        except (frames.FrameError, OSError, ValueError):
            pass
        finally:  # the supervisor is gone (or spoke nonsense): nothing may act without an owner
            self.inbox.put(("eof", None))

    def _take(self, timeout_s: float | None) -> Item | None:
        try:
            return self.inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def next_item(self, timeout_s: float | None) -> Item | None:
        """What arrived next: an item deferred while a reply was awaited, else the queue's."""
        return self.deferred.popleft() if self.deferred else self._take(timeout_s)

    def call(self, frame: Frame) -> dict[str, Any]:
        """Send a report and wait for its reply; its receipt. Refused: the host ends."""
        self.ids += 1
        self.stdout.write(frames.encode(frame.kind, self.ids, frame.model_dump()))
        self.stdout.flush()
        while True:
            item = self._take(None)
            assert item is not None
            kind, value = item
            if kind == "eof":
                raise _Ended(HOST_EXIT_DONE)
            if kind != "frame":
                self.deferred.append(item)
            elif value["k"] == Reply.kind and value["id"] == self.ids:
                reply = Reply.model_validate(value["b"])
                if reply.outcome not in ("accepted", "adopted"):
                    why = (
                        f"{frame.kind} was refused: {reply.outcome} {(reply.receipt or {}).get('code')}: {reply.error}"
                    )
                    raise _Ended(HOST_EXIT_FAILED, why)
                receipt = reply.receipt or {}
                self._observe(receipt)
                return receipt
            else:
                log.warning("agent host: unexpected %s frame from the supervisor", value["k"])

    def send_failure(self, why: str) -> None:
        """The last frame: why the host ends early (the supervisor parks the run with it)."""
        frame = HostFailure(why=why[:MAX_FAILURE_CHARS])
        try:
            self.stdout.write(frames.encode(frame.kind, 0, frame.model_dump()))
            self.stdout.flush()
        except OSError:
            pass  # the supervisor is gone: nobody to tell

    def _observe(self, receipt: dict[str, Any]) -> None:
        if receipt.get("timedOut"):
            self.stopping, self.timed_out = "the step's active-time budget is spent", True
        status = receipt.get("requestStatus")
        if status is not None and status not in OPEN_REQUEST:
            self.stopping = f"the request is {status}"

    # --- the segment ------------------------------------------------------------------------

    def serve(self) -> int:
        """Drive one segment; the exit status (HOST_EXIT_*)."""
        item = self._take(None)
        if item is None or item[0] != "frame":
            return HOST_EXIT_DONE
        try:
            launch = AgentLaunch.model_validate(item[1]["b"])
            self.timing[LAUNCH_READ] = now_ms()
            if launch.contract.executor.kind == "command":  # another command-line agent, not Pi
                return CommandStep(self, launch).drive()
            return self._drive(launch)
        except _Ended as ended:
            self.failure = ended.why  # the supervisor logs it with the exit (HostFailure)
            return ended.status
        except Exception as exc:
            self.failure = f"the agent host failed: {type(exc).__name__}: {exc}"
            log.exception("agent host failed")
            return HOST_EXIT_FAILED
        finally:
            if self.pi is not None and self.pi.proc.poll() is None:
                self.pi.kill()

    def _drive(self, launch: AgentLaunch) -> int:
        self.launch = launch
        self.steps = set(launch.steps)
        self.queue: deque[PendingStep] = deque()
        self.unconfirmed: dict[str, PendingStep] = {}  # sent, its entry not seen on the branch yet
        self.sent: set[str] = set()  # steps on the branch or prompted: never sent (again)
        self.current: PendingStep | None = None
        self.awaiting_start = False
        self.turn: Turn | None = None
        self.turns = 0
        self.spent_ms = launch.elapsed_ms
        self.capture = Capture()
        self.prompt_linked = False
        self.prompt_rpc: str | None = None
        self.flush_due_ns: int | None = None
        self.sample_due_ns: int | None = None
        faults.hit(faults.AGENT_AFTER_OPEN)
        state = self._start_pi()
        session_file, session_id = state.get("sessionFile"), state.get("sessionId")
        if not isinstance(session_file, str) or not isinstance(session_id, str):
            raise _Ended(
                HOST_EXIT_PI_UNAVAILABLE, "Pi runs without a session file (is --no-session in PI_WORKFLOWS_PI_ARGS?)"
            )
        if launch.pi_session_file is None:
            self.call(AgentBindSessionFrame(pi_session_file=session_file, pi_session_id=session_id))
        self.session = SessionFile(session_file)
        self.session.read()
        self.captured = {line.entry["id"] for line in self.session.lines}
        self._branch()
        while self.stopping is None:
            if self.turn is None and not self.awaiting_start:
                if not self.queue:
                    self.stopping = "no step is left to send"
                    break
                self._prompt(self.queue.popleft())
            item = self.next_item(self._timeout_s())
            if item is not None:
                self._handle(item)
            self._tick()
        return self._close()

    def _start_pi(self) -> dict[str, Any]:
        """Pi started and answering: its get_state data. Else the host ends, naming the fix."""
        launch = self.launch
        argv = pi_argv(launch, self.workflow_tool)
        try:
            self.pi = PiProcess(
                argv,
                launch.project_path,
                pi_env(launch),
                lambda record: self.inbox.put(("pi", record)),
                lambda code: self.inbox.put(("pi_exit", code)),
            )
        except OSError as exc:
            raise _Ended(
                HOST_EXIT_PI_UNAVAILABLE, f"Pi could not be started ({argv[0]}: {exc.strerror}): {SETUP_PI}"
            ) from None
        self.timing[PI_STARTED] = now_ms()
        state_rpc = self.pi.send({"type": "get_state"})
        deadline = time.monotonic() + launch.start_timeout_ms / 1000
        while True:
            item = self._take(max(0.0, deadline - time.monotonic()))
            if item is None:
                last = self.pi.last_stderr()
                raise _Ended(
                    HOST_EXIT_PI_UNAVAILABLE,
                    f"Pi did not answer within {launch.start_timeout_ms} ms{f' ({last})' if last else ''}: "
                    f"check that '{argv[0]} --mode rpc' runs here, or {SETUP_PI}",
                )
            kind, value = item
            if kind == "eof":
                raise _Ended(HOST_EXIT_DONE)
            if kind == "pi_exit":
                last = self.pi.last_stderr()
                fix = (
                    NEEDS_NODE
                    if value == 127 or "node" in last.lower()
                    else f"check that '{argv[0]}' runs, or {SETUP_PI}"
                )
                raise _Ended(
                    HOST_EXIT_PI_UNAVAILABLE,
                    f"Pi exited before it answered (exit {value}: {last or 'no output'}); {fix}",
                )
            if kind == "pi" and value.get("type") == "response" and value.get("id") == state_rpc:
                if not value.get("success") or not isinstance(value.get("data"), dict):
                    raise _Ended(HOST_EXIT_PI_UNAVAILABLE, f"Pi's get_state failed: {value.get('error')}")
                self.timing[PI_READY] = now_ms()
                return dict(value["data"])
            self.deferred.append(item)

    def _branch(self) -> None:
        """C5: the request's steps on the active branch (and a settled reply); what to send."""
        branch = self.session.branch()
        found = steps_on(branch, self.steps)
        settled = None
        if self.launch.contract.expected_output.kind == "assistant-message":
            reply = settled_reply(branch, self.steps)
            if reply is not None:
                message_id, entry_id, text = reply
                settled = SettledReply(
                    workflow_message_id=message_id, pi_entry_id=entry_id, text=BlobValue.of_text(text)
                )
        receipt = self.call(
            AgentBranchFrame(
                found=[BranchStep(workflow_message_id=m, pi_entry_id=e) for m, e in found], settled_reply=settled
            )
        )
        self.sent.update(message_id for message_id, _ in found)
        pending = receipt.get("pending")
        if pending is None:  # the launch's pending steps (less those already on the branch)
            self._queue(list(self.launch.pending))
        else:
            self._queue([PendingStep(workflow_message_id=p["workflowMessageId"], text=p["text"]) for p in pending])

    def _queue(self, steps: list[PendingStep]) -> None:
        known = {step.workflow_message_id for step in self.queue} | self.sent
        for step in steps:
            if step.workflow_message_id not in known:
                self.queue.append(step)
                self.steps.add(step.workflow_message_id)

    def _prompt(self, step: PendingStep) -> None:
        """A step to Pi (RPC prompt; its header keeps it from starting with '/')."""
        assert self.pi is not None
        faults.hit(faults.AGENT_BEFORE_PROMPT)
        self.capture.add(prompt_event(step.workflow_message_id, now_ms()))
        self._due_flush()
        self.prompt_rpc = self.pi.send({"type": "prompt", "message": step.text})
        self.timing.setdefault(PROMPT_WRITTEN, now_ms())
        faults.hit(faults.AGENT_AFTER_PROMPT)
        self.current = step
        self.sent.add(step.workflow_message_id)
        self.unconfirmed[step.workflow_message_id] = step
        self.awaiting_start = True

    # --- what Pi says ---------------------------------------------------------------------

    def _handle(self, item: Item) -> None:
        kind, value = item
        if kind == "eof":
            raise _Ended(HOST_EXIT_DONE)
        if kind == "pi_exit":
            last = self.pi.last_stderr() if self.pi else ""
            raise _Ended(HOST_EXIT_PI_EXITED, f"Pi exited during the step (exit {value}){f': {last}' if last else ''}")
        if kind == "frame":
            log.warning("agent host: unexpected %s frame from the supervisor", value["k"])
            return
        record: dict[str, Any] = value
        kind = str(record.get("type"))
        if kind == "response":
            if record.get("id") == self.prompt_rpc and not record.get("success"):
                raise _Ended(HOST_EXIT_PI_REFUSED, f"Pi refused the step: {record.get('error')}")
            return
        if kind == "extension_ui_request" and record.get("method") in UI_DIALOGS:
            assert self.pi is not None  # nobody answers a dialog of a headless step
            self.pi.send({"type": "extension_ui_response", "id": record.get("id"), "cancelled": True})
            return
        self.capture.add_event(record, now_ms())
        if self.capture.events:
            self._due_flush()
        if kind == "agent_start":
            self._turn_started()
        elif kind == "message_end" and isinstance(record.get("message"), dict):
            message = record["message"]
            if message.get("role") == "assistant" and self.turn is not None:
                self._note_end(message)
        elif kind == "agent_end" and self.turn is not None:
            self._agent_end(record)
        elif kind == "auto_retry_start" and self.turn is not None:
            self.turn.end_due_ns = None  # the turn goes on with Pi's retry
        elif kind == "auto_retry_end" and self.turn is not None and not record.get("success"):
            self.turn.end_due_ns = None
            self._end_turn()
        if kind in ("message_end", "turn_end", "agent_end", "tool_execution_end"):
            self._read_session()

    def _turn_started(self) -> None:
        self.awaiting_start = False
        if self.turn is not None:  # Pi's auto-retry of the open turn
            self.turn.end_due_ns = None
            return
        if self.current is None:
            return
        self.turns += 1
        self.turn = Turn(
            f"turn-{self.launch.segment_id}-{self.turns}", self.current.workflow_message_id, time.monotonic_ns()
        )
        self._schedule_sample()
        self.call(
            AgentTurnFrame(
                phase="started", workflow_turn_id=self.turn.turn_id, workflow_message_id=self.turn.message_id
            )
        )
        faults.hit(faults.AGENT_AFTER_TURN_STARTED)

    def _agent_end(self, record: dict[str, Any]) -> None:
        assert self.turn is not None
        messages = record.get("messages")
        for message in reversed(messages if isinstance(messages, list) else []):
            if isinstance(message, dict) and message.get("role") == "assistant":
                self._note_end(message)
                break
        if self.turn.stop_reason == "error":
            self.turn.end_due_ns = time.monotonic_ns() + self.launch.retry_settle_ms * 1_000_000
            return
        self._end_turn()

    def _note_end(self, message: dict[str, Any]) -> None:
        """How the open turn's last assistant message stopped, and Pi's error text when it failed."""
        assert self.turn is not None
        self.turn.stop_reason = message.get("stopReason") or self.turn.stop_reason
        error = message.get("errorMessage")
        self.turn.error = error if isinstance(error, str) and error else None

    def _end_turn(self) -> None:
        """C9: the turn's report, after what it settled is recorded; its receipt may hold a reminder."""
        turn = self.turn
        assert turn is not None
        self._read_session()
        self._flush()
        faults.hit(faults.AGENT_BEFORE_TURN_END)
        elapsed = turn.elapsed_ms()
        reply = None
        if self.launch.contract.expected_output.kind == "assistant-message" and turn.response_entry_id:
            text = assistant_text(self.session.by_id[turn.response_entry_id].entry)
            reply = BlobValue.of_text(text) if text else None
        self.turn = None
        self.sample_due_ns = None
        self.spent_ms += elapsed
        stopped = (turn.stop_reason or "stop")[:64]
        provider_error = None
        if stopped == "error":
            provider_error = BlobValue.of_text((turn.error or "Pi gave no message")[:MAX_FAILURE_CHARS])
        receipt = self.call(
            AgentTurnFrame(
                phase="ended",
                workflow_turn_id=turn.turn_id,
                workflow_message_id=turn.message_id,
                stop_reason=stopped,
                response_entry_id=turn.response_entry_id,
                reply=reply,
                elapsed_ms=elapsed,
                provider_error=provider_error,
            )
        )
        pending = receipt.get("pending") or []
        self._queue([PendingStep(workflow_message_id=p["workflowMessageId"], text=p["text"]) for p in pending])

    def _read_session(self) -> None:
        """New settled entries: C6 for the steps that appeared, the response, the capture."""
        added = self.session.read()
        if not added:
            return
        for line in added:
            entry_id = line.entry["id"]
            if entry_id not in self.captured:
                self.captured.add(entry_id)
                self.capture.add_entry(line)
                self._due_flush()
            if self.turn is not None and role_of(line.entry) == "assistant" and stop_reason(line.entry) is not None:
                self.turn.response_entry_id = entry_id
                self.capture.link(response_entry_id=entry_id)
        if self.unconfirmed:
            for message_id, entry_id in steps_on(self.session.branch(), set(self.unconfirmed)):
                del self.unconfirmed[message_id]
                self.call(AgentMessageSentFrame(workflow_message_id=message_id, pi_entry_id=entry_id))
                faults.hit(faults.AGENT_AFTER_MESSAGE_SENT)
                if not self.prompt_linked:
                    self.prompt_linked = True
                    self.capture.link(prompt_entry_id=entry_id)

    # --- time: samples, flushes, a deferred turn end ---------------------------------------

    def _due_flush(self) -> None:
        if self.flush_due_ns is None:
            self.flush_due_ns = time.monotonic_ns() + self.launch.flush_ms * 1_000_000

    def _schedule_sample(self) -> None:
        """The next sample of the open turn: its next multiple of sample_ms, or the moment the budget
        runs out when that comes first."""
        assert self.turn is not None
        launch = self.launch
        self.sample_due_ns = next_sample_ns(
            time.monotonic_ns(), self.turn.started_ns, launch.sample_ms, launch.timeout_ms, self.spent_ms
        )

    def _timeout_s(self) -> float:
        dues = [due for due in (self.flush_due_ns, self.sample_due_ns) if due is not None]
        if self.turn is not None and self.turn.end_due_ns is not None:
            dues.append(self.turn.end_due_ns)
        if not dues:
            return 3600.0
        return max(0.0, (min(dues) - time.monotonic_ns()) / 1e9)

    def _tick(self) -> None:
        if self.stopping is not None:
            return
        now = time.monotonic_ns()
        if self.turn is not None and self.turn.end_due_ns is not None and now >= self.turn.end_due_ns:
            self.turn.end_due_ns = None
            self._end_turn()
            return
        sample = self.sample_due_ns is not None and now >= self.sample_due_ns
        if sample or self.capture.full or (self.flush_due_ns is not None and now >= self.flush_due_ns):
            self._read_session()
            self._flush()

    def _flush(self) -> None:
        """agent.record until nothing waits (each with a sample while a turn is open)."""
        self.flush_due_ns = None
        first = True
        while self.stopping is None and (self.capture.waiting or (first and self.turn is not None)):
            first = False
            sample = ActiveSample(elapsed_ms=self.turn.elapsed_ms()) if self.turn is not None else None
            record = self.capture.take(
                sample,
                self.turn.turn_id if self.turn else None,
                self.current.workflow_message_id if self.current else None,
            )
            if self.turn is not None and self.sample_due_ns is not None and time.monotonic_ns() >= self.sample_due_ns:
                self._schedule_sample()
            self.call(record)
            faults.hit(faults.AGENT_AFTER_RECORD)

    # --- the end -----------------------------------------------------------------------------

    def _close(self) -> int:
        """C12: abort a running turn, close the segment, let Pi go (killed after the grace). An idle
        Pi ends first (killed): it wrote each entry as it settled and writes nothing more, and the
        run's next host may start on its session file once this host is gone."""
        assert self.pi is not None
        timing = ", ".join(f"{name} {self.timing[name]}" for name in TIMING if name in self.timing)
        log.info("agent host: segment %s closes: %s (epoch ms: %s)", self.launch.segment_id, self.stopping, timing)
        idle = self.turn is None and not self.awaiting_start
        if not idle:
            self.pi.send({"type": "abort"})
        if not self.timed_out:  # what settled is recorded (after a timeout the attempt is over)
            self.stopping = None
            self._read_session()
            self._flush()
        if idle:  # (its shutdown on end of input takes 0.1 s, on every step's path)
            self.pi.kill()
            self.pi.wait(10)
        faults.hit(faults.AGENT_BEFORE_CLOSE)
        self.call(AgentCloseFrame(elapsed_ms=self.turn.elapsed_ms() if self.turn is not None else None))
        self.pi.close_input()
        if self.pi.wait(self.launch.abort_grace_ms / 1000) is None:
            log.warning("agent host: Pi did not exit within %d ms of its end; killed", self.launch.abort_grace_ms)
            self.pi.kill()
            self.pi.wait(10)
        return HOST_EXIT_DONE


def main() -> int:
    """Serve one launch; the exit status. Every frame and stderr line is flushed when it returns."""
    host = Host(sys.stdin.buffer, sys.stdout.buffer)
    relay_logs(sys.stdout.buffer)
    sys.stdout = sys.stderr  # nothing printed may corrupt the channel
    status = host.serve()
    if host.failure:
        host.send_failure(host.failure)
    if os.getpgrp() == os.getpid():  # the supervisor started this group: end whatever Pi left in it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(os.getpgrp(), signal.SIGTERM)
    return status

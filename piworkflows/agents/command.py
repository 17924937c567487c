"""The command executor: an agent step performed by another command-line agent (``command(argv)``).

::

    host ── agent.branch (C5: no branch to walk; its receipt lists the step to send) ──> supervisor
    host ── agent.turn started (C7: the command's run is the step's one turn; the interval opens)
         ── argv started in the project, in the host's process group, with the host's environment;
            the step message written to its stdin, which then closes
         ── agent.message_sent (C6: the step, as the prompt entry) ── agent.record (C8: the prompt
            entry; then a sample every sample_ms while the command runs)
    a sample spends the budget ({"timedOut": true}): SIGTERM, SIGKILL after abort_grace_ms,
         agent.turn ended (aborted by the server)
    the command ends, its stdout read to the end ── agent.record (the output entry, the response)
         exit 0 and usable stdout (JSON when the output has a schema, else the text):
           ── client.v1 interaction.submit on the server's socket, as the workflow tool submits
              (C10, the same validator, C11) ── agent.turn ended (C9)
           an assistant-message reply goes with agent.turn ended instead (the writer judges it)
         otherwise ── agent.turn ended with the error: the attempt fails
    agent.close (C12); the host exits

A command runs once per segment and is never reminded: a run that gives no accepted output fails
its attempt, ``commandFailed`` (it could not start, exited non-zero or by a signal, printed
nothing, more than MAX_OUTPUT_BYTES, text that is not UTF-8, or no JSON where a schema is set),
or with the code of the validator's rejection (``validationFailed``, ``validatorFailed``) and
its error. A host killed mid-run (a crash, a pause) leaves the step ``sent``: the next host runs
the command again on the ``resumed`` step.

The two captured entries are shaped like Pi's message entries: the step message as the ``user``
entry, the stdout as the ``assistant`` entry (with ``stopReason`` and ``exitCode``), their ids
8 hex digits derived from the segment.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import IO, Any, Protocol

from piworkflows import faults
from piworkflows.agents.capture import Capture, next_sample_ns, now_ms, prompt_event
from piworkflows.agents.command_output import (
    MAX_OUTPUT_BYTES,
    Failure,
    Finished,
    entry_id,
    entry_of,
    exit_problem,
    output_of,
    submission_key,
    submit,
    verdict_of,
)
from piworkflows.protocol import client_v1
from piworkflows.protocol.internal.agents import (
    HOST_EXIT_DONE,
    ActiveSample,
    AgentBranchFrame,
    AgentCloseFrame,
    AgentLaunch,
    AgentMessageSentFrame,
    AgentTurnFrame,
    PendingStep,
    SessionEvent,
)
from piworkflows.protocol.internal.base import BlobValue, Frame

log = logging.getLogger("piworkflows.agents")

MAX_ERROR_CHARS = 4000
STDERR_LINES = 20
STDERR_LINE_CHARS = 512

Item = tuple[str, Any]


# --- the command ---------------------------------------------------------------------------


class CommandProcess:
    """A started command: the step message fed to its stdin (then closed), its stdout read to the
    end, the tail of its stderr kept; ``ended(Finished)`` once it exited and its stdout closed."""

    def __init__(
        self, argv: list[str], cwd: str, env: dict[str, str], stdin: bytes, ended: Callable[[Finished], None]
    ) -> None:
        # Raises OSError (FileNotFoundError, PermissionError ...) when it cannot be started.
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._feed, args=(self.proc.stdin, stdin), daemon=True).start()
        self._stderr = threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True)
        self._stderr.start()
        threading.Thread(target=self._read, args=(self.proc.stdout, ended), daemon=True).start()

    @staticmethod
    def _feed(stream: IO[bytes], data: bytes) -> None:
        try:
            stream.write(data)
        except (BrokenPipeError, OSError, ValueError):
            pass  # the command did not read it all: its exit and output tell the rest
        finally:
            try:
                stream.close()
            except (BrokenPipeError, OSError):
                pass

    def _read(self, stream: IO[bytes], ended: Callable[[Finished], None]) -> None:
        kept, overflowed = bytearray(), False
        while chunk := stream.read1(1 << 16):  # type: ignore[attr-defined]
            if overflowed or len(kept) + len(chunk) > MAX_OUTPUT_BYTES:
                overflowed = True
            else:
                kept += chunk
        code = self.proc.wait()
        self._stderr.join(1.0)
        last = next((line for line in reversed(self.stderr_tail) if line.strip()), "")
        ended(Finished(code, bytes(kept), overflowed, last))

    def _read_stderr(self, stream: IO[bytes]) -> None:
        partial = b""
        while data := stream.read1(1 << 16):  # type: ignore[attr-defined]
            *lines, partial = (partial + data).split(b"\n")
            for line in lines:
                self.stderr_tail.append(line.decode("utf-8", errors="replace")[:STDERR_LINE_CHARS])
        if partial:
            self.stderr_tail.append(partial.decode("utf-8", errors="replace")[:STDERR_LINE_CHARS])

    def stop(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL when it still runs after ``grace_s``; returns once it exited."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("agent host: the command did not exit within %.1f s of SIGTERM; killed", grace_s)
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


# --- one segment ---------------------------------------------------------------------------


class Channel(Protocol):
    """What the command executor uses of its agent host (host.Host)."""

    inbox: queue.Queue[Item]
    stopping: str | None  # why the segment closes now (a receipt said so: the budget is spent)

    def call(self, frame: Frame) -> dict[str, Any]: ...

    def next_item(self, timeout_s: float | None) -> Item | None: ...


class _Gone(Exception):
    """The supervisor is gone: nothing may act without an owner."""


class CommandStep:
    """One segment of a command step, driven over the host's channel to the supervisor."""

    def __init__(self, host: Channel, launch: AgentLaunch) -> None:
        self.host = host
        self.launch = launch
        self.capture = Capture()
        self.process: CommandProcess | None = None
        self.turn_id = f"turn-{launch.segment_id}-1"
        self.prompt_id = entry_id(launch.segment_id, "prompt")
        self.output_id = entry_id(launch.segment_id, "output")
        self.response_id: str | None = None  # the output entry, once recorded
        self.step: PendingStep | None = None
        self.started_ns = 0
        self.sample_due_ns: int | None = None
        self.stop_submitting = threading.Event()

    def drive(self) -> int:
        """The segment, from C5 to C12; the host's exit status."""
        try:
            faults.hit(faults.AGENT_AFTER_OPEN)
            pending = self.host.call(AgentBranchFrame()).get("pending")
            steps = (
                list(self.launch.pending)
                if pending is None
                else [PendingStep(workflow_message_id=p["workflowMessageId"], text=p["text"]) for p in pending]
            )
            if self.host.stopping is None and steps:
                self._run(steps[-1])  # (one pending step unless a crash left more; the latest says it all)
            faults.hit(faults.AGENT_BEFORE_CLOSE)
            self.host.call(AgentCloseFrame())
            return HOST_EXIT_DONE
        except _Gone:
            return HOST_EXIT_DONE
        finally:
            self.stop_submitting.set()
            if self.process is not None:
                self.process.kill()

    def _run(self, step: PendingStep) -> None:
        launch, self.step = self.launch, step
        argv = list(launch.contract.executor.argv or [])
        self.started_ns = time.monotonic_ns()
        self.host.call(
            AgentTurnFrame(phase="started", workflow_turn_id=self.turn_id, workflow_message_id=step.workflow_message_id)
        )
        faults.hit(faults.AGENT_AFTER_TURN_STARTED)
        faults.hit(faults.AGENT_BEFORE_PROMPT)
        try:
            self.process = CommandProcess(
                argv,
                launch.project_path,
                dict(os.environ),
                step.text.encode("utf-8"),
                lambda finished: self.host.inbox.put(("command_ended", finished)),
            )
        except OSError as exc:
            self._end(("commandFailed", f"the command could not be started ({argv[0]}: {exc.strerror or exc})"))
            return
        faults.hit(faults.AGENT_AFTER_PROMPT)
        at = now_ms()
        self.capture.add(prompt_event(step.workflow_message_id, at))
        self.capture.add(SessionEvent(event_type="agent_start", event_role="command", started_at=at))
        self.capture.entries.append(entry_of(self.prompt_id, None, "user", step.text, at))
        self.host.call(AgentMessageSentFrame(workflow_message_id=step.workflow_message_id, pi_entry_id=self.prompt_id))
        faults.hit(faults.AGENT_AFTER_MESSAGE_SENT)
        self.capture.link(prompt_entry_id=self.prompt_id)
        self._record()
        finished: Finished | None = self._await("command_ended")
        if finished is None:  # the budget is spent (a sample timed the attempt out)
            self.process.stop(launch.abort_grace_ms / 1000)
            self._end(aborted=True)
            return
        self._captured(finished)
        if self.host.stopping is not None:
            self._end(aborted=True)
            return
        output = output_of(launch.contract.expected_output, finished)
        if output.problem is not None:
            self._end(("commandFailed", output.problem))
        elif output.reply is not None:
            self._end(reply=output.reply)
        else:
            self._end(self._submit(output.value))

    def _captured(self, finished: Finished) -> None:
        """The command's end and its stdout, as the attempt's response entry."""
        at = now_ms()
        stop = "stop" if exit_problem(finished.returncode) is None else "error"
        status = f"exit {finished.returncode}"
        self.capture.add(SessionEvent(event_type="agent_end", event_role="command", event_status=status, ended_at=at))
        text = finished.stdout.decode("utf-8", errors="replace")
        fields = {"stopReason": stop, "exitCode": finished.returncode}
        self.capture.entries.append(entry_of(self.output_id, self.prompt_id, "assistant", text, at, **fields))
        self.capture.link(response_entry_id=self.output_id)
        self._record()
        if not self.capture.waiting:  # recorded (a spent budget records nothing more)
            self.response_id = self.output_id

    def _submit(self, value: Any) -> Failure | None:
        """The output through interaction.submit and the validator; None when it was accepted."""
        launch = self.launch
        key = submission_key(launch.segment_id)
        payload = client_v1.InteractionSubmitPayload(
            targetSessionId=launch.session_id,
            coordinatorEpoch=launch.coordinator_epoch,
            requestId=launch.request_id,
            submissionId=key,
            value=client_v1.SubmittedValue(output=value),
        )
        request = client_v1.Request(
            requestId="command-" + uuid.uuid4().hex,
            clientId=f"pi-workflows-command:{launch.segment_id}",
            operation="interaction.submit",
            idempotencyKey=key,
            payload=payload.model_dump(mode="json", exclude_defaults=True),  # as the tool sends it: no "operator"
        )
        try:
            client_v1.encode(request)
        except ValueError:
            return "commandFailed", "the command's output is larger than the server takes (1 MiB)"

        def send() -> None:
            self.host.inbox.put(("submitted", submit(launch.socket_path, request, self.stop_submitting)))

        threading.Thread(target=send, daemon=True).start()
        response: client_v1.Response | None = self._await("submitted")
        if response is None:  # the budget ran out while the output was validated
            return None
        return verdict_of(response)

    def _end(self, failure: Failure | None = None, reply: str | None = None, aborted: bool = False) -> None:
        """C9: the run's turn ends, with its reply or the failure that fails the attempt."""
        assert self.step is not None
        faults.hit(faults.AGENT_BEFORE_TURN_END)
        self.sample_due_ns = None
        code, error = failure if failure is not None else (None, None)
        if aborted or self.host.stopping is not None:
            code = error = None  # the attempt already ended (its budget); the end only closes the turn
        self.host.call(
            AgentTurnFrame(
                phase="ended",
                workflow_turn_id=self.turn_id,
                workflow_message_id=self.step.workflow_message_id,
                stop_reason="aborted" if aborted else ("error" if code == "commandFailed" else "stop"),
                response_entry_id=self.response_id,
                reply=BlobValue.of_text(reply) if reply is not None else None,
                aborted_by_server=aborted or self.host.stopping is not None,
                elapsed_ms=self._elapsed_ms(),
                error_code=code,
                error=BlobValue.of_text(error[:MAX_ERROR_CHARS]) if error is not None else None,
            )
        )

    # --- time: samples while the command runs and its output is validated ------------------

    def _elapsed_ms(self) -> int:
        return (time.monotonic_ns() - self.started_ns) // 1_000_000

    def _await(self, kind: str) -> Any:
        """The next ``kind`` item, sampling the open turn meanwhile; None once the segment stops (a
        sample spent the budget)."""
        while self.host.stopping is None:
            due = self.sample_due_ns
            item = self.host.next_item(None if due is None else max(0.0, (due - time.monotonic_ns()) / 1e9))
            if item is not None:
                got, value = item
                if got == "eof":
                    raise _Gone
                if got == kind:
                    return value
                log.warning(
                    "agent host: unexpected %s while the command runs", value.get("k") if got == "frame" else got
                )
            if self.sample_due_ns is not None and time.monotonic_ns() >= self.sample_due_ns:
                self._record()
        return None

    def _record(self) -> None:
        """agent.record until nothing waits, each with a sample of the open turn."""
        launch, first = self.launch, True
        while self.host.stopping is None and (first or self.capture.waiting):
            first = False
            sample = ActiveSample(elapsed_ms=self._elapsed_ms())
            self.sample_due_ns = next_sample_ns(
                time.monotonic_ns(), self.started_ns, launch.sample_ms, launch.timeout_ms, launch.elapsed_ms
            )
            assert self.step is not None
            self.host.call(self.capture.take(sample, self.turn_id, self.step.workflow_message_id))
            faults.hit(faults.AGENT_AFTER_RECORD)

"""Live watches for clients: a run's view (``view.run.watch``) or the run list's first page
(``view.runs.watch``) as the server sends them, on a connection of their own.

::

    RunWatch(state_dir, run_id)        connect ── hello ── view.run.watch {subscriptionId, revision}
      reader thread: every line ──> queue            (responses and events of this connection)
      next(timeout) ──> the newest document (a run view: a snapshot, then kept current with the
      ops of run_patch events), or None when none came within timeout
      connection lost: connect again within retry_for and watch again from the revision held; the
      server then sends the retained ops since (or a snapshot), so nothing is missed
    RunsWatch(state_dir, filters)     the same with view.runs.watch: each ``runs`` page

A watcher that reads slowly gets the newest document, never a stale one as current. A refusal (an
unknown run: ``notFound``) and the run's deletion (an ``unavailable`` event) raise ``WatchEnded``.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any

from piworkflows.client import ClientError, ServerNotRunning, ServerRefused, WorkflowClient
from piworkflows.protocol import envelope
from piworkflows.views.materialize import Document, Gap


class WatchEnded(ClientError):
    """The server refused the watch or ended it: ``outcome`` and ``code`` say why."""

    def __init__(self, outcome: str, code: str, message: str) -> None:
        super().__init__(message)
        self.outcome, self.code = outcome, code


_LOST = object()  # the reader thread's last item: its connection ended


class _Watch:
    operation = ""
    event = ""

    def __init__(
        self, state_dir: Any, run_id: str | None, payload: dict[str, Any], retry_for: float, client_id: str | None
    ) -> None:
        self.state_dir, self.run_id, self.payload = state_dir, run_id, payload
        self.retry_for = retry_for
        self.client_id = client_id
        self.subscription_id = "watch-" + uuid.uuid4().hex
        self.revision: Any = None  # of the newest document received
        self.document: dict[str, Any] | None = None
        self._items: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._generation = 0
        self._client: WorkflowClient | None = None
        self._request_id: str | None = None
        self._subscribe()

    def __enter__(self) -> _Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.shutdown()  # ends the reader thread's read
            self._client = None

    def _subscribe(self) -> None:
        """Connect (raises ServerNotRunning, ServerRefused) and ask for the watch."""
        self.close()
        client = WorkflowClient(self.state_dir, client_id=self.client_id, retry_for=0)
        client.connect()
        client.stream()
        self._generation += 1
        self._request_id = "req-" + uuid.uuid4().hex
        payload = {**self.payload, "subscriptionId": self.subscription_id}
        if self.revision is not None and self.operation == "view.run.watch":
            payload["revision"] = self.revision
        line = envelope.request_line(
            request_id=self._request_id,
            client_id=client.client_id,
            operation=self.operation,
            idempotency_key="key-" + uuid.uuid4().hex,
            payload=payload,
            run_id=self.run_id,
        )
        client.send(line)
        self._client = client
        threading.Thread(target=self._read, args=(self._generation, client), daemon=True, name="watch").start()

    def _read(self, generation: int, client: WorkflowClient) -> None:
        try:
            while True:
                self._items.put((generation, client.read_message()))
        except (OSError, ValueError, AttributeError):  # its end; AttributeError: closed under it
            pass
        finally:
            self._items.put((generation, _LOST))

    def next(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The newest document the server sent (all that waited are read; the last one wins), or
        None when none came within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        newest: dict[str, Any] | None = None
        while True:
            block = newest is None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                generation, item = self._items.get(block=block, timeout=left if block else None)
            except queue.Empty:
                return newest
            if generation != self._generation:
                continue  # of a connection given up
            if item is _LOST:
                self._reconnect()
                continue
            found = self._take(item)
            if found is not None:
                newest = found

    def _take(self, message: dict[str, Any]) -> dict[str, Any] | None:
        if message.get("type") == "response" and message.get("requestId") == self._request_id:
            if message.get("outcome") != "accepted":
                receipt = message.get("receipt")
                code = receipt.get("code") if isinstance(receipt, dict) else None
                raise WatchEnded(str(message.get("outcome")), str(code), str(message.get("error")))
            return None
        if message.get("type") != "event" or message.get("subscriptionId") != self.subscription_id:
            return None
        payload = message.get("payload")
        if message.get("event") == "unavailable":
            code = payload.get("code") if isinstance(payload, dict) else None
            text = payload.get("message") if isinstance(payload, dict) else None
            raise WatchEnded("unavailable", str(code), str(text or "the server ended the watch"))
        if not isinstance(payload, dict):
            return None
        return self._event(str(message.get("event")), payload)

    def _event(self, event: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The document an event of this watch makes current, if any."""
        if event != self.event:
            return None
        self.document, self.revision = payload, payload.get("revision")
        return payload

    def _reconnect(self) -> None:
        """The connection ended: watch again on a new one until retry_for has passed."""
        deadline = time.monotonic() + self.retry_for
        delay = 0.05
        while True:
            try:
                self._subscribe()
                return
            except (ServerNotRunning, ServerRefused, OSError, ConnectionError, ClientError):
                if time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class RunWatch(_Watch):
    """One run's view (``pi-workflows.run-view.v1``): a snapshot, then the ops of each revision
    applied strictly (views/materialize.py). A patch that does not apply is a gap: the watch starts
    over with a snapshot. ``patches=False``: snapshots only."""

    operation, event = "view.run.watch", "run_snapshot"

    def __init__(
        self,
        state_dir: Any,
        run_id: str,
        retry_for: float = 30.0,
        client_id: str | None = None,
        patches: bool = True,
    ) -> None:
        self._held: Document | None = None
        super().__init__(state_dir, run_id, {"patches": patches}, retry_for, client_id)

    def _event(self, event: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        if event == "run_snapshot":
            self._held = Document(payload)
        elif event == "run_patch" and self._held is not None:
            try:
                self._held.apply(payload)
            except Gap:
                self._start_over()
                return None
        else:
            return None
        self.document, self.revision = self._held.view, self._held.revision
        return self.document

    def _start_over(self) -> None:
        """A gap: watch again from nothing (the server sends a snapshot)."""
        self._held, self.revision = None, None
        self._subscribe()


class RunsWatch(_Watch):
    """The run list's first page (``pi-workflows.run-list-page.v1``) as it changes; ``filters``
    are run.list's (projectPath, status, workflowName, since, limit)."""

    operation, event = "view.runs.watch", "runs"

    def __init__(
        self,
        state_dir: Any,
        filters: dict[str, Any] | None = None,
        retry_for: float = 30.0,
        client_id: str | None = None,
    ) -> None:
        super().__init__(state_dir, None, dict(filters or {}), retry_for, client_id)

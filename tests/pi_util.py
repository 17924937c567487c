"""Real Pi in tests: the scripted model as its only provider, and the peers an agent host talks to.

::

    agent_dir(tmp, model)    a PI_CODING_AGENT_DIR whose models.json names provider `scripted`
    ClientServer             a client.v1 socket (hello, then each request answered by the test's
                             function; every parsed request recorded), for the workflow tool
    HostPeer                 an agent host (host.Host) in a thread on two pipes, and this test as its
                             supervisor: frames read, replies sent
    agent_env(tmp, pi, model)  a server's settings for agent steps on the real Pi and the model
    submit(output)           a scripted model turn that submits ``output`` through the workflow tool
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piworkflows.agents.host import Host
from piworkflows.protocol import client_v1, frames
from piworkflows.protocol.internal.base import Frame
from piworkflows.protocol.internal.writer import Reply
from piworkflows.testing import scripted_model
from piworkflows.testing.scripted_model import ScriptedModel
from tests.server_util import SCHEDULER_TICK

PROVIDER = scripted_model.PROVIDER


def agent_dir(root: Path, model: ScriptedModel) -> Path:
    """A Pi agent dir whose models.json serves every scripted model id as provider ``scripted``."""
    return model.write_pi_config(root)


def submit(output: Any) -> dict[str, Any]:
    """A model turn that calls the workflow tool with ``output`` for the request it was given."""
    arguments = {"action": "submit", "requestId": "${requestId}", "output": output}
    return {"tool_calls": [{"name": "workflow", "arguments": arguments}]}


def agent_env(tmp_path: Path, pi_command: list[str], model: ScriptedModel) -> dict[str, str]:
    """A server's settings for agent steps on the real Pi and ``model`` (its first script's model)."""
    return {
        **SCHEDULER_TICK,
        "HOME": str(tmp_path / "home"),
        "PI_WORKFLOWS_PI_COMMAND": pi_command[0],
        "PI_CODING_AGENT_DIR": str(model.write_pi_config(tmp_path / "pi-agent")),
        "PI_WORKFLOWS_AGENT_MODEL": f"scripted/{model.models()[0]}",
        "PI_WORKFLOWS_ACTIVE_SAMPLE_MS": "100",
        "PI_WORKFLOWS_AGENT_FLUSH_MS": "50",
    }


def pi_env(agent: Path, home: Path) -> dict[str, str]:
    """The environment of a Pi (or of a host that starts one): offline, private HOME and agent dir."""
    return {**os.environ, "HOME": str(home), "PI_CODING_AGENT_DIR": str(agent), "PI_OFFLINE": "1"}


Answer = Callable[[client_v1.Request], client_v1.Response | None]  # None: the connection is dropped


def accept(request: client_v1.Request) -> client_v1.Response:
    receipt = {"requestId": request.payload.get("requestId"), "status": "accepted"}
    if request.operation == "interaction.submit":
        receipt["submissionId"] = request.payload.get("submissionId")
    return client_v1.Response(requestId=request.requestId, outcome="accepted", receipt=receipt)


class ClientServer:
    """A client.v1 server on a Unix socket in a short private directory: the hello, then each
    request line parsed exactly as the real server parses it and answered by ``answer``."""

    def __init__(self, answer: Answer = accept) -> None:
        self.directory = tempfile.mkdtemp(prefix="piw-")
        self.path = os.path.join(self.directory, "host.sock")
        self.answer = answer
        self.requests: list[client_v1.Request] = []
        self.lines: list[bytes] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._exchange(conn)
        except ConnectionError:
            pass  # the tool's Pi was killed or aborted mid-request

    def _exchange(self, conn: socket.socket) -> None:
        with conn:
            conn.sendall(client_v1.encode(client_v1.Hello(connectionId="conn-test", packageVersion="0")))
            buffer = b""
            while data := conn.recv(1 << 16):
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self.lines.append(line + b"\n")
                    request = client_v1.parse_request(line + b"\n")  # raises on a non-canonical line
                    self.requests.append(request)
                    response = self.answer(request)
                    if response is None:
                        return
                    conn.sendall(client_v1.encode(response))

    def close(self) -> None:
        self._server.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ClientServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostPeer:
    """An agent host in a thread, and this test as its supervisor."""

    def __init__(self) -> None:
        to_host_r, self._to_host = os.pipe()
        self._from_host, from_host_w = os.pipe()
        self.host = Host(os.fdopen(to_host_r, "rb"), os.fdopen(from_host_w, "wb"))
        self.status: int | None = None
        self.decoder = frames.FrameDecoder()
        self.waiting: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        try:
            self.status = self.host.serve()
        finally:
            self.host.stdout.close()

    def start(self, launch: Frame) -> None:
        self.thread.start()
        self.send(launch.kind, 0, launch.model_dump())

    def send(self, kind: str, corr_id: int, body: Any) -> None:
        os.write(self._to_host, frames.encode(kind, corr_id, body))

    def receive(self, timeout: float = 60.0) -> dict[str, Any] | None:
        """The host's next frame (log frames left out); None once it closed its channel."""
        deadline = time.monotonic() + timeout
        while True:
            while self.waiting:
                frame = self.waiting.pop(0)
                if frame["k"] != "log":
                    return frame
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self._from_host], [], [], left)[0], "no frame from the host in time"
            data = os.read(self._from_host, 1 << 20)
            if not data:
                return None
            self.waiting.extend(self.decoder.feed(data))

    def reply(self, frame: dict[str, Any], outcome: str = "accepted", receipt: dict[str, Any] | None = None) -> None:
        self.send(Reply.kind, frame["id"], Reply(outcome=outcome, receipt=receipt).model_dump())

    def close(self) -> None:
        os.close(self._to_host)  # end of file: the host kills Pi and returns
        self.thread.join(30)
        os.close(self._from_host)

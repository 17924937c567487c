"""``python -m piworkflows.demo``: the main job on a fresh temporary state dir.

Starts a real server (and a local webhook receiver for the demo's http
node), runs the built-in demo workflow through the public client (exactly
what `pi-workflows run start builtin:demo` does), answers its checkpoint
like an operator would, prints the run view as it finishes; then runs the
built-in agent-demo workflow, whose agent step and decision run on the real
Pi coding agent against a scripted model (provider ``scripted``: answers
written in advance, no network, no API key), and stops the server. Nothing
outside the temporary directory is touched. Pi comes from
PI_WORKFLOWS_PI_COMMAND, else `pi-workflows setup pi` (scripts/demo runs it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from piworkflows import canonical
from piworkflows.client import WorkflowClient, start_server, stop_server
from piworkflows.paths import StatePaths
from piworkflows.testing.scripted_model import ScriptedModel


def wait_for(client: WorkflowClient, run_id: str, statuses: set[str], timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        view = client.request("view.run.get", {}, run_id=run_id).receipt
        if view["display"]["status"] in statuses:
            return view
        if time.monotonic() > deadline:
            raise SystemExit(f"the run did not reach {sorted(statuses)} within {timeout:g} s")
        time.sleep(0.05)


class _Hook(BaseHTTPRequestHandler):
    """The demo's webhook receiver: answers 200 with what it got."""

    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        data = canonical.dumps_bytes(
            {"received": canonical.loads(body) if body else None, "idempotencyKey": self.headers.get("Idempotency-Key")}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


# What the scripted model answers the agent-demo's two steps with: each a call of the workflow tool.
SCRIPT = [
    {
        "tool_calls": [
            {
                "name": "workflow",
                "arguments": {
                    "action": "submit",
                    "requestId": "${requestId}",
                    "output": {"summary": "All 41 tests pass after the change.", "risk": "low"},
                },
            }
        ]
    },
    {
        "tool_calls": [
            {
                "name": "workflow",
                "arguments": {"action": "submit", "requestId": "${requestId}", "output": {"route": "ship"}},
            }
        ]
    },
]


def print_done(view: dict, outputs: bool) -> None:
    """The run's end and one line per step of its view (a value over 256 bytes is a content
    reference: its size is shown)."""
    final = canonical.dumps(view["state"].get("finalOutput"))
    print(f"{view['runId']} {view['display']['status']}: output {final}")
    for index, step in enumerate(view["state"]["steps"], start=view["stepStart"]):
        output = step.get("output")
        if isinstance(output, dict) and "$artifact" in output:
            shown = f"({output['$artifact']['bytes']} bytes)"
        else:
            shown = canonical.dumps(output)[:100] if output is not None else ""
        line = f"  step {index}: {step['nodeId']} [{step['nodeType']}] {step['status']}"
        print(f"{line} {shown}" if outputs and shown else line)


def agent_demo(client: WorkflowClient, project: str) -> str:
    """builtin:agent-demo on the scripted model: its final display status."""
    started = client.request("run.start", {"projectPath": project, "workflowName": "builtin:agent-demo", "input": {}})
    run_id = started.receipt["runId"]
    print(f"run.start builtin:agent-demo -> {started.outcome}: {run_id}")
    print("  agent steps run on the real Pi against a SCRIPTED model (provider 'scripted', no network, no API key)")
    done = wait_for(client, run_id, {"completed", "failed", "cancelled", "timed_out"}, timeout=120)
    print_done(done, outputs=True)
    return str(done["display"]["status"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m piworkflows.demo")
    parser.add_argument(
        "demo",
        nargs="?",
        choices=["main", "telegram"],
        default="main",
        help="telegram: a decision answered by a simulated chat user (piworkflows/demo_telegram.py)",
    )
    parser.add_argument("--who", default="you")
    args = parser.parse_args(argv)
    if args.demo == "telegram":
        from piworkflows import demo_telegram

        return demo_telegram.main()
    with tempfile.TemporaryDirectory(prefix="piw-demo-") as tmp:
        paths = StatePaths.resolve(Path(tmp) / "state")
        print(f"state dir: {paths.state_dir}")
        hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
        threading.Thread(target=hook.serve_forever, daemon=True).start()
        model = ScriptedModel({"demo": SCRIPT})
        # The server (and the Pi it starts) reads these from its environment: Pi's own configuration
        # names the scripted model as provider "scripted"; the user's ~/.pi/agent is not touched.
        os.environ["PI_CODING_AGENT_DIR"] = str(model.write_pi_config(Path(tmp) / "pi-agent"))
        os.environ["PI_WORKFLOWS_AGENT_MODEL"] = "scripted/demo"
        start_server(paths)
        try:
            with WorkflowClient(paths.state_dir) as client:
                demo_input = {
                    "who": args.who,
                    "noteFile": str(Path(tmp) / "note.txt"),
                    "hookUrl": f"http://127.0.0.1:{hook.server_address[1]}/demo",
                }
                started = client.request(
                    "run.start", {"projectPath": tmp, "workflowName": "builtin:demo", "input": demo_input}
                )
                run_id = started.receipt["runId"]
                print(f"run.start -> {started.outcome}: {run_id}")
                waiting = wait_for(client, run_id, {"waiting", "failed"})
                print(f"{run_id} is {waiting['display']['status']}; controls {waiting['display']['controls']}")
                answered = client.request(
                    "checkpoint.answer", {"nodePath": "ask", "answer": {"continue": True}}, run_id=run_id
                )
                print(f"checkpoint.answer -> {answered.outcome}")
                done = wait_for(client, run_id, {"completed", "failed", "cancelled", "timed_out"})
                print_done(done, outputs=False)
                agent_status = agent_demo(client, tmp)
        finally:
            stop_server(paths)  # waits until the server process is gone, before the directory goes
            hook.shutdown()
            model.close()
    return 0 if done["display"]["status"] == agent_status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

"""``pi-workflows run logs``: a run's steps with their complete output, step by step.

::

    run.logs {after: cursor, nodePath?} ── pages of steps, in order
    each stream a shell step names ── run.logs {content: digest, mediaType, offset}, 256 KiB at
        a time ── the SHA-256 of the whole checked against the digest ── printed
    --follow: a live watch of the run's view (views/watch.py): on each snapshot (is the run
        settled, as run start --wait says) the steps that finished since
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

from piworkflows import canonical
from piworkflows.cli.base import EXIT_RUNTIME, accepted, check, fail, visible, visible_lines
from piworkflows.cli.runs import run_group
from piworkflows.cli.watch import settled
from piworkflows.client import ClientError, ServerNotRunning, ServerRefused, WorkflowClient
from piworkflows.isotime import iso_or_none
from piworkflows.paths import StatePaths
from piworkflows.states import MEDIA_JSON
from piworkflows.views.watch import RunWatch, WatchEnded

STREAMS = ("stdout", "stderr")
Ask = Callable[[str, dict[str, Any]], Any]
Emit = Callable[[dict[str, Any]], None]  # prints one step


@run_group.command("logs")
@click.argument("run_id")
@click.argument("node", required=False)
@click.option(
    "--follow",
    is_flag=True,
    help="Then print each step as it finishes until the run ends or waits; exit 0 only if it completed.",
)
@click.option("--stdout", "only", flag_value="stdout", help="Print only the shell steps' stdout, raw (for piping).")
@click.option("--stderr", "only", flag_value="stderr", help="Print only the shell steps' stderr, raw.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per step per line, stream texts included.")
@click.pass_obj
def run_logs(paths: StatePaths, run_id: str, node: str | None, follow: bool, only: str | None, as_json: bool) -> None:
    """Print a run's steps (of NODE only, if given): node, kind, visit, attempt, how it ended and
    how long it took, a shell step's complete stdout and stderr, the output and the error.

    Example: pi-workflows run logs run-0123abcd build --stdout > build.log
    """
    if only is not None and as_json:
        raise click.UsageError("--json prints both streams; leave out --stdout/--stderr")
    check("run.logs", {"nodePath": node} if node else {}, run_id)
    out = sys.stdout.buffer
    with WorkflowClient(paths.state_dir, retry_for=0) as client, _watch(paths, run_id, follow) as watch:
        ask = asker(client, paths, run_id)
        if node is not None:
            _known_node(ask, run_id, node)
        emit: Emit = _raw(out, ask, only) if only else _json(out, ask) if as_json else _human(out, ask)
        after = None
        while True:
            view = _next(watch) if watch is not None else None  # the first at once, then one per change
            done = view is None or settled(view)
            after, printed = _print_steps(ask, node, after, emit, finished_only=not done)
            if view is None:
                if after is None and only is None and not as_json:
                    _line(out, "no steps" + (f" of {node}" if node else "") + " yet")
                return
            if done:
                status, reason = view["display"]["status"], view["display"]["reason"]
                if only is None and not as_json:
                    _line(out, f"== {run_id} {status}" + (f" ({reason})" if reason else ""))
                sys.exit(0 if status == "completed" else EXIT_RUNTIME)


def _known_node(ask: Ask, run_id: str, node: str) -> None:
    """NODE must be a node of the run's workflow: a typo is an error naming the nodes, not "no steps"."""
    workflow = ask("run.status", {})["workflow"]
    nodes = workflow["nodes"]
    if nodes and node not in nodes:  # (a definition too large to inline lists none: not checked)
        raise click.BadParameter(
            f"{run_id} has no node {node!r}; its nodes: {', '.join(sorted(nodes))}", param_hint="NODE"
        )


@contextlib.contextmanager
def _watch(paths: StatePaths, run_id: str, follow: bool) -> Iterator[RunWatch | None]:
    """With --follow, a live watch of the run's view (its own connection)."""
    if not follow:
        yield None
        return
    try:
        watch = RunWatch(paths.state_dir, run_id, retry_for=30.0)
    except (ServerNotRunning, ServerRefused, OSError, ConnectionError):
        fail(f"no server is running for {paths.state_dir}; start it with 'pi-workflows server start'")
    try:
        yield watch
    finally:
        watch.close()


def _next(watch: RunWatch) -> dict[str, Any]:
    """The run's newest view, waiting for a change when none is new; the watch's end ends the command."""
    try:
        view = watch.next()
    except WatchEnded as exc:
        fail(f"{exc.outcome} ({exc.code}): {exc}")
    except (ClientError, OSError) as exc:
        fail(f"the server stopped answering ({exc})")
    assert view is not None  # no timeout: a view or an exception
    return view


def asker(client: WorkflowClient, paths: StatePaths, run_id: str) -> Ask:
    """One checked request on the run over the open connection; what is not accepted ends the command."""

    def ask(operation: str, payload: dict[str, Any]) -> Any:
        try:
            return accepted(client.request(operation, payload, run_id=run_id))
        except ServerRefused as exc:
            fail(str(exc))
        except (ServerNotRunning, OSError, ConnectionError):
            fail(f"no server is running for {paths.state_dir}; start it with 'pi-workflows server start'")

    return ask


def _print_steps(
    ask: Ask, node: str | None, after: int | None, emit: Emit, finished_only: bool
) -> tuple[int | None, bool]:
    """Emit the steps after ``after`` in order (stopping at the first unfinished one if
    ``finished_only``); the new cursor and whether anything was emitted."""
    printed = False
    while True:
        payload: dict[str, Any] = {} if node is None else {"nodePath": node}
        if after is not None:
            payload["after"] = after
        page = ask("run.logs", payload)
        for step in page["steps"]:
            if finished_only and step["finishedAt"] is None:
                return after, printed
            emit(step)
            after, printed = step["stepIndex"], True
        if page["cursor"] is None:
            return after, printed


def read_content(ask: Ask, reference: dict[str, Any]) -> bytes:
    """A stored stream, read in parts and verified whole against its digest."""
    data = bytearray()
    while True:
        content = {"digest": reference["digest"], "mediaType": reference["mediaType"], "offset": len(data)}
        part = ask("run.logs", {"content": content})
        chunk = base64.b64decode(part["data"])
        data += chunk
        if not chunk or len(data) >= part["byteLength"]:
            break
    if "sha256:" + hashlib.sha256(data).hexdigest() != reference["digest"]:
        fail(f"the stored stream {reference['digest']} did not verify against its digest")
    return bytes(data)


def _streams(ask: Ask, step: dict[str, Any]) -> dict[str, tuple[dict[str, Any], bytes]]:
    """A shell step's streams with their bytes (empty when nothing was stored)."""
    found = {}
    for name in STREAMS:
        reference = (step["streams"] or {}).get(name)
        if reference is not None:
            found[name] = (reference, read_content(ask, reference) if reference["digest"] else b"")
    return found


def _line(out: IO[bytes], text: str) -> None:
    out.write(text.encode("utf-8") + b"\n")


def _raw(out: IO[bytes], ask: Ask, only: str) -> Emit:
    def emit(step: dict[str, Any]) -> None:
        stream = _streams(ask, step).get(only)
        if stream is not None:
            out.write(stream[1])
            out.flush()

    return emit


def _output(ask: Ask, step: dict[str, Any]) -> Any:
    """The step's output whole: one the page left out for its size (``{"omitted": {byteLength,
    digest}}``) is read in parts, as the streams are."""
    output = step["output"]
    if isinstance(output, dict) and set(output) == {"omitted"} and isinstance(output["omitted"], dict):
        reference = {"digest": output["omitted"]["digest"], "mediaType": MEDIA_JSON}
        return canonical.loads(read_content(ask, reference))
    return output


def _json(out: IO[bytes], ask: Ask) -> Emit:
    def emit(step: dict[str, Any]) -> None:
        texts = {name: data.decode("utf-8") for name, (_, data) in _streams(ask, step).items()}
        whole = {**step, "output": _output(ask, step), **{name: texts.get(name) for name in STREAMS}}
        whole |= {name: iso_or_none(step[name]) for name in ("startedAt", "finishedAt")}  # ISO, as everywhere
        _line(out, canonical.dumps(whole))
        out.flush()

    return emit


def _human(out: IO[bytes], ask: Ask) -> Emit:
    """For people: every text from the run (streams, output, error) ``visible``, line by line."""

    def emit(step: dict[str, Any]) -> None:
        _line(out, visible(_header(step)))
        for name, (reference, data) in _streams(ask, step).items():
            seen, kept = reference["seenBytes"], reference["keptBytes"]
            if not seen:
                continue
            if reference["digest"] is None:
                _line(out, f"-- {name}: {seen:,} bytes, not stored --")
                continue
            _line(out, f"-- {name}: {seen:,} bytes --")
            for line in visible_lines(data.decode("utf-8", "replace").removesuffix("\n")):
                _line(out, line)
            if kept < seen:
                _line(out, f"-- {name} cut: {seen - kept:,} bytes not kept (the cap is {kept:,} bytes) --")
        if step["output"] is not None:
            _line(out, "-- output --")
            _line(out, visible(canonical.dumps(_output(ask, step))))
        if step["error"] is not None:
            _line(out, "-- error --")
            for line in visible_lines(step["error"].removesuffix("\n")):
                _line(out, line)
        out.flush()

    return emit


def _header(step: dict[str, Any]) -> str:
    """``== step 3: build (shell) visit 1 attempt 1: failed (nonZeroExit) in 1.2 s``"""
    ended = step["status"] + (f" ({step['errorCode']})" if step["errorCode"] else "")
    if step["finishedAt"] is not None:
        took = step["finishedAt"] - step["startedAt"]
        ended += f" in {took} ms" if took < 1000 else f" in {took / 1000:.1f} s"
    return (
        f"== step {step['stepIndex']}: {step['nodePath']} ({step['nodeKind']}) visit {step['visit']} "
        f"attempt {step['attempt']}: {ended}"
    )

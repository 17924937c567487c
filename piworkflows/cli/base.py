"""The CLI's shared parts: the root group, exit codes, and sending one checked request.

Every command module (``server``, ``runs``, ``find``, ``state``, ``effects``, ``protocol``) adds its
commands to ``main`` here and answers through ``accepted``/``fail``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import click

from piworkflows.client import ServerNotRunning, ServerRefused, StartFailed, WorkflowClient
from piworkflows.errors import StateIncompatible
from piworkflows.paths import StatePaths
from piworkflows.protocol import domain, envelope

EXIT_RUNTIME = 1
EXIT_USAGE = 2  # click's own code for a usage error


# How long a command waits for an answer: longer than the server's own bound on a resolver child
# (resolve_timeout_ms, read from the environment as the server does), so a slow listing is
# answered by the server (its error) before the CLI gives up.
def _answer_wait_s() -> float:
    try:
        return int(os.environ.get("PI_WORKFLOWS_RESOLVE_TIMEOUT_MS") or 30_000) / 1000 + 15
    except ValueError:  # the server refuses such a setting at its start; the CLI waits the default
        return 45.0


ANSWER_WAIT_S = _answer_wait_s()
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
OPERATOR_CLIENT_ID = "pi-workflows-cli-operator"  # stored receipts are per client id


# What a terminal would act on rather than show: C0 controls (tab aside), DEL, C1 controls, and
# the marks that reorder text (bidi embeddings, overrides and isolates).
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\x1b": "\\e"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    point = ord(char)
    return _SHORT.get(char) or (f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}")


def visible(text: str) -> str:
    """Text from a run (a title, an error, a command's output) as a terminal must show it: each control
    character as a visible escape (``\\e``, ``\\r``, ``\\n``, ``\\x9b``, ``\\u202e``) and each lone surrogate
    as U+FFFD, so no data can move the cursor, retitle the window or forge a line. Cut text after this,
    never before (a cut between ESC and ``[`` would leave half a sequence)."""
    return _CONTROLS.sub(_escape, domain.text(text))


def visible_lines(text: str) -> list[str]:
    """Multi-line text from a run as the lines a terminal shows, each ``visible`` (only ``\\n`` ends one)."""
    return [visible(line) for line in text.split("\n")]


def say(line: str) -> None:
    """One line for people on stdout, ``visible``: every human renderer prints through here."""
    click.echo(visible(line))


def fail(message: str) -> NoReturn:
    click.echo(f"pi-workflows: {message}", err=True)
    sys.exit(EXIT_RUNTIME)


class _Main(click.Group):
    """Ctrl-C anywhere exits 130 (click's own handling would print "Aborted!" and exit 1).

    Commands load on first use: ``modules`` (set in cli/__init__.py) names, for each top-level
    command, the modules that add it and its subcommands, so a read command imports only its
    own module; a listing (``--help``) loads them all."""

    modules: dict[str, tuple[str, ...]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.modules))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        wanted = [f"piworkflows.cli.{module}" for module in self.modules.get(cmd_name, ())]
        if any(name not in sys.modules for name in wanted):  # "run" of runs.py alone lacks "run logs"
            for name in wanted:
                importlib.import_module(name)
            from piworkflows.cli import completion  # what was added completes from the server too

            completion.attach(self)
        return super().get_command(ctx, cmd_name)

    def main(self, args: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """Before any command: an argument that is not Unicode text (bytes that are not UTF-8, which
        Python keeps as lone surrogates) is a usage error, exit 2, nothing sent."""
        for index, arg in enumerate(sys.argv[1:] if args is None else args, start=1):
            if isinstance(arg, str) and domain.lone_surrogate(arg) is not None:
                click.echo(f"Error: argument {index} is not UTF-8 text; pass every argument as UTF-8", err=True)
                sys.exit(EXIT_USAGE)
        return super().main(args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\npi-workflows: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Main)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="State directory (default: $PI_WORKFLOWS_STATE_DIR, else ~/.pi/agent/workflows).",
)
@click.version_option(package_name="piworkflows")
@click.pass_context
def main(ctx: click.Context, state_dir: str | None) -> None:
    """Pi Workflows durable workflow server.

    Example: pi-workflows server start && pi-workflows server status
    """
    ctx.obj = StatePaths.resolve(state_dir)


def command_line(*args: str) -> str:
    """A command line for the user to run next, with --state-dir when one was given (outside a
    command, as in the viewer's screens: without)."""
    context = click.get_current_context(silent=True)
    given = context is not None and context.find_root().params.get("state_dir")
    state_dir = ["--state-dir", str(context.obj.state_dir)] if context is not None and given else []
    return shlex.join(["pi-workflows", *state_dir, *args])


def json_argument(source: str, example: str, param_hint: str | None = None) -> Any:
    """A JSON argument as a value of the protocol's domain (no duplicate keys, NaN, Infinity, numbers
    past a double, lone surrogates; at most 256 levels): else a usage error naming why, nothing sent."""
    try:
        return domain.loads(source)
    except domain.OutsideDomain as exc:
        raise click.BadParameter(f"{exc}; pass e.g. {shlex.quote(example)}", param_hint=param_hint) from None


def check_run_id(operation: str, run_id: str | None) -> None:
    """A run id the envelope would refuse is a usage error (nothing sent): the cheap check."""
    if run_id is not None:
        try:
            envelope.check_id(run_id)
        except ValueError as exc:
            raise click.UsageError(f"{operation}: RUN_ID: {exc}") from None


def check(operation: str, payload: Any, run_id: str | None = None) -> None:
    """What the CLI can check itself, with the protocol's own models: a usage error, nothing sent.
    It loads pydantic and every payload model (most of a command's start), so ``request`` runs it
    only once the server refused the payload or no server answers."""
    from pydantic import ValidationError

    from piworkflows.protocol import client_v1

    check_run_id(operation, run_id)
    try:
        client_v1.OPERATION_SHAPES[operation][0].model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(payload)'}: {e['msg']}" for e in exc.errors())
        raise click.UsageError(f"{operation}: {problems}") from None


def request(
    paths: StatePaths,
    operation: str,
    payload: Any,
    run_id: str | None = None,
    expected_revision: int | None = None,
    idempotency_key: str | None = None,
) -> envelope.Response:
    """Send one request. A payload the server refuses as invalid (``validationFailed``: nothing
    was written), or any request when no server answers, is checked here with the protocol's
    models: a usage error (exit 2) that says what to fix."""
    check_run_id(operation, run_id)
    # Operator recovery keys are derived from the effect: one client id makes a repeat adopt.
    client_id = OPERATOR_CLIENT_ID if idempotency_key is not None else None
    with connection(paths, client_id, unanswered=lambda: check(operation, payload, run_id)) as client:
        response = client.request(
            operation, payload, run_id=run_id, expected_revision=expected_revision, idempotency_key=idempotency_key
        )
    refused = response.receipt.get("code") if isinstance(response.receipt, dict) else None
    if response.outcome == "rejected" and refused == "validationFailed":
        check(operation, payload, run_id)  # else the server refused something no model checks: its answer
    return response


@contextlib.contextmanager
def connection(
    paths: StatePaths, client_id: str | None = None, unanswered: Callable[[], None] | None = None
) -> Iterator[WorkflowClient]:
    """A client of the running server, without retries; no server (or a lost one) is the CLI's
    failure, after ``unanswered`` (a check that may find a usage error first)."""
    try:
        with WorkflowClient(paths.state_dir, retry_for=0, client_id=client_id, timeout=ANSWER_WAIT_S) as client:
            yield client
    except ServerRefused as exc:
        fail(str(exc))
    except TimeoutError:  # it runs but is slow: never "no server is running"
        status = command_line("server", "status")
        fail(f"the server did not answer within {ANSWER_WAIT_S:g} s; '{status}' shows whether it is busy or stuck")
    except (ServerNotRunning, OSError, ConnectionError):
        if unanswered is not None:
            unanswered()
        fail(f"no server is running for {paths.state_dir}; start it with 'pi-workflows server start'")


def accepted(response: envelope.Response) -> Any:
    if response.outcome not in ("accepted", "adopted"):
        code = (response.receipt or {}).get("code", "?") if isinstance(response.receipt, dict) else "?"
        fail(f"{response.outcome} ({code}): {response.error}")
    return response.receipt


def start_failed(exc: StartFailed) -> NoReturn:
    """Why the server did not start; for an incompatible state also the one command that does the
    instruction's steps."""
    message = str(exc)
    if message == StateIncompatible.MESSAGE:
        message += "\n  " + StateIncompatible.RESET_HINT.format(
            command=command_line("state", "reset", "--backup", "/abs/new-dir/")
        )
    fail(message)


def span(ms: int) -> str:
    """A short human duration (an age, how long a run ran): 42s, 17m, 5h, 3d."""
    seconds = max(0, ms) // 1000
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h" if seconds < 172_800 else f"{seconds // 86_400}d"

"""``pi-workflows secrets set NAME``: a secret into the private credentials file, from stdin."""

from __future__ import annotations

import sys

import click

from piworkflows import credentials
from piworkflows.cli.base import fail, main


@main.group("secrets")
def secrets_group() -> None:
    """Secrets that effects name (an http header's {"secret": NAME}; a Telegram bot token), kept
    only in credentials.json (mode 0600) in the private config directory, never in the database.

    Example: printf '%s' "$TOKEN" | pi-workflows secrets set telegram-ops
    """


@secrets_group.command("set")
@click.argument("name")
def secrets_set(name: str) -> None:
    """Store secret NAME, read from standard input (one trailing newline dropped), in
    credentials.json (made 0600 when missing; the other secrets are kept). The value is never
    printed, logged or put in the arguments.

    Example: printf '%s' "$TOKEN" | pi-workflows secrets set telegram-ops
    """
    if not credentials.valid_name(name):
        raise click.BadParameter("use letters, digits, '_', '.', '-' (at most 128, not starting with a digit)")
    if sys.stdin.isatty():
        click.echo(f"the value of {name}, then Enter and Ctrl-D:", err=True)
    value = sys.stdin.read()
    value = value[:-1] if value.endswith("\n") else value
    if not value:
        raise click.UsageError("no value on standard input: pipe it in, e.g. printf '%s' \"$TOKEN\" | ...")
    problem = credentials.value_problem(value)
    if problem is not None:  # before anything is written; the value itself is never echoed
        raise click.UsageError(f"{problem}; pipe in the value alone, e.g. printf '%s' \"$TOKEN\" | ...")
    try:
        path = credentials.store_secret(name, value)
    except credentials.CredentialsError as exc:
        fail(str(exc))
    click.echo(f"stored {name} in {path}")

"""``pi-workflows protocol schema``: the client protocol's JSON Schema."""

from __future__ import annotations

import json

import click

from piworkflows.cli.base import main


@main.group()
def protocol() -> None:
    """The client protocol pi-workflows.client.v1.

    Example: pi-workflows protocol schema > schema.json
    """


@protocol.command("schema")
def protocol_schema() -> None:
    """Print the JSON Schema of every message, payload and receipt.

    Example: pi-workflows protocol schema > schema.json
    """
    from piworkflows.protocol import client_v1  # pydantic and every model: only this command

    click.echo(json.dumps(client_v1.schema_document(), indent=2, sort_keys=True))

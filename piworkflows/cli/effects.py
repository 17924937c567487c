"""``pi-workflows effects`` and ``effect confirm|retry``: operator recovery of ambiguous effects."""

from __future__ import annotations

from typing import Any

import click

from piworkflows import canonical
from piworkflows.cli.base import accepted, fail, json_argument, main, request, say, span
from piworkflows.paths import StatePaths
from piworkflows.states import EFFECT_STATUSES


@main.command("effects")
@click.option("--run", "run_id", help="Only effects of this run.")
@click.option("--all", "show_all", is_flag=True, help="Settled effects too (applied, rejected, cancelled).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line per effect.")
@click.pass_obj
def effects(paths: StatePaths, run_id: str | None, show_all: bool, as_json: bool) -> None:
    """List unsettled and ambiguous effects, newest first: id, type, status, run, node, attempts, age.

    No payloads, results or secrets. An ambiguous effect waits for 'pi-workflows effect confirm'
    or 'pi-workflows effect retry'; one whose run ended is marked "run ended: confirm only"
    (nothing attempts it again).

    Example: pi-workflows effects --json
    """
    payload: dict[str, Any] = {}
    if show_all:
        payload["statuses"] = sorted(EFFECT_STATUSES)
    page = accepted(request(paths, "effect.list", payload, run_id=run_id))
    if as_json:
        for item in page["items"]:
            click.echo(canonical.dumps(item))
        return
    if not page["items"]:
        say("no effects")
    for item in page["items"]:
        age = span(page["now"] - item["createdAt"])
        node = f"{item['nodePath']}#{item['visit']}" if item["nodePath"] else "-"
        # an ambiguous effect of an ended run is never attempted again: say so where it is listed
        ended = (
            " (run ended: confirm only)" if item["status"] == "ambiguous" and "retry" not in item["controls"] else ""
        )
        say(
            f"{item['effectId']}  {item['effectType']:<18} {item['status']:<10} {item['runId'] or '-'}  "
            f"{node:<16} attempts {item['attempts']}/{item['maxAttempts']}  {age}{ended}"
        )


@main.group("effect")
def effect_group() -> None:
    """Operator recovery of an ambiguous effect (the run view's review control).

    Example: pi-workflows effect confirm effect-0123abcd --note "deploy log shows it ran"
    """


def _effect(paths: StatePaths, effect_id: str) -> dict[str, Any]:
    """One effect as effect.list shows it, whatever its status."""
    payload = {"effectId": effect_id, "statuses": sorted(EFFECT_STATUSES)}
    items = accepted(request(paths, "effect.list", payload))["items"]
    if not items:
        fail(f"no effect {effect_id}; list them with 'pi-workflows effects'")
    item: dict[str, Any] = items[0]
    return item


@effect_group.command("confirm")
@click.argument("effect_id")
@click.option("--note", default="", help="Why you know it acted (kept with the effect).")
@click.option("--output", "output_json", help="The node's output as JSON (default null).")
@click.pass_obj
def effect_confirm(paths: StatePaths, effect_id: str, note: str, output_json: str | None) -> None:
    """Confirm an ambiguous effect acted: it becomes applied and its parked run continues.

    Repeating the same command is harmless (the first answer is adopted).

    Example: pi-workflows effect confirm effect-0123abcd --note "deploy log shows it ran"
    """
    payload: dict[str, Any] = {"effectId": effect_id, "note": note}
    if output_json is not None:
        payload["output"] = json_argument(output_json, '{"ok": true}', "--output")
    response = request(paths, "effect.confirm", payload, idempotency_key=f"effect.confirm:{effect_id}")
    code = (response.receipt or {}).get("code") if isinstance(response.receipt, dict) else None
    if response.outcome == "conflict" and code in ("winnerDecided", "idempotencyKeyReused"):
        if _effect(paths, effect_id)["status"] == "applied":  # confirmed before (another note), or it ran
            click.echo(f"{effect_id} is already applied")
            return
    accepted(response)
    click.echo(
        f"{effect_id} " + ("was already confirmed applied" if response.outcome == "adopted" else "confirmed applied")
    )


@effect_group.command("retry")
@click.argument("effect_id")
@click.pass_obj
def effect_retry(paths: StatePaths, effect_id: str) -> None:
    """Ask for a new numbered attempt of an ambiguous effect; its parked run continues.

    Repeating the same command before that attempt starts is harmless (adopted). A node's effect
    whose run has ended (cancelled, failed, ...) is never attempted again: confirm it instead.

    Example: pi-workflows effect retry effect-0123abcd
    """
    attempts = _effect(paths, effect_id)["attempts"]
    key = f"effect.retry:{effect_id}:{attempts}"  # one retry per attempt number: a repeat adopts it
    response = request(paths, "effect.retry", {"effectId": effect_id}, idempotency_key=key)
    accepted(response)
    click.echo(f"{effect_id} will be attempted again" + (" (already)" if response.outcome == "adopted" else ""))

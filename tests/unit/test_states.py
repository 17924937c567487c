"""Keep the closed value sets of writer/schema.sql equal to piworkflows.states.

SQLite needs every status and kind set inside a CHECK constraint, and Python
code needs it as a frozenset. These tests parse the DDL as SQLite stored it and
fail when the two copies drift, or when a new IN-list has no Python owner.
"""

from __future__ import annotations

import re
import sqlite3

import pytest

from piworkflows import errors, states
from piworkflows.writer import schema

pytestmark = pytest.mark.timeout(60)

# A whole CHECK that is one closed set: ``CHECK (col IN ('a', 'b'))``.
_CLOSED_CHECK = re.compile(r"CHECK \(\s*(\w+) IN \(([^)]*)\)\s*\)")
# Any IN-list at all (closed sets and conditions inside larger CHECKs).
_ANY_IN = re.compile(r"(\w+) IN \(([^)]*)\)")
_LITERAL = re.compile(r"'((?:[^']|'')*)'|(-?\d+)")

# (table, column) -> the states constant the CHECK must equal.
CLOSED_SETS: dict[tuple[str, str], frozenset[str]] = {
    ("blobs", "media_type"): states.MEDIA_TYPES,
    ("run_view_content", "media_type"): states.MEDIA_TYPES,
    ("resources", "resource_kind"): states.RESOURCE_KINDS,
    ("events", "actor_class"): states.ACTOR_CLASSES,
    ("workflow_setting_changes", "actor_class"): states.ACTOR_CLASSES,
    ("host_commands", "outcome"): states.STORED_OUTCOMES,
    ("worker_messages", "outcome"): states.STORED_OUTCOMES,
    ("run_workers", "launch_command"): states.RUNNER_COMMANDS,
    ("run_workers", "outcome"): states.RUNNER_OUTCOMES,
    ("interactive_requests", "request_status"): states.INTERACTIVE_REQUEST_STATUSES,
    ("interactive_submissions", "outcome"): states.SUBMISSION_OUTCOMES,
    ("runs", "status"): states.RUN_STATUSES,
    ("runs", "park_reason"): states.PARK_REASONS,
    ("runs", "execution_mode"): states.EXECUTION_MODES,
    ("runs", "lineage"): states.RUN_LINEAGES,
    ("run_sources", "source_kind"): states.SOURCE_KINDS,
    ("node_attempts", "node_kind"): states.NODE_KINDS,
    ("node_attempts", "attempt_status"): states.ATTEMPT_STATUSES,
    ("node_attempts", "outcome"): states.NODE_OUTCOMES,
    ("run_bindings", "binding_kind"): states.BINDING_KINDS,
    ("run_queue", "queue_status"): states.QUEUE_STATUSES,
    ("attempt_active_intervals", "end_cause"): states.INTERVAL_END_CAUSES,
    ("workflow_updates", "update_kind"): states.UPDATE_KINDS,
    ("workflow_follow_ups", "follow_up_status"): states.FOLLOW_UP_STATUSES,
    ("session_segments", "segment_status"): states.SEGMENT_STATUSES,
    ("human_decision_submissions", "submission_outcome"): states.DECISION_SUBMISSION_OUTCOMES,
    ("human_decision_resolutions", "resolution_kind"): states.DECISION_RESOLUTION_KINDS,
    ("controller_resources", "lifecycle"): states.CONTROLLER_LIFECYCLES,
    ("controller_queue", "queue_status"): states.CONTROLLER_QUEUE_STATUSES,
    ("effects", "effect_class"): states.EFFECT_CLASSES,
    ("effects", "performer"): states.EFFECT_PERFORMERS,
    ("effects", "recovery_policy"): states.RECOVERY_POLICIES,
    ("effects", "owner_scope"): states.EFFECT_OWNER_SCOPES,
    ("effects", "effect_status"): states.EFFECT_STATUSES,
    ("effect_attempts", "attempt_status"): states.EFFECT_ATTEMPT_STATUSES,
    ("workflow_messages", "message_kind"): states.MESSAGE_KINDS,
    ("workflow_messages", "message_state"): states.MESSAGE_STATES,
    ("workflow_messages", "recovery_stop"): states.RECOVERY_STOPS,
    ("workflow_turns", "turn_state"): states.TURN_STATES,
    ("channels", "channel_kind"): states.CHANNEL_KINDS,
    ("channel_messages", "record_kind"): states.CHANNEL_RECORD_KINDS,
    ("viewer_deltas", "target_type"): frozenset(states.VIEW_TARGETS),
}

# Closed CHECKs that admit only part of a states constant on purpose:
# (table, column) -> (constant, the exact subset the DDL lists).
INTENTIONAL_SUBSETS: dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]] = {
    # Only people and their relays submit human decisions; servers, runners,
    # the outbox, models and maintenance never do.
    ("human_decision_submissions", "actor_class"): (
        states.ACTOR_CLASSES,
        frozenset({"client", "channel", "operator", "human"}),
    ),
}

# 0/1 flags are not named states.
FLAGS: dict[tuple[str, str], frozenset[object]] = {
    ("runs", "paused"): frozenset({0, 1}),
}

# IN-lists inside a larger CHECK expression are conditions (``(col IN (...)) = ...``),
# not closed sets: (table, column) -> each such condition list, which must be a
# subset of the column's closed set.
CONDITIONS: dict[tuple[str, str], list[frozenset[str]]] = {
    ("runs", "status"): [states.TERMINAL_RUN_STATUSES],  # exactly the statuses with finished_at
    ("node_attempts", "attempt_status"): [frozenset({"running", "waiting"})],  # the unfinished ones
    ("effects", "effect_status"): [states.TERMINAL_EFFECT_STATUSES],  # exactly the settled ones
    ("human_decision_resolutions", "resolution_kind"): [frozenset({"human", "timeoutPolicy"})],  # carry a response
}


def _values(raw: str) -> frozenset[object]:
    found: set[object] = set()
    for text, number in _LITERAL.findall(raw):
        found.add(int(number) if number else text.replace("''", "'"))
    assert found, f"empty IN-list {raw!r}"
    return frozenset(found)


def _table_sql() -> dict[str, str]:
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(schema.ddl_text())
        rows = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND sql IS NOT NULL").fetchall()
    finally:
        conn.close()
    return dict(rows)


def _parse() -> tuple[dict[tuple[str, str], frozenset[object]], dict[tuple[str, str], list[frozenset[object]]]]:
    """Closed sets and condition lists found in CREATE TABLE statements (indexes excluded)."""
    closed: dict[tuple[str, str], frozenset[object]] = {}
    conditions: dict[tuple[str, str], list[frozenset[object]]] = {}
    for table, sql in _table_sql().items():
        closed_spans = set()
        for match in _CLOSED_CHECK.finditer(sql):
            key = (table, match.group(1))
            assert key not in closed, f"two closed CHECKs for {key}"
            closed[key] = _values(match.group(2))
            closed_spans.add(match.start(1))
        for match in _ANY_IN.finditer(sql):
            if match.start(1) in closed_spans:
                continue
            conditions.setdefault((table, match.group(1)), []).append(_values(match.group(2)))
    return closed, conditions


CLOSED_FOUND, CONDITIONS_FOUND = _parse()


def test_parser_finds_the_checks() -> None:
    # guards against a regex that silently matches nothing
    assert len(CLOSED_FOUND) >= 40
    assert ("runs", "status") in CLOSED_FOUND
    assert ("runs", "status") in CONDITIONS_FOUND
    assert CLOSED_FOUND[("blobs", "media_type")] == {"application/json", "text/plain;charset=utf-8"}


def test_every_closed_check_has_a_python_owner() -> None:
    mapped = set(CLOSED_SETS) | set(INTENTIONAL_SUBSETS) | set(FLAGS)
    unmapped = sorted(set(CLOSED_FOUND) - mapped)
    assert unmapped == [], f"CHECK IN-lists without a states constant: {unmapped}"
    stale = sorted(mapped - set(CLOSED_FOUND))
    assert stale == [], f"mapped columns with no CHECK IN-list in schema.sql: {stale}"


def test_no_key_is_mapped_twice() -> None:
    assert not set(CLOSED_SETS) & set(INTENTIONAL_SUBSETS)
    assert not set(CLOSED_SETS) & set(FLAGS)
    assert not set(INTENTIONAL_SUBSETS) & set(FLAGS)


@pytest.mark.parametrize("key", sorted(CLOSED_SETS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_closed_check_equals_states_constant(key: tuple[str, str]) -> None:
    constant = CLOSED_SETS[key]
    in_ddl = CLOSED_FOUND.get(key)
    assert in_ddl is not None, f"{key} has no CHECK IN-list"
    assert in_ddl == constant, (
        f"{key[0]}.{key[1]}: only in schema.sql {sorted(map(str, in_ddl - constant))}, "
        f"only in states.py {sorted(map(str, constant - in_ddl))}"
    )


@pytest.mark.parametrize("key", sorted(INTENTIONAL_SUBSETS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_intentional_subset_checks(key: tuple[str, str]) -> None:
    constant, expected = INTENTIONAL_SUBSETS[key]
    assert CLOSED_FOUND[key] == expected
    assert CLOSED_FOUND[key] <= constant
    assert CLOSED_FOUND[key] != constant  # otherwise it belongs in CLOSED_SETS


@pytest.mark.parametrize("key", sorted(FLAGS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_flag_checks(key: tuple[str, str]) -> None:
    assert CLOSED_FOUND[key] == FLAGS[key]


def test_every_condition_list_is_known_and_within_its_closed_set() -> None:
    def normal(lists: list[frozenset[str]] | list[frozenset[object]]) -> list[list[str]]:
        return sorted(sorted(map(str, values)) for values in lists)

    assert {k: normal(v) for k, v in CONDITIONS_FOUND.items()} == {k: normal(v) for k, v in CONDITIONS.items()}
    for key, lists in CONDITIONS_FOUND.items():
        closed = CLOSED_FOUND[key]
        for values in lists:
            assert values <= closed, f"{key}: condition {normal([values])} names values outside the column's set"


def test_media_type_constants() -> None:
    assert states.MEDIA_TYPES == {states.MEDIA_JSON, states.MEDIA_TEXT}


# ---------------------------------------------------------------- internal consistency


def test_run_status_partitions() -> None:
    assert states.TERMINAL_RUN_STATUSES < states.RUN_STATUSES
    assert states.RUN_STATUSES - states.TERMINAL_RUN_STATUSES == {"queued", "running", "waiting"}


def test_effect_status_partitions() -> None:
    assert states.UNSETTLED_EFFECT_STATUSES | states.TERMINAL_EFFECT_STATUSES == states.EFFECT_STATUSES
    assert not states.UNSETTLED_EFFECT_STATUSES & states.TERMINAL_EFFECT_STATUSES


def test_effect_transitions_cover_exactly_the_statuses() -> None:
    assert set(states.EFFECT_TRANSITIONS) == states.EFFECT_STATUSES
    for source, targets in states.EFFECT_TRANSITIONS.items():
        assert targets <= states.EFFECT_STATUSES, f"{source} -> {sorted(targets - states.EFFECT_STATUSES)}"


def test_terminal_effect_statuses_have_no_way_out() -> None:
    for status in states.TERMINAL_EFFECT_STATUSES:
        assert states.EFFECT_TRANSITIONS[status] == frozenset(), status
    for status in states.UNSETTLED_EFFECT_STATUSES:
        assert states.EFFECT_TRANSITIONS[status], f"{status} can never settle"


def test_every_unsettled_effect_can_reach_a_terminal_status() -> None:
    for start in states.UNSETTLED_EFFECT_STATUSES:
        seen, frontier = {start}, [start]
        while frontier:
            for target in states.EFFECT_TRANSITIONS[frontier.pop()]:
                if target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert seen & states.TERMINAL_EFFECT_STATUSES, start


def test_attempt_end_covers_every_way_an_applying_effect_moves() -> None:
    assert set(states.ATTEMPT_END_FOR_EFFECT_STATUS) == states.EFFECT_TRANSITIONS["applying"]
    for effect_status, attempt_status in states.ATTEMPT_END_FOR_EFFECT_STATUS.items():
        assert effect_status in states.EFFECT_STATUSES
        assert attempt_status in states.EFFECT_ATTEMPT_STATUSES
        assert attempt_status != "applying", f"an attempt ending for {effect_status} stays open"


def test_stored_outcomes_are_protocol_outcomes() -> None:
    assert states.STORED_OUTCOMES <= set(errors.OUTCOMES)
    assert "unavailable" not in states.STORED_OUTCOMES  # never stored
    assert "adopted" not in states.STORED_OUTCOMES  # a replay of a stored "accepted"


def test_error_codes_name_refusal_outcomes() -> None:
    assert len(set(errors.OUTCOMES)) == len(errors.OUTCOMES)
    for code, outcome in errors.CODES.items():
        assert outcome in errors.OUTCOMES, code
        assert outcome not in ("accepted", "adopted"), code
    refusals = set(errors.OUTCOMES) - {"accepted", "adopted"}
    assert set(errors.CODES.values()) == refusals  # every refusal outcome has a code


def test_error_codes_are_camel_case() -> None:
    for code in errors.CODES:
        assert re.fullmatch(r"[a-z][a-zA-Z]*", code), code


def test_runner_park_reasons_are_what_the_runner_exit_message_accepts():
    from typing import get_args

    from piworkflows.protocol.internal.runners import RunnerExited

    literal, none = get_args(RunnerExited.model_fields["park_reason"].annotation)
    assert none is type(None)
    assert set(get_args(literal)) == states.RUNNER_PARK_REASONS
    assert states.RUNNER_PARK_REASONS <= states.PARK_REASONS

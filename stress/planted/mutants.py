"""The planted bugs: one per way a critical check could break, each with the fast unit tests that
must fail when it is planted (docs/TESTING.md lists them as a table).

``old`` is an exact text of the package as it stands and ``new`` its broken form; ``path`` is
where ``old`` is today (a moved text is looked up in the whole package). Keep ``old`` short and
unique: the anchor test (tests/unit/test_planted_anchors.py) fails when one no longer is.
"""

from __future__ import annotations

from dataclasses import dataclass

from piworkflows.writer import prune


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what the planted text does, for a person
    check: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


REVISION = "revision compare"
LEASE = "lease generation and claim token"
FINGERPRINT = "idempotency fingerprint"
ATTEMPTS = "attempt numbering"
AMBIGUOUS = "ambiguous on crash"
CANONICAL = "canonical form"
SCHEMA = "schema shape"
BLOCKERS = "retention blockers"
COMMIT = "reply after commit"
IDENTITY = "process identity"

_RECORDS = "piworkflows/writer/records.py"
_PRUNE = "piworkflows/writer/prune.py"
_CANONICAL = "piworkflows/canonical.py"
_SCHEMA = "piworkflows/writer/schema.py"
_REGISTRY = "piworkflows/supervisor/registry.py"
_DB = "piworkflows/writer/db.py"

_GUARDS = "tests/unit/test_guards.py"
_GUARDS_NODE_ATTEMPTS = _GUARDS + "::test_an_interrupted_visit_takes_a_new_attempt_number_and_id"
_CONTRACT = "tests/unit/test_contract.py"
_CONTRACT_CHECKS = _CONTRACT + "::test_each_check_rolls_back_the_middle_command_only"
_CONTRACT_RECEIPTS = _CONTRACT + "::test_receipts_adopt_same_request_and_conflict_on_other"
_CONTRACT_KEY_CONFLICT = _CONTRACT + "::test_failure_after_writes_rolls_back_everything_the_command_wrote"
_OUTBOX = "tests/unit/test_outbox_writer.py"
_CANONICAL_OBJECTS = "tests/unit/test_canonical.py::test_object_vectors"
_SCHEMA_DAMAGE = "tests/unit/test_schema.py::test_damaged_database_is_refused_untouched"
_IDENTITY = "tests/unit/test_identity.py"
_BLOCKERS = "tests/unit/test_retention_blockers.py::test_each_blocker_keeps_the_tree_by_itself"

MUTANTS: tuple[Mutant, ...] = (
    # --- revision compare ---------------------------------------------------------------
    Mutant(
        "revision.older-expected-accepted",
        "a command at an older expected revision is accepted (`!=` became `>`)",
        REVISION,
        "piworkflows/writer/contract.py",
        "elif target.expected_revision != resource.revision:",
        "elif target.expected_revision > resource.revision:",
        (_CONTRACT_CHECKS,),
    ),
    Mutant(
        "revision.increment-ignores-miss",
        "compare-and-increment accepts an update that matched no row",
        REVISION,
        _RECORDS,
        "if cur.rowcount != 1:",
        "if cur.rowcount > 1:",
        (_GUARDS + "::test_increment_revision_compares_before_it_increments",),
    ),
    Mutant(
        "revision.client-expected-ignored",
        "a client's expectedRevision on a run is replaced by the current revision",
        REVISION,
        "piworkflows/writer/commands/runs.py",
        "return Target(run_id, expected_revision if expected_revision is not None else run.revision)",
        "return Target(run_id, run.revision)",
        (_GUARDS + "::test_a_client_control_command_at_an_older_run_revision_is_a_conflict",),
    ),
    # --- lease generation and claim token -------------------------------------------------
    Mutant(
        "lease.generation-unchecked",
        "the claim's lease generation is not compared",
        LEASE,
        _RECORDS,
        "if lease.lease_generation != claim.lease_generation:",
        "if False:",
        (_CONTRACT_CHECKS,),
    ),
    Mutant(
        "lease.token-hash-unchecked",
        "the claim token hash is not compared (only the owner)",
        LEASE,
        _RECORDS,
        "if lease.claim_token_hash != claim.claim_token_hash or lease.owner_id != claim.owner_id:",
        "if lease.owner_id != claim.owner_id:",
        (_CONTRACT_CHECKS,),
    ),
    Mutant(
        "lease.expiry-unchecked",
        "an expired claim is still accepted",
        LEASE,
        _RECORDS,
        'if not lease.live(now):\n        raise CommandError("claimExpired"',
        'if False:\n        raise CommandError("claimExpired"',
        (_CONTRACT_CHECKS,),
    ),
    Mutant(
        "lease.server-epoch-unchecked",
        "a claim of an older server epoch is accepted",
        LEASE,
        _RECORDS,
        "if row is None or row[0] != server_epoch:",
        "if row is None:",
        (_CONTRACT + "::test_claims_of_an_older_server_epoch_are_dead",),
    ),
    Mutant(
        "lease.generation-reused",
        "a new owner gets the previous lease generation again",
        LEASE,
        _RECORDS,
        "generation = 1 if lease is None else lease.lease_generation + 1",
        "generation = 1 if lease is None else lease.lease_generation",
        (_CONTRACT + "::test_retry_gets_new_generation_and_attempt_number",),
    ),
    Mutant(
        "lease.live-at-expiry",
        "a claim is still live at its expiry instant (`>` became `>=`)",
        LEASE,
        _RECORDS,
        "self.expires_at > now",
        "self.expires_at >= now",
        (_GUARDS + "::test_a_claim_is_dead_at_its_expiry_instant",),
    ),
    # --- idempotency fingerprint ----------------------------------------------------------
    Mutant(
        "fingerprint.reused-key-adopted",
        "a reused client idempotency key with another fingerprint is adopted",
        FINGERPRINT,
        _RECORDS,
        "if row[0] != key.fingerprint:",
        "if False:",
        (_CONTRACT_RECEIPTS,),
    ),
    Mutant(
        "fingerprint.repeat-executed-again",
        "a repeated request is executed again instead of answered from its receipt",
        FINGERPRINT,
        _DB,
        "if stored is not None:",
        "if False:",
        (_CONTRACT_RECEIPTS,),
    ),
    Mutant(
        "fingerprint.effect-key-conflict-adopted",
        "an effect key with another request fingerprint is adopted",
        FINGERPRINT,
        _RECORDS,
        "if row[1] != fingerprint:",
        "if False:",
        (_CONTRACT_KEY_CONFLICT,),
    ),
    Mutant(
        "fingerprint.request-id-fingerprinted",
        "the client request fingerprint includes requestId",
        FINGERPRINT,
        "piworkflows/protocol/client_v1.py",
        'del data["requestId"]',
        "pass",
        ("tests/unit/test_client_v1.py::test_fingerprint_is_sha256_of_the_canonical_request_without_request_id",),
    ),
    Mutant(
        "fingerprint.effect-payload-ignored",
        "the effect fingerprint leaves out the payload digest",
        FINGERPRINT,
        "piworkflows/protocol/internal.py",
        'fields["payload"] = self.payload.digest.hex()',
        'fields["payload"] = None',
        (_CONTRACT_KEY_CONFLICT,),
    ),
    Mutant(
        "fingerprint.effect-repeat-refused",
        "a repeated identical effect request is refused instead of adopted",
        FINGERPRINT,
        _RECORDS,
        "if row[1] != fingerprint:",
        "if True:",
        (_GUARDS + "::test_a_repeated_effect_request_adopts_its_effect",),
    ),
    # --- attempt numbering ----------------------------------------------------------------
    Mutant(
        "attempts.effect-number-off-by-one",
        "effect attempts are numbered from 2",
        ATTEMPTS,
        _RECORDS,
        "coalesce(max(attempt_number), 0) + 1",
        "coalesce(max(attempt_number), 1) + 1",
        (_CONTRACT + "::test_settle_applied_releases_the_claim_but_keeps_the_generation",),
    ),
    Mutant(
        "attempts.effect-count-not-incremented",
        "a claim does not count the attempt (max_attempts never reached)",
        ATTEMPTS,
        _RECORDS,
        "attempt_count = attempt_count + 1",
        "attempt_count = attempt_count",
        (_CONTRACT + "::test_retries_exhausted_end_rejected",),
    ),
    Mutant(
        "attempts.node-retry-same-number",
        "the runner retries an interrupted visit with attempt number 1 again",
        ATTEMPTS,
        "piworkflows/runner/run.py",
        '"attempt_number": retries.get((path, visit), 0) + 1',
        '"attempt_number": 1',
        ("tests/unit/test_guards_runner.py::test_an_interrupted_visit_continues_with_the_next_attempt_number",),
    ),
    Mutant(
        "attempts.node-duplicate-attempt-unchecked",
        "the writer does not refuse an attempt number the visit already has",
        ATTEMPTS,
        "piworkflows/writer/commands/nodes.py",
        'if conn.execute("SELECT 1 FROM node_attempts WHERE attempt_id = ?", (attempt_id,)).fetchone():',
        "if False:",
        (_GUARDS_NODE_ATTEMPTS,),
    ),
    Mutant(
        "attempts.node-id-ignores-attempt",
        "the attempt id leaves out the attempt number",
        ATTEMPTS,
        "piworkflows/protocol/internal.py",
        "canonical.dumps_bytes([run_id, node_path, visit_number, attempt_number])",
        "canonical.dumps_bytes([run_id, node_path, visit_number])",
        (_GUARDS_NODE_ATTEMPTS,),
    ),
    # --- ambiguous on crash -------------------------------------------------------------
    Mutant(
        "ambiguous.manual-retried-after-crash",
        "a manual effect whose claimant died goes back to pending",
        AMBIGUOUS,
        _RECORDS,
        'if cancelled or policy == "manual":',
        "if cancelled:",
        (_OUTBOX + "::test_abandon_of_a_manual_effect_leaves_it_ambiguous",),
    ),
    Mutant(
        "ambiguous.manual-retry-settlement-allowed",
        "a worker may settle a manual effect as retry",
        AMBIGUOUS,
        "piworkflows/writer/commands/effects.py",
        'if policy == "manual" and not cmd.not_acted:\n                raise',
        "if False:\n                raise",
        (_CONTRACT_CHECKS,),
    ),
    Mutant(
        "ambiguous.orphaned-runner-effects-left-applying",
        "an orphaned runner's applying effects are not abandoned",
        AMBIGUOUS,
        "piworkflows/writer/commands/runners.py",
        'if cmd.outcome == "orphaned" else []',
        'if cmd.outcome == "never" else []',
        (_OUTBOX + "::test_an_effect_left_applying_by_a_runner_of_a_crashed_server",),
    ),
    Mutant(
        "ambiguous.old-epoch-claim-not-recovered",
        "a live claim of an older server epoch counts as alive",
        AMBIGUOUS,
        _RECORDS,
        '_DEAD_CLAIM = "(l.owner_id IS NULL OR l.expires_at <= ? OR l.owner_id != ?)"',
        '_DEAD_CLAIM = "(l.owner_id IS NULL OR l.expires_at <= ? OR ? IS NULL)"',
        (_OUTBOX + "::test_recover_after_a_new_server_epoch_ends_live_claims_of_the_old_one",),
    ),
    Mutant(
        "ambiguous.cancel-retries-applying",
        "a cancel sends an applying manual effect back to pending",
        AMBIGUOUS,
        "piworkflows/writer/commands/control.py",
        "records.abandon_effect(conn, effect_id, tx.actor, now, cancelled=True)",
        "records.abandon_effect(conn, effect_id, tx.actor, now, cancelled=False)",
        ("tests/unit/test_nodes.py::test_cancel_settles_everything_in_one_commit",),
    ),
    Mutant(
        "ambiguous.shell-timeout-applied",
        "a manual shell command killed at its timeout counts as applied",
        AMBIGUOUS,
        "piworkflows/performers/shell.py",
        'if timed_out:\n            if policy == "manual":',
        "if timed_out:\n            if False:",
        (_GUARDS + "::test_a_shell_command_that_timed_out_may_have_acted",),
    ),
    Mutant(
        "ambiguous.http-no-answer-retried",
        "a manual http request sent without an answer is retried",
        AMBIGUOUS,
        "piworkflows/performers/http.py",
        'Outcome("ambiguous" if manual else "retry", error=error, error_code="noAnswer")',
        'Outcome("retry", error=error, error_code="noAnswer")',
        ("tests/unit/test_http_performer.py::test_no_answer_before_timeout",),
    ),
    # --- canonical form -----------------------------------------------------------------
    Mutant(
        "canonical.keys-unsorted",
        "the fast path keeps insertion order instead of sorting keys",
        CANONICAL,
        _CANONICAL,
        'separators=(",", ":"), sort_keys=True, allow_nan=False)',
        'separators=(",", ":"), sort_keys=False, allow_nan=False)',
        (_CANONICAL_OBJECTS,),
    ),
    Mutant(
        "canonical.keys-by-code-point",
        "keys sorted by code point instead of UTF-16 code units",
        CANONICAL,
        _CANONICAL,
        'others.sort(key=lambda k: k.encode("utf-16-be", "surrogatepass"))',
        "others.sort()",
        (_CANONICAL_OBJECTS,),
    ),
    Mutant(
        "canonical.index-keys-as-text",
        "array-index keys sorted as text instead of numerically",
        CANONICAL,
        _CANONICAL,
        "index_keys = sorted((k for k in obj if _is_index_key(k)), key=int)",
        "index_keys = sorted(k for k in obj if _is_index_key(k))",
        (_CANONICAL_OBJECTS,),
    ),
    Mutant(
        "canonical.astral-keys-on-fast-path",
        "keys with astral characters take the C encoder (code point order)",
        CANONICAL,
        _CANONICAL,
        '_PLAIN_KEY_CHARS = re.compile("[\\x00-\\ud7ff]*\\\\Z")',
        '_PLAIN_KEY_CHARS = re.compile("[^\\ud800-\\udfff]*\\\\Z")',
        (_CANONICAL_OBJECTS,),
    ),
    Mutant(
        "canonical.small-exponent",
        "1e-7 printed as 0.0000001",
        CANONICAL,
        _CANONICAL,
        "elif -6 < n <= 0:",
        "elif -7 < n <= 0:",
        ("tests/unit/test_canonical.py::test_number_vectors",),
    ),
    # --- schema shape ---------------------------------------------------------------------
    Mutant(
        "schema.sql-text-ignored",
        "the shape compares names only, not each object's SQL",
        SCHEMA,
        _SCHEMA,
        '"SELECT type, name, tbl_name, sql FROM sqlite_schema',
        '"SELECT type, name, tbl_name, NULL FROM sqlite_schema',
        (_SCHEMA_DAMAGE,),
    ),
    Mutant(
        "schema.shape-unchecked",
        "the shape is not compared at all",
        SCHEMA,
        _SCHEMA,
        "if tuple(schema_shape(conn)) != expected_shape():",
        "if False:",
        (_SCHEMA_DAMAGE,),
    ),
    Mutant(
        "schema.meta-unchecked",
        "schema_meta's name, version and DDL digest are not compared",
        SCHEMA,
        _SCHEMA,
        "if rows != [(SCHEMA_NAME, SCHEMA_VERSION, ddl_sha256())]:",
        "if not rows:",
        (_SCHEMA_DAMAGE,),
    ),
    Mutant(
        "schema.indexes-ignored",
        "indexes are left out of the shape",
        SCHEMA,
        _SCHEMA,
        "WHERE name NOT GLOB 'sqlite_stat*' ORDER BY",
        "WHERE name NOT GLOB 'sqlite_stat*' AND type != 'index' ORDER BY",
        (_SCHEMA_DAMAGE,),
    ),
    # --- retention blockers (besides one dropped blocker each, below) ------------------------------
    Mutant(
        "blockers.ambiguous-effect-not-blocking",
        "an ambiguous effect no longer keeps its tree",
        BLOCKERS,
        _PRUNE,
        "AND effect_status IN ('pending', 'applying', 'ambiguous')",
        "AND effect_status IN ('pending', 'applying')",
        (_BLOCKERS,),
    ),
    Mutant(
        "blockers.effect-leases-ignored",
        "a live claim on an effect of the tree no longer keeps it",
        BLOCKERS,
        _PRUNE,
        "OR l.resource_id IN (SELECT effect_id FROM effects",
        "OR 0 AND l.resource_id IN (SELECT effect_id FROM effects",
        (_BLOCKERS,),
    ),
    Mutant(
        "blockers.recent-run-at-cutoff-not-blocking",
        "a run finished exactly at the cutoff no longer keeps its tree",
        BLOCKERS,
        _PRUNE,
        "AND finished_at >= :cutoff",
        "AND finished_at > :cutoff",
        (_BLOCKERS,),
    ),
    # --- reply after commit -----------------------------------------------------------------
    Mutant(
        "commit.failed-commit-answered",
        "a group whose COMMIT failed is answered as if it committed",
        COMMIT,
        _DB,
        "raise GroupFailed(str(exc), condition) from exc",
        "return replies + done, leftover",
        (_CONTRACT + "::test_error_that_ends_the_transaction_acknowledges_nothing",),
    ),
    Mutant(
        "commit.answered-before-commit",
        "replies are returned with the group's transaction still open",
        COMMIT,
        _DB,
        'faults.hit(faults.WRITER_BEFORE_COMMIT)\n                self.conn.execute("COMMIT")',
        "faults.hit(faults.WRITER_BEFORE_COMMIT)",
        (_GUARDS + "::test_a_group_is_committed_when_its_replies_are_returned",),
    ),
    Mutant(
        "commit.refusal-kept",
        "a refused command's writes are not rolled back to its savepoint",
        COMMIT,
        _DB,
        'if answer.outcome != "accepted":\n            conn.execute("ROLLBACK TO command")',
        'if False:\n            conn.execute("ROLLBACK TO command")',
        (_CONTRACT_KEY_CONFLICT,),
    ),
    # --- process identity -----------------------------------------------------------------
    Mutant(
        "identity.create-time-ignored",
        "a recorded pid matches whatever its create time",
        IDENTITY,
        _REGISTRY,
        "if proc.create_time() != self.createTime or proc.status() == psutil.STATUS_ZOMBIE:",
        "if proc.status() == psutil.STATUS_ZOMBIE:",
        (_IDENTITY + "::test_another_create_time_is_another_process",),
    ),
    Mutant(
        "identity.marker-ignored",
        "a recorded pid matches whatever its command line",
        IDENTITY,
        _REGISTRY,
        "if not any(self.marker in part for part in proc.cmdline()):",
        "if False:",
        (_IDENTITY + "::test_another_marker_is_another_process",),
    ),
    Mutant(
        "identity.end-unverified-pid",
        "end_process signals the recorded pid without checking its identity",
        IDENTITY,
        _REGISTRY,
        "    proc = identity.find()\n    if proc is None:\n        return False\n    try:",
        "    proc = psutil.Process(identity.pid)\n    try:",
        (_IDENTITY + "::test_end_process_signals_nothing_whose_create_time_differs",),
    ),
)


def _blocker_mutant(name: str) -> Mutant:
    """A dropped blocker: its query finds nothing."""
    opening = '" UNION' if name == "outsideReference" else 'f"'  # how its query starts in BLOCKERS
    return Mutant(
        f"blockers.{name}-dropped",
        f"the {name} blocker's query finds nothing",
        BLOCKERS,
        _PRUNE,
        f'    "{name}": {opening}',
        f'    "{name}": "SELECT 1 WHERE 0" or {opening}',
        (_BLOCKERS,),
    )


MUTANTS += tuple(_blocker_mutant(name) for name in prune.BLOCKERS)

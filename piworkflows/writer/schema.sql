-- pi-workflows-state, schema version 1: the complete DDL and the only place
-- in the project with CREATE. Its exact bytes are hashed into schema_meta;
-- changing one byte makes every older database incompatible (alpha hard cut,
-- no migrations). Conventions: times are integer epoch milliseconds, digests
-- are 32-byte SHA-256 BLOBs, flags are 0/1 integers, ids are opaque text.
-- Closed value sets here mirror piworkflows/states.py (a test keeps them equal).

CREATE TABLE schema_meta (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  schema_name TEXT NOT NULL CHECK (schema_name = 'pi-workflows-state'),
  schema_version INTEGER NOT NULL CHECK (schema_version = 1),
  ddl_sha256 BLOB NOT NULL CHECK (length(ddl_sha256) = 32),
  app_version TEXT NOT NULL,
  created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE projects (
  project_id TEXT PRIMARY KEY,
  canonical_path TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL
) STRICT;

-- Content-addressed values ------------------------------------------------

CREATE TABLE blobs (
  digest BLOB PRIMARY KEY CHECK (length(digest) = 32),
  media_type TEXT NOT NULL CHECK (media_type IN ('application/json', 'text/plain;charset=utf-8')),
  byte_length INTEGER NOT NULL CHECK (byte_length >= 0),
  bytes BLOB NOT NULL CHECK (length(bytes) = byte_length),
  created_at INTEGER NOT NULL
) STRICT;

-- Shared lifecycle ---------------------------------------------------------

CREATE TABLE resources (
  resource_id TEXT PRIMARY KEY,
  resource_kind TEXT NOT NULL CHECK (resource_kind IN ('server', 'run', 'settings_scope', 'follow_up', 'decision', 'managed_resource', 'effect', 'channel', 'workflow_message', 'session_segment')),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  project_id TEXT REFERENCES projects (project_id),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE leases (
  resource_id TEXT PRIMARY KEY REFERENCES resources (resource_id) ON DELETE CASCADE,
  lease_generation INTEGER NOT NULL CHECK (lease_generation >= 1),
  owner_id TEXT,
  claim_token_hash BLOB CHECK (claim_token_hash IS NULL OR length(claim_token_hash) = 32),
  acquired_at INTEGER,
  renewed_at INTEGER,
  expires_at INTEGER,
  CHECK ((owner_id IS NULL) = (claim_token_hash IS NULL)),
  CHECK ((owner_id IS NULL) = (expires_at IS NULL)),
  CHECK ((owner_id IS NULL) = (acquired_at IS NULL)),
  CHECK ((owner_id IS NULL) = (renewed_at IS NULL))
) STRICT;
CREATE INDEX leases_live_by_expiry ON leases (expires_at) WHERE owner_id IS NOT NULL;

CREATE TABLE events (
  event_id INTEGER PRIMARY KEY,
  resource_id TEXT NOT NULL REFERENCES resources (resource_id) ON DELETE CASCADE,
  resource_revision INTEGER NOT NULL CHECK (resource_revision >= 1),
  event_type TEXT NOT NULL,
  actor_class TEXT NOT NULL CHECK (actor_class IN ('server', 'client', 'runner', 'outbox', 'channel', 'operator', 'human', 'model', 'maintenance')),
  actor_id TEXT,
  lease_generation INTEGER,
  payload_digest BLOB REFERENCES blobs (digest),
  -- The node attempt a run's event is about (the trace names its node). A plain id:
  -- the attempt and the event both go with the run, and a foreign key would need
  -- an index over every event for the attempts' deletes.
  attempt_id TEXT,
  committed_at INTEGER NOT NULL,
  UNIQUE (resource_id, resource_revision)
) STRICT;
CREATE INDEX events_by_payload ON events (payload_digest) WHERE payload_digest IS NOT NULL;

-- Events are immutable. Only the retention path deletes them: it registers
-- piw_retention_deleting() on its own connection for the deleting transaction.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN
  SELECT RAISE(ABORT, 'events are immutable');
END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN piw_retention_deleting() = 0
BEGIN
  SELECT RAISE(ABORT, 'events are deleted only by retention');
END;

CREATE TABLE workflow_host_state (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  server_epoch INTEGER NOT NULL CHECK (server_epoch >= 1),
  host_id TEXT,
  claim_token_hash BLOB CHECK (claim_token_hash IS NULL OR length(claim_token_hash) = 32),
  pid INTEGER,
  process_started_at INTEGER,
  started_at INTEGER NOT NULL,
  heartbeat_at INTEGER,
  expires_at INTEGER,
  CHECK ((host_id IS NULL) = (claim_token_hash IS NULL)),
  CHECK ((host_id IS NULL) = (expires_at IS NULL)),
  CHECK ((host_id IS NULL) = (heartbeat_at IS NULL)),
  CHECK ((host_id IS NULL) = (pid IS NULL)),
  CHECK ((host_id IS NULL) = (process_started_at IS NULL))
) STRICT;

-- Server protocol ------------------------------------------------------------

CREATE TABLE host_commands (
  client_id TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  fingerprint BLOB NOT NULL CHECK (length(fingerprint) = 32),
  operation TEXT NOT NULL,
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'rejected', 'conflict', 'notFound', 'claimLost')),
  revision INTEGER,
  receipt TEXT,
  error TEXT,
  run_id TEXT REFERENCES runs (run_id) ON DELETE CASCADE,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (client_id, idempotency_key),
  CHECK ((outcome = 'accepted') = (error IS NULL))
) STRICT;
CREATE INDEX host_commands_by_run ON host_commands (run_id) WHERE run_id IS NOT NULL;

CREATE TABLE run_workers (
  runner_epoch INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  server_epoch INTEGER NOT NULL CHECK (server_epoch >= 1),
  lease_generation INTEGER NOT NULL CHECK (lease_generation >= 1),
  launch_command TEXT NOT NULL CHECK (launch_command IN ('start', 'resume', 'continue', 'restart')),
  start_revision INTEGER NOT NULL CHECK (start_revision >= 1),
  pid INTEGER,
  process_started_at INTEGER,
  outcome TEXT CHECK (outcome IN ('exited', 'cancelled', 'timedOut', 'crashed', 'claimLost', 'orphaned')),
  created_at INTEGER NOT NULL,
  spawned_at INTEGER,
  ended_at INTEGER,
  CHECK ((pid IS NULL) = (process_started_at IS NULL)),
  CHECK ((outcome IS NULL) = (ended_at IS NULL))
) STRICT;
CREATE UNIQUE INDEX run_workers_one_live_per_run ON run_workers (run_id) WHERE ended_at IS NULL;
CREATE INDEX run_workers_by_run ON run_workers (run_id);  -- deleting a run checks every runner it had

CREATE TABLE worker_messages (
  sender_scope TEXT NOT NULL,
  message_id TEXT NOT NULL,
  fingerprint BLOB NOT NULL CHECK (length(fingerprint) = 32),
  message_kind TEXT NOT NULL,
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'rejected', 'conflict', 'notFound', 'claimLost')),
  revision INTEGER,
  receipt TEXT,
  error TEXT,
  run_id TEXT REFERENCES runs (run_id) ON DELETE CASCADE,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (sender_scope, message_id),
  CHECK ((outcome = 'accepted') = (error IS NULL))
) STRICT;
CREATE INDEX worker_messages_by_run ON worker_messages (run_id) WHERE run_id IS NOT NULL;

CREATE TABLE interactive_requests (
  request_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
  target_session_id TEXT NOT NULL,
  contract_digest BLOB NOT NULL REFERENCES blobs (digest),
  request_status TEXT NOT NULL CHECK (request_status IN ('pending', 'validating', 'accepted', 'cancelled', 'failed')),
  accepted_submission_id TEXT REFERENCES interactive_submissions (submission_id),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  CHECK ((request_status = 'accepted') = (accepted_submission_id IS NOT NULL))
) STRICT;
CREATE INDEX interactive_requests_by_run ON interactive_requests (run_id);
CREATE INDEX interactive_requests_by_attempt ON interactive_requests (attempt_id);
CREATE UNIQUE INDEX interactive_requests_one_open_per_attempt ON interactive_requests (attempt_id) WHERE request_status IN ('pending', 'validating');
CREATE INDEX interactive_requests_open_by_session ON interactive_requests (target_session_id) WHERE request_status IN ('pending', 'validating');

CREATE TABLE interactive_submissions (
  submission_id TEXT PRIMARY KEY,
  request_id TEXT NOT NULL REFERENCES interactive_requests (request_id) ON DELETE CASCADE,
  idempotency_key TEXT NOT NULL,
  payload_digest BLOB NOT NULL REFERENCES blobs (digest),
  outcome TEXT CHECK (outcome IN ('accepted', 'adopted', 'rejected')),
  receipt_digest BLOB REFERENCES blobs (digest),
  created_at INTEGER NOT NULL,
  settled_at INTEGER,
  UNIQUE (request_id, idempotency_key),
  CHECK ((outcome IS NULL) = (settled_at IS NULL))
) STRICT;

-- Workflows ------------------------------------------------------------------

CREATE TABLE workflow_definitions (
  definition_digest BLOB PRIMARY KEY REFERENCES blobs (digest),
  workflow_name TEXT NOT NULL,
  created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE runs (
  run_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  project_id TEXT NOT NULL REFERENCES projects (project_id),
  workflow_name TEXT NOT NULL,
  definition_digest BLOB NOT NULL REFERENCES workflow_definitions (definition_digest),
  status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled')),
  paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
  park_reason TEXT CHECK (park_reason IN ('shutdown', 'paused', 'runnerNoProgress', 'workflowSourceChanged', 'effectAmbiguous', 'agentNoProgress')),
  execution_mode TEXT NOT NULL CHECK (execution_mode IN ('headless', 'interactive')),
  origin_session_id TEXT,
  title TEXT,
  input_digest BLOB NOT NULL REFERENCES blobs (digest),
  launch_options_digest BLOB REFERENCES blobs (digest),
  output_digest BLOB REFERENCES blobs (digest),
  error_digest BLOB REFERENCES blobs (digest),
  error_code TEXT,
  max_steps INTEGER NOT NULL CHECK (max_steps >= 1),
  lineage TEXT NOT NULL CHECK (lineage IN ('root', 'restart', 'recovery', 'child')),
  root_run_id TEXT NOT NULL REFERENCES runs (run_id),
  parent_run_id TEXT REFERENCES runs (run_id),
  parent_attempt_id TEXT REFERENCES node_attempts (attempt_id),
  restart_number INTEGER NOT NULL DEFAULT 0 CHECK (restart_number >= 0),
  recovery_root_run_id TEXT REFERENCES runs (run_id),
  recovery_source_message_id TEXT REFERENCES workflow_messages (workflow_message_id),
  created_at INTEGER NOT NULL,
  started_at INTEGER,
  finished_at INTEGER,
  updated_at INTEGER NOT NULL,
  CHECK ((status IN ('completed', 'failed', 'timed_out', 'cancelled')) = (finished_at IS NOT NULL)),
  CHECK (execution_mode = 'headless' OR origin_session_id IS NOT NULL),
  CHECK ((lineage = 'root') = (parent_run_id IS NULL)),
  CHECK ((recovery_root_run_id IS NULL) = (recovery_source_message_id IS NULL))
) STRICT;
CREATE INDEX runs_by_project_status ON runs (project_id, status);
CREATE INDEX runs_by_status_finished ON runs (status, finished_at);
CREATE INDEX runs_by_root ON runs (root_run_id);
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_by_recovery_root ON runs (recovery_root_run_id) WHERE recovery_root_run_id IS NOT NULL;
CREATE INDEX runs_by_parent_attempt ON runs (parent_attempt_id) WHERE parent_attempt_id IS NOT NULL;
CREATE INDEX runs_finished_roots ON runs (finished_at, run_id) WHERE run_id = root_run_id AND finished_at IS NOT NULL;
CREATE UNIQUE INDEX runs_one_unfinished_interactive_per_session ON runs (origin_session_id) WHERE execution_mode = 'interactive' AND status IN ('queued', 'running', 'waiting');
CREATE UNIQUE INDEX runs_one_run_per_recovery_message ON runs (recovery_source_message_id) WHERE recovery_source_message_id IS NOT NULL;
-- run.list walks one of these newest first (created_at, run_id): without a filter, by status, by workflow, by project.
CREATE INDEX runs_by_created ON runs (created_at, run_id);
CREATE INDEX runs_by_status_created ON runs (status, created_at, run_id);
CREATE INDEX runs_by_workflow_created ON runs (workflow_name, created_at, run_id);
CREATE INDEX runs_by_project_created ON runs (project_id, created_at, run_id);

CREATE TABLE run_sources (
  run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
  source_kind TEXT NOT NULL CHECK (source_kind IN ('file', 'builtin')),
  source_path TEXT,
  source_sha256 BLOB CHECK (source_sha256 IS NULL OR length(source_sha256) = 32),
  builtin_id TEXT,
  builtin_revision TEXT,
  CHECK ((source_kind = 'file') = (source_path IS NOT NULL AND source_sha256 IS NOT NULL)),
  CHECK ((source_kind = 'builtin') = (builtin_id IS NOT NULL AND builtin_revision IS NOT NULL))
) STRICT;

CREATE TABLE node_attempts (
  attempt_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  node_path TEXT NOT NULL,
  node_kind TEXT NOT NULL CHECK (node_kind IN ('agent', 'decision', 'compute', 'notify', 'action', 'shell', 'http', 'checkpoint', 'human_decision', 'workflow')),
  visit_number INTEGER NOT NULL CHECK (visit_number >= 1),
  attempt_number INTEGER NOT NULL CHECK (attempt_number >= 1),
  attempt_status TEXT NOT NULL CHECK (attempt_status IN ('running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled', 'interrupted')),
  outcome TEXT CHECK (outcome IN ('ok', 'failed', 'timed_out', 'cancelled')),
  lease_generation INTEGER NOT NULL CHECK (lease_generation >= 1),
  timeout_ms INTEGER CHECK (timeout_ms IS NULL OR timeout_ms >= 0),
  output_digest BLOB REFERENCES blobs (digest),
  error_digest BLOB REFERENCES blobs (digest),
  error_code TEXT,
  receipt_digest BLOB REFERENCES blobs (digest),
  started_at INTEGER NOT NULL,
  finished_at INTEGER,
  UNIQUE (run_id, node_path, visit_number, attempt_number),
  CHECK ((attempt_status IN ('running', 'waiting')) = (finished_at IS NULL)),
  CHECK ((outcome IS NULL) = (finished_at IS NULL))
) STRICT;
CREATE UNIQUE INDEX node_attempts_one_active_per_run ON node_attempts (run_id) WHERE attempt_status IN ('running', 'waiting');
CREATE TRIGGER node_attempts_started_at_fixed BEFORE UPDATE OF started_at ON node_attempts
WHEN NEW.started_at IS NOT OLD.started_at
BEGIN
  SELECT RAISE(ABORT, 'node_attempts.started_at never changes');
END;

CREATE TABLE run_steps (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  step_index INTEGER NOT NULL CHECK (step_index >= 0),
  attempt_id TEXT NOT NULL UNIQUE REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
  PRIMARY KEY (run_id, step_index)
) STRICT;

CREATE TABLE run_bindings (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  binding_kind TEXT NOT NULL CHECK (binding_kind IN ('settings', 'session', 'managed_resource')),
  binding_key TEXT NOT NULL,
  resource_id TEXT NOT NULL REFERENCES resources (resource_id),
  bound_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, binding_kind, binding_key)
) STRICT;
CREATE INDEX run_bindings_by_resource ON run_bindings (resource_id);

CREATE TABLE run_queue (
  run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
  project_id TEXT NOT NULL REFERENCES projects (project_id),
  queue_status TEXT NOT NULL CHECK (queue_status IN ('queued', 'starting', 'running', 'parked', 'done', 'failed', 'cancelled')),
  priority INTEGER NOT NULL DEFAULT 0,
  available_at INTEGER NOT NULL,
  enqueued_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX run_queue_admission ON run_queue (queue_status, priority, available_at);

CREATE TABLE attempt_active_intervals (
  attempt_id TEXT NOT NULL REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
  interval_number INTEGER NOT NULL CHECK (interval_number >= 1),
  started_at INTEGER NOT NULL,
  last_observed_at INTEGER NOT NULL,
  ended_at INTEGER,
  elapsed_ms INTEGER NOT NULL DEFAULT 0 CHECK (elapsed_ms >= 0),
  end_cause TEXT CHECK (end_cause IN ('pause', 'disconnect', 'settlement', 'recovery', 'turn_end')),
  PRIMARY KEY (attempt_id, interval_number),
  CHECK ((ended_at IS NULL) = (end_cause IS NULL))
) STRICT;
CREATE UNIQUE INDEX attempt_active_intervals_one_open ON attempt_active_intervals (attempt_id) WHERE ended_at IS NULL;

CREATE TABLE workflow_updates (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  update_seq INTEGER NOT NULL CHECK (update_seq >= 1),
  attempt_id TEXT REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
  update_kind TEXT NOT NULL CHECK (update_kind IN ('progress', 'notification')),
  body_digest BLOB NOT NULL REFERENCES blobs (digest),
  created_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, update_seq)
) STRICT;
CREATE INDEX workflow_updates_by_attempt ON workflow_updates (attempt_id) WHERE attempt_id IS NOT NULL;

-- Live settings --------------------------------------------------------------

CREATE TABLE workflow_settings (
  scope_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  scope_key TEXT NOT NULL,
  value_digest BLOB NOT NULL REFERENCES blobs (digest),
  updated_at INTEGER NOT NULL,
  UNIQUE (run_id, scope_key)
) STRICT;

CREATE TABLE workflow_setting_changes (
  scope_id TEXT NOT NULL REFERENCES workflow_settings (scope_id) ON DELETE CASCADE,
  change_number INTEGER NOT NULL CHECK (change_number >= 1),
  patch_digest BLOB NOT NULL REFERENCES blobs (digest),
  value_digest BLOB NOT NULL REFERENCES blobs (digest),
  actor_class TEXT NOT NULL CHECK (actor_class IN ('server', 'client', 'runner', 'outbox', 'channel', 'operator', 'human', 'model', 'maintenance')),
  created_at INTEGER NOT NULL,
  PRIMARY KEY (scope_id, change_number)
) STRICT;

-- Post-run follow-ups --------------------------------------------------------

CREATE TABLE workflow_follow_ups (
  follow_up_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  source_order INTEGER NOT NULL CHECK (source_order >= 1),
  source_session_id TEXT NOT NULL,
  prompt_digest BLOB NOT NULL REFERENCES blobs (digest),
  follow_up_status TEXT NOT NULL CHECK (follow_up_status IN ('queued', 'delivered', 'removed', 'cancelled')),
  workflow_message_id TEXT REFERENCES workflow_messages (workflow_message_id),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (run_id, source_order)
) STRICT;

-- Session capture --------------------------------------------------------------

CREATE TABLE session_segments (
  segment_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  attempt_id TEXT REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
  session_id TEXT NOT NULL,
  segment_status TEXT NOT NULL CHECK (segment_status IN ('recording', 'closed')),
  event_count INTEGER NOT NULL DEFAULT 0 CHECK (event_count >= 0),
  pi_session_file TEXT,
  pi_session_id TEXT,
  started_at INTEGER NOT NULL,
  ended_at INTEGER,
  CHECK ((segment_status = 'closed') = (ended_at IS NOT NULL)),
  CHECK ((pi_session_file IS NULL) = (pi_session_id IS NULL))
) STRICT;
CREATE INDEX session_segments_by_run ON session_segments (run_id);
CREATE UNIQUE INDEX session_segments_one_recording_per_run ON session_segments (run_id) WHERE segment_status = 'recording';
CREATE INDEX session_segments_by_attempt ON session_segments (attempt_id) WHERE attempt_id IS NOT NULL;

CREATE TABLE session_entries (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  run_seq INTEGER NOT NULL CHECK (run_seq >= 1),
  segment_id TEXT NOT NULL REFERENCES session_segments (segment_id) ON DELETE CASCADE,
  pi_entry_id TEXT NOT NULL,
  entry_role TEXT NOT NULL,
  content_digest BLOB NOT NULL REFERENCES blobs (digest),
  settled_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, run_seq),
  UNIQUE (run_id, pi_entry_id)
) STRICT;
CREATE INDEX session_entries_by_segment ON session_entries (segment_id);

CREATE TABLE attempt_entries (
  attempt_id TEXT PRIMARY KEY REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  prompt_seq INTEGER,
  response_seq INTEGER,
  first_seq INTEGER,
  last_seq INTEGER,
  FOREIGN KEY (run_id, prompt_seq) REFERENCES session_entries (run_id, run_seq),
  FOREIGN KEY (run_id, response_seq) REFERENCES session_entries (run_id, run_seq),
  FOREIGN KEY (run_id, first_seq) REFERENCES session_entries (run_id, run_seq),
  FOREIGN KEY (run_id, last_seq) REFERENCES session_entries (run_id, run_seq)
) STRICT;
CREATE INDEX attempt_entries_by_run ON attempt_entries (run_id, prompt_seq);  -- deleting a run or its entries

CREATE TABLE session_events (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  run_seq INTEGER NOT NULL CHECK (run_seq >= 1),
  segment_id TEXT NOT NULL REFERENCES session_segments (segment_id) ON DELETE CASCADE,
  event_type TEXT NOT NULL,
  pi_event_id TEXT,
  event_role TEXT,
  event_status TEXT,
  started_at INTEGER,
  ended_at INTEGER,
  recorded_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, run_seq)
) STRICT;
CREATE INDEX session_events_by_segment ON session_events (segment_id);

-- Human decisions --------------------------------------------------------------

CREATE TABLE human_decisions (
  decision_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
  audience TEXT NOT NULL,
  request_digest BLOB NOT NULL REFERENCES blobs (digest),
  default_response_digest BLOB REFERENCES blobs (digest),
  deadline_at INTEGER,
  continuation_id TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  CHECK (default_response_digest IS NULL OR deadline_at IS NOT NULL)
) STRICT;
CREATE INDEX human_decisions_by_run ON human_decisions (run_id);
CREATE INDEX human_decisions_by_deadline ON human_decisions (deadline_at) WHERE deadline_at IS NOT NULL;

CREATE TABLE human_decision_submissions (
  submission_id TEXT PRIMARY KEY,
  decision_id TEXT NOT NULL REFERENCES human_decisions (decision_id) ON DELETE CASCADE,
  idempotency_key TEXT NOT NULL,
  actor_class TEXT NOT NULL CHECK (actor_class IN ('client', 'channel', 'operator', 'human')),
  actor_id TEXT,
  channel_id TEXT REFERENCES channels (channel_id),
  response_digest BLOB NOT NULL REFERENCES blobs (digest),
  submission_outcome TEXT NOT NULL CHECK (submission_outcome IN ('accepted', 'rejected', 'superseded')),
  created_at INTEGER NOT NULL,
  UNIQUE (decision_id, idempotency_key)
) STRICT;

-- One immutable winner per decision: the primary key admits one resolution.
CREATE TABLE human_decision_resolutions (
  decision_id TEXT PRIMARY KEY REFERENCES human_decisions (decision_id) ON DELETE CASCADE,
  resolution_kind TEXT NOT NULL CHECK (resolution_kind IN ('human', 'timeoutPolicy', 'cancellation', 'expiry')),
  submission_id TEXT REFERENCES human_decision_submissions (submission_id),
  response_digest BLOB REFERENCES blobs (digest),
  resolved_at INTEGER NOT NULL,
  CHECK ((resolution_kind = 'human') = (submission_id IS NOT NULL)),
  CHECK ((resolution_kind IN ('human', 'timeoutPolicy')) = (response_digest IS NOT NULL))
) STRICT;
CREATE TRIGGER human_decision_resolutions_immutable BEFORE UPDATE ON human_decision_resolutions
BEGIN
  SELECT RAISE(ABORT, 'a decision resolution is immutable');
END;

-- Managed resources (resource manager; internal name controller) ------------

CREATE TABLE controller_resources (
  managed_resource_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  project_id TEXT NOT NULL REFERENCES projects (project_id),
  manager_name TEXT NOT NULL,
  resource_key TEXT NOT NULL,
  metadata_digest BLOB REFERENCES blobs (digest),
  spec_digest BLOB NOT NULL REFERENCES blobs (digest),
  status_digest BLOB REFERENCES blobs (digest),
  spec_generation INTEGER NOT NULL CHECK (spec_generation >= 1),
  observed_generation INTEGER NOT NULL DEFAULT 0 CHECK (observed_generation >= 0),
  lifecycle TEXT NOT NULL CHECK (lifecycle IN ('active', 'deleting')),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (project_id, manager_name, resource_key)
) STRICT;

CREATE TABLE controller_finalizers (
  managed_resource_id TEXT NOT NULL REFERENCES controller_resources (managed_resource_id) ON DELETE CASCADE,
  finalizer TEXT NOT NULL,
  added_at INTEGER NOT NULL,
  PRIMARY KEY (managed_resource_id, finalizer)
) STRICT;

CREATE TABLE controller_queue (
  managed_resource_id TEXT PRIMARY KEY REFERENCES controller_resources (managed_resource_id) ON DELETE CASCADE,
  queue_status TEXT NOT NULL CHECK (queue_status IN ('queued', 'claimed', 'idle')),
  available_at INTEGER NOT NULL,
  failures INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
  last_error_digest BLOB REFERENCES blobs (digest),
  updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX controller_queue_due ON controller_queue (queue_status, available_at);

CREATE TABLE controller_workflows (
  managed_resource_id TEXT NOT NULL REFERENCES controller_resources (managed_resource_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL UNIQUE REFERENCES runs (run_id),
  purpose TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (managed_resource_id, run_id)
) STRICT;

-- Effects: the transactional outbox ------------------------------------------

CREATE TABLE effects (
  effect_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  source_resource_id TEXT NOT NULL REFERENCES resources (resource_id),
  source_revision INTEGER NOT NULL CHECK (source_revision >= 1),
  effect_type TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
  payload_digest BLOB NOT NULL REFERENCES blobs (digest),
  effect_class TEXT NOT NULL CHECK (effect_class IN ('local', 'external')),
  performer TEXT NOT NULL CHECK (performer IN ('writer', 'runner', 'shell.exec', 'http.request', 'telegram.api')),
  recovery_policy TEXT NOT NULL CHECK (recovery_policy IN ('idempotent', 'manual')),
  owner_scope TEXT NOT NULL CHECK (owner_scope IN ('server', 'run', 'resource_manager', 'channel')),
  run_id TEXT REFERENCES runs (run_id) ON DELETE CASCADE,
  -- the channel whose adapter performs it: set exactly for channel-scoped effects
  channel_id TEXT REFERENCES channels (channel_id),
  effect_status TEXT NOT NULL CHECK (effect_status IN ('pending', 'applying', 'applied', 'rejected', 'ambiguous', 'cancelled')),
  available_at INTEGER NOT NULL,
  attempt_count INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
  max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
  result_digest BLOB REFERENCES blobs (digest),
  error_digest BLOB REFERENCES blobs (digest),
  error_code TEXT,
  external_ref TEXT,
  settled_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  CHECK ((effect_status IN ('applied', 'rejected', 'cancelled')) = (settled_at IS NOT NULL)),
  CHECK (attempt_count <= max_attempts),
  CHECK ((effect_class = 'local') = (performer = 'writer')),
  CHECK ((owner_scope = 'channel') = (channel_id IS NOT NULL)),
  CHECK ((performer = 'telegram.api') = (owner_scope = 'channel'))
) STRICT;
CREATE UNIQUE INDEX effects_one_deterministic_key ON effects (effect_type, idempotency_key);
CREATE INDEX effects_due ON effects (performer, effect_status, available_at) WHERE effect_status IN ('pending', 'applying');
CREATE INDEX effects_by_run ON effects (run_id, effect_status) WHERE run_id IS NOT NULL;
CREATE INDEX effects_by_source ON effects (source_resource_id);
CREATE INDEX effects_channel_due ON effects (channel_id, effect_status, available_at) WHERE channel_id IS NOT NULL;

CREATE TABLE effect_attempts (
  effect_id TEXT NOT NULL REFERENCES effects (effect_id) ON DELETE CASCADE,
  attempt_number INTEGER NOT NULL CHECK (attempt_number >= 1),
  lease_generation INTEGER NOT NULL CHECK (lease_generation >= 1),
  owner_id TEXT NOT NULL,
  attempt_status TEXT NOT NULL CHECK (attempt_status IN ('applying', 'applied', 'rejected', 'failed', 'ambiguous')),
  result_digest BLOB REFERENCES blobs (digest),
  error_digest BLOB REFERENCES blobs (digest),
  error_code TEXT,
  external_ref TEXT,
  retry_at INTEGER,
  started_at INTEGER NOT NULL,
  ended_at INTEGER,
  PRIMARY KEY (effect_id, attempt_number),
  CHECK ((attempt_status = 'applying') = (ended_at IS NULL))
) STRICT;
CREATE UNIQUE INDEX effect_attempts_one_applying ON effect_attempts (effect_id) WHERE attempt_status = 'applying';

-- Pi messages ------------------------------------------------------------------

CREATE TABLE workflow_messages (
  workflow_message_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  request_id TEXT REFERENCES interactive_requests (request_id) ON DELETE CASCADE,
  target_session_id TEXT NOT NULL,
  message_kind TEXT NOT NULL CHECK (message_kind IN ('step', 'decision', 'notification', 'terminal', 'follow_up')),
  source_kind TEXT NOT NULL,
  source_id TEXT NOT NULL,
  idempotency_key TEXT NOT NULL UNIQUE,
  content_digest BLOB NOT NULL REFERENCES blobs (digest),
  session_order INTEGER NOT NULL CHECK (session_order >= 1),
  message_state TEXT NOT NULL CHECK (message_state IN ('pending', 'sent', 'cancelled')),
  pi_entry_id TEXT,
  recovery_stop TEXT CHECK (recovery_stop IN ('cancellation', 'interruption', 'timeout')),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (target_session_id, session_order),
  CHECK ((message_state = 'sent') = (pi_entry_id IS NOT NULL)),
  CHECK ((message_kind = 'step') <= (request_id IS NOT NULL))
) STRICT;
CREATE INDEX workflow_messages_by_run ON workflow_messages (run_id);
CREATE INDEX workflow_messages_pending_by_session ON workflow_messages (target_session_id, session_order) WHERE message_state = 'pending';
CREATE INDEX workflow_messages_by_request ON workflow_messages (request_id) WHERE request_id IS NOT NULL;
CREATE UNIQUE INDEX workflow_messages_one_pending_step_per_request ON workflow_messages (request_id) WHERE message_kind = 'step' AND message_state = 'pending';

CREATE TABLE workflow_turns (
  workflow_turn_id TEXT PRIMARY KEY,
  workflow_message_id TEXT NOT NULL REFERENCES workflow_messages (workflow_message_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  target_session_id TEXT NOT NULL,
  turn_state TEXT NOT NULL CHECK (turn_state IN ('open', 'ended', 'lost')),
  stop_reason TEXT,
  response_entry_id TEXT,
  active_elapsed_ms INTEGER CHECK (active_elapsed_ms IS NULL OR active_elapsed_ms >= 0),
  started_at INTEGER NOT NULL,
  ended_at INTEGER,
  CHECK ((turn_state = 'open') = (ended_at IS NULL))
) STRICT;
CREATE UNIQUE INDEX workflow_turns_one_open_per_message ON workflow_turns (workflow_message_id) WHERE turn_state = 'open';
CREATE INDEX workflow_turns_by_run ON workflow_turns (run_id);
CREATE INDEX workflow_turns_by_message ON workflow_turns (workflow_message_id);

-- Channels ---------------------------------------------------------------------

CREATE TABLE channels (
  channel_id TEXT PRIMARY KEY REFERENCES resources (resource_id),
  channel_kind TEXT NOT NULL CHECK (channel_kind IN ('telegram')),
  profile_name TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE channel_cursors (
  channel_id TEXT PRIMARY KEY REFERENCES channels (channel_id) ON DELETE CASCADE,
  cursor_position INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE channel_messages (
  channel_message_id TEXT PRIMARY KEY,
  channel_id TEXT NOT NULL REFERENCES channels (channel_id),
  decision_id TEXT NOT NULL REFERENCES human_decisions (decision_id) ON DELETE CASCADE,
  record_kind TEXT NOT NULL CHECK (record_kind IN ('delivery', 'settlement')),
  effect_id TEXT NOT NULL REFERENCES effects (effect_id),
  created_at INTEGER NOT NULL,
  UNIQUE (channel_id, decision_id, record_kind)
) STRICT;
CREATE INDEX channel_messages_by_decision ON channel_messages (decision_id);
CREATE TRIGGER channel_messages_immutable BEFORE UPDATE ON channel_messages
BEGIN
  SELECT RAISE(ABORT, 'channel messages are immutable');
END;

-- Viewer projection ------------------------------------------------------------

CREATE TABLE viewer_runs (
  run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
  presentation_revision INTEGER NOT NULL CHECK (presentation_revision >= 1),
  retained_revision_floor INTEGER NOT NULL CHECK (retained_revision_floor >= 1),
  updated_at INTEGER NOT NULL,
  CHECK (retained_revision_floor <= presentation_revision)
) STRICT;

-- One row per target patch: the ordered ops of one target of one presentation revision, as one
-- canonical JSON array in blobs. A revision's ops are its deltas in delta_index order.
CREATE TABLE viewer_deltas (
  run_id TEXT NOT NULL REFERENCES viewer_runs (run_id) ON DELETE CASCADE,
  presentation_revision INTEGER NOT NULL CHECK (presentation_revision >= 1),
  delta_index INTEGER NOT NULL CHECK (delta_index >= 0),
  target_type TEXT NOT NULL CHECK (target_type IN ('summary', 'graph', 'replay', 'timeline', 'conversation', 'inspector')),
  target_key TEXT NOT NULL,
  patch_digest BLOB NOT NULL REFERENCES blobs (digest),
  recorded_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, presentation_revision, delta_index)
) STRICT;

CREATE TABLE viewer_session_checkpoints (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  run_seq INTEGER NOT NULL CHECK (run_seq >= 256 AND run_seq % 256 = 0),
  state_digest BLOB NOT NULL REFERENCES blobs (digest),
  created_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, run_seq)
) STRICT;

CREATE TABLE run_view_content (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  digest BLOB NOT NULL REFERENCES blobs (digest),
  media_type TEXT NOT NULL CHECK (media_type IN ('application/json', 'text/plain;charset=utf-8')),
  byte_length INTEGER NOT NULL CHECK (byte_length >= 0),
  created_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, digest, media_type)
) STRICT;
CREATE INDEX run_view_content_by_digest ON run_view_content (digest);

-- Every reference to a blob is indexed: retention deletes a blob only when no row references
-- it, and SQLite's foreign-key check on that delete would otherwise scan each of these tables.
CREATE INDEX interactive_requests_by_contract_digest ON interactive_requests (contract_digest);
CREATE INDEX interactive_submissions_by_payload_digest ON interactive_submissions (payload_digest);
CREATE INDEX interactive_submissions_by_receipt_digest ON interactive_submissions (receipt_digest) WHERE receipt_digest IS NOT NULL;
CREATE INDEX runs_by_input_digest ON runs (input_digest);
CREATE INDEX runs_by_launch_options_digest ON runs (launch_options_digest) WHERE launch_options_digest IS NOT NULL;
CREATE INDEX runs_by_output_digest ON runs (output_digest) WHERE output_digest IS NOT NULL;
CREATE INDEX runs_by_error_digest ON runs (error_digest) WHERE error_digest IS NOT NULL;
CREATE INDEX node_attempts_by_output_digest ON node_attempts (output_digest) WHERE output_digest IS NOT NULL;
CREATE INDEX node_attempts_by_error_digest ON node_attempts (error_digest) WHERE error_digest IS NOT NULL;
CREATE INDEX node_attempts_by_receipt_digest ON node_attempts (receipt_digest) WHERE receipt_digest IS NOT NULL;
CREATE INDEX workflow_updates_by_body_digest ON workflow_updates (body_digest);
CREATE INDEX workflow_settings_by_value_digest ON workflow_settings (value_digest);
CREATE INDEX workflow_setting_changes_by_patch_digest ON workflow_setting_changes (patch_digest);
CREATE INDEX workflow_setting_changes_by_value_digest ON workflow_setting_changes (value_digest);
CREATE INDEX workflow_follow_ups_by_prompt_digest ON workflow_follow_ups (prompt_digest);
CREATE INDEX session_entries_by_content_digest ON session_entries (content_digest);
CREATE INDEX human_decisions_by_request_digest ON human_decisions (request_digest);
CREATE INDEX human_decisions_by_default_response_digest ON human_decisions (default_response_digest) WHERE default_response_digest IS NOT NULL;
CREATE INDEX human_decision_submissions_by_response_digest ON human_decision_submissions (response_digest);
CREATE INDEX human_decision_resolutions_by_response_digest ON human_decision_resolutions (response_digest) WHERE response_digest IS NOT NULL;
CREATE INDEX controller_resources_by_metadata_digest ON controller_resources (metadata_digest) WHERE metadata_digest IS NOT NULL;
CREATE INDEX controller_resources_by_spec_digest ON controller_resources (spec_digest);
CREATE INDEX controller_resources_by_status_digest ON controller_resources (status_digest) WHERE status_digest IS NOT NULL;
CREATE INDEX controller_queue_by_last_error_digest ON controller_queue (last_error_digest) WHERE last_error_digest IS NOT NULL;
CREATE INDEX effects_by_payload_digest ON effects (payload_digest);
CREATE INDEX effects_by_result_digest ON effects (result_digest) WHERE result_digest IS NOT NULL;
CREATE INDEX effects_by_error_digest ON effects (error_digest) WHERE error_digest IS NOT NULL;
CREATE INDEX effect_attempts_by_result_digest ON effect_attempts (result_digest) WHERE result_digest IS NOT NULL;
CREATE INDEX effect_attempts_by_error_digest ON effect_attempts (error_digest) WHERE error_digest IS NOT NULL;
CREATE INDEX workflow_messages_by_content_digest ON workflow_messages (content_digest);
CREATE INDEX viewer_session_checkpoints_by_state_digest ON viewer_session_checkpoints (state_digest);
-- One entry per target patch (a few per transaction), not per op value.
CREATE INDEX viewer_deltas_by_patch_digest ON viewer_deltas (patch_digest);

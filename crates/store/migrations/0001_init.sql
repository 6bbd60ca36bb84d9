-- Tidegate's state schema, shared by SQLite and PostgreSQL.
-- Portable types only: timestamps are TEXT (RFC 3339, UTC, milliseconds, `Z`, so that text order
-- is time order), JSON is TEXT, booleans are integers, counters are BIGINT.

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    trigger_kind TEXT NOT NULL,
    priority TEXT NOT NULL,
    requester TEXT NOT NULL,
    backfill_id TEXT,
    idempotency_key TEXT,
    request_json TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX runs_by_created ON runs (created_at, id);
CREATE INDEX runs_by_status ON runs (status);

CREATE TABLE steps (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id),
    -- Position in the request's step list, so steps come back in the order they were planned.
    step_idx BIGINT NOT NULL,
    name TEXT NOT NULL,
    task TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    interval_start TEXT,
    interval_end TEXT,
    step_key TEXT NOT NULL,
    pool TEXT NOT NULL,
    upstream_json TEXT NOT NULL,
    inputs_json TEXT NOT NULL,
    -- Denormalized from state_json so that schedulers can select by status and epoch.
    status TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    state_json TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (run_id, name)
);
CREATE INDEX steps_by_run ON steps (run_id);
CREATE INDEX steps_by_status ON steps (status, pool);
CREATE INDEX steps_by_task_partition ON steps (task, partition_key);
CREATE INDEX steps_by_key ON steps (step_key);

CREATE TABLE attempts (
    step_id TEXT NOT NULL REFERENCES steps (id),
    attempt BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    worker TEXT NOT NULL,
    started_at TEXT NOT NULL,
    ended_at TEXT,
    outcome TEXT,
    reason TEXT,
    PRIMARY KEY (step_id, attempt)
);

-- One lease per step: the current attempt's. `epoch` is the fencing token.
CREATE TABLE leases (
    step_id TEXT PRIMARY KEY REFERENCES steps (id),
    attempt BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    worker TEXT NOT NULL,
    acquired_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
CREATE INDEX leases_by_expiry ON leases (expires_at);

-- The immutable staged output of one step for one dataset partition.
CREATE TABLE versions (
    id TEXT PRIMARY KEY,
    step_id TEXT NOT NULL REFERENCES steps (id),
    attempt BIGINT NOT NULL,
    dataset TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    files_json TEXT NOT NULL,
    n_rows BIGINT NOT NULL,
    schema_hash TEXT NOT NULL,
    checksum TEXT NOT NULL,
    stats_json TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX versions_by_step ON versions (step_id);
CREATE INDEX versions_by_dataset_partition ON versions (dataset, partition_key);

-- A publication (or a rollback, which restores earlier versions) and the versions it made visible.
CREATE TABLE releases (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    run_id TEXT REFERENCES runs (id),
    backfill_id TEXT,
    restores_release_id TEXT REFERENCES releases (id),
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE release_versions (
    release_id TEXT NOT NULL REFERENCES releases (id),
    dataset TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    version_id TEXT REFERENCES versions (id),
    delta_version BIGINT,
    PRIMARY KEY (release_id, dataset, partition_key)
);
CREATE INDEX release_versions_by_dataset ON release_versions (dataset, partition_key);

-- Recorded only after the output it covers is durably staged (invariant 4).
CREATE TABLE checkpoints (
    step_id TEXT NOT NULL REFERENCES steps (id),
    granule TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    position TEXT NOT NULL,
    version_id TEXT REFERENCES versions (id),
    created_at TEXT NOT NULL,
    PRIMARY KEY (step_id, granule)
);

CREATE TABLE backfills (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    requester TEXT NOT NULL,
    comparison_hash TEXT,
    approved_by TEXT,
    approved_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

-- Client idempotency keys: `in_progress` between claim and run creation, then `done`.
CREATE TABLE idempotency_records (
    idem_key TEXT PRIMARY KEY,
    request_json TEXT NOT NULL,
    state TEXT NOT NULL,
    run_id TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
CREATE INDEX idempotency_by_expiry ON idempotency_records (expires_at);

-- The append-only, hash-chained journal. No foreign keys: it must outlive what it describes.
CREATE TABLE journal (
    seq BIGINT PRIMARY KEY,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    at TEXT NOT NULL,
    actor TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    run_id TEXT,
    step_id TEXT,
    task TEXT,
    partition_key TEXT,
    interval_start TEXT,
    interval_end TEXT,
    from_status TEXT,
    to_status TEXT,
    reason TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX journal_by_run ON journal (run_id, seq);
CREATE INDEX journal_by_step ON journal (step_id, seq);
CREATE INDEX journal_by_task_partition ON journal (task, partition_key, seq);

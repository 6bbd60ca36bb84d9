-- Worker processes (`tidegate worker`) register here and renew their registration as they run;
-- the scheduler gives leases only to workers whose registration has not expired, never more
-- than their slots. Portable SQL, shared by SQLite and PostgreSQL.
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    slots BIGINT NOT NULL,
    started_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
CREATE INDEX leases_by_worker ON leases (worker);

-- The scheduler's gauges (queue depths, retry budgets left, throughput, backlog ETA), written as
-- it runs so that `tidegate status` in another process can show them. Not journaled: they record
-- no decision.
CREATE TABLE metrics (
    name TEXT PRIMARY KEY,
    value_json TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

-- Engine support: what a checkpoint covers, and the single scheduler role.
-- Portable SQL, shared by SQLite and PostgreSQL. The checkpoints table is empty before this
-- migration (nothing wrote it), but the defaults keep `ADD COLUMN ... NOT NULL` legal on SQLite.

-- A checkpoint records the data version, schema hash, row count and checksum of what it covers,
-- so that a resumed attempt can check that the staged output it skips is the one it expects.
ALTER TABLE checkpoints ADD COLUMN data_version BIGINT;
ALTER TABLE checkpoints ADD COLUMN schema_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE checkpoints ADD COLUMN n_rows BIGINT NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN checksum TEXT NOT NULL DEFAULT '';
CREATE INDEX checkpoints_by_step_created ON checkpoints (step_id, created_at, granule);

-- At most one row: who holds the scheduler role and until when. Only the holder promotes steps,
-- expires leases and publishes; a holder that stops renewing loses the role at `expires_at`.
CREATE TABLE scheduler_role (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    owner TEXT NOT NULL,
    acquired_at TEXT NOT NULL,
    renewed_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);

-- A release publishes its datasets in dependency order; keep the order its items were given in.
ALTER TABLE release_versions ADD COLUMN item_idx BIGINT NOT NULL DEFAULT 0;
CREATE INDEX release_versions_by_release ON release_versions (release_id, item_idx);
CREATE INDEX releases_by_created ON releases (created_at, id);

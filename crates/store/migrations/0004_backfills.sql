-- Backfills: the whole record as JSON beside the columns queries filter on, and the partitions
-- each backfill rewrites, so that an overlapping second backfill is refused inside the same
-- transaction that would create it. Portable SQL, shared by SQLite and PostgreSQL.
ALTER TABLE backfills ADD COLUMN run_id TEXT;
ALTER TABLE backfills ADD COLUMN record_json TEXT NOT NULL DEFAULT '{}';
CREATE INDEX backfills_by_created ON backfills (created_at, id);

CREATE TABLE backfill_partitions (
    backfill_id TEXT NOT NULL REFERENCES backfills (id),
    dataset TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    PRIMARY KEY (backfill_id, dataset, partition_key)
);
CREATE INDEX backfill_partitions_by_partition ON backfill_partitions (dataset, partition_key);

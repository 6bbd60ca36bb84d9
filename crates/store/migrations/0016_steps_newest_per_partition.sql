-- The newest step of each partition of a task, read from the index alone (the web UI's overview,
-- `Store::newest_steps`): a partial index of the steps that say something about a partition's
-- data, so that the query passes over neither the rows of steps nor the skipped, superseded and
-- cancelled ones (most of a busy store's steps). The condition is the query's own, word for word,
-- so that SQLite's and PostgreSQL's planners both use it. Portable SQL.
CREATE INDEX steps_newest_per_partition ON steps (task, partition_key, created_at, id, status)
    WHERE status NOT IN ('skipped', 'superseded', 'cancelled');

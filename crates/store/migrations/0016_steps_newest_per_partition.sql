-- The newest step of each partition of a task, read from the index alone (the web UI's overview,
-- `Store::newest_steps`): without it the query visits every step row of the task, skipped and
-- superseded ones included, to read their status. Portable SQL.
CREATE INDEX steps_newest_per_partition ON steps (task, partition_key, created_at, id, status);

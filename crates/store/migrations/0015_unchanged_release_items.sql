-- A release item whose commit changed nothing in its partition (an append whose every row was
-- already published): 1, else NULL. What was built on that partition is not made stale by it
-- (invariant 14). Portable SQL.
ALTER TABLE release_versions ADD COLUMN unchanged BIGINT;

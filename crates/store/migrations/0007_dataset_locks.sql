-- Maintenance locks, one per dataset: vacuum holds a dataset's lock while it decides which files
-- no kept version needs and deletes them, and everything that adds files back to a table
-- (rollback, a backfill's rollback) holds it while it commits, so a file cannot be deleted
-- between a rollback's check that it exists and the commit that references it again. A holder
-- that stops renewing loses the lock at `expires_at`. Portable SQL, shared by SQLite and
-- PostgreSQL.
CREATE TABLE dataset_locks (
    dataset TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    purpose TEXT NOT NULL,
    acquired_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);

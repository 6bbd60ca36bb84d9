-- How far the OpenLineage export has got, per transport (`file`, `http`): the sequence number of
-- the last journal entry whose events that transport accepted. The events themselves are derived
-- from the journal again whenever needed, so this one number per transport is all the export
-- keeps. Not journaled: it records no decision. Portable SQL, shared by SQLite and PostgreSQL.
-- (Number 0009 is taken by the HTTP API's request keys, on another branch.)
CREATE TABLE lineage_cursors (
    transport TEXT PRIMARY KEY,
    after_seq BIGINT NOT NULL,
    updated_at TEXT NOT NULL
);

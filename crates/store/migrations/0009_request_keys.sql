-- Idempotency keys of API requests (`Idempotency-Key` on the HTTP API), apart from the run
-- submission keys of `idempotency_records`: one row per caller (`scope`, the authenticated
-- identity) and key, claimed by one request at a time (the primary key makes a claim atomic),
-- in progress while `held_until` is set and renewed, then complete with the response to replay.
-- Expired rows are forgotten by the next claim of their key and deleted by a purge. Not
-- journaled: the operation a request runs journals itself. Portable SQL, shared by SQLite and
-- PostgreSQL.
CREATE TABLE request_keys (
    scope TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    claim_id TEXT NOT NULL UNIQUE,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    body_hash TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    held_until TEXT,
    response_status BIGINT,
    response_type TEXT,
    response_body TEXT,
    completed_at TEXT,
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX request_keys_by_expiry ON request_keys (expires_at);

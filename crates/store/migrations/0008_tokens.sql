-- Tokens: identities an admin mints for people (and, behind the server, programs). The store keeps
-- a token's hash, never the token. `identity_key` is the name as people compare names (case and
-- look-alike letters folded), so two spellings of one person cannot hold two identities.
-- Portable SQL, shared by SQLite and PostgreSQL.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    identity_key TEXT NOT NULL,
    role TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    revoked_at TEXT
);
CREATE INDEX tokens_by_identity ON tokens (identity_key);

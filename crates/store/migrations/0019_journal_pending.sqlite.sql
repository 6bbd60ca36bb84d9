-- Journal entries appended but not chained yet (decision 0024). On SQLite, with its one writer,
-- every entry is chained as it is appended, so this table stays empty; it exists so that a query
-- over both tables reads the same on either database.
CREATE TABLE journal_pending (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    xid INTEGER NOT NULL DEFAULT 0,
    at TEXT NOT NULL,
    actor TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    run_id TEXT,
    step_id TEXT,
    task TEXT,
    partition_key TEXT,
    interval_start TEXT,
    interval_end TEXT,
    from_status TEXT,
    to_status TEXT,
    reason TEXT NOT NULL,
    payload TEXT NOT NULL,
    via TEXT
);

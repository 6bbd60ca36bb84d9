-- Journal entries appended by concurrent writers before the chainer gives them their place in the
-- chain (decision 0024): a write transaction appends here without reading the journal's head, and
-- after it commits the chainer moves its entries into `journal`, in the order of their
-- transactions' ids, computing `seq`, `prev_hash` and `hash` there. `xid` is the appending
-- transaction's id. An entry is never changed here, only taken by the chainer.
CREATE TABLE journal_pending (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
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
CREATE INDEX journal_pending_in_order ON journal_pending (xid, id);
CREATE TRIGGER journal_pending_unchanged BEFORE UPDATE ON journal_pending
    FOR EACH ROW EXECUTE FUNCTION journal_reject_change();

-- Alert episodes and silences (issue 34, decision 0023). `alert_states` holds, per rule and
-- subject (a task, pool, dataset or backfill the rule watches, or `*` for the workspace), the
-- episode's state as JSON (`tidegate_core::alert::Episode`), how many episodes fired so far, and
-- whether the firing episode was silenced when it fired (its resolution is then silent too). A
-- state moves only from the state its writer read (compare and set), with its journal entry in
-- the same transaction: one fire per episode however many evaluators run. `silences` keeps every
-- silence with its expiry and reason; one ended early has `ended_at`. Portable SQL.
CREATE TABLE alert_states (
    rule TEXT NOT NULL,
    subject TEXT NOT NULL,
    state TEXT NOT NULL,
    episodes BIGINT NOT NULL,
    quiet INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (rule, subject)
);
CREATE TABLE silences (
    id TEXT PRIMARY KEY,
    rule TEXT NOT NULL,
    subject TEXT,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    ended_at TEXT
);

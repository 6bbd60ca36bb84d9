-- Pauses an operator put in force (issue 34): what is paused (`schedule:TASK`, `task:TASK`,
-- `pool:NAME`, `class:catchup`, `class:backfill`), who paused it, why and when. A row exists
-- while the pause holds; resuming deletes it. Both are journaled (`paused`, `resumed`) in the
-- same transaction, so the journal keeps the whole story. Portable SQL, shared by SQLite and
-- PostgreSQL.
CREATE TABLE pauses (
    what TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    paused_at TEXT NOT NULL
);

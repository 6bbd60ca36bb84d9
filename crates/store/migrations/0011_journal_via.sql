-- How the actor of a journal entry was established and from where (`token tk-... (approver),
-- http 127.0.0.1:53012`); NULL for the engine's own decisions and for entries written before.
ALTER TABLE journal ADD COLUMN via TEXT;

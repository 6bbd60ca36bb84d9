-- The journal is append-only: the database itself refuses to change or remove an entry, so that a
-- bug in any code path cannot rewrite history. (Someone with write access to the file can still
-- drop these triggers; the hash chain is what detects that.)
CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
BEGIN
    SELECT RAISE(ABORT, 'the journal is append-only: entries cannot be updated');
END;
CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
BEGIN
    SELECT RAISE(ABORT, 'the journal is append-only: entries cannot be deleted');
END;

-- The journal is append-only: the database itself refuses to change or remove an entry, so that a
-- bug in any code path cannot rewrite history. (A superuser can still drop the trigger; the hash
-- chain is what detects that.)
CREATE FUNCTION journal_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the journal is append-only: entries cannot be %', lower(TG_OP) || 'd'
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE ON journal
    FOR EACH ROW EXECUTE FUNCTION journal_reject_change();
-- TRUNCATE bypasses row triggers; refuse it too.
CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON journal
    FOR EACH STATEMENT EXECUTE FUNCTION journal_reject_change();

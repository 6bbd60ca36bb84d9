-- A run's status is re-derived from a count of its steps by status in every transaction that
-- changes one of them: a covering index makes that count an index range, not a table scan.
CREATE INDEX steps_by_run_status ON steps (run_id, status);
DROP INDEX steps_by_run;

-- The code version each step was planned with (the task's command or SQL text and declared files,
-- `idempotency::code_version`), so that a step runs only the code it was submitted with and a
-- published partition's code version is known from its release (decision 0020). NULL for steps
-- planned before this column: their code version is unknown. Portable SQL.
ALTER TABLE steps ADD COLUMN code_version TEXT;

-- Which process holds a worker's name. A registration belongs to one process, told apart by a
-- random instance id and named by its host and pid: a second live process asking for the name
-- is refused, naming the first. A lease's attempt is started by the one process that takes it
-- (`runner`: a worker's instance id, or the scheduler's name for the attempts it runs itself),
-- so that even a duplicate that slipped through cannot run an attempt twice. Portable SQL.
ALTER TABLE workers ADD COLUMN instance TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN host TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN pid BIGINT NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN runner TEXT;

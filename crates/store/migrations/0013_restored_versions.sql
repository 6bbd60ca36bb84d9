-- What a rollback restored, per item: the Delta table version whose state of that partition (or,
-- for `*`, of the whole table) it made visible again. With it, the store alone says which
-- partitions are published now (decision 0018): a rollback's item counts as published exactly
-- when the restored version had that partition published. Portable SQL.
ALTER TABLE release_versions ADD COLUMN restored_delta_version BIGINT;
-- Rollbacks recorded before this column: an undo of a release restored the version before that
-- release's commit to the dataset. A rollback to an explicit version recorded nothing to derive
-- it from and stays NULL, which counts as unpublished (shown as debt, never as fresh data).
UPDATE release_versions SET restored_delta_version = (
    SELECT MIN(undone.delta_version) - 1
    FROM releases r
    JOIN release_versions undone
        ON undone.release_id = r.restores_release_id AND undone.dataset = release_versions.dataset
    WHERE r.id = release_versions.release_id
)
WHERE version_id IS NULL AND release_id IN (SELECT id FROM releases WHERE kind = 'rollback');
CREATE INDEX release_versions_by_dataset_version ON release_versions (dataset, delta_version);

#![warn(missing_docs, unreachable_pub)]
//! Tidegate's data plane: each dataset is a Delta table in the lake. Steps stage their output as
//! uncommitted Parquet files, checks run on the staged rows, and publication makes them visible in
//! one Delta commit per dataset, guarded against replays by an application transaction. Rollback
//! is a new commit that restores an earlier version's files; vacuum deletes the files no version a
//! rollback may still target references.
//!
//! Architecture invariant: this crate knows nothing of the state store. It returns plain,
//! serializable records ([`StagedVersion`], [`CheckResult`], [`Publication`]) that the engine
//! persists and journals.
//!
//! Architecture invariant: user SQL (`sql`, custom checks, SQL tasks) runs only through
//! `df::user_query` on a `df::UserSession`: read-only, with no file access, bounded in memory and
//! time. `df::query` is for the SQL Tidegate writes itself.
//!
//! Architecture invariant: a file is visible to readers only through a Delta commit; staging never
//! writes to `_delta_log`, and every staged path is non-hidden so vacuum and reconciliation can
//! clean it.

mod amplifiers;
mod anchor;
mod approved;
mod cache;
mod checks;
mod column_names;
mod compare;
mod convert;
mod dedup;
mod df;
mod error;
mod evolution;
pub mod failpoint;
mod layout;
mod local;
mod logs;
mod modes;
mod pointer;
mod publish;
mod query;
mod read;
mod rollback;
mod s3;
pub mod source;
mod stage;
mod table;
mod vacuum;

pub use anchor::{
    ANCHOR_SEARCH_COMMITS, Anchor, AnchoredVersion, HEAD_DIR, HeadAnchor, JOURNAL_HASH_KEY, JOURNAL_SEQ_KEY,
    PROJECT_KEY,
};
pub use checks::{CheckResult, SCHEMA_CONTRACT};
pub use compare::{
    ColumnDelta, CompareSpec, Comparison, ComparisonTotals, MAX_SLICE_VALUES, NULL_SLICE_VALUE, PartitionComparison,
    PartitionSize, SliceDelta,
};
pub use df::{LimitsSetBy, QueryLimits, USER_QUERY_MEMORY_LIMIT_MB, USER_QUERY_TIME_LIMIT_S, is_reported_panic};
pub use error::{Error, FileLocation, Result};
pub use evolution::{ChangeKind, ColumnChange, PendingChange, SchemaChange};
pub use layout::{PARTITIONING_PROPERTY, PartitionColumn, PartitionKind};
pub use logs::{LOG_STREAMS, LOGS_DIR, LogCopy};
pub use pointer::{Advance, CURRENT_POINTER, POINTER_DIR, Pointer};
pub use publish::{
    APP_ID_PREFIX, DUPLICATES_DROPPED_KEY, LATE_ROWS_IGNORED_KEY, MAX_COMMIT_ATTEMPTS, Publication, PublishedItem,
    Release, ReleaseItem, SCHEMA_CHANGE_KEY, TXN_UNDONE, app_id,
};
pub use query::InputTable;
pub use read::{Commit, DIFF_SAMPLE_ROWS, Diff};
pub use rollback::{
    Declared, Deletion, Differences, FILE_TIME_GRANULARITY, LeftAlone, MismatchedRelease, MissingFile, MissingVersion,
    NotOwned, OBJECT_STORE_CLOCK_SKEW, Owner, ROLLBACK_PARTITIONS_KEY, Reconciliation, RollbackCommit, Scope,
    UnknownVersion,
};
pub use stage::{ColumnStats, MAX_INPUT_FILES, StagedFile, StagedVersion, schema_hash};
pub use table::{Lake, PARTITION_COLUMN, STAGING_DIR};
pub use vacuum::{Vacuum, VacuumPlan};

/// Re-exported so callers build and read batches with the exact Arrow version the lake uses.
pub use arrow;

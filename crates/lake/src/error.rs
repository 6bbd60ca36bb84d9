//! The one error type of the data plane, sorted by who must act: the user (bad data, bad names,
//! unsupported lake), the caller's retry loop (commit conflicts, storage hiccups), or us (bugs).

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the lake. Use [`Error::is_retryable`] to classify.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- the user's mistake: deterministic, retrying cannot help ----
    /// The lake URL names a store Tidegate cannot write safely (or at all).
    #[error("lake {url}: {reason}")]
    UnsupportedLake {
        /// The lake location as given.
        url: String,
        /// Why Tidegate cannot use it, and what to use instead.
        reason: String,
    },

    /// The lake URL is neither a folder nor a supported object-store URL.
    #[error("invalid lake location {url:?}: {reason}")]
    InvalidLake {
        /// The lake location as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A dataset name, staging id or partition key that cannot be used as given.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// What the value names, e.g. `dataset name`, `staging id` or `partition key`.
        what: &'static str,
        /// The value as given.
        value: String,
        /// The rule it breaks.
        reason: String,
    },

    /// The dataset's table was written by an earlier Tidegate, with a text partition column and
    /// its files under `staging/`: readable, but Tidegate no longer writes that layout.
    #[error(
        "dataset {dataset:?}: its table was written with Tidegate's earlier layout (partition column {column} \
         as text, files under staging/), which Polars and other readers of partition folders misread; Tidegate \
         writes <column>=<value>/ folders and a typed column now, and will not mix the two in one table. Rewrite \
         it: move the table folder aside, then rebuild every partition with a governed backfill (tidegate \
         backfill plan <task> --from <first> --to <last> --reprocess all), which shows the blast radius and the comparison \
         before anything is published; until then the old table stays readable as it is"
    )]
    LegacyLayout {
        /// The dataset whose table has the old layout.
        dataset: String,
        /// Its partition column.
        column: String,
    },

    /// An append delivery has rows whose `dedup_key` is null: their identity is unknown, so
    /// de-duplication cannot hold them once.
    #[error(
        "dataset {dataset:?}: {n_rows} staged rows have a null in dedup_key column {column:?}; a row with no \
         identity cannot be de-duplicated, so the delivery is refused: fill the key in the task, or filter \
         such rows out"
    )]
    NullDedupKey {
        /// The dataset being staged.
        dataset: String,
        /// The first key column with nulls.
        column: String,
        /// Rows with a null in that column.
        n_rows: u64,
    },

    /// The dataset has no Delta table yet (nothing staged or published).
    #[error("dataset {dataset:?} has no table in the lake yet")]
    UnknownDataset {
        /// The dataset name that was looked up.
        dataset: String,
    },

    /// The requested table version does not exist.
    #[error("dataset {dataset:?} has no version {version}")]
    UnknownVersion {
        /// The dataset whose table was read.
        dataset: String,
        /// The table version that was asked for.
        version: u64,
    },

    /// Staged data does not fit the dataset's schema.
    #[error("dataset {dataset:?}: {location}column {column:?}: {detail}")]
    SchemaMismatch {
        /// The dataset being staged, compared or read.
        dataset: String,
        /// Where the mismatch was found (file, line, row, batches or the table).
        location: FileLocation,
        /// The column that does not fit, is missing, or was named but does not exist.
        column: String,
        /// How it does not fit, e.g. the found and the declared type.
        detail: String,
    },

    /// A file left by a command could not be read as Parquet, CSV or JSON lines.
    #[error("dataset {dataset:?}: cannot read {file}: {detail}")]
    UnreadableFile {
        /// The dataset being staged.
        dataset: String,
        /// The file (or output folder) as the command left it, on the local file system.
        file: String,
        /// Why it cannot be read.
        detail: String,
    },

    /// A row names a partition the step was not asked to write.
    #[error("dataset {dataset:?}: {location}a row has {value}, but this step writes only {expected}")]
    PartitionMismatch {
        /// The dataset being staged.
        dataset: String,
        /// Where the offending row is.
        location: FileLocation,
        /// The partition column and the row's value in it (`tg_partition "null"`, or
        /// `tg_partition "(none)"` when the rows carry no partition column).
        value: String,
        /// The partition keys the step writes, comma-separated.
        expected: String,
    },

    /// A merge source holds several rows for one key and no ordering decides between them.
    #[error(
        "dataset {dataset:?}: the merge source has {n_rows} rows for key {key} and {why}; \
         nothing was written"
    )]
    TiedDuplicates {
        /// The merge dataset being staged or published.
        dataset: String,
        /// The tied key's values, as `(v1, v2, ...)`.
        key: String,
        /// How many source rows carry that key.
        n_rows: u64,
        /// Why no row wins: no `order_by`, or a shared highest `order_by` value.
        why: &'static str,
    },

    /// An append delivery holds different rows for one `dedup_key` in one partition and no
    /// `order_by` picks one.
    #[error(
        "dataset {dataset:?}: the delivery has {n_rows} different rows for dedup_key {key} in partition \
         {partition} and {why}; nothing of it was published"
    )]
    AppendTie {
        /// The append dataset being staged or published.
        dataset: String,
        /// The tied key's values, as `(k1=v1, k2=v2, ...)`.
        key: String,
        /// The partition the rows are in.
        partition: String,
        /// How many different rows carry that key there.
        n_rows: u64,
        /// Why no row wins, and what to do.
        why: String,
    },

    /// A staged file that a publication would reference is gone (reconciled or deleted by hand).
    #[error("dataset {dataset:?}: staged file {path} is missing; stage the step again")]
    MissingStagedFile {
        /// The dataset the file was staged for.
        dataset: String,
        /// The staged file's path, relative to the table root.
        path: String,
    },

    /// A staged version whose schema is not the table's at publication: the table was
    /// recreated with other columns after the step staged.
    #[error(
        "dataset {dataset:?}: staged version {staging_id} was written for another schema than the table now \
         has (was the table recreated?); run the step again to stage it for the current schema"
    )]
    StagedForOtherSchema {
        /// The dataset being published.
        dataset: String,
        /// The staged version whose schema hash differs from the table's.
        staging_id: String,
    },

    /// A schema change readers cannot follow in place, published by a release that would leave
    /// files written in the old schema in the table (see `evolution`).
    #[error(
        "dataset {dataset:?}: {change}; Delta readers cannot follow that change in place, so every file of the \
         table must be rewritten in one commit: publish it with a governed backfill of every partition \
         (tidegate backfill plan <task> --from <first> --to <last> --reprocess all), whose blast radius and \
         comparison show the change before it is approved. Until then the table keeps its schema{also}"
    )]
    SchemaNeedsRewrite {
        /// The dataset whose declared columns changed.
        dataset: String,
        /// The first change that needs a rewrite, naming the column.
        change: String,
        /// The other changes, if any (`; also ...`).
        also: String,
    },

    /// A rollback of some partitions to a version whose schema the table has since changed in a
    /// way the restored files do not fit.
    #[error(
        "dataset {dataset:?}: the table's schema changed after version {version} ({change}), so that version's \
         files of these partitions do not fit the table any more; restore the whole table instead (tidegate \
         rollback {dataset} --to-version {version}), which brings back its schema too, or roll back the release \
         that changed the schema"
    )]
    SchemaChangedSince {
        /// The dataset rolled back.
        dataset: String,
        /// The version the rollback targets.
        version: u64,
        /// How the schema changed since, naming the column.
        change: String,
    },

    /// A rollback target whose files vacuum has deleted (no kept release needed them).
    #[error(
        "dataset {dataset:?}: version {version} references {path}, which vacuum removed; roll back to a \
         version a retained release recorded (see `tidegate vacuum --help`)"
    )]
    VacuumedVersion {
        /// The dataset being rolled back or restored.
        dataset: String,
        /// The table version that was to be restored.
        version: u64,
        /// The first file of that version found missing, relative to the table root.
        path: String,
    },

    /// A commit in a table's log that is empty or not JSON (a full disk, a copy cut short, an
    /// editor): what it adds or removes is unknown, so nothing that deletes or restores may
    /// decide from the log.
    #[error(
        "dataset {dataset:?}: commit file {file} is {problem}; vacuum, reconcile and rollback refuse to touch \
         this table until it is repaired: restore the file from a backup (or, if it is the newest commit and \
         cannot be recovered, move it out of _delta_log so the table ends at the version before it, then run \
         `tidegate reconcile` to see what the store expects)"
    )]
    UnreadableCommit {
        /// The dataset whose log holds the commit.
        dataset: String,
        /// The commit file's full location (table URL and `_delta_log/...` path).
        file: String,
        /// What is wrong with it: empty, or the line that is not JSON.
        problem: String,
    },

    /// `reconcile --delete` named a file that reconcile does not report as not provably Tidegate's.
    #[error(
        "{file} is not a file reconcile reports as not provably Tidegate's (a commit, a file a table version \
         references, a file of an attempt that may still publish, or a path that does not exist); nothing was \
         deleted. Run `tidegate reconcile` and name files exactly as it prints them"
    )]
    NotReported {
        /// The file as named by the caller (`<dataset>/<path>`).
        file: String,
    },

    /// A snapshot older than the one published would move readers backwards in time.
    #[error(
        "dataset {dataset:?}: the snapshot of {staged} is older than the published snapshot of {published}; not publishing it"
    )]
    SupersededSnapshot {
        /// The snapshot dataset being published.
        dataset: String,
        /// The newest partition key of the staged snapshot.
        staged: String,
        /// The newest partition key of the published snapshot.
        published: String,
    },

    /// A reviewed release (a backfill) whose dataset changed under it after its comparison was
    /// approved: publishing it would replace data nobody reviewed it against.
    #[error(
        "dataset {dataset:?}: {} changed after the comparison was approved against {} (found version \
         {found_version}); nothing more was published. Compare again and have the new comparison approved",
        describe_partitions(partitions),
        approved_version.map_or_else(|| "no table".to_owned(), |v| format!("table version {v}"))
    )]
    MovedSinceApproval {
        /// The dataset that moved.
        dataset: String,
        /// The release's partitions that commits since approval touched (for a snapshot, any).
        partitions: Vec<String>,
        /// The table version the comparison was approved against; `None`: there was no table.
        approved_version: Option<u64>,
        /// The table version found when publishing.
        found_version: u64,
    },

    /// A restore that would replace data committed after the version it undoes.
    #[error(
        "dataset {dataset:?}: {} changed after version {version} (found version {found_version}); not \
         restored over the newer data",
        describe_partitions(partitions)
    )]
    ChangedSinceCommit {
        /// The dataset that would have been restored.
        dataset: String,
        /// The partitions that commits after `version` touched.
        partitions: Vec<String>,
        /// The table version of the commit the restore undoes.
        version: u64,
        /// The table version found when restoring.
        found_version: u64,
    },

    /// A query given by the user (custom check, `sql`) failed to plan or run.
    #[error("query failed: {detail}")]
    Query {
        /// What went wrong: DataFusion's message (less its request to report a bug), or an input never published.
        detail: String,
    },

    /// A user query names a table its session does not have (a typo, or a dataset it may not read).
    #[error("query failed: no table {table:?} ({})", describe_tables(table, known))]
    UnknownTable {
        /// The table name as the query gave it.
        table: String,
        /// The tables the session has, sorted.
        known: Vec<String>,
    },

    /// A user query that would write (a table, a file, the session) or read a file by path.
    #[error(
        "query refused: {statement} is not allowed; Tidegate runs user SQL read-only (SELECT, WITH ... SELECT, \
         VALUES, EXPLAIN), and a task writes only through staging, which Tidegate does with the query's rows"
    )]
    ReadOnlyQuery {
        /// The kind of statement refused, or what the query's plan would do.
        statement: String,
    },

    /// A user query that went over a limit Tidegate sets on every user query.
    #[error(
        "query stopped: {what} went over the {limit} of one query; make it read less (filter on tg_partition, \
         select fewer columns, aggregate before joining){raise}"
    )]
    QueryLimit {
        /// What went over: `it`, `its result (16384 rows so far)`, `repeat (2.8 GiB for one batch of 30 rows)`.
        what: String,
        /// The limit that was reached, with its value, e.g. `time limit of 600 s`.
        limit: String,
        /// Who raises it and how (a flag and its default), starting with `, or` or `;`.
        raise: String,
    },

    /// A user query DataFusion stopped on inside itself (a panic, caught) instead of answering
    /// with an error: a value past what Arrow holds, or a fault of the engine on this query.
    #[error("query stopped: {what}; the query: {query}")]
    QueryFault {
        /// What ran out, or what failed, and what the user can do.
        what: String,
        /// The query, cut to its first 200 characters.
        query: String,
    },

    /// A commit of a table's Delta log that cannot be read (damaged or written by another tool).
    #[error(
        "dataset {dataset:?}: the Delta log cannot be read at {file}: {detail}; the file was changed outside \
         Tidegate: restore it from a backup or a copy of the table (nothing was written)"
    )]
    CorruptLog {
        /// The dataset whose table could not be loaded.
        dataset: String,
        /// The damaged commit file (a local path for a folder lake, else a URL).
        file: String,
        /// The line that is not JSON and the parser's message.
        detail: String,
    },

    // ---- try again ----
    /// Other writers kept committing to the table while this commit was prepared.
    #[error("dataset {dataset:?}: commit conflict persisted after {n_attempts} attempts; retry later")]
    Conflict {
        /// The dataset whose table others kept committing to.
        dataset: String,
        /// How many times it was planned and tried ([`crate::MAX_COMMIT_ATTEMPTS`]).
        n_attempts: u32,
    },

    /// The object store failed in a way that may succeed on retry (IO, network).
    #[error("storage error: {detail}")]
    Storage {
        /// The object store's or file system's message.
        detail: String,
    },

    /// A release failed part-way; the datasets it had already committed were restored.
    #[error(
        "release {release_id}: publishing {dataset:?} failed: {source}; restored: {}{}",
        describe_restored(restored),
        describe_not_restored(not_restored)
    )]
    ReleaseFailed {
        /// The release that failed.
        release_id: String,
        /// The dataset whose publication failed.
        dataset: String,
        /// Why that dataset's publication failed.
        #[source]
        source: Box<Error>,
        /// `(dataset, new table version)` of every restore commit, in the order they were made.
        restored: Vec<(String, u64)>,
        /// Datasets whose restore itself failed (they still show the new data).
        not_restored: Vec<String>,
    },

    // ---- a bug ----
    /// Something the lake assumes about itself or delta-rs did not hold.
    #[error("internal error: {0}; this is a bug, please report it")]
    Internal(String),
}

/// Where in the staged input a schema problem was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileLocation {
    /// A file a command left in its output folder.
    File(String),
    /// A line of a CSV file a command left (1-based, the header being line 1).
    Line {
        /// The file, as the command left it.
        file: String,
        /// The line number, 1-based.
        line: u64,
    },
    /// A row of a file a command left: 1-based in the file once staging has placed it, 0-based in
    /// the batch [`crate::stage`] was conforming until then.
    Row {
        /// The file, as the command left it.
        file: String,
        /// The row number: 1-based in the file, 0-based in the batch until staging places it.
        row: u64,
    },
    /// Record batches handed over by a SQL task.
    Batches,
    /// The declared columns against an existing table.
    Table,
}

impl std::fmt::Display for FileLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileLocation::File(file) => write!(f, "file {file}: "),
            FileLocation::Line { file, line } => write!(f, "file {file}, line {line}: "),
            FileLocation::Row { file, row } => write!(f, "file {file}, row {row}: "),
            FileLocation::Batches => f.write_str("staged rows: "),
            FileLocation::Table => f.write_str("existing table: "),
        }
    }
}

impl FileLocation {
    /// The same place narrowed to row `row` (0-based) of the batch being read from a file.
    pub(crate) fn at_row(&self, row: usize) -> FileLocation {
        match self {
            FileLocation::File(file) => FileLocation::Row { file: file.clone(), row: row as u64 },
            other => other.clone(),
        }
    }
}

/// The nearest of the tables a query could read, or all of them.
fn describe_tables(table: &str, known: &[String]) -> String {
    if let Some(hint) = tidegate_core::spec::did_you_mean(table, known.iter().map(String::as_str)) {
        return hint;
    }
    match known {
        [] => "it can read no table".to_owned(),
        _ => format!("it can read {}", known.join(", ")),
    }
}

fn describe_partitions(partitions: &[String]) -> String {
    match partitions {
        [one] => format!("partition {one}"),
        many => format!("partitions {}", many.join(", ")),
    }
}

fn describe_not_restored(not_restored: &[String]) -> String {
    if not_restored.is_empty() {
        return String::new();
    }
    format!("; NOT restored (they still show this release): {}", not_restored.join(", "))
}

fn describe_restored(restored: &[(String, u64)]) -> String {
    if restored.is_empty() {
        return "nothing (no dataset had been committed)".to_owned();
    }
    let parts: Vec<String> = restored.iter().map(|(d, v)| format!("{d} at version {v}")).collect();
    parts.join(", ")
}

impl Error {
    /// Whether the same call may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Conflict { .. } | Error::Storage { .. } => true,
            Error::ReleaseFailed { source, .. } => source.is_retryable(),
            _ => false,
        }
    }

    pub(crate) fn internal(what: impl std::fmt::Display) -> Error {
        Error::Internal(what.to_string())
    }
}

impl From<deltalake_core::DeltaTableError> for Error {
    fn from(e: deltalake_core::DeltaTableError) -> Self {
        use deltalake_core::DeltaTableError as D;
        match e {
            D::ObjectStore { source } => source.into(),
            D::Io { source } => Error::Storage { detail: source.to_string() },
            // The first line only: the delta kernel appends a backtrace when one was captured.
            other if storage_failure(&other) => Error::Storage { detail: first_line(&other) },
            other => Error::Internal(format!("delta: {}", first_line(&other))),
        }
    }
}

impl From<object_store::Error> for Error {
    fn from(e: object_store::Error) -> Self {
        Error::Storage { detail: e.to_string() }
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        if storage_failure(&e) {
            return Error::Storage { detail: first_line(&e) };
        }
        Error::Internal(format!("datafusion: {e}"))
    }
}

fn first_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

/// Whether a library's error is, somewhere in its chain, the object store or the network failing
/// (a server restarting, a connection refused): worth trying again, unlike a missing file or a
/// bad query. A query, the delta kernel and delta-rs each wrap such a failure their own way.
pub(crate) fn storage_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    use datafusion::error::DataFusionError as F;
    use delta_kernel::Error as K;
    use deltalake_core::DeltaTableError as D;
    let object_store = |e: &object_store::Error| !matches!(e, object_store::Error::NotFound { .. });
    let mut next = Some(e);
    while let Some(e) = next {
        let failed = e.downcast_ref::<object_store::Error>().is_some_and(object_store)
            || e.is::<std::io::Error>()
            || match e.downcast_ref::<K>() {
                Some(K::ObjectStore(inner)) => object_store(inner),
                Some(K::IOError(_) | K::Reqwest(_)) => true,
                _ => false,
            }
            || matches!(e.downcast_ref::<D>(), Some(D::ObjectStore { source }) if object_store(source))
            || matches!(e.downcast_ref::<D>(), Some(D::Io { .. }))
            || matches!(e.downcast_ref::<F>(), Some(F::ObjectStore(inner)) if object_store(inner))
            || matches!(e.downcast_ref::<F>(), Some(F::IoError(_)))
            // DataFusion's Parquet reader keeps only the text of a failed fetch.
            || matches!(e.downcast_ref::<parquet::errors::ParquetError>(),
                Some(parquet::errors::ParquetError::General(m)) if m.contains("Object Store error: ") && !m.contains(" not found"));
        if failed {
            return true;
        }
        next = e.source();
    }
    false
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        Error::Internal(format!("arrow: {e}"))
    }
}

impl From<parquet::errors::ParquetError> for Error {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Error::Internal(format!("parquet: {e}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Storage { detail: e.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(what: &str) -> object_store::Error {
        object_store::Error::Generic { store: "S3", source: what.into() }
    }

    #[test]
    fn an_object_store_failing_inside_the_kernel_or_a_query_is_worth_retrying() {
        let kernel = deltalake_core::DeltaTableError::KernelError(delta_kernel::Error::ObjectStore(generic("refused")));
        let e = Error::from(kernel);
        assert!(matches!(e, Error::Storage { .. }) && e.is_retryable(), "{e:?}");
        let query = datafusion::error::DataFusionError::External(Box::new(
            deltalake_core::DeltaTableError::KernelError(delta_kernel::Error::ObjectStore(generic("reset"))),
        ));
        assert!(Error::from(query).is_retryable());
        let io = datafusion::error::DataFusionError::ObjectStore(Box::new(generic("timed out")));
        assert!(Error::from(io).is_retryable());
        let fetch = parquet::errors::ParquetError::General(format!(
            "Failed to fetch metadata for file raw/part-0.parquet: {}",
            datafusion::error::DataFusionError::ObjectStore(Box::new(generic("refused")))
        ));
        assert!(Error::from(datafusion::error::DataFusionError::ParquetError(Box::new(fetch))).is_retryable());
    }

    #[test]
    fn a_missing_file_or_a_bad_query_is_not() {
        let missing = object_store::Error::NotFound { path: "raw/part-0.parquet".into(), source: "gone".into() };
        let kernel = deltalake_core::DeltaTableError::KernelError(delta_kernel::Error::ObjectStore(missing));
        assert!(!Error::from(kernel).is_retryable());
        let plan = datafusion::error::DataFusionError::Plan("no column x".into());
        assert!(!Error::from(plan).is_retryable());
        let kernel = deltalake_core::DeltaTableError::KernelError(delta_kernel::Error::generic("bad schema"));
        assert!(!Error::from(kernel).is_retryable());
    }
}

//! The lake and its tables: where each dataset's Delta table lives, how it is loaded, and how it
//! is created from the dataset's schema contract on first use.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel as _;
use deltalake_core::kernel::transaction::CommitProperties;
use deltalake_core::kernel::{Add, StructType};
use deltalake_core::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use tidegate_core::spec::model::Dataset;
use url::Url;

use crate::cache::{Cached, TableCache};
use crate::df::QueryLimits;
use crate::error::{Error, FileLocation, Result};
use crate::layout::{PARTITIONING_PROPERTY, PartitionColumn};

/// The default name of the Delta partition column every dataset carries (`partitioning.column`
/// names another): the partition a row belongs to, typed as [`PartitionColumn`] says.
pub const PARTITION_COLUMN: &str = tidegate_core::spec::model::DEFAULT_PARTITION_COLUMN;

/// The folder inside a table under which steps stage their files. It is not hidden on purpose:
/// vacuum never looks at paths starting with `_` or `.`, so files there could never be cleaned.
pub const STAGING_DIR: &str = "staging";

/// The time zone of every `timestamp` column; Delta's TIMESTAMP type is UTC microseconds.
const UTC: &str = "UTC";

/// A lake: a folder or an `s3://` prefix holding one Delta table per dataset at
/// `<root>/<dataset name>`.
#[derive(Debug, Clone)]
pub struct Lake {
    root: Root,
    root_url: Url,
    /// Tables loaded before, brought up to date incrementally (shared by clones of the handle).
    pub(crate) cache: Arc<TableCache>,
    /// The bounds of every user query this handle runs (`sql`, custom checks, SQL tasks).
    pub(crate) limits: QueryLimits,
}

/// Where the tables live.
#[derive(Debug, Clone)]
enum Root {
    Folder(PathBuf),
    /// A bucket's store and the lake's prefix in it.
    Objects {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
    },
}

impl Lake {
    /// Opens the lake at `location`: a folder path or `file://` URL (created if missing), or an
    /// `s3://bucket/prefix` URL, whose store must honour conditional put (see [`crate::s3`]).
    pub async fn open(location: &str) -> Result<Lake> {
        let path = match Url::parse(location) {
            Ok(url) if url.scheme() == "file" => url
                .to_file_path()
                .map_err(|()| Error::InvalidLake { url: location.to_owned(), reason: "not a local path".into() })?,
            Ok(url) if crate::s3::SCHEMES.contains(&url.scheme()) => {
                let mut root_url = url.clone();
                if !root_url.path().ends_with('/') {
                    root_url.set_path(&format!("{}/", root_url.path()));
                }
                let (store, prefix) = crate::s3::open(&url).await?;
                let root = Root::Objects { store, prefix };
                return Ok(Lake { root, root_url, cache: Arc::default(), limits: QueryLimits::default() });
            }
            Ok(url) if url.scheme().len() > 1 => {
                // A one-letter scheme is a Windows drive letter, not a URL.
                if matches!(url.scheme(), "gs" | "az" | "abfss" | "r2") {
                    return Err(Error::UnsupportedLake {
                        url: location.to_owned(),
                        reason: format!("{}:// lakes are not supported; use a folder or s3://", url.scheme()),
                    });
                }
                return Err(Error::InvalidLake {
                    url: location.to_owned(),
                    reason: format!("unknown scheme {:?}; use a folder path or s3://bucket/prefix", url.scheme()),
                });
            }
            _ => PathBuf::from(location),
        };
        crate::local::register();
        tokio::fs::create_dir_all(&path).await?;
        let root = tokio::fs::canonicalize(&path).await?;
        let root_url = Url::from_directory_path(&root).map_err(|()| Error::InvalidLake {
            url: location.to_owned(),
            reason: "cannot be expressed as a file URL".into(),
        })?;
        Ok(Lake { root: Root::Folder(root), root_url, cache: Arc::default(), limits: QueryLimits::default() })
    }

    /// This handle with other bounds on the user queries it runs (`sql`, custom checks, SQL
    /// tasks) than [`QueryLimits::default`].
    pub fn with_query_limits(mut self, limits: QueryLimits) -> Lake {
        self.limits = limits;
        self
    }

    /// The lake's root as a URL, ending in a slash.
    pub(crate) fn root_url(&self) -> &Url {
        &self.root_url
    }

    /// The folder the lake lives in; `None` for an object-store lake.
    pub fn root(&self) -> Option<&FsPath> {
        match &self.root {
            Root::Folder(path) => Some(path),
            Root::Objects { .. } => None,
        }
    }

    /// The bucket's store and the lake's prefix in it; `None` for a folder lake.
    pub(crate) fn object_root(&self) -> Option<(Arc<dyn ObjectStore>, ObjectPath)> {
        match &self.root {
            Root::Folder(_) => None,
            Root::Objects { store, prefix } => Some((store.clone(), prefix.clone())),
        }
    }

    /// Creates the folder of one dataset's table (or a folder inside it): the local object store
    /// refuses to write under a root that does not exist. Object stores have no folders.
    pub(crate) async fn ensure_folder(&self, dataset: &str, inside: Option<&str>) -> Result<()> {
        check_segment("dataset name", dataset)?;
        if let Root::Folder(root) = &self.root {
            let dir = root.join(dataset);
            tokio::fs::create_dir_all(match inside {
                Some(folder) => dir.join(folder),
                None => dir,
            })
            .await?;
        }
        Ok(())
    }

    /// The URL of one dataset's table, with a trailing slash so joins stay inside it.
    pub(crate) fn table_url(&self, dataset: &str) -> Result<Url> {
        check_segment("dataset name", dataset)?;
        self.root_url.join(&format!("{dataset}/")).map_err(|e| Error::InvalidName {
            what: "dataset name",
            value: dataset.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The names of the folders (or prefixes) directly under the lake's root, unsorted.
    pub(crate) async fn child_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        match &self.root {
            Root::Folder(root) => {
                let mut entries = tokio::fs::read_dir(root).await?;
                while let Some(entry) = entries.next_entry().await? {
                    if entry.file_type().await?.is_dir() {
                        names.push(entry.file_name().to_string_lossy().into_owned());
                    }
                }
            }
            Root::Objects { store, prefix } => {
                let listing = store.list_with_delimiter(Some(prefix)).await?;
                names.extend(listing.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_owned)));
            }
        }
        Ok(names)
    }

    /// Whether the dataset's table has been created.
    pub(crate) async fn table_exists(&self, dataset: &str) -> Result<bool> {
        check_segment("dataset name", dataset)?;
        match &self.root {
            Root::Folder(root) => Ok(tokio::fs::try_exists(root.join(dataset).join("_delta_log")).await?),
            Root::Objects { store, prefix } => {
                let log = prefix.clone().join(dataset).join("_delta_log");
                Ok(!store.list_with_delimiter(Some(&log)).await?.objects.is_empty())
            }
        }
    }

    /// Loads the latest version of a table, or `None` if the dataset has no table yet. A table
    /// loaded before by this handle is brought up to date from its newer commits only, without
    /// first looking whether the table exists: bringing it up to date reads its commit at the
    /// cached version, which a deleted or replaced table no longer has (on S3 the look was a
    /// listing per load, a fifth of a worker's requests per attempt; issue 35).
    pub(crate) async fn try_load(&self, dataset: &str) -> Result<Option<DeltaTable>> {
        check_segment("dataset name", dataset)?;
        if let Some(cached) = self.cache.get(dataset) {
            match cached.caught_up().await? {
                Some(cached) => {
                    let table = cached.table.clone();
                    self.cache.put(dataset, cached);
                    return Ok(Some(table));
                }
                // The table was replaced or deleted under us (or its log cannot be followed):
                // load afresh, if it is there.
                None => self.cache.forget(dataset),
            }
        }
        if !self.table_exists(dataset).await? {
            return Ok(None);
        }
        match DeltaTableBuilder::from_url(self.table_url(dataset)?)?.load().await {
            Ok(table) => {
                let txns = crate::cache::read_txns(&table).await.map(Arc::new);
                let tag = crate::cache::commit_tag(&table).await?;
                self.cache.put(dataset, Cached { table: table.clone(), txns, tag });
                Ok(Some(table))
            }
            // The log folder exists but holds no commit yet: a creation is under way or crashed.
            Err(DeltaTableError::NotATable(_)) => Ok(None),
            Err(e) => Err(self.load_error(dataset, e).await),
        }
    }

    /// A failure to load `dataset`'s table as its reader should see it: a commit of the log that
    /// is not JSON lines is named with the table ([`Error::CorruptLog`]) instead of surfacing as
    /// delta-rs' internal error.
    async fn load_error(&self, dataset: &str, e: DeltaTableError) -> Error {
        let converted = Error::from(e);
        if !matches!(converted, Error::Internal(_)) {
            return converted;
        }
        match self.damaged_commit(dataset).await {
            Ok(Some((file, detail))) => Error::CorruptLog { dataset: dataset.to_owned(), file, detail },
            Ok(None) | Err(_) => converted,
        }
    }

    /// The newest commit of `dataset`'s log (among the last [`MAX_COMMITS_DIAGNOSED`]) with a
    /// line that is not JSON: its location and what is wrong with it.
    async fn damaged_commit(&self, dataset: &str) -> Result<Option<(String, String)>> {
        use futures::TryStreamExt as _;
        use object_store::ObjectStoreExt as _;
        let url = self.table_url(dataset)?;
        let store = DeltaTableBuilder::from_url(url.clone())?.build()?.object_store();
        let listed: Vec<object_store::ObjectMeta> =
            store.list(Some(&ObjectPath::from("_delta_log"))).try_collect().await?;
        let mut commits: Vec<ObjectPath> = listed
            .into_iter()
            .map(|meta| meta.location)
            .filter(|p| p.filename().and_then(|n| n.strip_suffix(".json")).is_some_and(|v| v.parse::<u64>().is_ok()))
            .collect();
        commits.sort_unstable_by(|a, b| b.cmp(a));
        for path in commits.iter().take(MAX_COMMITS_DIAGNOSED) {
            let bytes = store.get(path).await?.bytes().await?;
            let lines = bytes.split(|b| *b == b'\n').enumerate().filter(|(_, l)| !l.trim_ascii().is_empty());
            for (idx, line) in lines {
                if let Err(e) = serde_json::from_slice::<serde_json::Value>(line) {
                    let name = path.filename().unwrap_or_default();
                    let at = url.join(&format!("_delta_log/{name}")).map_err(|err| Error::internal(err.to_string()))?;
                    let shown = at.to_file_path().map_or_else(|()| at.to_string(), |p| p.display().to_string());
                    return Ok(Some((shown, format!("line {} is not JSON ({e})", idx + 1))));
                }
            }
        }
        Ok(None)
    }

    /// The version the step's application transaction records in `table` (a version of
    /// `dataset` this handle loaded), from the cached `txn` map when it is of that version, else
    /// from delta-rs' log replay.
    pub(crate) async fn txn_version(&self, dataset: &str, table: &DeltaTable, app_id: &str) -> Result<Option<i64>> {
        if let Some(txns) = self.cache.txns_at(dataset, table.version()) {
            return Ok(txns.get(app_id).copied());
        }
        Ok(table.snapshot()?.transaction_version(table.log_store().as_ref(), app_id).await?)
    }

    /// The table version at which the step `step_identity` was published to `dataset`, read
    /// from its application transaction in the latest version; `None` when the table does not
    /// exist, the step never committed to it, or its commit was undone.
    pub async fn committed_version(&self, dataset: &str, step_identity: &str) -> Result<Option<u64>> {
        let Some(table) = self.try_load(dataset).await? else { return Ok(None) };
        let recorded = self.txn_version(dataset, &table, &crate::publish::app_id(step_identity)).await?;
        Ok(recorded.and_then(|v| u64::try_from(v).ok()))
    }

    /// The version of the table this handle last loaded or committed, as it was, without
    /// looking for newer commits: for what needs the table's schema and location, not its
    /// latest state. `None` when this handle has not loaded it.
    pub(crate) fn loaded(&self, dataset: &str) -> Option<DeltaTable> {
        self.cache.get(dataset).map(|cached| cached.table)
    }

    /// Loads the latest version of a table that must exist.
    pub(crate) async fn load(&self, dataset: &str) -> Result<DeltaTable> {
        self.try_load(dataset).await?.ok_or_else(|| Error::UnknownDataset { dataset: dataset.to_owned() })
    }

    /// Loads a table as of `version` (or the latest when `None`).
    pub(crate) async fn load_at(&self, dataset: &str, version: Option<u64>) -> Result<DeltaTable> {
        let Some(version) = version else { return self.load(dataset).await };
        if !self.table_exists(dataset).await? {
            return Err(Error::UnknownDataset { dataset: dataset.to_owned() });
        }
        let latest = self.load(dataset).await?.version().unwrap_or_default();
        if version > latest {
            return Err(Error::UnknownVersion { dataset: dataset.to_owned(), version });
        }
        match DeltaTableBuilder::from_url(self.table_url(dataset)?)?.with_version(version).load().await {
            Ok(table) => Ok(table),
            Err(DeltaTableError::InvalidVersion(_) | DeltaTableError::NotATable(_)) => {
                Err(Error::UnknownVersion { dataset: dataset.to_owned(), version })
            }
            Err(other) => Err(self.load_error(dataset, other).await),
        }
    }

    /// Loads the dataset's table, creating it if needed. The schema is the declared `columns`
    /// plus the partition column ([`PartitionColumn::of_dataset`]); with no declared columns it is `first_data` (the first staged
    /// rows), normalised to types Delta can store.
    ///
    /// A table whose declared columns changed is returned as it is: staging writes the declared
    /// schema ([`crate::evolution::target_schema`]) and publication decides whether the change
    /// may be published (`evolution`).
    ///
    /// Staging needs the table's schema, not its latest version: a table this handle has loaded
    /// before is used as it was, without looking for newer commits (on a busy table that was a
    /// log update per staging). Publication checks each staged version's schema hash against the
    /// version it commits on, so a table recreated with another schema in between is refused
    /// there ([`Error::StagedForOtherSchema`]).
    pub(crate) async fn ensure_table(&self, dataset: &Dataset, first_data: Option<&SchemaRef>) -> Result<DeltaTable> {
        let known = match self.loaded(&dataset.name) {
            Some(table) => Some(table),
            None => self.try_load(&dataset.name).await?,
        };
        if let Some(table) = known {
            check_layout(dataset, &table)?;
            return Ok(table);
        }
        let schema = match (declared_schema(dataset)?, first_data) {
            (Some(declared), _) => declared,
            (None, Some(data)) => schema_from_data(dataset, data)?,
            (None, None) => {
                return Err(Error::SchemaMismatch {
                    dataset: dataset.name.clone(),
                    location: FileLocation::Batches,
                    column: dataset.partition_column.clone(),
                    detail: "the dataset declares no columns and the step staged no data to \
                             take the schema from"
                        .to_owned(),
                });
            }
        };
        self.ensure_folder(&dataset.name, None).await?;
        let kernel: StructType = schema
            .as_ref()
            .try_into_kernel()
            .map_err(|e| Error::internal(format!("schema of {} has no Delta equivalent: {e}", dataset.name)))?;
        let table = DeltaTableBuilder::from_url(self.table_url(&dataset.name)?)?.build()?;
        let partition = PartitionColumn::of_dataset(dataset);
        let created = table
            .create()
            .with_table_name(dataset.name.clone())
            .with_columns(kernel.fields().cloned())
            .with_partition_columns([partition.name.clone()])
            // The partitioning the column encodes (and the mark of the hive-style layout).
            .with_configuration([(PARTITIONING_PROPERTY, Some(partition.property()))])
            .with_raise_if_key_not_exists(false)
            // Every publication loads the table; a checkpoint every few commits keeps that load
            // flat as history grows (delta-rs' default of 100 lets per-step cost climb with it).
            .with_configuration_property(
                deltalake_core::TableProperty::CheckpointInterval,
                Some(CHECKPOINT_INTERVAL.to_string()),
            )
            // A creator that loses the race must fail, not retry its CREATE TABLE on top of the
            // winner's as version 1 (a second metaData action with a new table id); the branch
            // below then uses the winner's table.
            .with_commit_properties(CommitProperties::default().with_max_retries(0))
            .await;
        match created {
            Ok(table) => Ok(table),
            // Another writer created the table first: use theirs, if it agrees with ours.
            Err(_) if self.try_load(&dataset.name).await?.is_some() => {
                let table = self.load(&dataset.name).await?;
                check_layout(dataset, &table)?;
                Ok(table)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The most commits of a log read to find a damaged one after a table failed to load (the error
/// path only; the newest are read first).
const MAX_COMMITS_DIAGNOSED: usize = 1_000;

/// Commits between Delta checkpoints of the tables Tidegate creates.
pub(crate) const CHECKPOINT_INTERVAL: u32 = 10;

/// The Arrow schema of a loaded table, partition column included.
pub(crate) fn table_schema(table: &DeltaTable) -> Result<SchemaRef> {
    Ok(table.snapshot()?.snapshot().arrow_schema())
}

/// The schema of the Parquet files: the table schema without the partition column `partition`,
/// which Delta stores in the log and the folder names instead of the files.
pub(crate) fn file_schema(schema: &SchemaRef, partition: &str) -> SchemaRef {
    let fields: Vec<Arc<Field>> = schema.fields().iter().filter(|f| f.name() != partition).cloned().collect();
    Arc::new(Schema::new(fields))
}

/// Refuses a table whose partition column is not the one the dataset asks for: a table written
/// by an earlier Tidegate (text partition column, files under `staging/`), or one whose
/// partitioning (column name or type) changed. Either needs the table rewritten on purpose.
pub(crate) fn check_layout(dataset: &Dataset, table: &DeltaTable) -> Result<()> {
    let found = PartitionColumn::of_table(table)?;
    let wanted = PartitionColumn::of_dataset(dataset);
    if found.legacy {
        return Err(Error::LegacyLayout { dataset: dataset.name.clone(), column: found.name });
    }
    if found != wanted {
        return Err(Error::SchemaMismatch {
            dataset: dataset.name.clone(),
            location: FileLocation::Table,
            column: wanted.name.clone(),
            detail: format!(
                "the table is partitioned by {} ({}), the spec asks for {} ({}); a change of partitioning \
                 rewrites the dataset: move the table aside and rebuild it with a backfill of every partition",
                found.name,
                found.property(),
                wanted.name,
                wanted.property()
            ),
        });
    }
    Ok(())
}

/// The Arrow schema of a dataset's declared columns, plus the partition column, or `None` when
/// the dataset declares no columns.
pub(crate) fn declared_schema(dataset: &Dataset) -> Result<Option<SchemaRef>> {
    if dataset.columns.is_empty() {
        return Ok(None);
    }
    let partition = PartitionColumn::of_dataset(dataset);
    let mut fields = Vec::with_capacity(dataset.columns.len() + 1);
    for column in &dataset.columns {
        if column.name == partition.name {
            // A declared column of that name is the partition column (the spec checked its type).
            if declared_type(&column.data_type) != Some(partition.data_type()) {
                return Err(Error::SchemaMismatch {
                    dataset: dataset.name.clone(),
                    location: FileLocation::Table,
                    column: column.name.clone(),
                    detail: format!("this is the partition column, of type {}", partition.data_type()),
                });
            }
            fields.push(Field::new(&column.name, partition.data_type(), true));
            continue;
        }
        let data_type = declared_type(&column.data_type).ok_or_else(|| Error::SchemaMismatch {
            dataset: dataset.name.clone(),
            location: FileLocation::Table,
            column: column.name.clone(),
            detail: format!("unknown type {:?}", column.data_type),
        })?;
        fields.push(Field::new(&column.name, data_type, column.nullable));
    }
    if !dataset.columns.iter().any(|c| c.name == partition.name) {
        fields.push(Field::new(&partition.name, partition.data_type(), true));
    }
    Ok(Some(Arc::new(Schema::new(fields))))
}

/// The Arrow type of a declared column type (the spec's vocabulary).
pub(crate) fn declared_type(name: &str) -> Option<DataType> {
    Some(match name {
        "string" => DataType::Utf8,
        "int64" => DataType::Int64,
        "int32" => DataType::Int32,
        "float64" => DataType::Float64,
        "bool" => DataType::Boolean,
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        _ => return None,
    })
}

/// A table schema taken from the first staged data: types Delta cannot store are widened to ones
/// it can, every column is nullable (nothing was declared), and the partition column is added.
fn schema_from_data(dataset: &Dataset, data: &SchemaRef) -> Result<SchemaRef> {
    let partition = PartitionColumn::of_dataset(dataset);
    let dataset = dataset.name.as_str();
    let mut fields = Vec::with_capacity(data.fields().len() + 1);
    for field in data.fields() {
        if *field.name() == partition.name {
            continue;
        }
        let data_type = delta_type(field.data_type()).ok_or_else(|| Error::SchemaMismatch {
            dataset: dataset.to_owned(),
            location: FileLocation::Batches,
            column: field.name().clone(),
            detail: format!("type {} cannot be stored in a Delta table", field.data_type()),
        })?;
        fields.push(Field::new(field.name(), data_type, true));
    }
    fields.push(Field::new(&partition.name, partition.data_type(), true));
    Ok(Arc::new(Schema::new(fields)))
}

/// The Delta-storable type closest to an Arrow type, for schemas inferred from data.
pub(crate) fn delta_type(data_type: &DataType) -> Option<DataType> {
    Some(match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => DataType::Int32,
        DataType::Int32 => DataType::Int32,
        DataType::Int64 | DataType::UInt32 => DataType::Int64,
        DataType::Float16 | DataType::Float32 => DataType::Float32,
        DataType::Float64 => DataType::Float64,
        DataType::Boolean => DataType::Boolean,
        DataType::Date32 | DataType::Date64 => DataType::Date32,
        DataType::Timestamp(_, _) => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        DataType::Decimal128(p, s) => DataType::Decimal128(*p, *s),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => DataType::Binary,
        _ => return None,
    })
}

/// The partitions (as keys) that hold at least one active file of the loaded version.
pub(crate) async fn partitions_with_files(table: &DeltaTable) -> Result<std::collections::BTreeSet<String>> {
    let column = PartitionColumn::of_table(table)?;
    let files = active_files(table, None).await?;
    let values = files.iter().filter_map(|a| a.partition_values.get(&column.name).cloned().flatten());
    Ok(values.filter_map(|v| column.key_of(&v)).collect())
}

/// Checks that `value` can be one path segment that is neither hidden nor special.
pub(crate) fn check_segment(what: &'static str, value: &str) -> Result<()> {
    let bad = |reason: &str| Err(Error::InvalidName { what, value: value.to_owned(), reason: reason.to_owned() });
    if value.is_empty() || value.len() > 128 {
        return bad("must be 1 to 128 characters");
    }
    if value.starts_with(['_', '.']) {
        return bad("must not start with '_' or '.' (Delta and vacuum treat such paths as hidden)");
    }
    if !value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        return bad("may hold only ASCII letters, digits, '_', '-' and '.'");
    }
    if value.contains("..") {
        return bad("must not contain '..'");
    }
    Ok(())
}

/// Every active file of a loaded table, as Add actions with the path as the object store spells it
/// (as Tidegate logs it), optionally only the partitions whose keys are given.
pub(crate) async fn active_files(table: &DeltaTable, partitions: Option<&[String]>) -> Result<Vec<Add>> {
    use futures::TryStreamExt as _;
    let column = PartitionColumn::of_table(table)?;
    let views: Vec<_> = table.get_active_add_actions_by_partitions(&[]).try_collect().await?;
    let mut adds = Vec::with_capacity(views.len());
    for view in views {
        let partition_values = view.partition_values_map();
        // Compared as keys: another writer may spell a value differently (`2024-01-05T07:00:00Z`).
        let key = partition_values.get(&column.name).cloned().flatten().and_then(|v| column.key_of(&v));
        if let Some(wanted) = partitions
            && !key.as_ref().is_some_and(|k| wanted.contains(k))
        {
            continue;
        }
        // Rebuilt by hand because `LogicalFileView::add_action` is deprecated in 1.1.3.
        adds.push(Add {
            // delta-rs un-escapes the logged path; escaped again as a path part, it is the stored name.
            path: ObjectPath::from(view.path().as_ref()).to_string(),
            partition_values,
            size: view.size(),
            modification_time: view.modification_time(),
            data_change: true,
            stats: view.stats(),
            tags: None,
            deletion_vector: None,
            base_row_id: None,
            default_row_commit_version: None,
            clustering_provider: None,
        });
    }
    adds.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(adds)
}

/// A Remove action for a file that is active now.
pub(crate) fn remove_of(add: &Add) -> deltalake_core::kernel::Remove {
    deltalake_core::kernel::Remove {
        path: add.path.clone(),
        data_change: true,
        deletion_timestamp: Some(chrono::Utc::now().timestamp_millis()),
        extended_file_metadata: Some(true),
        partition_values: Some(add.partition_values.clone()),
        size: Some(add.size),
        tags: None,
        deletion_vector: None,
        base_row_id: None,
        default_row_commit_version: None,
    }
}

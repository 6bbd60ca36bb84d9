//! Schema evolution: how a dataset's declared columns may differ from its table's schema, and
//! which differences a publication may carry.
//!
//! Two kinds of change, by what readers of the Delta table can follow:
//! - **In place**: a nullable column added, a not-null column made nullable. The publication's
//!   commit carries the new schema; files written before it simply lack the column, and every
//!   Delta reader (delta-rs, Polars, DuckDB, pandas through `deltalake`, Spark) reads them as
//!   null. Any run or backfill may publish it.
//! - **Rewrite**: a column dropped or renamed, its type widened, narrowed or changed, a column
//!   made not null, a not-null column added. Delta can only express these by rewriting every
//!   file (type widening in place needs the `typeWidening` table feature, which delta-rs and so
//!   Python `deltalake` and Polars cannot read), so such a change is published only by a release
//!   that replaces every file of the table in one commit: a governed backfill of every partition,
//!   whose blast radius and comparison show the change before anyone approves it.
//!
//! A change of partitioning is neither: `table::check_layout` refuses it (the table is rebuilt).

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel as _;
use deltalake_core::kernel::{Action, MetadataExt as _, StructType};
use deltalake_core::{DeltaTable, DeltaTableError};
use object_store::ObjectStoreExt as _;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use tidegate_core::spec::model::Dataset;

use crate::error::{Error, FileLocation, Result};
use crate::stage::{StagedFile, StagedVersion, schema_hash};
use crate::table::{declared_schema, delta_type, table_schema};

/// One column's difference between a table's schema and the dataset's declared columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnChange {
    /// The column.
    pub column: String,
    /// What changed.
    pub kind: ChangeKind,
}

/// How a column changed, from the table's schema to the declared one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum ChangeKind {
    /// Declared, not in the table; `nullable` says whether earlier rows can read as null.
    Added {
        /// The declared type.
        data_type: String,
        /// Whether the column is nullable (only then can it be added in place).
        nullable: bool,
    },
    /// In the table, no longer declared (dropped, or renamed to a column shown as added).
    Dropped,
    /// A type every value of the old one converts to without loss (`int32` to `int64`).
    Widened {
        /// The table's type.
        from: String,
        /// The declared type.
        to: String,
    },
    /// Any other change of type (narrowed, or to an unrelated type).
    Retyped {
        /// The table's type.
        from: String,
        /// The declared type.
        to: String,
    },
    /// A not-null column declared nullable.
    MadeNullable,
    /// A nullable column declared not null (rows already published may hold nulls).
    MadeNotNull,
}

impl ColumnChange {
    /// Whether readers follow the change without any file rewritten.
    pub fn in_place(&self) -> bool {
        matches!(self.kind, ChangeKind::Added { nullable: true, .. } | ChangeKind::MadeNullable)
    }
}

impl fmt::Display for ColumnChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.column;
        match &self.kind {
            ChangeKind::Added { data_type, nullable: true } => write!(f, "column {c} added ({data_type}, nullable)"),
            ChangeKind::Added { data_type, nullable: false } => write!(f, "column {c} added ({data_type}, not null)"),
            ChangeKind::Dropped => write!(f, "column {c} dropped (or renamed)"),
            ChangeKind::Widened { from, to } => write!(f, "column {c} widened from {from} to {to}"),
            ChangeKind::Retyped { from, to } => write!(f, "column {c} changed from {from} to {to}"),
            ChangeKind::MadeNullable => write!(f, "column {c} made nullable"),
            ChangeKind::MadeNotNull => write!(f, "column {c} made not null"),
        }
    }
}

/// How a dataset's declared columns differ from its table's schema: empty when they agree (or
/// nothing is declared, and the table's schema is the contract).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaChange {
    /// Each column that differs, in the declared order, then the dropped ones.
    pub columns: Vec<ColumnChange>,
}

impl SchemaChange {
    /// Whether nothing differs.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// Whether every change is one readers follow in place (true when nothing differs).
    pub fn in_place(&self) -> bool {
        self.columns.iter().all(ColumnChange::in_place)
    }

    /// The first change that needs every file rewritten, if any.
    pub fn first_rewrite(&self) -> Option<&ColumnChange> {
        self.columns.iter().find(|c| !c.in_place())
    }

    /// [`Error::SchemaNeedsRewrite`] for `dataset`, naming the first change that needs a
    /// rewrite and the others, if there is such a change.
    pub fn rewrite_refusal(&self, dataset: &str) -> Option<Error> {
        let first = self.first_rewrite()?;
        let others: Vec<String> = self.columns.iter().filter(|c| *c != first).map(ToString::to_string).collect();
        Some(Error::SchemaNeedsRewrite {
            dataset: dataset.to_owned(),
            change: first.to_string(),
            also: if others.is_empty() { String::new() } else { format!(" (other changes: {})", others.join("; ")) },
        })
    }
}

impl fmt::Display for SchemaChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.columns.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

/// A dataset's pending schema change, as planning sees it before anything runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PendingChange {
    /// How the declared columns differ from the table's schema (empty without a table).
    pub change: SchemaChange,
    /// The partitions that hold files now: a change that is not in place must replace them all.
    pub partitions_with_data: Vec<String>,
}

impl crate::table::Lake {
    /// How `dataset`'s declared columns differ from its table's schema, and which partitions
    /// hold data (every one, when the change needs a rewrite, must be replaced by one release).
    pub async fn schema_change(&self, dataset: &Dataset) -> Result<PendingChange> {
        let Some(table) = self.try_load(&dataset.name).await? else { return Ok(PendingChange::default()) };
        let change = of_dataset(dataset, &table_schema(&table)?)?;
        let mut partitions_with_data = Vec::new();
        if !change.in_place() {
            partitions_with_data = crate::table::partitions_with_files(&table).await?.into_iter().collect();
        }
        Ok(PendingChange { change, partitions_with_data })
    }
}

/// The differences from `table` (a table's schema) to `declared`, column by column, by name.
pub(crate) fn diff(table: &Schema, declared: &Schema) -> SchemaChange {
    let mut columns = Vec::new();
    for field in declared.fields() {
        let column = field.name().clone();
        let Ok(existing) = table.field_with_name(field.name()) else {
            let kind = ChangeKind::Added { data_type: type_name(field.data_type()), nullable: field.is_nullable() };
            columns.push(ColumnChange { column, kind });
            continue;
        };
        if existing.data_type() != field.data_type() {
            let (from, to) = (type_name(existing.data_type()), type_name(field.data_type()));
            let kind = if widens(existing.data_type(), field.data_type()) {
                ChangeKind::Widened { from, to }
            } else {
                ChangeKind::Retyped { from, to }
            };
            columns.push(ColumnChange { column: column.clone(), kind });
        }
        match (existing.is_nullable(), field.is_nullable()) {
            (false, true) => columns.push(ColumnChange { column, kind: ChangeKind::MadeNullable }),
            (true, false) => columns.push(ColumnChange { column, kind: ChangeKind::MadeNotNull }),
            _ => {}
        }
    }
    for field in table.fields().iter().filter(|f| declared.field_with_name(f.name()).is_err()) {
        columns.push(ColumnChange { column: field.name().clone(), kind: ChangeKind::Dropped });
    }
    SchemaChange { columns }
}

/// How `dataset`'s declared columns differ from `table` (its table's schema); nothing when it
/// declares no columns.
pub(crate) fn of_dataset(dataset: &Dataset, table: &SchemaRef) -> Result<SchemaChange> {
    Ok(match declared_schema(dataset)? {
        Some(declared) => diff(table, &declared),
        None => SchemaChange::default(),
    })
}

/// The schema staged rows are written in: the declared one when it differs from the table's
/// (a publication then evolves the table), the table's otherwise.
pub(crate) fn target_schema(dataset: &Dataset, table: &SchemaRef) -> Result<SchemaRef> {
    match declared_schema(dataset)? {
        Some(declared) if !diff(table, &declared).is_empty() => Ok(declared),
        _ => Ok(table.clone()),
    }
}

/// The schema staging writes `data` (the schemas of the rows or files to stage) in: for a dataset
/// that declares columns, [`target_schema`]; for one that does not (its data is its contract),
/// the table's schema plus, as nullable columns at the end, the columns the data has and the table
/// lacks (a SQL task's new output column is added, as a declared nullable column would be).
pub(crate) fn staging_schema(dataset: &Dataset, table: &SchemaRef, data: &[SchemaRef]) -> Result<SchemaRef> {
    if !dataset.columns.is_empty() {
        return target_schema(dataset, table);
    }
    let mut fields: Vec<FieldRef> = table.fields().iter().cloned().collect();
    for field in data.iter().flat_map(|d| d.fields().iter()) {
        if *field.name() == dataset.partition_column || fields.iter().any(|f| f.name() == field.name()) {
            continue;
        }
        let data_type = delta_type(field.data_type()).ok_or_else(|| Error::SchemaMismatch {
            dataset: dataset.name.clone(),
            location: FileLocation::Batches,
            column: field.name().clone(),
            detail: format!("type {} cannot be stored in a Delta table", field.data_type()),
        })?;
        fields.push(Arc::new(Field::new(field.name(), data_type, true)));
    }
    if fields.len() == table.fields().len() {
        return Ok(table.clone());
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// The schema a staged version was written in, as publication and checks need it: the declared
/// one for a dataset that declares columns ([`target_schema`]); for one that does not, the
/// table's, plus the columns its files have and the table lacks (read from one file's footer,
/// only when its schema hash says it differs).
pub(crate) async fn staged_schema(table: &DeltaTable, dataset: &Dataset, staged: &StagedVersion) -> Result<SchemaRef> {
    let schema = table_schema(table)?;
    if !dataset.columns.is_empty() {
        return target_schema(dataset, &schema);
    }
    let Some(file) = staged.files.first().filter(|_| staged.schema_hash != schema_hash(&schema)) else {
        return Ok(schema);
    };
    let footer = file_schema(table, &dataset.name, file).await?;
    staging_schema(dataset, &schema, &[footer])
}

/// The Arrow schema a staged file was written in, from its Parquet footer.
pub(crate) async fn file_schema(table: &DeltaTable, dataset: &str, file: &StagedFile) -> Result<SchemaRef> {
    let bytes = match table.object_store().get(&crate::layout::object_path(file.path.as_str())).await {
        Ok(found) => found.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Error::MissingStagedFile { dataset: dataset.to_owned(), path: file.path.clone() });
        }
        Err(e) => return Err(e.into()),
    };
    Ok(ParquetRecordBatchReaderBuilder::try_new(bytes)?.schema().clone())
}

/// What a publication onto `table` must add to its commit for a staged schema `target`: nothing
/// when the table has that schema; the table's metadata with the new schema when the change is
/// in place, or when it needs a rewrite and `remaining` (the files the commit leaves in the
/// table) is empty; otherwise [`Error::SchemaNeedsRewrite`], naming the first such column.
pub(crate) fn metadata_action(
    dataset: &str,
    table: &DeltaTable,
    target: &SchemaRef,
    remaining: usize,
) -> Result<Option<(Action, SchemaChange)>> {
    let change = diff(table_schema(table)?.as_ref(), target);
    if change.is_empty() {
        return Ok(None);
    }
    if let Some(refusal) = change.rewrite_refusal(dataset).filter(|_| remaining > 0) {
        return Err(refusal);
    }
    let kernel: StructType = target
        .as_ref()
        .try_into_kernel()
        .map_err(|e| Error::internal(format!("schema of {dataset} has no Delta equivalent: {e}")))?;
    let metadata = table.snapshot()?.metadata().clone().with_schema(&kernel).map_err(DeltaTableError::from)?;
    Ok(Some((Action::Metadata(metadata), change)))
}

/// Whether every value of `from` converts to `to` without loss.
fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::{Float32, Float64, Int8, Int16, Int32, Int64};
    matches!(
        (from, to),
        (Int8, Int16 | Int32 | Int64 | Float64)
            | (Int16, Int32 | Int64 | Float64)
            | (Int32, Int64 | Float64)
            | (Float32, Float64)
            | (DataType::Date32, DataType::Timestamp(..))
    )
}

/// A type as the spec's vocabulary names it (`int64`, `timestamp`), or Arrow's name otherwise.
pub(crate) fn type_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Utf8 => "string".to_owned(),
        DataType::Int64 => "int64".to_owned(),
        DataType::Int32 => "int32".to_owned(),
        DataType::Float64 => "float64".to_owned(),
        DataType::Boolean => "bool".to_owned(),
        DataType::Date32 => "date".to_owned(),
        DataType::Timestamp(..) => "timestamp".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::Field;

    use super::*;

    fn schema(fields: &[(&str, DataType, bool)]) -> Schema {
        Schema::new(fields.iter().map(|(n, t, null)| Field::new(*n, t.clone(), *null)).collect::<Vec<_>>())
    }

    #[test]
    fn nullable_additions_are_in_place_and_everything_else_rewrites() {
        let table = schema(&[("id", DataType::Int32, false), ("v", DataType::Float64, true)]);
        let same = diff(&table, &table);
        assert!(same.is_empty() && same.in_place());

        let added = diff(
            &table,
            &schema(&[("id", DataType::Int32, false), ("v", DataType::Float64, true), ("note", DataType::Utf8, true)]),
        );
        assert!(added.in_place());
        assert_eq!(added.to_string(), "column note added (string, nullable)");

        let widened = diff(&table, &schema(&[("id", DataType::Int64, false), ("v", DataType::Float64, true)]));
        assert!(!widened.in_place());
        assert_eq!(
            widened.first_rewrite().map(ToString::to_string).as_deref(),
            Some("column id widened from int32 to int64")
        );

        let narrowed = diff(&table, &schema(&[("id", DataType::Int32, false), ("v", DataType::Int32, true)]));
        assert_eq!(narrowed.to_string(), "column v changed from float64 to int32");

        let renamed = diff(&table, &schema(&[("id", DataType::Int32, false), ("value", DataType::Float64, true)]));
        assert_eq!(renamed.to_string(), "column value added (float64, nullable); column v dropped (or renamed)");
        assert!(!renamed.in_place());

        let loosened = diff(&table, &schema(&[("id", DataType::Int32, true), ("v", DataType::Float64, true)]));
        assert!(loosened.in_place());
        let tightened = diff(&table, &schema(&[("id", DataType::Int32, false), ("v", DataType::Float64, false)]));
        assert_eq!(tightened.to_string(), "column v made not null");
        assert!(!tightened.in_place());
        let required = diff(
            &table,
            &schema(&[("id", DataType::Int32, false), ("v", DataType::Float64, true), ("n", DataType::Int64, false)]),
        );
        assert!(!required.in_place());
    }
}

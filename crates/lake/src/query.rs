//! SQL tasks: a query over the step's inputs, each read at its pinned table version and restricted
//! to the partitions the step's mapping names, so a retry reads exactly what the first attempt read.
//! An input may carry an overlay: staged versions of an unpublished backfill whose partitions stand
//! in for the pinned version's, so downstream steps can be computed before the backfill is approved.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use crate::layout::PartitionColumn;
use crate::read::scan_where;
use crate::stage::{StagedFile, StagedVersion};
use crate::table::{Lake, PARTITION_COLUMN, table_schema};
use crate::{Error, Result, df};

/// One input of a SQL task: registered as the table `name`.
#[derive(Debug, Clone, PartialEq)]
pub struct InputTable {
    /// The table name the query uses (the dataset's name).
    pub name: String,
    /// The dataset whose table is read.
    pub dataset: String,
    /// The pinned table version; `None` when the input had no published version when pinned.
    pub version: Option<u64>,
    /// The partitions to read; empty means every partition of that version (`latest` mapping).
    pub partitions: Vec<String>,
    /// Staged versions of this dataset whose partitions replace the pinned version's rows of the
    /// same partitions (a partition staged empty reads as empty); usually empty.
    pub overlay: Vec<StagedVersion>,
}

impl Lake {
    /// Runs `query` with each input registered as a table holding exactly the pinned version's
    /// rows of the named partitions, with overlaid partitions read from their staged files,
    /// without the partition column (the output's partition is the step's own, not its inputs').
    ///
    /// The query only reads ([`Error::ReadOnlyQuery`] otherwise), within this handle's
    /// [`crate::QueryLimits`]: the task's output is what Tidegate stages from its rows.
    pub async fn sql_over(&self, query: &str, inputs: &[InputTable]) -> Result<Vec<RecordBatch>> {
        let session = df::UserSession::new(self.limits)?;
        for input in inputs {
            let (schema, batches) = self.input_rows(input).await?;
            let (schema, batches) = without_partition_column(&schema, batches)?;
            df::register_batches(session.ctx(), &input.name, &schema, batches)?;
        }
        df::user_query(&session, query).await
    }

    /// The rows of one input, partition column included: the pinned version's rows of the wanted
    /// partitions that the overlay does not cover, then the overlay's rows of the wanted partitions.
    async fn input_rows(&self, input: &InputTable) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        if let Some(other) = input.overlay.iter().find(|s| s.dataset != input.dataset) {
            return Err(Error::internal(format!(
                "input {:?} overlaid with a version staged for {:?}",
                input.dataset, other.dataset
            )));
        }
        let table = match input.version {
            Some(version) => self.load_at(&input.dataset, Some(version)).await?,
            None if !input.overlay.is_empty() => self.load(&input.dataset).await?,
            None => {
                return Err(Error::Query {
                    detail: format!(
                        "input {:?} has no published version yet; run the task that writes it first",
                        input.dataset
                    ),
                });
            }
        };
        let schema = table_schema(&table)?;
        let mut rows = Vec::new();
        if input.version.is_some() {
            let column = PartitionColumn::of_table(&table)?;
            let overlaid: BTreeSet<String> = input.overlay.iter().flat_map(StagedVersion::partition_keys).collect();
            let overlaid: Vec<String> = overlaid.into_iter().collect();
            let mut filter = vec!["true".to_owned()];
            if !input.partitions.is_empty() {
                filter.push(column.sql_in(&input.partitions)?);
            }
            if !overlaid.is_empty() {
                filter.push(format!("NOT ({})", column.sql_in(&overlaid)?));
            }
            rows = scan_where(&table, &filter.join(" AND "), &schema).await?;
        }
        let wanted = |f: &&StagedFile| input.partitions.is_empty() || input.partitions.contains(&f.partition);
        let files: Vec<StagedFile> = input.overlay.iter().flat_map(|s| &s.files).filter(wanted).cloned().collect();
        rows.extend(self.read_staged(&table, &input.dataset, &files, &schema).await?);
        Ok((schema, rows))
    }
}
fn without_partition_column(schema: &SchemaRef, batches: Vec<RecordBatch>) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let Ok(idx) = schema.index_of(PARTITION_COLUMN) else { return Ok((schema.clone(), batches)) };
    let keep: Vec<usize> = (0..schema.fields().len()).filter(|i| *i != idx).collect();
    let projected = Arc::new(Schema::new(keep.iter().map(|i| schema.field(*i).clone()).collect::<Vec<_>>()));
    let batches = batches
        .into_iter()
        .map(|b| b.project(&keep).map_err(|e| Error::internal(format!("dropping the partition column: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    Ok((projected, batches))
}

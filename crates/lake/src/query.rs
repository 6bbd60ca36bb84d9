//! SQL tasks: a query over the step's inputs, each read at its pinned table version and restricted
//! to the partitions the step's mapping names, so a retry reads exactly what the first attempt read.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use crate::read::scan;
use crate::table::{Lake, PARTITION_COLUMN, table_schema};
use crate::{Error, Result, df};

/// One input of a SQL task: registered as the table `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputTable {
    /// The table name the query uses (the dataset's name).
    pub name: String,
    pub dataset: String,
    /// The pinned table version; `None` when the input had no published version when pinned.
    pub version: Option<u64>,
    /// The partitions to read; empty means every partition of that version (`latest` mapping).
    pub partitions: Vec<String>,
}

impl Lake {
    /// Runs `query` with each input registered as a table holding exactly the pinned version's
    /// rows of the named partitions, without the partition column (the output's partition is the
    /// step's own, not its inputs').
    pub async fn sql_over(&self, query: &str, inputs: &[InputTable]) -> Result<Vec<RecordBatch>> {
        let ctx = df::session();
        for input in inputs {
            let Some(version) = input.version else {
                return Err(Error::Query {
                    detail: format!(
                        "input {:?} has no published version yet; run the task that writes it first",
                        input.dataset
                    ),
                });
            };
            let table = self.load_at(&input.dataset, Some(version)).await?;
            let schema = table_schema(&table)?;
            let partitions = (!input.partitions.is_empty()).then_some(input.partitions.as_slice());
            let batches = scan(&table, partitions, &schema).await?;
            let (schema, batches) = without_partition_column(&schema, batches)?;
            df::register_batches(&ctx, &input.name, &schema, batches)?;
        }
        df::user_query(&ctx, query).await
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

//! Small DataFusion and Arrow helpers shared by staging, the write modes, checks and reading:
//! sessions, in-memory tables, SQL quoting, and casting results back to a table's schema.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::SchemaRef;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::TableReference;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};

/// A fresh DataFusion session. Each operation gets its own so registrations never leak between
/// callers.
pub(crate) fn session() -> SessionContext {
    SessionContext::new()
}

/// Registers `batches` (all of `schema`) as the in-memory table `name`.
pub(crate) fn register_batches(
    ctx: &SessionContext,
    name: &str,
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<()> {
    let table = MemTable::try_new(schema.clone(), vec![batches])?;
    ctx.register_table(TableReference::bare(name), Arc::new(table))?;
    Ok(())
}

/// Runs a query written by Tidegate itself; a failure is a bug, not the user's mistake.
pub(crate) async fn query(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    let frame = ctx.sql(sql).await.map_err(|e| Error::internal(format!("planning `{sql}`: {e}")))?;
    frame.collect().await.map_err(|e| Error::internal(format!("running `{sql}`: {e}")))
}

/// Runs a query written by the user (custom checks, `Lake::sql`): failures are theirs to fix.
pub(crate) async fn user_query(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    let frame = ctx.sql(sql).await.map_err(|e| Error::Query { detail: e.to_string() })?;
    frame.collect().await.map_err(|e| Error::Query { detail: e.to_string() })
}

/// A SQL identifier, always quoted so any column name works.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A SQL string literal.
pub(crate) fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// `a, b, c` with each name quoted.
pub(crate) fn ident_list(names: &[String]) -> String {
    names.iter().map(|n| ident(n)).collect::<Vec<_>>().join(", ")
}

/// `('x', 'y')` for an IN list.
pub(crate) fn literal_list(values: &[String]) -> String {
    let parts: Vec<String> = values.iter().map(|v| literal(v)).collect();
    format!("({})", parts.join(", "))
}

/// Casts query results to `schema` column by column (by name). DataFusion may hand back
/// `Utf8View` strings or dictionary-encoded partition values; the writer and the callers want the
/// table's own types.
pub(crate) fn conform(batches: Vec<RecordBatch>, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    let options = CastOptions { safe: false, ..Default::default() };
    let mut out = Vec::with_capacity(batches.len());
    for batch in batches {
        if batch.num_rows() == 0 {
            continue;
        }
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let column = match batch.column_by_name(field.name()) {
                Some(c) if c.data_type() == field.data_type() => c.clone(),
                Some(c) => cast_with_options(c, field.data_type(), &options)?,
                None => new_null_array(field.data_type(), batch.num_rows()),
            };
            columns.push(column);
        }
        out.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok(out)
}

/// The first value of column `idx` in the first non-empty batch, as text (None for no rows/null).
pub(crate) fn first_value(batches: &[RecordBatch], idx: usize) -> Result<Option<String>> {
    for batch in batches {
        if batch.num_rows() > 0 {
            return value_at(batch.column(idx), 0);
        }
    }
    Ok(None)
}

/// One value as display text, or `None` for a null.
pub(crate) fn value_at(array: &ArrayRef, row: usize) -> Result<Option<String>> {
    if array.is_null(row) {
        return Ok(None);
    }
    let formatter = ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default())?;
    Ok(Some(formatter.value(row).to_string()))
}

/// The first value of column `idx` as an integer (for `count(*)` style results).
pub(crate) fn first_u64(batches: &[RecordBatch], idx: usize) -> Result<u64> {
    match first_value(batches, idx)? {
        None => Ok(0),
        Some(text) => text.parse::<u64>().map_err(|e| Error::internal(format!("expected a count, got {text:?}: {e}"))),
    }
}

/// The total number of rows in `batches`.
pub(crate) fn n_rows(batches: &[RecordBatch]) -> u64 {
    batches.iter().map(|b| b.num_rows() as u64).sum()
}

/// Up to `limit` rows rendered as JSON objects, for reports and check details.
pub(crate) fn sample_rows(batches: &[RecordBatch], limit: usize) -> Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    for batch in batches {
        if out.len() >= limit {
            break;
        }
        let take = (limit - out.len()).min(batch.num_rows());
        let slice = batch.slice(0, take);
        let mut writer = arrow::json::ArrayWriter::new(Vec::new());
        writer.write(&slice)?;
        writer.finish()?;
        let bytes = writer.into_inner();
        if bytes.is_empty() {
            continue;
        }
        let rows: Vec<serde_json::Value> =
            serde_json::from_slice(&bytes).map_err(|e| Error::internal(format!("arrow wrote invalid JSON: {e}")))?;
        out.extend(rows);
    }
    Ok(out)
}

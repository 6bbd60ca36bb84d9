//! Small DataFusion and Arrow helpers shared by staging, the write modes, checks and reading:
//! sessions, in-memory tables, SQL quoting, and casting results back to a table's schema. User
//! SQL (`sql`, custom checks, SQL tasks) runs only through [`UserSession`] and [`user_query`]:
//! read-only, bounded in memory and time.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::SchemaRef;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::TableReference;
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SQLOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{SetExpr, Statement as AstStatement};
use datafusion::sql::sqlparser::parser::ParserError;

use crate::error::{Error, Result};

/// A fresh DataFusion session for Tidegate's own queries (never for user SQL: see
/// [`UserSession`]). Each operation gets its own so registrations never leak between callers.
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
    frame.collect().await.map_err(|e| {
        // The lake away for a moment is worth trying again, not a bug.
        if crate::error::storage_failure(&e) {
            Error::from(e)
        } else {
            Error::internal(format!("running `{sql}`: {e}"))
        }
    })
}

/// The memory one user query may hold (`tidegate sql`, a custom SQL check, a SQL task), in MiB.
/// User queries never spill to disk, so this bounds them.
pub const USER_QUERY_MEMORY_LIMIT_MB: u64 = 1024;

/// How long one user query may plan and run, in seconds.
pub const USER_QUERY_TIME_LIMIT_S: u64 = 600;

/// The table functions a user query may call: both compute rows, neither reads a file. Whatever
/// else a future DataFusion registers by default (a file reader, say) is removed, not trusted.
const USER_TABLE_FUNCTIONS: &[&str] = &["generate_series", "range"];

/// The bounds of one user query; [`QueryLimits::default`] is what checks and SQL tasks get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// The memory one query may hold, in MiB; a query that needs more fails (it never spills).
    pub memory_mb: u64,
    /// How long one query may plan and run, in seconds.
    pub time_s: u64,
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits { memory_mb: USER_QUERY_MEMORY_LIMIT_MB, time_s: USER_QUERY_TIME_LIMIT_S }
    }
}

/// A session for user SQL: a bounded memory pool, no spilling to disk, no URL tables, and only
/// the table functions of [`USER_TABLE_FUNCTIONS`]. Tables are registered through [`Self::ctx`];
/// queries run only through [`user_query`], which refuses anything but reading.
pub(crate) struct UserSession {
    ctx: SessionContext,
    limits: QueryLimits,
}

impl UserSession {
    pub(crate) fn new(limits: QueryLimits) -> Result<UserSession> {
        let no_disk = DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled);
        let memory_bytes = usize::try_from(limits.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX);
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(memory_bytes, 1.0)
            .with_disk_manager_builder(no_disk)
            .build_arc()?;
        let ctx = SessionContext::new_with_config_rt(SessionConfig::new(), runtime);
        let registered: Vec<String> = ctx.state().table_functions().keys().cloned().collect();
        for name in registered.iter().filter(|n| !USER_TABLE_FUNCTIONS.contains(&n.as_str())) {
            ctx.deregister_udtf(name);
        }
        Ok(UserSession { ctx, limits })
    }

    /// The tables registered in the session, sorted: what a query may name.
    fn table_names(&self) -> Vec<String> {
        let schema = self.ctx.catalog("datafusion").and_then(|c| c.schema("public"));
        let mut names = schema.map(|s| s.table_names()).unwrap_or_default();
        names.sort();
        names
    }

    /// The session, to register tables in (and to run Tidegate's own queries over them).
    pub(crate) fn ctx(&self) -> &SessionContext {
        &self.ctx
    }
}

/// Runs a query written by the user: the one way user SQL runs. Only a query (SELECT, WITH,
/// VALUES, set operations, EXPLAIN or DESCRIBE of one) is accepted, first by its statement and
/// then by its plan (no DDL, DML, COPY or session statement anywhere in it), within the session's
/// memory and time limits. Failures are the user's to fix.
pub(crate) async fn user_query(session: &UserSession, sql: &str) -> Result<Vec<RecordBatch>> {
    let limits = session.limits;
    let run = async {
        let state = session.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(sql, &dialect).map_err(|e| user_error(e, session))?;
        read_only_statement(&statement)?;
        let plan = state.statement_to_plan(statement).await.map_err(|e| user_error(e, session))?;
        let read_only = SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
        read_only
            .verify_plan(&plan)
            .map_err(|e| Error::ReadOnlyQuery { statement: format!("what its plan does ({})", e.message()) })?;
        let frame = session.ctx.execute_logical_plan(plan).await.map_err(|e| user_error(e, session))?;
        frame.collect().await.map_err(|e| user_error(e, session))
    };
    match tokio::time::timeout(Duration::from_secs(limits.time_s), run).await {
        Ok(result) => result,
        Err(_) => Err(Error::QueryLimit {
            limit: format!("time limit of {} s", limits.time_s),
            flag: "--time-limit-s",
            default: format!("{USER_QUERY_TIME_LIMIT_S} s"),
        }),
    }
}

/// Refuses a statement that is not a query, naming its kind.
fn read_only_statement(statement: &Statement) -> Result<()> {
    let refused = |kind: &str| Err(Error::ReadOnlyQuery { statement: kind.to_owned() });
    match statement {
        Statement::Statement(ast) => match ast.as_ref() {
            AstStatement::Query(query) if matches!(query.body.as_ref(), SetExpr::Select(s) if s.into.is_some()) => {
                refused("SELECT ... INTO")
            }
            AstStatement::Query(_) | AstStatement::ExplainTable { .. } => Ok(()),
            AstStatement::Explain { statement, .. } => match statement.as_ref() {
                AstStatement::Query(_) => Ok(()),
                other => refused(&format!("EXPLAIN {}", statement_kind(other))),
            },
            other => refused(&statement_kind(other)),
        },
        Statement::Explain(explain) => read_only_statement(&explain.statement),
        Statement::CreateExternalTable(_) => refused("CREATE EXTERNAL TABLE"),
        Statement::CopyTo(_) => refused("COPY"),
        Statement::Reset(_) => refused("RESET"),
    }
}

/// The leading keywords of a statement (`INSERT INTO`, `DROP TABLE`), for messages.
fn statement_kind(statement: &AstStatement) -> String {
    let text = statement.to_string();
    // sqlparser prints keywords in capitals and identifiers as written.
    let is_keyword = |w: &&str| w.chars().all(|c| c.is_ascii_uppercase());
    let words: Vec<&str> = text.split_whitespace().take_while(is_keyword).take(3).collect();
    if words.is_empty() { "this statement".to_owned() } else { words.join(" ") }
}

/// A user query's failure: over the memory limit, or a mistake in the query, said plainly.
fn user_error(e: DataFusionError, session: &UserSession) -> Error {
    let limits = session.limits;
    if let DataFusionError::Plan(message) = e.find_root()
        && let Some(table) = unknown_table(message)
    {
        return Error::UnknownTable { table, known: session.table_names() };
    }
    if matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)) {
        return Error::QueryLimit {
            limit: format!("memory limit of {} MiB", limits.memory_mb),
            flag: "--memory-limit-mb",
            default: format!("{USER_QUERY_MEMORY_LIMIT_MB} MiB"),
        };
    }
    if let DataFusionError::SQL(parser, _) = e.find_root()
        && let ParserError::ParserError(message) | ParserError::TokenizerError(message) = parser.as_ref()
    {
        return Error::Query { detail: format!("syntax error: {message}") };
    }
    Error::Query { detail: without_bug_report(&e.to_string()) }
}

/// The table of DataFusion's "table 'datafusion.public.raww' not found", as the query named it.
fn unknown_table(message: &str) -> Option<String> {
    let full = message.strip_prefix("table '")?.strip_suffix("' not found")?;
    let table = full.strip_prefix("datafusion.").unwrap_or(full);
    Some(table.strip_prefix("public.").unwrap_or(table).to_owned())
}

/// DataFusion's bug-report request, which it appends to an "internal error".
const DATAFUSION_BUG_REPORT: &str = "This issue was likely caused by a bug in DataFusion's code. Please help us to \
                                     resolve this by filing a bug report in our issue tracker: \
                                     https://github.com/apache/datafusion/issues";

/// DataFusion reports some mistakes of a query (a function given the wrong types) as its own
/// internal errors, asking for a bug report: the query is at fault, so what follows the request
/// (or, when nothing does, the first line before it) is kept, without the request.
fn without_bug_report(text: &str) -> String {
    let Some((before, after)) = text.split_once(DATAFUSION_BUG_REPORT) else {
        return text.to_owned();
    };
    let after = after.trim_start_matches(['.', ' ', '\n']).trim_end();
    let kept = if after.is_empty() {
        let first = before.lines().next().unwrap_or_default();
        first.replace("Error during planning: ", "").replace("Internal error: ", "")
    } else {
        after.to_owned()
    };
    format!("the query cannot be planned as written: {kept}")
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

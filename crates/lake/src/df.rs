//! Small DataFusion and Arrow helpers shared by staging, the write modes, checks and reading:
//! sessions, in-memory tables, SQL quoting, and casting results back to a table's schema. User
//! SQL (`sql`, custom checks, SQL tasks) runs only through [`UserSession`] and [`user_query`]:
//! read-only, bounded in memory (its result counted as it is built) and time, and never a panic.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::SchemaRef;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::TableReference;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{DataFrame, SQLOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{SetExpr, Statement as AstStatement};
use datafusion::sql::sqlparser::parser::ParserError;
use futures::{FutureExt as _, StreamExt as _};

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
    let collected = std::panic::AssertUnwindSafe(frame.collect()).catch_unwind().await;
    let collected = collected.map_err(|panic| {
        Error::internal(format!("running `{sql}`: DataFusion panicked: {}", panic_text(panic.as_ref())))
    })?;
    collected.map_err(|e| {
        // The lake away for a moment is worth trying again, not a bug.
        if crate::error::storage_failure(&e) {
            Error::from(e)
        } else {
            Error::internal(format!("running `{sql}`: {e}"))
        }
    })
}

/// The memory one user query may hold (`tidegate sql`, a custom SQL check, a SQL task), in MiB:
/// what its operators hold and its result, counted as it is built. User queries never spill to
/// disk, so this bounds them.
pub const USER_QUERY_MEMORY_LIMIT_MB: u64 = 1024;

/// How long one user query may plan and run, in seconds.
pub const USER_QUERY_TIME_LIMIT_S: u64 = 600;

/// The table functions a user query may call: both compute rows, neither reads a file. Whatever
/// else a future DataFusion registers by default (a file reader, say) is removed, not trusted.
const USER_TABLE_FUNCTIONS: &[&str] = &["generate_series", "range"];

/// The most characters of a query a message quotes.
const QUOTED_QUERY_CHARS: usize = 200;

/// The bounds of one user query; [`QueryLimits::default`] is what checks and SQL tasks get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// The memory one query may hold, its result included, in MiB; a query that needs more fails
    /// (it never spills).
    pub memory_mb: u64,
    /// How long one query may plan and run, in seconds.
    pub time_s: u64,
    /// The most rows its result may hold; `None`: as many as `memory_mb` holds.
    pub max_rows: Option<u64>,
    /// The most memory its result may hold, in MiB; `None`: as much as `memory_mb` allows.
    pub max_result_mb: Option<u64>,
    /// Who set these limits, so that a query stopped by one is told how to raise it.
    pub set_by: LimitsSetBy,
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits {
            memory_mb: USER_QUERY_MEMORY_LIMIT_MB,
            time_s: USER_QUERY_TIME_LIMIT_S,
            max_rows: None,
            max_result_mb: None,
            set_by: LimitsSetBy::Defaults,
        }
    }
}

/// Who set a query's limits: where a limit is raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitsSetBy {
    /// `tidegate sql`'s flags (`--memory-limit-mb`, `--time-limit-s`).
    SqlCommand,
    /// `tidegate serve`'s flags, for queries over HTTP (`--sql-memory-limit-mb`, ...).
    Server,
    /// The defaults: checks and SQL tasks, which no setting raises.
    Defaults,
}

/// One of the limits of [`QueryLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    Memory,
    Time,
    Rows,
    ResultBytes,
}

impl QueryLimits {
    /// `memory limit of 64 MiB`, `limit of 10000 rows per result`, ...
    fn describe(&self, limit: Limit) -> String {
        match limit {
            Limit::Memory => format!("memory limit of {} MiB", self.memory_mb),
            Limit::Time => format!("time limit of {} s", self.time_s),
            Limit::Rows => format!("limit of {} rows per result", self.max_rows.unwrap_or_default()),
            Limit::ResultBytes => format!("limit of {} MiB per result", self.max_result_mb.unwrap_or_default()),
        }
    }

    /// How to raise `limit`: who acts, with which flag, and its default.
    fn raise(&self, limit: Limit) -> String {
        let (sql_flag, serve_flag, default) = match limit {
            Limit::Memory => {
                ("--memory-limit-mb", "--sql-memory-limit-mb", format!("{USER_QUERY_MEMORY_LIMIT_MB} MiB"))
            }
            Limit::Time => ("--time-limit-s", "--sql-time-limit-s", format!("{USER_QUERY_TIME_LIMIT_S} s")),
            Limit::Rows => ("", "--sql-max-rows", String::new()),
            Limit::ResultBytes => ("", "--sql-max-result-mb", String::new()),
        };
        match self.set_by {
            LimitsSetBy::SqlCommand if !sql_flag.is_empty() => {
                format!(
                    ", or raise it with `tidegate sql {sql_flag}` (checks and SQL tasks run with the default, {default})"
                )
            }
            LimitsSetBy::SqlCommand => String::new(),
            LimitsSetBy::Server => format!(
                "; the server's operator sets it (`tidegate serve {serve_flag}`); `tidegate sql` on the workspace runs \
                 with its own limits"
            ),
            LimitsSetBy::Defaults => " (checks and SQL tasks run with the default limits)".to_owned(),
        }
    }

    /// [`Error::QueryLimit`] for `limit`, reached by `what` (`it`, `its result`, ...).
    fn reached(&self, limit: Limit, what: impl Into<String>) -> Error {
        Error::QueryLimit { what: what.into(), limit: self.describe(limit), raise: self.raise(limit) }
    }

    /// The bytes one query may hold.
    fn memory_bytes(&self) -> usize {
        usize::try_from(self.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX)
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
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(limits.memory_bytes(), 1.0)
            .with_disk_manager_builder(no_disk)
            .build_arc()?;
        let ctx = SessionContext::new_with_config_rt(SessionConfig::new(), runtime);
        let registered: Vec<String> = ctx.state().table_functions().keys().cloned().collect();
        for name in registered.iter().filter(|n| !USER_TABLE_FUNCTIONS.contains(&n.as_str())) {
            ctx.deregister_udtf(name);
        }
        let pool = ctx.runtime_env().memory_pool.clone();
        crate::amplifiers::bound(&ctx, pool, limits.memory_bytes() as u64);
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
        let statement = state.sql_to_statement(sql, &dialect).map_err(|e| user_error(e, session, sql))?;
        read_only_statement(&statement)?;
        let plan = state.statement_to_plan(statement).await.map_err(|e| user_error(e, session, sql))?;
        let read_only = SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
        read_only
            .verify_plan(&plan)
            .map_err(|e| Error::ReadOnlyQuery { statement: format!("what its plan does ({})", e.message()) })?;
        let frame = session.ctx.execute_logical_plan(plan).await.map_err(|e| user_error(e, session, sql))?;
        collect_within(session, frame, sql).await
    };
    // A panic inside DataFusion (a value past what Arrow holds) is the query's failure, not the
    // process's: it is caught here, or in DataFusion's own tasks (`user_error`), and reported
    // as an error; the panic hook stays quiet about it (`is_reported_panic`).
    let guarded = Flagged(Box::pin(std::panic::AssertUnwindSafe(run).catch_unwind()));
    match tokio::time::timeout(Duration::from_secs(limits.time_s), guarded).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(fault(&panic_text(panic.as_ref()), sql)),
        Err(_) => Err(limits.reached(Limit::Time, "it")),
    }
}

/// The rows of `frame`, each batch counted as it arrives against the result limits and, in the
/// session's memory pool, against its memory limit: a result never grows outside the pool.
async fn collect_within(session: &UserSession, frame: DataFrame, sql: &str) -> Result<Vec<RecordBatch>> {
    let limits = session.limits;
    let pool = session.ctx.runtime_env().memory_pool.clone();
    let reservation = MemoryConsumer::new("query result").register(&pool);
    let max_result_bytes = limits.max_result_mb.map(|mb| mb.saturating_mul(1024 * 1024));
    let mut stream = frame.execute_stream().await.map_err(|e| user_error(e, session, sql))?;
    let (mut rows, mut n_rows, mut n_bytes) = (Vec::new(), 0_u64, 0_u64);
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| user_error(e, session, sql))?;
        n_rows += batch.num_rows() as u64;
        let size = result_bytes(&batch);
        n_bytes += size as u64;
        if limits.max_rows.is_some_and(|max| n_rows > max) {
            return Err(limits.reached(Limit::Rows, format!("its result ({n_rows} rows so far)")));
        }
        if max_result_bytes.is_some_and(|max| n_bytes > max) {
            return Err(limits.reached(Limit::ResultBytes, format!("its result ({} so far)", mib(n_bytes))));
        }
        if reservation.try_grow(size).is_err() {
            return Err(limits.reached(Limit::Memory, format!("it, holding its result ({} so far)", mib(n_bytes))));
        }
        rows.push(batch);
    }
    Ok(rows)
}

thread_local! {
    /// Whether this thread is polling a user query now.
    static IN_USER_QUERY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A future that marks its thread as running a user query while it is polled.
struct Flagged<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for Flagged<F> {
    type Output = F::Output;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let before = IN_USER_QUERY.with(|f| f.replace(true));
        let polled = self.0.as_mut().poll(cx);
        IN_USER_QUERY.with(|f| f.set(before));
        polled
    }
}

/// Whether a panic at `location` is one the lake catches and reports as the query's error, so a
/// panic hook should not print it: it happened while this thread polled a user query, or inside
/// Arrow or DataFusion (whose panics every caller in the lake catches: a user query's become
/// [`Error::QueryFault`], Tidegate's own queries' an internal error with the panic's message).
pub fn is_reported_panic(location: Option<&std::panic::Location<'_>>) -> bool {
    if IN_USER_QUERY.with(std::cell::Cell::get) {
        return true;
    }
    location.is_some_and(|l| is_engine_source(l.file()))
}

/// Whether `file` is a source file of Arrow or DataFusion: a path through a crate's source
/// folder (`arrow-array-59.3.2`, `datafusion-55.2.0`).
fn is_engine_source(file: &str) -> bool {
    std::path::Path::new(file).components().any(|c| {
        let name = c.as_os_str().to_string_lossy();
        let engine = name.starts_with("arrow") || name.starts_with("datafusion");
        engine && name.rsplit_once('-').is_some_and(|(_, version)| version.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// The bytes a result batch holds: each column's slice (a batch that is a slice of a larger one,
/// as `LIMIT` over an in-memory table returns, counts only its rows), or, where Arrow cannot say,
/// its buffers whole.
fn result_bytes(batch: &RecordBatch) -> usize {
    let sliced: Option<usize> = batch.columns().iter().map(|c| c.to_data().get_slice_memory_size().ok()).sum();
    sliced.unwrap_or_else(|| get_record_batch_memory_size(batch))
}

/// `12.5 MiB`.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The message a panic carried (a `String` or a `&str`), or what stands for it.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "no message".to_owned())
}

/// [`Error::QueryFault`] for a panic inside DataFusion that said `message`: what ran out, in the
/// words a user acts on, and the query.
fn fault(message: &str, sql: &str) -> Error {
    let what = if message.contains("offset overflow") {
        "the strings or bytes of one column exceed 2 GiB in one batch of rows, more than Arrow (DataFusion's \
         format) holds: build shorter values (repeat, lpad, string_agg, array functions) or aggregate sooner"
            .to_owned()
    } else if message.contains("capacity overflow") || message.contains("overflow") {
        format!("a value grew past what one array can hold ({message}): build smaller values")
    } else {
        format!(
            "DataFusion stopped on it ({message}) instead of answering with an error: rewrite the query; if it is \
             valid SQL, the fault is DataFusion's"
        )
    };
    let mut query: String = sql.trim().chars().take(QUOTED_QUERY_CHARS).collect();
    if sql.trim().chars().count() > QUOTED_QUERY_CHARS {
        query.push('…');
    }
    Error::QueryFault { what, query }
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

/// A user query's failure: over the memory limit, a panic in one of DataFusion's tasks, or a
/// mistake in the query, said plainly.
fn user_error(e: DataFusionError, session: &UserSession, sql: &str) -> Error {
    let limits = session.limits;
    if let DataFusionError::Plan(message) = e.find_root()
        && let Some(table) = unknown_table(message)
    {
        return Error::UnknownTable { table, known: session.table_names() };
    }
    if let DataFusionError::ResourcesExhausted(message) = e.find_root() {
        let what = crate::amplifiers::what_of(message).unwrap_or_else(|| "it".to_owned());
        return limits.reached(Limit::Memory, what);
    }
    // A panic in one of DataFusion's tasks comes back as tokio's `task 54 panicked with message
    // "offset overflow"`, as the root or wrapped (RepartitionExec wraps it as an external error).
    let text = e.to_string();
    if let Some((_, panicked)) = text.split_once(" panicked") {
        let message = panicked.trim_start_matches(" with message ").trim_matches(['"', ' ']);
        return fault(message, sql);
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{Volatility, create_udf};

    use super::*;

    /// A session with `overflowing(x)`, which panics as Arrow does when a text column of one
    /// batch passes 2 GiB.
    fn session_with_a_panicking_function() -> UserSession {
        let session = UserSession::new(QueryLimits::default()).expect("a session");
        let panics = Arc::new(|_: &[datafusion::logical_expr::ColumnarValue]| -> datafusion::error::Result<_> {
            panic!("offset overflow")
        });
        let udf = create_udf("overflowing", vec![DataType::Int64], DataType::Int64, Volatility::Volatile, panics);
        session.ctx().register_udf(udf);
        session
    }

    /// Issue 31, item 13a: a panic inside a query, on the thread polling it or in a task
    /// DataFusion spawned, is the query's error, naming what ran out and the query.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_inside_a_query_is_the_querys_error() {
        let session = session_with_a_panicking_function();
        let queries = [
            "SELECT overflowing(value) FROM generate_series(1, 3)",
            // Repartitioned: the function runs in a task DataFusion spawns.
            "SELECT count(*) FROM (SELECT overflowing(value) AS v FROM generate_series(1, 100000)) GROUP BY v % 7",
        ];
        for query in queries {
            let err = user_query(&session, query).await.expect_err("the panic is an error");
            let text = err.to_string();
            assert!(matches!(err, Error::QueryFault { .. }), "{query}: {err:?}");
            assert!(text.contains("exceed 2 GiB in one batch") && text.contains("overflowing(value)"), "{text}");
            assert!(!text.contains("internal error") && !text.contains("task "), "{text}");
        }
    }

    /// The bounded functions answer as DataFusion's own do, on plain and view strings, columns
    /// and constants.
    #[tokio::test]
    async fn bounded_functions_answer_as_before() {
        let session = UserSession::new(QueryLimits::default()).expect("a session");
        let query = "SELECT repeat(s, 2) AS r, lpad(s, 5, '*') AS l, rpad(v, 4, '-') AS p, replace(s, 'a', 'bb') AS x, \
                       regexp_replace(v, 'b', 'c') AS g, array_length(array_repeat(s, 3)) AS a, \
                       array_length(range(1, 10)) AS n, repeat('z', 3) AS z \
                     FROM (SELECT s, arrow_cast(s, 'Utf8View') AS v FROM (VALUES ('abc')) t(s))";
        let rows = user_query(&session, query).await.expect("the query");
        let got: Vec<Option<String>> = (0..8).map(|i| first_value(&rows, i).expect("a value")).collect();
        let want = ["abcabc", "**abc", "abc-", "bbbc", "acc", "3", "9", "zzz"];
        assert_eq!(got, want.iter().map(|w| Some((*w).to_owned())).collect::<Vec<_>>());
    }

    #[test]
    fn panics_in_arrow_and_datafusion_sources_are_the_lakes_to_report() {
        let registry = "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";
        assert!(is_engine_source(&format!("{registry}/arrow-array-59.3.2/src/array/byte_array.rs")));
        assert!(is_engine_source(&format!("{registry}/datafusion-physical-plan-55.2.0/src/projection.rs")));
        assert!(!is_engine_source(&format!("{registry}/tokio-1.48.0/src/runtime/task/harness.rs")));
        assert!(!is_engine_source("crates/lake/src/stage.rs"));
        assert!(!is_engine_source("/home/u/arrowhead/src/main.rs"));
    }
}

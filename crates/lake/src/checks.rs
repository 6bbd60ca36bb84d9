//! Checks on staged data before publication. The staged files are read back and registered in
//! DataFusion as the table `staged`; each declared check (plus the schema contract when columns
//! are declared) becomes one [`CheckResult`]. A failing blocking check must stop publication.

use arrow::array::{Array, AsArray as _};
use arrow::compute::cast;
use arrow::datatypes::{DataType, TimeUnit, TimestampMicrosecondType};
use chrono::{DateTime, Utc};
use object_store::ObjectStoreExt as _;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use tidegate_core::spec::model::{Aggregate, Check, CheckRule, Dataset};

use crate::df;
use crate::error::{Error, Result};
use crate::layout::PartitionColumn;
use crate::read;
use crate::stage::StagedVersion;
use crate::table::{Lake, declared_schema, table_schema};

/// The name of the implicit check that compares staged files with the declared columns.
pub const SCHEMA_CONTRACT: &str = "schema_contract";

/// The most failing values or rows quoted in a check's detail.
const DETAIL_SAMPLES: usize = 5;

/// The outcome of one check on one staged version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The check's declared name, or [`SCHEMA_CONTRACT`] for the implicit schema check.
    pub name: String,
    /// Whether the staged rows satisfy the check; a custom query that fails to run does not pass.
    pub passed: bool,
    /// Whether a failure stops publication (the schema contract always does).
    pub blocking: bool,
    /// What was measured, in words, for the run page and the journal.
    pub detail: String,
    /// Rows (or partitions, for freshness) that violate the check.
    pub n_failing: u64,
}

impl CheckResult {
    /// True when this result must stop publication.
    pub fn blocks(&self) -> bool {
        self.blocking && !self.passed
    }
}

impl Lake {
    /// Runs the schema contract (when columns are declared) and every declared check against a
    /// staged version. Failures of the data are results; only IO and bugs are errors.
    pub async fn check(&self, dataset: &Dataset, staged: &StagedVersion) -> Result<Vec<CheckResult>> {
        // Only an aggregate tolerance reads the published rows; the other checks read the staged
        // files and need the table for its schema and store, which any version this handle has
        // loaded gives without reading the log for newer commits.
        let compares = dataset.checks.iter().any(|c| matches!(c.rule, CheckRule::AggregateTolerance { .. }));
        let table = match self.loaded(&dataset.name) {
            Some(table) if !compares => table,
            _ => self.load(&dataset.name).await?,
        };
        let mut results = Vec::with_capacity(dataset.checks.len() + 1);
        if !dataset.columns.is_empty() {
            results.push(self.schema_contract(&table, dataset, staged).await?);
        }
        if dataset.checks.is_empty() {
            return Ok(results);
        }
        let schema = crate::evolution::staged_schema(&table, dataset, staged).await?;
        let rows = self.read_staged(&table, &dataset.name, &staged.files, &schema).await?;
        // The built-in rules run Tidegate's own SQL in a session of their own; custom queries run
        // in a user session, read-only and bounded, over the same rows.
        let ctx = df::session();
        df::register_batches(&ctx, "staged", &schema, rows.clone())?;
        let user = df::UserSession::new(self.limits)?;
        df::register_batches(user.ctx(), "staged", &schema, rows)?;
        for check in &dataset.checks {
            let (passed, n_failing, detail) = match &check.rule {
                CheckRule::Sql { query } => custom_sql(&user, query).await?,
                rule => run_rule(&ctx, &table, staged, rule).await?,
            };
            results.push(result(check, passed, n_failing, detail));
        }
        Ok(results)
    }

    /// Compares the staged files' own schemas, and their nulls, with the declared columns.
    async fn schema_contract(
        &self,
        table: &deltalake_core::DeltaTable,
        dataset: &Dataset,
        staged: &StagedVersion,
    ) -> Result<CheckResult> {
        let declared =
            declared_schema(dataset)?.ok_or_else(|| Error::internal("schema contract without declared columns"))?;
        let store = table.object_store();
        let mut problems = Vec::new();
        let mut n_failing = 0u64;
        for file in &staged.files {
            let bytes = store.get(&crate::layout::object_path(file.path.as_str())).await?;
            let bytes = bytes.bytes().await?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
            let actual = builder.schema().clone();
            for field in declared.fields().iter().filter(|f| *f.name() != dataset.partition_column) {
                match actual.field_with_name(field.name()) {
                    Err(_) => problems.push(format!("{}: column {} is missing", file.path, field.name())),
                    Ok(found) if found.data_type() != field.data_type() => problems.push(format!(
                        "{}: column {} is {} but declared {}",
                        file.path,
                        field.name(),
                        found.data_type(),
                        field.data_type()
                    )),
                    Ok(_) => {}
                }
            }
            for batch in builder.build()? {
                let batch = batch?;
                for field in declared.fields().iter().filter(|f| !f.is_nullable()) {
                    if let Some(column) = batch.column_by_name(field.name()) {
                        let nulls = column.null_count() as u64;
                        if nulls > 0 {
                            n_failing += nulls;
                            problems.push(format!("{}: {nulls} nulls in not-null column {}", file.path, field.name()));
                        }
                    }
                }
            }
        }
        let expected_hash = crate::stage::schema_hash(&declared);
        if staged.schema_hash != expected_hash {
            problems.push("the staged schema hash differs from the declared columns".to_owned());
        }
        let passed = problems.is_empty();
        let detail = if passed {
            format!("{} files match the {} declared columns", staged.files.len(), dataset.columns.len())
        } else {
            problems.truncate(DETAIL_SAMPLES);
            problems.join("; ")
        };
        Ok(CheckResult { name: SCHEMA_CONTRACT.to_owned(), passed, blocking: true, detail, n_failing })
    }
}

fn result(check: &Check, passed: bool, n_failing: u64, detail: String) -> CheckResult {
    CheckResult { name: check.name.clone(), passed, blocking: check.blocking, detail, n_failing }
}

/// (passed, n_failing, detail) of a built-in rule.
async fn run_rule(
    ctx: &datafusion::prelude::SessionContext,
    table: &deltalake_core::DeltaTable,
    staged: &StagedVersion,
    rule: &CheckRule,
) -> Result<(bool, u64, String)> {
    let count = |sql: String| async move { df::first_u64(&df::query(ctx, &sql).await?, 0) };
    Ok(match rule {
        CheckRule::NotNull { columns } => {
            let any_null: Vec<String> = columns.iter().map(|c| format!("{} IS NULL", df::ident(c))).collect();
            let n = count(format!("SELECT count(*) FROM staged WHERE {}", any_null.join(" OR "))).await?;
            (n == 0, n, format!("{n} rows with a null in {}", columns.join(", ")))
        }
        CheckRule::Unique { columns } => {
            let cols = df::ident_list(columns);
            let n = count(format!(
                "SELECT coalesce(sum(n), 0) FROM (SELECT count(*) AS n FROM staged GROUP BY {cols} \
                 HAVING count(*) > 1)"
            ))
            .await?;
            (n == 0, n, format!("{n} rows share their ({}) with another row", columns.join(", ")))
        }
        CheckRule::AcceptedValues { column, values } => {
            let c = df::ident(column);
            let outside = format!(
                "FROM staged WHERE {c} IS NOT NULL AND CAST({c} AS VARCHAR) NOT IN {}",
                df::literal_list(values)
            );
            let n = count(format!("SELECT count(*) {outside}")).await?;
            let samples =
                df::query(ctx, &format!("SELECT DISTINCT CAST({c} AS VARCHAR) {outside} LIMIT {DETAIL_SAMPLES}"))
                    .await?;
            let mut seen = Vec::new();
            for batch in &samples {
                for row in 0..batch.num_rows() {
                    seen.extend(df::value_at(batch.column(0), row)?);
                }
            }
            let detail = if n == 0 {
                format!("every {column} value is one of {}", values.join(", "))
            } else {
                format!("{n} rows have {column} outside the accepted values, e.g. {}", seen.join(", "))
            };
            (n == 0, n, detail)
        }
        CheckRule::RowCount { min, max } => {
            let n = staged.n_rows;
            let low = min.is_some_and(|m| n < m);
            let high = max.is_some_and(|m| n > m);
            let bounds = format!(
                "[{}, {}]",
                min.map_or("-".to_owned(), |m| m.to_string()),
                max.map_or("-".to_owned(), |m| m.to_string())
            );
            let failing = if low || high { n } else { 0 };
            (!(low || high), failing, format!("{n} rows staged; bounds {bounds}"))
        }
        CheckRule::AggregateTolerance { column, aggregate, tolerance_pct } => {
            aggregate_tolerance(ctx, table, staged, column, *aggregate, *tolerance_pct).await?
        }
        CheckRule::Freshness { column, max_age_s } => freshness(ctx, table, staged, column, *max_age_s).await?,
        CheckRule::Sql { .. } => return Err(Error::internal("custom SQL reached run_rule")),
    })
}

/// The aggregate of `column` in staged rows against the published rows of the same partitions.
async fn aggregate_tolerance(
    ctx: &datafusion::prelude::SessionContext,
    table: &deltalake_core::DeltaTable,
    staged: &StagedVersion,
    column: &str,
    aggregate: Aggregate,
    tolerance_pct: f64,
) -> Result<(bool, u64, String)> {
    let c = df::ident(column);
    let expr = match aggregate {
        Aggregate::Sum => format!("sum({c})"),
        Aggregate::Mean => format!("avg({c})"),
        Aggregate::Min => format!("min({c})"),
        Aggregate::Max => format!("max({c})"),
        Aggregate::Count => format!("count({c})"),
    };
    let sql = |from: &str| format!("SELECT CAST({expr} AS DOUBLE), count(*) FROM {from}");
    let now = df::query(ctx, &sql("staged")).await?;
    let schema = table_schema(table)?;
    if schema.field_with_name(column).is_err() {
        // A column this publication adds: nothing published to compare with yet.
        return Ok((true, 0, format!("column {column} is new: no published values to compare with")));
    }
    let published = read::scan(table, Some(&staged.partition_keys()), &schema).await?;
    let before_ctx = df::session();
    df::register_batches(&before_ctx, "published", &schema, published)?;
    let before = df::query(&before_ctx, &sql("published")).await?;
    let name = format!("{aggregate:?}").to_lowercase();
    if df::first_u64(&before, 1)? == 0 {
        return Ok((true, 0, format!("no published rows in these partitions to compare {name}({column}) with")));
    }
    let value = |b: &[arrow::array::RecordBatch]| -> Result<Option<f64>> {
        Ok(match df::first_value(b, 0)? {
            None => None,
            Some(t) => Some(t.parse::<f64>().map_err(|e| Error::internal(format!("aggregate {t:?}: {e}")))?),
        })
    };
    let (new, old) = (value(&now)?, value(&before)?);
    let (new, old) = match (new, old) {
        (Some(n), Some(o)) => (n, o),
        (n, o) => {
            let same = n.is_none() && o.is_none();
            return Ok((same, u64::from(!same), format!("{name}({column}) is {n:?} now and {o:?} published")));
        }
    };
    let change_pct =
        if old == 0.0 { if new == 0.0 { 0.0 } else { f64::INFINITY } } else { ((new - old) / old).abs() * 100.0 };
    let passed = change_pct <= tolerance_pct;
    Ok((
        passed,
        u64::from(!passed),
        format!("{name}({column}) moved from {old} to {new} ({change_pct:.2}%, tolerance {tolerance_pct}%)"),
    ))
}

/// The newest `column` value of each staged partition against the partition's end (or the current
/// time for static partitions, which have no end).
async fn freshness(
    ctx: &datafusion::prelude::SessionContext,
    table: &deltalake_core::DeltaTable,
    staged: &StagedVersion,
    column: &str,
    max_age_s: u64,
) -> Result<(bool, u64, String)> {
    let partition = PartitionColumn::of_table(table)?;
    let sql =
        format!("SELECT {p}, max({c}) FROM staged GROUP BY {p}", p = df::ident(&partition.name), c = df::ident(column));
    let newest = df::query(ctx, &sql).await?;
    let mut by_partition = std::collections::HashMap::new();
    for batch in &newest {
        let keys = cast(batch.column(0), &DataType::Utf8)?;
        let times = cast(batch.column(1), &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())))?;
        let times = times.as_primitive::<TimestampMicrosecondType>();
        for row in 0..batch.num_rows() {
            let value = keys.as_string::<i32>().value(row);
            let key = partition.key_of(value).unwrap_or_else(|| value.to_owned());
            let at = (!times.is_null(row)).then(|| times.value(row));
            by_partition.insert(key, at);
        }
    }
    let mut stale = Vec::new();
    for partition in &staged.partitions {
        let end: DateTime<Utc> = partition.interval.map_or_else(Utc::now, |i| i.end);
        let newest = by_partition.get(&partition.key).copied().flatten();
        let age_s = newest.and_then(DateTime::<Utc>::from_timestamp_micros).map(|t| (end - t).num_seconds());
        match age_s {
            Some(age) if age <= i64::try_from(max_age_s).unwrap_or(i64::MAX) => {}
            Some(age) => stale.push(format!("{} ({age} s old)", partition.key)),
            None => stale.push(format!("{} (no {column} values)", partition.key)),
        }
    }
    let n = stale.len() as u64;
    let detail = if stale.is_empty() {
        format!("newest {column} is within {max_age_s} s of each partition's end")
    } else {
        stale.truncate(DETAIL_SAMPLES);
        format!("stale partitions (max {max_age_s} s): {}", stale.join(", "))
    };
    Ok((n == 0, n, detail))
}

/// A custom query returning failing rows; a query that does not run (a typo, a statement that is
/// not read-only, one over a limit) is a failing check whose detail says why, so it blocks
/// publication instead of being ignored.
async fn custom_sql(session: &df::UserSession, query: &str) -> Result<(bool, u64, String)> {
    match df::user_query(session, query).await {
        Ok(rows) => {
            let n = df::n_rows(&rows);
            if n == 0 {
                return Ok((true, 0, "the query returned no failing rows".to_owned()));
            }
            let samples = df::sample_rows(&rows, DETAIL_SAMPLES)?;
            let shown: Vec<String> = samples.iter().map(|v| v.to_string()).collect();
            Ok((false, n, format!("{n} failing rows, e.g. {}", shown.join(", "))))
        }
        Err(Error::Query { detail }) => Ok((false, 0, format!("the query failed: {detail}"))),
        Err(e @ (Error::ReadOnlyQuery { .. } | Error::QueryLimit { .. } | Error::UnknownTable { .. })) => {
            Ok((false, 0, e.to_string()))
        }
        Err(e) => Err(e),
    }
}

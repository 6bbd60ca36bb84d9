//! `tidegate-bench lake`: the lake's benchmarks, each a median over several runs with a baseline
//! measured in the same run.
//!
//! 1. Publication of a 365-partition `replace` release (staging excluded) on a table with 0, about
//!    10 and about 50 prior versions: does `Lake::publish` stay flat as the log grows?
//! 2. A merge of changed rows (updates, tombstones, inserts) into a large table, timed as the
//!    `Lake::publish` of the staged changes; baseline: DuckDB's `MERGE INTO` on the same Parquet
//!    files, in a `python3` child process.
//! 3. `Lake::diff` of the versions before and after that merge, with known counts; baseline: the
//!    same six queries (three counts, three samples) in DuckDB over the same Parquet files.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use chrono::{Duration, TimeZone as _, Utc};
use serde_json::{Value, json};
use tidegate_core::partition::{Grain, Interval, Partition};
use tidegate_core::spec::model::{Column, Dataset, DatasetKind, Loc, Partitioning, ReviewFlags, WriteMode};
use tidegate_lake::arrow::array::{
    Array, ArrayRef, AsArray as _, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use tidegate_lake::arrow::compute::cast;
use tidegate_lake::arrow::datatypes::{DataType, Int64Type};
use tidegate_lake::{Lake, Release, ReleaseItem, StagedVersion};

use super::{
    Samples, Scratch, command_line, machine, mib, now_text, peak_rss_kib, progress, ratio, reset_peak_rss, round,
};
use tidegate_app::workspace::runtime;

#[derive(Debug, clap::Args)]
pub struct LakeArgs {
    /// One run per measurement and a 1,000,000-row table instead of 10,000,000.
    #[arg(long)]
    pub quick: bool,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Rows of the merge and diff table (the changes are a tenth of it).
    #[arg(long, value_name = "N")]
    pub rows: Option<u64>,
    /// Runs per measurement (the median is reported).
    #[arg(long, value_name = "N")]
    pub runs: Option<usize>,
    /// Keep the temp folder (its path is printed) instead of removing it.
    #[arg(long)]
    pub keep: bool,
}

/// Day partitions in the publication benchmark.
const N_DAYS: usize = 365;
/// Rows per day partition in the publication benchmark.
const ROWS_PER_DAY: i64 = 4;
/// The table versions at which publication is measured (the first on fresh tables); 100 shows the
/// trend over a longer log. The lake checkpoints its tables every few commits (`table.rs`).
const PUBLISH_LEVELS: [u64; 4] = [0, 10, 50, 100];
/// The publication aim of the issue, in seconds.
const PUBLISH_AIM_S: f64 = 2.0;
/// The merge aim of the issue: at most this multiple of DuckDB's `MERGE INTO`.
const MERGE_AIM_RATIO: f64 = 1.5;
/// Static partitions of the merge table; a row's partition is `b<id % N_BUCKETS>`.
const N_BUCKETS: u64 = 10;

/// Sizes of one invocation.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    runs: usize,
    rows: u64,
    n_updates: u64,
    n_deletes: u64,
    n_inserts: u64,
}

impl Sizes {
    fn of(args: &LakeArgs) -> Result<Sizes> {
        let runs = args.runs.unwrap_or(if args.quick { 1 } else { 5 });
        let rows = args.rows.unwrap_or(if args.quick { 1_000_000 } else { 10_000_000 });
        ensure!(runs >= 1, "--runs must be at least 1");
        ensure!(rows >= 1_000, "--rows must be at least 1000");
        let changes = rows / 10;
        let n_updates = changes * 8 / 10;
        let n_deletes = changes / 10;
        Ok(Sizes { runs, rows, n_updates, n_deletes, n_inserts: changes - n_updates - n_deletes })
    }

    fn changes(&self) -> u64 {
        self.n_updates + self.n_deletes + self.n_inserts
    }
}

pub fn run(args: LakeArgs) -> Result<ExitCode> {
    let sizes = Sizes::of(&args)?;
    let command = command_line();
    let scratch = Scratch::new(args.keep)?;
    let rt = runtime()?;
    let report = rt.block_on(run_all(&scratch.path, sizes))?;
    let machine = machine();
    let date = now_text();
    if args.json {
        let mut out = report.json(sizes);
        out["command"] = json!(command);
        out["date"] = json!(date);
        out["machine"] = machine;
        out["mode"] = json!(if args.quick { "quick" } else { "full" });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report.human(sizes, &command, &date, &machine));
    }
    Ok(ExitCode::SUCCESS)
}

/// Every measurement of one invocation.
#[derive(Debug)]
struct Report {
    publish: Vec<PublishLevel>,
    publish_rss_kib: Option<u64>,
    merge: Samples,
    merge_rss_kib: Option<u64>,
    merge_check: String,
    base_read: Samples,
    diff: Samples,
    diff_rss_kib: Option<u64>,
    diff_counts: (u64, u64, u64),
    duckdb: Baseline,
}

/// One level of the publication benchmark.
#[derive(Debug)]
struct PublishLevel {
    /// The table version just before each timed publication.
    versions: Vec<u64>,
    samples: Samples,
}

/// DuckDB's figures, or why there are none.
#[derive(Debug)]
enum Baseline {
    Skipped(String),
    Measured { version: String, threads: String, merge: Samples, copy: Samples, diff: Samples, rss_kib: Option<u64> },
}

async fn run_all(dir: &Path, sizes: Sizes) -> Result<Report> {
    let lake_dir = dir.join("lake");
    let lake = Lake::open(lake_dir.to_str().context("the temp folder is not UTF-8")?).await?;

    let tracked = reset_peak_rss();
    let publish = bench_publish(&lake, sizes).await?;
    let publish_rss_kib = tracked.then(peak_rss_kib).flatten();

    let merge = bench_merge(&lake, sizes).await?;
    let tracked = reset_peak_rss();
    let (diff, diff_counts) = bench_diff(&lake, sizes, &merge).await?;
    let diff_rss_kib = tracked.then(peak_rss_kib).flatten();

    progress("DuckDB baseline (python3 -c ...)");
    let duckdb = duckdb_baseline(dir, sizes, &merge)?;
    if let Baseline::Skipped(why) = &duckdb {
        progress(&format!("DuckDB baseline skipped: {why}"));
    }
    Ok(Report {
        publish,
        publish_rss_kib,
        merge: merge.samples,
        merge_rss_kib: merge.rss_kib,
        merge_check: merge.check,
        base_read: merge.base_read,
        diff,
        diff_rss_kib,
        diff_counts,
        duckdb,
    })
}

// ---------------------------------------------------------------------------------------------
// 1. Publication of a 365-partition replace release

fn column(name: &str, data_type: &str, nullable: bool) -> Column {
    Column { name: name.to_owned(), data_type: data_type.to_owned(), nullable }
}

fn dataset(name: &str, partitioning: Partitioning, write: WriteMode, columns: Vec<Column>) -> Dataset {
    Dataset {
        name: name.to_owned(),
        loc: Loc::default(),
        partitioning,
        partition_column: tidegate_core::spec::model::DEFAULT_PARTITION_COLUMN.to_owned(),
        kind: DatasetKind::Managed { write },
        consumers: vec![],
        slice_columns: vec![],
        columns,
        checks: vec![],
        review_flags: ReviewFlags::DEFAULT,
        rewrites: tidegate_core::spec::Rewrites::Review,
        stale: tidegate_core::spec::StalePolicy::Report,
    }
}

fn days() -> Result<Vec<Partition>> {
    let first = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).single().context("a valid date")?;
    Ok((0..N_DAYS)
        .map(|i| {
            let start = first + Duration::days(i as i64);
            Partition {
                key: start.format("%Y-%m-%d").to_string(),
                interval: Some(Interval { start, end: start + Duration::days(1) }),
            }
        })
        .collect())
}

fn daily_dataset(name: &str, days: &[Partition]) -> Result<Dataset> {
    let start = days.first().and_then(|d| d.interval.as_ref()).context("at least one day")?.start;
    Ok(dataset(
        name,
        Partitioning::Time { grain: Grain::Day, start, time_zone: None },
        WriteMode::Replace,
        vec![column("id", "int64", false), column("value", "float64", true)],
    ))
}

/// `ROWS_PER_DAY` rows for every day, marked with `n` so versions differ.
fn daily_rows(days: &[Partition], n: u64) -> Result<RecordBatch> {
    let mut ids = Vec::with_capacity(days.len() * ROWS_PER_DAY as usize);
    let mut values = Vec::with_capacity(ids.capacity());
    let mut keys = Vec::with_capacity(ids.capacity());
    for day in days {
        for i in 0..ROWS_PER_DAY {
            ids.push(i);
            values.push(n as f64 + i as f64 / 10.0);
            keys.push(day.key.as_str());
        }
    }
    Ok(RecordBatch::try_from_iter([
        ("id", arr(Int64Array::from(ids))),
        ("value", arr(Float64Array::from(values))),
        ("tg_partition", arr(StringArray::from(keys))),
    ])?)
}

fn arr<A: Array + 'static>(array: A) -> ArrayRef {
    std::sync::Arc::new(array)
}

fn release(name: &str, dataset: &Dataset, staged: StagedVersion) -> Release {
    Release {
        release_id: format!("rel-{name}"),
        run_id: format!("run-{name}"),
        spec_hash: "bench".to_owned(),
        items: vec![ReleaseItem { dataset: dataset.clone(), staged, step_identity: format!("bench:{name}") }],
        anchor: None,
    }
}

/// Stages one 365-day version; returns it with the table version it will be published onto.
async fn stage_days(lake: &Lake, ds: &Dataset, days: &[Partition], n: u64) -> Result<(StagedVersion, u64)> {
    let staged = lake.stage_batches(ds, &format!("stg-{n}"), days, vec![daily_rows(days, n)?]).await?;
    ensure!(staged.files.len() == days.len(), "expected one staged file per day, got {}", staged.files.len());
    let version = lake.table_version(&ds.name).await?.context("staging creates the table")?;
    Ok((staged, version))
}

/// Publishes and returns the seconds `Lake::publish` took.
async fn timed_publish(lake: &Lake, release: &Release) -> Result<f64> {
    let start = Instant::now();
    let publication = lake.publish(release).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let item = publication.items.first().context("a one-item release publishes one item")?;
    ensure!(!item.already_published, "{} was taken for a replay", release.release_id);
    Ok(elapsed)
}

async fn bench_publish(lake: &Lake, sizes: Sizes) -> Result<Vec<PublishLevel>> {
    let days = days()?;
    let mut levels = Vec::new();

    // Level 0: the first publication of fresh tables (version 0 is the table's creation).
    progress(&format!("publish: {N_DAYS} partitions on fresh tables, {} run(s)", sizes.runs));
    let mut level = PublishLevel { versions: Vec::new(), samples: Samples::default() };
    for run in 0..sizes.runs {
        let ds = daily_dataset(&format!("daily_fresh_{run}"), &days)?;
        let (staged, version) = stage_days(lake, &ds, &days, 0).await?;
        level.versions.push(version);
        level.samples.0.push(timed_publish(lake, &release(&format!("{}-0", ds.name), &ds, staged)).await?);
    }
    levels.push(level);

    // Later levels: one table grown by untimed publications of the same shape.
    let ds = daily_dataset("daily_grown", &days)?;
    let mut n = 0u64;
    for &target in &PUBLISH_LEVELS[1..] {
        progress(&format!("publish: growing a table to version {target}, then {} timed run(s)", sizes.runs));
        let mut level = PublishLevel { versions: Vec::new(), samples: Samples::default() };
        loop {
            n += 1;
            let (staged, version) = stage_days(lake, &ds, &days, n).await?;
            let rel = release(&format!("{}-{n}", ds.name), &ds, staged);
            if version < target {
                lake.publish(&rel).await?;
                continue;
            }
            level.versions.push(version);
            level.samples.0.push(timed_publish(lake, &rel).await?);
            if level.samples.0.len() == sizes.runs {
                break;
            }
        }
        levels.push(level);
    }
    Ok(levels)
}

// ---------------------------------------------------------------------------------------------
// 2. Merge

/// What the merge benchmark leaves for the diff and the DuckDB baseline.
#[derive(Debug)]
struct MergeOutcome {
    samples: Samples,
    /// `Lake::read` of every row of the base version (context, not a baseline).
    base_read: Samples,
    rss_kib: Option<u64>,
    /// Table version of the published base and of the first merge's result.
    base_version: u64,
    merged_version: u64,
    /// Absolute paths of the base's Parquet files, of the staged changes', of the first merge's.
    base_files: Vec<String>,
    change_files: Vec<String>,
    merged_files: Vec<String>,
    /// Expected `count(*)`, `sum(seq)`, `sum(id)` after the merge.
    expected: (i64, i64, i64),
    check: String,
}

const MERGE_TABLE: &str = "accounts";

fn merge_columns() -> Vec<Column> {
    vec![
        column("id", "int64", false),
        column("seq", "int64", false),
        column("value", "float64", true),
        column("name", "string", true),
        column("deleted", "bool", true),
    ]
}

fn buckets() -> Vec<Partition> {
    (0..N_BUCKETS).map(|b| Partition { key: format!("b{b}"), interval: None }).collect()
}

fn merge_dataset(write: WriteMode) -> Dataset {
    let keys = buckets().into_iter().map(|p| p.key).collect();
    dataset(MERGE_TABLE, Partitioning::Static { keys }, write, merge_columns())
}

fn base_value(id: i64) -> f64 {
    (id % 1_000) as f64 * 0.25
}

/// Rows of the merge table's schema, with their partition column.
#[derive(Debug, Default)]
struct Rows {
    id: Vec<i64>,
    seq: Vec<i64>,
    value: Vec<f64>,
    name: Vec<String>,
    deleted: Vec<bool>,
}

impl Rows {
    fn with_capacity(n: usize) -> Rows {
        Rows {
            id: Vec::with_capacity(n),
            seq: Vec::with_capacity(n),
            value: Vec::with_capacity(n),
            name: Vec::with_capacity(n),
            deleted: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, id: i64, seq: i64, value: f64, name: String, deleted: bool) {
        self.id.push(id);
        self.seq.push(seq);
        self.value.push(value);
        self.name.push(name);
        self.deleted.push(deleted);
    }

    fn batch(self) -> Result<RecordBatch> {
        let partitions: Vec<String> =
            self.id.iter().map(|id| format!("b{}", id.rem_euclid(N_BUCKETS as i64))).collect();
        Ok(RecordBatch::try_from_iter([
            ("id", arr(Int64Array::from(self.id))),
            ("seq", arr(Int64Array::from(self.seq))),
            ("value", arr(Float64Array::from(self.value))),
            ("name", arr(StringArray::from(self.name))),
            ("deleted", arr(BooleanArray::from(self.deleted))),
            ("tg_partition", arr(StringArray::from(partitions))),
        ])?)
    }
}

/// The base table: ids `0..rows`, seq 1, one batch per bucket.
fn base_batches(rows: u64) -> Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    for bucket in 0..N_BUCKETS {
        let n = (rows + N_BUCKETS - 1 - bucket) / N_BUCKETS;
        let mut r = Rows::with_capacity(n as usize);
        for id in (bucket..rows).step_by(N_BUCKETS as usize) {
            let id = id as i64;
            r.push(id, 1, base_value(id), format!("n{id}"), false);
        }
        batches.push(r.batch()?);
    }
    Ok(batches)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The existing ids the changes touch, spread over the whole table: `i * m mod rows` for a
/// multiplier `m` coprime with `rows`, so they are distinct.
fn touched_ids(sizes: Sizes) -> Vec<i64> {
    let mut m = 7_919u64;
    while gcd(m, sizes.rows) != 1 {
        m += 1;
    }
    (0..sizes.n_updates + sizes.n_deletes).map(|i| ((i as u128 * m as u128) % sizes.rows as u128) as i64).collect()
}

/// The changes: updates (seq 2, new value and name), tombstones (seq 2, `deleted`), new ids.
fn change_batch(sizes: Sizes) -> Result<(RecordBatch, (i64, i64, i64))> {
    let touched = touched_ids(sizes);
    let mut r = Rows::with_capacity(sizes.changes() as usize);
    let (updated, deleted) = touched.split_at(sizes.n_updates as usize);
    for &id in updated {
        r.push(id, 2, base_value(id) + 1.0, format!("u{id}"), false);
    }
    for &id in deleted {
        r.push(id, 2, base_value(id), format!("n{id}"), true);
    }
    let first_new = sizes.rows as i64;
    let inserted: Vec<i64> = (first_new..first_new + sizes.n_inserts as i64).collect();
    for &id in &inserted {
        r.push(id, 1, base_value(id), format!("n{id}"), false);
    }
    let rows = sizes.rows as i64;
    let count = rows - deleted.len() as i64 + inserted.len() as i64;
    let sum_seq = (rows - deleted.len() as i64) + updated.len() as i64 + inserted.len() as i64;
    let sum_id = rows * (rows - 1) / 2 - deleted.iter().sum::<i64>() + inserted.iter().sum::<i64>();
    Ok((r.batch()?, (count, sum_seq, sum_id)))
}

fn absolute(lake: &Lake, files: &[tidegate_lake::StagedFile]) -> Vec<String> {
    let root = lake.root().expect("the benchmark's lake is a temp folder");
    files.iter().map(|f| root.join(MERGE_TABLE).join(&f.path).display().to_string()).collect()
}

/// The Parquet files a merge wrote: the oldest `publish-*` folder under the changes' staging folder.
fn first_publish_files(lake: &Lake, staging_id: &str) -> Result<Vec<String>> {
    let dir = lake
        .root()
        .context("the benchmark's lake is a temp folder")?
        .join(MERGE_TABLE)
        .join(tidegate_lake::STAGING_DIR)
        .join(staging_id);
    let mut folders: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("publish-")))
        .collect();
    folders.sort();
    let first = folders.first().context("the merge wrote no publish-* folder")?;
    let mut files = Vec::new();
    parquet_files(first, &mut files)?;
    files.sort();
    Ok(files)
}

fn parquet_files(dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            parquet_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "parquet") {
            out.push(path.display().to_string());
        }
    }
    Ok(())
}

/// `count(*)`, `sum(seq)`, `sum(id)` of the merge table at its latest version.
async fn merge_table_sums(lake: &Lake) -> Result<(i64, i64, i64)> {
    let batches = lake.sql(&format!("SELECT count(*), sum(seq), sum(id) FROM {MERGE_TABLE}")).await?;
    Ok((scalar(&batches, 0)?, scalar(&batches, 1)?, scalar(&batches, 2)?))
}

fn scalar(batches: &[RecordBatch], col: usize) -> Result<i64> {
    let batch = batches.iter().find(|b| b.num_rows() > 0).context("the query returned no row")?;
    let column = cast(batch.column(col), &DataType::Int64)?;
    let ints = column.as_primitive::<Int64Type>();
    ensure!(!ints.is_null(0), "the query returned null");
    Ok(ints.value(0))
}

async fn bench_merge(lake: &Lake, sizes: Sizes) -> Result<MergeOutcome> {
    progress(&format!("merge: generating and publishing the {}-row base (untimed)", sizes.rows));
    // The base is loaded in replace mode: the table does not record a mode, and a replace skips
    // the merge machinery that the timed runs are about.
    let base_ds = merge_dataset(WriteMode::Replace);
    let base = lake.stage_batches(&base_ds, "base", &buckets(), base_batches(sizes.rows)?).await?;
    ensure!(base.n_rows == sizes.rows, "staged {} base rows, expected {}", base.n_rows, sizes.rows);
    let base_files = absolute(lake, &base.files);
    let published = lake.publish(&release("base", &base_ds, base)).await?;
    let base_version = published.items.first().context("one item")?.table_version;

    progress(&format!("merge: staging {} changed rows (untimed)", sizes.changes()));
    let ds = merge_dataset(WriteMode::Merge {
        keys: vec!["id".to_owned()],
        order_by: Some("seq".to_owned()),
        delete_marker: Some("deleted".to_owned()),
    });
    let (changes, expected) = change_batch(sizes)?;
    let staged = lake.stage_batches(&ds, "changes", &buckets(), vec![changes]).await?;
    let change_files = absolute(lake, &staged.files);

    let tracked = reset_peak_rss();
    let mut samples = Samples::default();
    let mut merged_version = 0;
    let mut check = String::new();
    for run in 0..sizes.runs {
        if run > 0 {
            // Back to the base (untimed), so every run merges the same changes into the same rows.
            lake.rollback(MERGE_TABLE, base_version, None, &format!("rel-restore-{run}"), None, None).await?;
        }
        progress(&format!("merge: timed run {} of {}", run + 1, sizes.runs));
        let rel = release(&format!("merge-{run}"), &ds, staged.clone());
        let start = Instant::now();
        let publication = lake.publish(&rel).await?;
        samples.0.push(start.elapsed().as_secs_f64());
        let item = publication.items.first().context("one item")?;
        ensure!(!item.already_published, "merge run {run} was taken for a replay");
        if run == 0 {
            merged_version = item.table_version;
            let got = merge_table_sums(lake).await?;
            ensure!(got == expected, "after the merge (count, sum(seq), sum(id)) = {got:?}, expected {expected:?}");
            check = format!("count {}, sum(seq) {}, sum(id) {} as expected", got.0, got.1, got.2);
        }
    }
    let rss_kib = tracked.then(peak_rss_kib).flatten();
    let merged_files = first_publish_files(lake, &staged.staging_id)?;

    // Context for the merge's cost: reading every row of the base version once.
    let mut base_read = Samples::default();
    for run in 0..sizes.runs {
        progress(&format!("merge context: Lake::read of the base version, run {} of {}", run + 1, sizes.runs));
        let start = Instant::now();
        let batches = lake.read(MERGE_TABLE, None, Some(base_version)).await?;
        base_read.0.push(start.elapsed().as_secs_f64());
        let n: usize = batches.iter().map(RecordBatch::num_rows).sum();
        ensure!(n as u64 == sizes.rows, "read {n} rows of the base, expected {}", sizes.rows);
    }
    Ok(MergeOutcome {
        samples,
        base_read,
        rss_kib,
        base_version,
        merged_version,
        base_files,
        change_files,
        merged_files,
        expected,
        check,
    })
}

// ---------------------------------------------------------------------------------------------
// 3. Diff

async fn bench_diff(lake: &Lake, sizes: Sizes, merge: &MergeOutcome) -> Result<(Samples, (u64, u64, u64))> {
    let keys = vec!["id".to_owned()];
    let want = (sizes.n_inserts, sizes.n_deletes, sizes.n_updates);
    let mut samples = Samples::default();
    for run in 0..sizes.runs {
        progress(&format!(
            "diff: versions {} and {}, timed run {} of {}",
            merge.base_version,
            merge.merged_version,
            run + 1,
            sizes.runs
        ));
        let start = Instant::now();
        let diff = lake.diff(MERGE_TABLE, &keys, merge.base_version, merge.merged_version).await?;
        samples.0.push(start.elapsed().as_secs_f64());
        let got = (diff.n_added, diff.n_removed, diff.n_changed);
        ensure!(got == want, "diff (added, removed, changed) = {got:?}, expected {want:?}");
    }
    Ok((samples, want))
}

// ---------------------------------------------------------------------------------------------
// DuckDB baseline

/// Runs in `python3 -c`; argv[1] is the JSON configuration, stdout one JSON object.
const DUCKDB_SCRIPT: &str = r#"
import json, resource, sys, time
cfg = json.loads(sys.argv[1])
try:
    import duckdb
except ImportError:
    print(json.dumps({"skipped": "the duckdb module is not installed for python3 (python3 -m pip install duckdb)"}))
    sys.exit(0)

def files(paths):
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"

def quote(path):
    return "'" + path.replace("'", "''") + "'"

part = "'b' || CAST(id % {} AS VARCHAR)".format(cfg["buckets"])
cols = "id, seq, value, name, deleted"
con = duckdb.connect()
# Its progress bar writes to stdout once a query runs for two seconds (a busy machine); the
# result below must be the only thing there.
con.execute("SET enable_progress_bar = false")
out = {"version": duckdb.__version__, "threads": str(con.execute("SELECT current_setting('threads')").fetchone()[0]),
       "merge_s": [], "copy_s": [], "diff_s": []}
con.execute("CREATE TABLE s AS SELECT {}, {} AS tg_partition FROM read_parquet({})".format(cols, part, files(cfg["changes"])))
merge = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED AND s.deleted THEN DELETE
WHEN MATCHED THEN UPDATE SET seq = s.seq, value = s.value, name = s.name, deleted = s.deleted
WHEN NOT MATCHED AND NOT s.deleted THEN INSERT (id, seq, value, name, deleted, tg_partition)
  VALUES (s.id, s.seq, s.value, s.name, s.deleted, s.tg_partition)"""
for run in range(cfg["runs"]):
    con.execute("DROP TABLE IF EXISTS t")
    con.execute("CREATE TABLE t AS SELECT {}, {} AS tg_partition FROM read_parquet({})".format(cols, part, files(cfg["base"])))
    start = time.perf_counter()
    con.execute(merge)
    merged = time.perf_counter()
    con.execute("COPY t TO {} (FORMAT parquet, PARTITION_BY (tg_partition))".format(quote(cfg["out"] + "/run-" + str(run))))
    copied = time.perf_counter()
    out["merge_s"].append(merged - start)
    out["copy_s"].append(copied - merged)
    if run == 0:
        out["after"] = list(con.execute("SELECT count(*), sum(seq), sum(id) FROM t").fetchone())
con.execute("DROP TABLE t")
con.execute("DROP TABLE s")

con.execute("CREATE VIEW a AS SELECT {} FROM read_parquet({})".format(cols, files(cfg["base"])))
con.execute("CREATE VIEW b AS SELECT {} FROM read_parquet({})".format(cols, files(cfg["merged"])))
on = "a.id = b.id"
differs = " OR ".join("a.{0} IS DISTINCT FROM b.{0}".format(c) for c in ["seq", "value", "name", "deleted"])
added = "FROM b ANTI JOIN a ON " + on
removed = "FROM a ANTI JOIN b ON " + on
changed = "FROM a JOIN b ON {} WHERE {}".format(on, differs)
for run in range(cfg["runs"]):
    start = time.perf_counter()
    counts = [con.execute("SELECT count(*) " + q).fetchone()[0] for q in (added, removed, changed)]
    for what, q in (("b", added), ("a", removed), ("b", changed)):
        con.execute("SELECT {}.* {} LIMIT 5".format(what, q)).fetchall()
    out["diff_s"].append(time.perf_counter() - start)
    out["diff_counts"] = counts
out["max_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
"#;

fn duckdb_baseline(dir: &Path, sizes: Sizes, merge: &MergeOutcome) -> Result<Baseline> {
    let out_dir = dir.join("duckdb");
    std::fs::create_dir_all(&out_dir)?;
    let cfg = json!({
        "runs": sizes.runs,
        "buckets": N_BUCKETS,
        "base": merge.base_files,
        "changes": merge.change_files,
        "merged": merge.merged_files,
        "out": out_dir.display().to_string(),
    });
    let output = match std::process::Command::new("python3").arg("-c").arg(DUCKDB_SCRIPT).arg(cfg.to_string()).output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Baseline::Skipped("python3 is not on PATH".to_owned()));
        }
        Err(e) => return Err(e).context("starting python3"),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("the DuckDB baseline failed ({}):\n{}", output.status, tail.join("\n"));
    }
    // The result is the script's last line; anything DuckDB itself printed before it is not.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
    let result: Value = serde_json::from_str(last)
        .with_context(|| format!("reading the DuckDB baseline's output, whose last line is {last:?}"))?;
    if let Some(why) = result.get("skipped").and_then(Value::as_str) {
        return Ok(Baseline::Skipped(why.to_owned()));
    }
    let samples = |key: &str| -> Result<Samples> {
        let values =
            result.get(key).and_then(Value::as_array).with_context(|| format!("no {key} in DuckDB's output"))?;
        Ok(Samples(values.iter().filter_map(Value::as_f64).collect()))
    };
    let after: Vec<i64> = result
        .get("after")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let expected = merge.expected;
    ensure!(
        after == [expected.0, expected.1, expected.2],
        "DuckDB's merge gave (count, sum(seq), sum(id)) = {after:?}, expected {expected:?}"
    );
    let counts: Vec<u64> = result
        .get("diff_counts")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    ensure!(
        counts == [sizes.n_inserts, sizes.n_deletes, sizes.n_updates],
        "DuckDB's diff gave (added, removed, changed) = {counts:?}"
    );
    let text = |key: &str| result.get(key).and_then(Value::as_str).unwrap_or("?").to_owned();
    Ok(Baseline::Measured {
        version: text("version"),
        threads: text("threads"),
        merge: samples("merge_s")?,
        copy: samples("copy_s")?,
        diff: samples("diff_s")?,
        rss_kib: result.get("max_rss_kib").and_then(Value::as_u64),
    })
}

// ---------------------------------------------------------------------------------------------
// Output

fn versions_label(versions: &[u64]) -> String {
    match (versions.iter().min(), versions.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
        (Some(lo), Some(hi)) => format!("{lo}-{hi}"),
        _ => "-".to_owned(),
    }
}

impl Report {
    fn publish_aim_met(&self) -> bool {
        self.publish.iter().all(|l| l.samples.median() < PUBLISH_AIM_S)
    }

    fn json(&self, sizes: Sizes) -> Value {
        let base = self.publish.first().map(|l| l.samples.median()).unwrap_or(f64::NAN);
        let levels: Vec<Value> = self
            .publish
            .iter()
            .map(|l| {
                let mut v = l.samples.json();
                v["table_versions"] = json!(l.versions);
                v["ratio_to_fresh"] = json!(round(ratio(l.samples.median(), base)));
                v
            })
            .collect();
        let mut merge = self.merge.json();
        merge["rows"] = json!(sizes.rows);
        merge["changes"] =
            json!({ "updates": sizes.n_updates, "deletes": sizes.n_deletes, "inserts": sizes.n_inserts });
        merge["partitions"] = json!(N_BUCKETS);
        merge["check"] = json!(self.merge_check);
        merge["context_read_base"] = self.base_read.json();
        merge["peak_rss_kib"] = json!(self.merge_rss_kib);
        let mut diff = self.diff.json();
        diff["rows"] = json!(sizes.rows);
        diff["counts"] =
            json!({ "added": self.diff_counts.0, "removed": self.diff_counts.1, "changed": self.diff_counts.2 });
        diff["peak_rss_kib"] = json!(self.diff_rss_kib);
        let duckdb = match &self.duckdb {
            Baseline::Skipped(why) => json!({ "skipped": why }),
            Baseline::Measured { version, threads, merge: m, copy, diff: d, rss_kib } => {
                merge["ratio_to_duckdb_merge"] = json!(round(ratio(self.merge.median(), m.median())));
                merge["ratio_to_duckdb_merge_and_copy"] =
                    json!(round(ratio(self.merge.median(), m.sum(copy).median())));
                merge["aim_ratio"] = json!(MERGE_AIM_RATIO);
                merge["aim_met"] = json!(ratio(self.merge.median(), m.median()) <= MERGE_AIM_RATIO);
                diff["ratio_to_duckdb"] = json!(round(ratio(self.diff.median(), d.median())));
                json!({
                    "version": version,
                    "threads": threads,
                    "merge": m.json(),
                    "copy_to_parquet": copy.json(),
                    "merge_and_copy": m.sum(copy).json(),
                    "diff": d.json(),
                    "max_rss_kib": rss_kib,
                })
            }
        };
        json!({
            "runs": sizes.runs,
            "publish": {
                "partitions": N_DAYS,
                "rows_per_partition": ROWS_PER_DAY,
                "levels": levels,
                "aim_s": PUBLISH_AIM_S,
                "aim_met": self.publish_aim_met(),
                "peak_rss_kib": self.publish_rss_kib,
            },
            "merge": merge,
            "diff": diff,
            "duckdb": duckdb,
        })
    }

    fn human(&self, sizes: Sizes, command: &str, date: &str, machine: &Value) -> String {
        let mut o = String::new();
        let s = |x: f64| format!("{x:.3} s");
        let _ = writeln!(o, "Lake benchmarks  ({date})");
        let _ = writeln!(
            o,
            "machine: {} CPU(s), {} GiB RAM, {}",
            machine["nproc"],
            machine["mem_total_gib"],
            machine["cpu"].as_str().unwrap_or("?")
        );
        let _ = writeln!(o, "command: {command}");
        let _ = writeln!(o, "runs per measurement: {} (median reported)", sizes.runs);

        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "1. Lake::publish of a {N_DAYS}-partition replace release ({ROWS_PER_DAY} rows per partition), staging excluded"
        );
        let _ = writeln!(
            o,
            "   {:<24} {:>10} {:>10} {:>10} {:>14}",
            "table version before", "median", "min", "max", "vs fresh table"
        );
        let base = self.publish.first().map(|l| l.samples.median()).unwrap_or(f64::NAN);
        for level in &self.publish {
            let m = level.samples.median();
            let _ = writeln!(
                o,
                "   {:<24} {:>10} {:>10} {:>10} {:>13.2}x",
                versions_label(&level.versions),
                s(m),
                s(level.samples.min()),
                s(level.samples.max()),
                ratio(m, base)
            );
        }
        let _ = writeln!(
            o,
            "   aim under {PUBLISH_AIM_S} s at every level: {}; peak RSS {}",
            if self.publish_aim_met() { "met" } else { "NOT met" },
            mib(self.publish_rss_kib)
        );

        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "2. merge of {} changed rows ({} updates, {} tombstones, {} inserts) into {} rows, {N_BUCKETS} partitions",
            sizes.changes(),
            sizes.n_updates,
            sizes.n_deletes,
            sizes.n_inserts,
            sizes.rows
        );
        let _ = writeln!(o, "   {:<50} {:>10} {:>10} {:>10} {:>12}", "what", "median", "min", "max", "vs DuckDB");
        let merge_base = match &self.duckdb {
            Baseline::Measured { merge, .. } => merge.median(),
            Baseline::Skipped(_) => f64::NAN,
        };
        let row = |o: &mut String, what: &str, samples: &Samples, base: f64| {
            let _ = writeln!(
                o,
                "   {:<50} {:>10} {:>10} {:>10} {:>11.2}x",
                what,
                s(samples.median()),
                s(samples.min()),
                s(samples.max()),
                ratio(samples.median(), base)
            );
        };
        row(&mut o, "tidegate Lake::publish (merge mode)", &self.merge, merge_base);
        match &self.duckdb {
            Baseline::Measured { merge, copy, version, threads, .. } => {
                row(&mut o, &format!("DuckDB {version} MERGE INTO (in memory, {threads} threads)"), merge, merge_base);
                row(&mut o, "DuckDB MERGE INTO + COPY to Parquet", &merge.sum(copy), merge_base);
                let r = ratio(self.merge.median(), merge.median());
                let _ = writeln!(
                    o,
                    "   aim within {MERGE_AIM_RATIO}x of DuckDB's MERGE: {} ({r:.2}x)",
                    if r <= MERGE_AIM_RATIO { "met" } else { "NOT met" }
                );
            }
            Baseline::Skipped(why) => {
                let _ = writeln!(o, "   DuckDB baseline skipped: {why}");
            }
        }
        let _ = writeln!(
            o,
            "   context, Lake::read of all {} base rows: median {} (min {}, max {})",
            sizes.rows,
            s(self.base_read.median()),
            s(self.base_read.min()),
            s(self.base_read.max())
        );
        let _ = writeln!(o, "   result checked: {}; peak RSS {}", self.merge_check, mib(self.merge_rss_kib));

        let _ = writeln!(o);
        let (added, removed, changed) = self.diff_counts;
        let _ = writeln!(
            o,
            "3. Lake::diff by id of two {}-row versions ({added} added, {removed} removed, {changed} changed, all checked)",
            sizes.rows
        );
        let _ = writeln!(o, "   {:<50} {:>10} {:>10} {:>10} {:>12}", "what", "median", "min", "max", "vs DuckDB");
        let diff_base = match &self.duckdb {
            Baseline::Measured { diff, .. } => diff.median(),
            Baseline::Skipped(_) => f64::NAN,
        };
        row(&mut o, "tidegate Lake::diff (3 counts + 3 samples)", &self.diff, diff_base);
        match &self.duckdb {
            Baseline::Measured { diff, rss_kib, .. } => {
                row(&mut o, "DuckDB, same 6 queries over the same Parquet", diff, diff_base);
                let _ =
                    writeln!(o, "   peak RSS {}; DuckDB process peak RSS {}", mib(self.diff_rss_kib), mib(*rss_kib));
            }
            Baseline::Skipped(why) => {
                let _ = writeln!(o, "   DuckDB baseline skipped: {why}");
                let _ = writeln!(o, "   peak RSS {}", mib(self.diff_rss_kib));
            }
        }
        o
    }
}

//! Readers no one here wrote, on real tables of every write mode: Python `deltalake`, pandas
//! (through `deltalake`), Polars (which takes partition values from the folder names) and DuckDB
//! (over a `deltalake` pyarrow dataset) each filter by the partition column, count, and read an
//! older version, and must agree with Tidegate's own reads. The snippets `docs/reading-tables.md`
//! and README.md show are extracted from those files and run as they are written. Skipped, with a
//! message, when the Python packages are missing (CI installs them).

use std::path::Path;
use std::process::Command;

use chrono::{TimeZone as _, Utc};
use tidegate_core::partition::{Grain, Interval, Partition};
use tidegate_core::spec::model::{Dataset, Partitioning, WriteMode};
use tidegate_lake::Lake;
use tidegate_lake::arrow::array::RecordBatch;

use crate::common::*;

/// Prints, per reader, the rows of the latest version and of `previous`, all and filtered to
/// one partition, the partition column's nulls and type.
const READERS: &str = r#"
import datetime as dt, json, os, sys
import duckdb, polars as pl
from deltalake import DeltaTable

path, column, kind, raw, previous = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
value = {"date": dt.date.fromisoformat, "timestamp": dt.datetime.fromisoformat, "string": str}[kind](raw)
is_value = [(column, "=", value)]

def table(version=None):
    return DeltaTable(path) if version is None else DeltaTable(path, version=version)

def arrow(version=None, filters=None):
    return table(version).to_pyarrow_table(filters=filters)

def duck(version=None, where="true"):
    ds = table(version).to_pyarrow_dataset()
    con = duckdb.connect()
    con.register("t", ds)
    n = con.execute(f'SELECT count(*) FROM t WHERE {where}', [value] if "?" in where else []).fetchone()[0]
    con.close()
    return n

latest = arrow()
polars_latest = pl.read_delta(path)
out = {
    "deltalake": {
        "total": latest.num_rows,
        "filtered": arrow(filters=is_value).num_rows,
        "previous_total": arrow(previous).num_rows,
        "previous_filtered": arrow(previous, is_value).num_rows,
        "nulls": latest.column(column).null_count,
        "type": str(latest.schema.field(column).type),
    },
    "pandas": {
        "total": len(table().to_pandas()),
        "filtered": len(table().to_pandas(filters=is_value)),
        "previous_total": len(table(previous).to_pandas()),
        "previous_filtered": len(table(previous).to_pandas(filters=is_value)),
        "nulls": int(table().to_pandas()[column].isna().sum()),
    },
    "polars": {
        "total": polars_latest.height,
        "filtered": pl.scan_delta(path).filter(pl.col(column) == value).collect().height,
        "previous_total": pl.read_delta(path, version=previous).height,
        "previous_filtered": pl.scan_delta(path, version=previous).filter(pl.col(column) == value).collect().height,
        "nulls": polars_latest[column].null_count(),
        "type": str(polars_latest.schema[column]),
    },
    "duckdb": {
        "total": duck(),
        "filtered": duck(where=f'"{column}" = ?'),
        "previous_total": duck(previous),
        "previous_filtered": duck(previous, f'"{column}" = ?'),
        "nulls": duck(where=f'"{column}" IS NULL'),
    },
}
print(json.dumps(out))
sys.stdout.flush()
# deltalake 1.6.6 with pyarrow 26 sometimes aborts in interpreter teardown after all work is done.
os._exit(0)
"#;

/// Whether the readers this file drives are importable.
fn python_has_readers() -> bool {
    Command::new("python3")
        .args(["-c", "import deltalake, polars, pandas, duckdb"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// A dataset of `write` partitioned by `partitioning` into the column `column`.
fn partitioned(name: &str, write: WriteMode, partitioning: Partitioning, column: &str) -> Dataset {
    let mut ds = dataset(name, write, basic_columns());
    ds.partitioning = partitioning;
    ds.partition_column = column.to_owned();
    ds
}

fn days() -> Partitioning {
    let start = Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).single().expect("a date");
    Partitioning::Time { grain: Grain::Day, start, time_zone: None }
}

fn hour(d: u32, h: u32) -> Partition {
    let start = Utc.with_ymd_and_hms(2024, 1, d, h, 0, 0).single().expect("an hour");
    Partition {
        key: start.format("%Y-%m-%dT%H").to_string(),
        interval: Some(Interval { start, end: start + chrono::Duration::hours(1) }),
    }
}

/// Rows with ids `ids` (value = 10 x id), for one partition.
fn ids(ids: &[i64]) -> RecordBatch {
    let rows: Vec<(i64, Option<i64>, Option<&str>)> = ids.iter().map(|i| (*i, Some(i * 10), Some("n"))).collect();
    rows_of(&rows)
}

fn rows_of(rows: &[(i64, Option<i64>, Option<&str>)]) -> RecordBatch {
    crate::common::rows(rows, None)
}

/// One table the readers are pointed at: publications in order, and the partition to filter on.
struct Case {
    dataset: Dataset,
    puts: Vec<(Partition, Vec<i64>)>,
    filter: Partition,
    /// The Python type of the filter value, and the value as Python parses it.
    kind: &'static str,
    value: &'static str,
}

fn cases() -> Vec<Case> {
    let merge = WriteMode::Merge { keys: vec!["id".to_owned()], order_by: None, delete_marker: None };
    let append = WriteMode::Append { dedup_key: vec!["id".to_owned()], dedup_lookback: 0, order_by: None };
    let regions = Partitioning::Static { keys: vec!["eu".to_owned(), "us".to_owned()] };
    let hours = Partitioning::Time {
        grain: Grain::Hour,
        start: Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).single().expect("an hour"),
        time_zone: None,
    };
    let (d2, d3) = (day(2024, 1, 2), day(2024, 1, 3));
    vec![
        Case {
            dataset: partitioned("replaced", WriteMode::Replace, days(), "day"),
            puts: vec![(d2.clone(), vec![1, 2, 3]), (d3.clone(), vec![4, 5]), (d2.clone(), vec![6])],
            filter: d2.clone(),
            kind: "date",
            value: "2024-01-02",
        },
        Case {
            dataset: partitioned("appended", append, days(), "day"),
            puts: vec![(d2.clone(), vec![1, 2]), (d3.clone(), vec![3]), (d2.clone(), vec![4, 5])],
            filter: d2.clone(),
            kind: "date",
            value: "2024-01-02",
        },
        Case {
            dataset: partitioned("merged", merge, days(), "day"),
            puts: vec![(d2.clone(), vec![1, 2]), (d3.clone(), vec![3]), (d2.clone(), vec![2, 7])],
            filter: d2.clone(),
            kind: "date",
            value: "2024-01-02",
        },
        Case {
            dataset: partitioned("snapshots", WriteMode::Snapshot, days(), "tg_partition"),
            puts: vec![(d2.clone(), vec![1, 2, 3]), (d3.clone(), vec![4, 5])],
            filter: d2,
            kind: "date",
            value: "2024-01-02",
        },
        Case {
            dataset: partitioned("hourly", WriteMode::Replace, hours, "hour"),
            puts: vec![(hour(5, 7), vec![1, 2]), (hour(5, 8), vec![3]), (hour(5, 7), vec![4, 5, 6])],
            filter: hour(5, 7),
            kind: "timestamp",
            value: "2024-01-05T07:00:00+00:00",
        },
        Case {
            dataset: partitioned("regional", WriteMode::Replace, regions, "region"),
            puts: vec![(part("eu"), vec![1]), (part("us"), vec![2, 3]), (part("eu"), vec![4, 5])],
            filter: part("eu"),
            kind: "string",
            value: "eu",
        },
    ]
}

async fn n_rows(lake: &Lake, dataset: &str, partition: Option<&str>, version: Option<u64>) -> u64 {
    let wanted = partition.map(|p| vec![p.to_owned()]);
    let batches = lake.read(dataset, wanted.as_deref(), version).await.expect("read");
    batches.iter().map(|b| b.num_rows() as u64).sum()
}

#[tokio::test]
async fn every_reader_filters_counts_and_travels_in_time_on_every_write_mode() {
    if !python_has_readers() {
        tidegate_testkit::service_missing(
            "every_reader_filters_counts_and_travels_in_time_on_every_write_mode",
            "Python deltalake, polars, pandas and duckdb",
        );
        return;
    }
    let (dir, lake) = lake().await;
    let script = dir.path().join("readers.py");
    std::fs::write(&script, READERS).expect("script");
    for case in cases() {
        let name = case.dataset.name.clone();
        let mut version = 0;
        for (i, (partition, ids_)) in case.puts.iter().enumerate() {
            version =
                put(&lake, &case.dataset, std::slice::from_ref(partition), ids(ids_), &format!("{name}-{i}")).await;
        }
        let previous = version - 1;
        let key = case.filter.key.as_str();
        let expected = serde_json::json!({
            "total": n_rows(&lake, &name, None, None).await,
            "filtered": n_rows(&lake, &name, Some(key), None).await,
            "previous_total": n_rows(&lake, &name, None, Some(previous)).await,
            "previous_filtered": n_rows(&lake, &name, Some(key), Some(previous)).await,
            "nulls": 0,
        });
        // Every case filters to a partition that has rows in one of the two versions.
        assert!(expected["filtered"].as_u64() > Some(0) || expected["previous_filtered"].as_u64() > Some(0));

        let table = lake.root().expect("a folder lake").join(&name);
        let column = case.dataset.partition_column.as_str();
        let output = Command::new("python3")
            .arg(&script)
            .arg(&table)
            .args([column, case.kind, case.value, &previous.to_string()])
            .output()
            .expect("run python");
        assert!(output.status.success(), "{name}: python failed: {}", String::from_utf8_lossy(&output.stderr));
        let theirs: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json from python");
        for reader in ["deltalake", "pandas", "polars", "duckdb"] {
            let mut found = theirs[reader].clone();
            if let Some(found) = found.as_object_mut() {
                found.remove("type");
            }
            assert_eq!(found, expected, "{name}: {reader} disagrees with Tidegate");
        }
        let types = (theirs["deltalake"]["type"].as_str(), theirs["polars"]["type"].as_str());
        let wanted = match case.kind {
            "date" => (Some("date32[day]"), Some("Date")),
            "timestamp" => (Some("timestamp[us, tz=UTC]"), Some("Datetime(time_unit='us', time_zone='UTC')")),
            _ => (Some("string"), Some("String")),
        };
        assert_eq!(types, wanted, "{name}: the partition column's type");

        // Every data file lives in its partition's folder, as readers of paths expect.
        for entry in walk(&table) {
            let relative = entry.strip_prefix(&table).expect("inside the table").to_string_lossy().into_owned();
            if relative.starts_with("_delta_log") || !relative.ends_with(".parquet") {
                continue;
            }
            assert!(relative.starts_with(&format!("{column}=")), "{name}: {relative} is not in a partition folder");
        }
    }
}

/// Every file under `dir`, recursively.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The ```` ```python tested ```` blocks of a Markdown file, in order.
fn tested_snippets(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim() == "```python tested" => current = Some(String::new()),
            Some(block) if line.trim() == "```" => {
                out.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

/// The snippets of `docs/reading-tables.md` and README.md, run as written from a workspace folder
/// whose `daily_stats` dataset has 2 rows on 2024-01-02 and 3 on 2024-01-03: each filters to
/// 2024-01-03 and prints the rows it found.
#[tokio::test]
async fn the_documented_snippets_filter_by_partition() {
    if !python_has_readers() {
        tidegate_testkit::service_missing(
            "the_documented_snippets_filter_by_partition",
            "Python deltalake, polars, pandas and duckdb",
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut snippets = Vec::new();
    for file in ["docs/reading-tables.md", "README.md"] {
        let text = std::fs::read_to_string(root.join(file)).expect("the doc");
        let found = tested_snippets(&text);
        // DuckDB, Polars and pandas in each.
        for reader in ["duckdb.sql(", "pl.scan_delta(", ".to_pandas("] {
            assert!(found.iter().any(|s| s.contains(reader)), "{file} has no tested snippet calling {reader}");
        }
        snippets.extend(found.into_iter().map(|s| (file, s)));
    }

    let ws = tempfile::tempdir().expect("temp dir");
    let lake = Lake::open(ws.path().join(".tidegate/lake").to_str().expect("utf-8")).await.expect("lake");
    let mut ds = partitioned("daily_stats", WriteMode::Replace, days(), "tg_partition");
    ds.partition_column = tidegate_lake::PARTITION_COLUMN.to_owned();
    put(&lake, &ds, &[day(2024, 1, 2)], ids(&[1, 2]), "d2").await;
    put(&lake, &ds, &[day(2024, 1, 3)], ids(&[3, 4, 5]), "d3").await;

    for (file, snippet) in snippets {
        let script = ws.path().join("snippet.py");
        std::fs::write(&script, format!("{snippet}\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n"))
            .expect("script");
        let output = Command::new("python3").arg(&script).current_dir(ws.path()).output().expect("run python");
        assert!(output.status.success(), "{file}:\n{snippet}\nfailed: {}", String::from_utf8_lossy(&output.stderr));
        let printed = String::from_utf8_lossy(&output.stdout);
        assert_eq!(printed.trim(), "3", "{file}:\n{snippet}\nprinted {printed}");
    }
}

/// A table of the earlier layout (a text `tg_partition`, no `tidegate.partitioning` property; made
/// here by Python `deltalake`) stays readable, and publishing to it is refused naming the way out.
#[tokio::test]
async fn a_table_of_the_earlier_layout_is_read_but_not_written() {
    if !python_has_readers() {
        tidegate_testkit::service_missing(
            "a_table_of_the_earlier_layout_is_read_but_not_written",
            "Python deltalake, polars, pandas and duckdb",
        );
        return;
    }
    let (_dir, lake) = lake().await;
    let table = lake.root().expect("a folder lake").join("old");
    let script = r#"
import os, sys
import pyarrow as pa
from deltalake import write_deltalake
rows = pa.table({"id": pa.array([1, 2], pa.int64()), "value": pa.array([10, 20], pa.int64()),
                 "name": pa.array(["a", "b"]), "tg_partition": pa.array(["2024-01-02", "2024-01-03"])})
write_deltalake(sys.argv[1], rows, partition_by=["tg_partition"])
sys.stdout.flush()
os._exit(0)
"#;
    let output = Command::new("python3").args(["-c", script]).arg(&table).output().expect("run python");
    assert!(output.status.success(), "python failed: {}", String::from_utf8_lossy(&output.stderr));

    let ds = partitioned("old", WriteMode::Replace, days(), "tg_partition");
    assert_eq!(n_rows(&lake, "old", Some("2024-01-03"), None).await, 1, "read as text keys");
    let err = lake.stage_batches(&ds, "stg-old", &[day(2024, 1, 3)], vec![ids(&[9])]).await.expect_err("refused");
    assert!(matches!(&err, tidegate_lake::Error::LegacyLayout { column, .. } if column == "tg_partition"), "{err}");
    assert!(err.to_string().contains("governed backfill"), "{err}");
    assert_eq!(n_rows(&lake, "old", None, None).await, 2, "nothing changed");
}

//! Column names a Delta table could not hold are refused at staging (issue 31, item 13b), naming
//! the file (or the SQL task's rows), the column and, for a collision, both names: names that
//! differ only in case (Delta compares names ignoring case) within one file, across the files of
//! one output and against the table's columns and its partition column; empty names; names with
//! a character Delta forbids without column mapping; a Parquet file naming one column twice.

use std::path::PathBuf;
use std::sync::Arc;

use tidegate_core::spec::model::{Dataset, WriteMode};
use tidegate_lake::arrow::array::{ArrayRef, RecordBatch};
use tidegate_lake::arrow::datatypes::{DataType, Field, Schema};
use tidegate_lake::{Error, FileLocation};

use crate::common::*;

/// A dataset without declared columns: its data's names become its table's.
fn free(name: &str) -> Dataset {
    dataset(name, WriteMode::Replace, vec![])
}

/// An output folder under the scratch folder holding `files` (name, contents).
fn output(place: &Place, case: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let dir = place.path().join(case);
    std::fs::create_dir_all(&dir).expect("an output folder");
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("an output file");
    }
    dir
}

/// Why `err` is not the refusal expected (`None` when it is): a schema mismatch in `file` (or in
/// a SQL task's rows when `file` is empty) naming `column`, whose message says all of `says` and
/// nothing of a bug.
fn unclear(err: &Error, file: &str, column: &str, says: &[&str]) -> Option<String> {
    let text = err.to_string();
    let mut problems = Vec::new();
    match err {
        Error::SchemaMismatch { location, column: named, .. } => {
            match (location, file) {
                (FileLocation::Batches, "") => {}
                (FileLocation::File(name), _) if !file.is_empty() && name.ends_with(file) => {}
                (other, _) => problems.push(format!("placed at {other:?}")),
            }
            if named != column {
                problems.push(format!("names column {named:?}, expected {column:?}"));
            }
        }
        _ => problems.push("is not a schema mismatch".to_owned()),
    }
    if text.to_lowercase().contains("internal") || text.contains("panicked") {
        problems.push("reads as a bug".to_owned());
    }
    problems.extend(says.iter().filter(|s| !text.contains(*s)).map(|s| format!("does not say {s:?}")));
    (!problems.is_empty()).then(|| format!("{}\n    got: {text}", problems.join("; ")))
}

/// The reported case: a dataset without declared columns whose CSV header renames `id` to `ID`
/// failed only at publication, with "internal error: ... Duplicate field name (case-insensitive)".
#[tokio::test]
async fn a_header_that_renames_a_column_by_case_is_refused_at_staging() {
    let (place, lake) = lake().await;
    let ds = free("renamed");
    let first = output(&place, "first", &[("rows.csv", b"id,v\n1,a\n")]);
    let staged = lake.stage_files(&ds, "first", &[part("p")], &first).await.expect("stage");
    lake.publish(&release("first", &ds, staged, "first")).await.expect("publish");

    let renamed = output(&place, "renamed", &[("rows.csv", b"ID,v\n2,b\n")]);
    let err = match lake.stage_files(&ds, "renamed", &[part("p")], &renamed).await {
        Ok(staged) => {
            let published = lake.publish(&release("renamed", &ds, staged, "renamed")).await;
            panic!("staged; the publication then gave {published:?}")
        }
        Err(e) => e,
    };
    if let Some(why) = unclear(&err, "rows.csv", "ID", &["\"id\"", "case"]) {
        panic!("{why}");
    }
    assert_eq!(read_all(&lake, "renamed").await, ["id=1|v=a|tg_partition=p"]);
}

/// A batch whose schema names `names` (every column int64, one row).
fn named(names: &[&str]) -> RecordBatch {
    let fields: Vec<Field> = names.iter().map(|n| Field::new(*n, DataType::Int64, true)).collect();
    let columns: Vec<ArrayRef> = names.iter().map(|_| ints(&[1])).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("a batch")
}

/// One output a new table would be made from: its files, and the file and column the refusal
/// must name, and what it must say.
type Case = (&'static [(&'static str, &'static [u8])], &'static str, &'static str, &'static [&'static str]);

const NEW_TABLE: &[Case] = &[
    (&[("a.csv", b"id,ID\n1,2\n")], "a.csv", "ID", &["\"id\"", "case"]),
    // JSON keys are read in their sorted order: "Id" comes first, so "id" is the one refused.
    (&[("a.jsonl", b"{\"id\": 1, \"Id\": 2}\n")], "a.jsonl", "id", &["\"Id\"", "case"]),
    (&[("a.csv", b"x\n1\n"), ("b.csv", b"X\n2\n")], "b.csv", "X", &["\"x\"", "a.csv", "case"]),
    (&[("a.csv", b"TG_PARTITION,v\n1,2\n")], "a.csv", "TG_PARTITION", &["\"tg_partition\"", "partition column"]),
    (&[("a.csv", b"id,,v\n1,2,3\n")], "a.csv", "", &["empty"]),
    (&[("a.csv", b"id,my col\n1,2\n")], "a.csv", "my col", &["' '"]),
    (&[("a.jsonl", b"{\"a;b\": 1}\n")], "a.jsonl", "a;b", &["';'"]),
    (&[("a.jsonl", b"{\"x=y\": 1}\n")], "a.jsonl", "x=y", &["'='"]),
    (&[("a.jsonl", b"{\"f(x)\": 1}\n")], "a.jsonl", "f(x)", &["'('"]),
    (&[("a.jsonl", b"{\"a{b}\": 1}\n")], "a.jsonl", "a{b}", &["'{'"]),
    (&[("a.jsonl", b"{\"a\\tb\": 1}\n")], "a.jsonl", "a\tb", &["tab"]),
    (&[("a.jsonl", b"{\"a\\nb\": 1}\n")], "a.jsonl", "a\nb", &["newline"]),
    (&[("a.jsonl", b"{\"\": 1}\n")], "a.jsonl", "", &["empty"]),
];

#[tokio::test]
async fn every_name_a_delta_table_would_refuse_is_refused_at_staging() {
    let (place, lake) = lake().await;
    let mut failures = Vec::new();
    for (i, (files, file, column, says)) in NEW_TABLE.iter().enumerate() {
        let ds = free(&format!("new{i}"));
        let dir = output(&place, &format!("case-{i}"), files);
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        match lake.stage_files(&ds, "s", &[part("p")], &dir).await {
            Ok(_) => failures.push(format!("{names:?}: staged")),
            Err(err) => failures.extend(unclear(&err, file, column, says).map(|why| format!("{names:?}: {why}"))),
        }
        if lake.history(&ds.name).await.is_ok_and(|h| !h.is_empty()) {
            failures.push(format!("{names:?}: a table was created"));
        }
    }

    // A Parquet file can name a column twice.
    let dir = place.path().join("twice");
    std::fs::create_dir_all(&dir).expect("an output folder");
    let twice = named(&["id", "id"]);
    let file = std::fs::File::create(dir.join("twice.parquet")).expect("a parquet file");
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, twice.schema(), None).expect("a writer");
    writer.write(&twice).expect("write");
    writer.close().expect("close");
    match lake.stage_files(&free("twice"), "s", &[part("p")], &dir).await {
        Ok(_) => failures.push("twice.parquet: staged".to_owned()),
        Err(err) => failures.extend(unclear(&err, "twice.parquet", "id", &["twice"]).map(|w| format!("twice: {w}"))),
    }

    // A SQL task's rows: an expression named after itself, a name twice in one batch, and one
    // against an existing table's column.
    match lake.stage_batches(&free("unnamed"), "s", &[part("p")], vec![named(&["day", "count(*)"])]).await {
        Ok(_) => failures.push("SQL count(*): staged".to_owned()),
        Err(err) => failures.extend(unclear(&err, "", "count(*)", &["'('", "AS"]).map(|w| format!("SQL: {w}"))),
    }
    match lake.stage_batches(&free("sql"), "s", &[part("p")], vec![named(&["name", "Name"])]).await {
        Ok(_) => failures.push("SQL name, Name: staged".to_owned()),
        Err(err) => failures.extend(unclear(&err, "", "Name", &["\"name\"", "case"]).map(|w| format!("SQL: {w}"))),
    }
    let ds = free("grown");
    put(&lake, &ds, &[part("p")], named(&["id"]), "first").await;
    match lake.stage_batches(&ds, "s", &[part("p")], vec![named(&["id", "ID"])]).await {
        Ok(_) => failures.push("SQL id, ID onto a table with id: staged".to_owned()),
        Err(err) => failures.extend(unclear(&err, "", "ID", &["\"id\"", "case"]).map(|w| format!("SQL onto id: {w}"))),
    }
    assert!(failures.is_empty(), "{} cases fall short:\n{}", failures.len(), failures.join("\n"));
}

/// With declared columns a name the declaration lacks is refused already; one that differs from
/// a declared column only in case says so.
#[tokio::test]
async fn a_name_that_differs_from_a_declared_column_only_in_case_says_so() {
    let (place, lake) = lake().await;
    let ds = dataset("declared", WriteMode::Replace, basic_columns());
    let dir = output(&place, "declared", &[("rows.csv", b"ID,value\n1,2\n")]);
    let err = lake.stage_files(&ds, "s", &[part("p")], &dir).await.expect_err("ID is not declared");
    if let Some(why) = unclear(&err, "rows.csv", "ID", &["\"id\"", "case"]) {
        panic!("{why}");
    }
}

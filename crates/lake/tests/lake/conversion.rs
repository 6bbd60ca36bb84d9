//! Values are converted into a table's column types only without loss (issue 31, item 2): a
//! corpus per input format (CSV, JSON lines, Parquet) and declared type, each with values that
//! must be stored as written and values that must be refused with a message naming the file, the
//! row (the line of a CSV file), the column, the value and the type; and an undeclared table's
//! own types (float32, decimal) taking values the same way.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidegate_core::spec::model::{Dataset, WriteMode};
use tidegate_lake::arrow::array::{
    ArrayRef, Date32Array, Date64Array, Decimal128Array, Float32Array, Int32Array, LargeStringArray, RecordBatch,
    TimestampMicrosecondArray, TimestampNanosecondArray,
};
use tidegate_lake::{Error, FileLocation, Lake};

use crate::common::*;

/// A dataset with one nullable column of each declared type beside its `id`.
fn typed() -> Dataset {
    dataset(
        "typed",
        WriteMode::Replace,
        vec![
            col("id", "int64", false),
            col("b", "bool", true),
            col("i32", "int32", true),
            col("i64", "int64", true),
            col("f64", "float64", true),
            col("s", "string", true),
            col("d", "date", true),
            col("ts", "timestamp", true),
        ],
    )
}

/// A fresh output folder under the test's scratch folder, holding only `name` with `bytes`.
fn output(place: &Place, case: usize, name: &str, bytes: &[u8]) -> PathBuf {
    let dir = place.path().join(format!("out-{case}"));
    std::fs::create_dir_all(&dir).expect("an output folder");
    std::fs::write(dir.join(name), bytes).expect("an output file");
    dir
}

/// Writes `batch` as the Parquet file `name` in a fresh output folder.
fn parquet_output(place: &Place, case: usize, name: &str, batch: &RecordBatch) -> PathBuf {
    let dir = place.path().join(format!("out-{case}"));
    std::fs::create_dir_all(&dir).expect("an output folder");
    let file = std::fs::File::create(dir.join(name)).expect("a parquet file");
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("a writer");
    writer.write(batch).expect("write");
    writer.close().expect("close");
    dir
}

/// Stages `dir` for `ds`, publishes it, and returns the table's rows (without `tg_partition`).
async fn stored(lake: &Lake, ds: &Dataset, dir: &Path, step: &str) -> Vec<String> {
    let staged = lake.stage_files(ds, step, &[part("p")], dir).await.unwrap_or_else(|e| panic!("{step}: {e}"));
    lake.publish(&release(step, ds, staged, step)).await.expect("publish");
    let rows = read_all(lake, &ds.name).await;
    rows.into_iter().map(|r| r.trim_end_matches("|tg_partition=p").to_owned()).collect()
}

/// Why staging `dir` did not refuse it as expected (`None` when it did): the error must be a
/// schema mismatch at `place` (`line N` of a CSV file, `row N` otherwise) of `file`, in `column`,
/// whose message says every one of `says`.
async fn unrefused(
    lake: &Lake,
    ds: &Dataset,
    dir: &Path,
    file: &str,
    at: (&str, u64),
    column: &str,
    says: &[&str],
) -> Option<String> {
    let err = match lake.stage_files(ds, "refused", &[part("p")], dir).await {
        Ok(staged) => return Some(format!("staged {} rows: {:?}", staged.n_rows, staged.columns)),
        Err(e) => e,
    };
    let text = err.to_string();
    let mut problems = Vec::new();
    match &err {
        Error::SchemaMismatch { location, column: named, .. } => {
            let (name, n) = match location {
                FileLocation::Line { file, line } => (file, ("line", *line)),
                FileLocation::Row { file, row } => (file, ("row", *row)),
                other => return Some(format!("placed at {other:?}: {text}")),
            };
            if !name.ends_with(file) {
                problems.push(format!("names file {name}"));
            }
            if n != at {
                problems.push(format!("names {} {}, expected {} {}", n.0, n.1, at.0, at.1));
            }
            if named != column {
                problems.push(format!("names column {named:?}"));
            }
        }
        _ => problems.push("is not a schema mismatch".to_owned()),
    }
    problems.extend(says.iter().filter(|s| !text.contains(*s)).map(|s| format!("does not say {s:?}")));
    (!problems.is_empty()).then(|| format!("{}\n    got: {text}", problems.join("; ")))
}

/// One refused value: the column, the file's contents, and what the message must say beside the
/// file, the place and the column.
type Refused = (&'static str, &'static str, &'static [&'static str]);

/// Runs every refused case of a text format (each in a file of its own, the bad value in the
/// file's first row) and fails listing those not refused as expected.
async fn assert_refused(lake: &Lake, place: &Place, name: &str, unit: &str, cases: &[Refused]) {
    let ds = typed();
    let mut failures = Vec::new();
    for (i, (column, contents, says)) in cases.iter().enumerate() {
        let dir = output(place, 100 + i, name, contents.as_bytes());
        let at = (unit, if unit == "line" { 2 } else { 1 });
        if let Some(why) = unrefused(lake, &ds, &dir, name, at, column, says).await {
            failures.push(format!("{column} = {contents:?}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases fall short:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// CSV is text: every value is parsed into its column's type, and a parse that would lose
/// anything is refused.
const CSV_REFUSED: &[Refused] = &[
    ("b", "id,b\n1,1\n", &["\"1\"", "bool"]),
    ("b", "id,b\n1,yes\n", &["\"yes\"", "bool"]),
    ("i32", "id,i32\n1,2147483648\n", &["\"2147483648\"", "int32"]),
    ("i32", "id,i32\n1,1.5\n", &["\"1.5\"", "int32", "whole number"]),
    ("i64", "id,i64\n1,1.5\n", &["\"1.5\"", "int64", "whole number"]),
    ("i64", "id,i64\n1,7e-1\n", &["\"7e-1\"", "int64"]),
    ("i64", "id,i64\n1,99999999999999999999\n", &["\"99999999999999999999\"", "int64"]),
    ("i64", "id,i64\n1,1 2\n", &["\"1 2\"", "int64"]),
    ("f64", "id,f64\n1,1e400\n", &["\"1e400\"", "float64"]),
    ("f64", "id,f64\n1,12345678901234567891\n", &["\"12345678901234567891\"", "float64"]),
    ("f64", "id,f64\n1,abc\n", &["\"abc\"", "float64"]),
    ("d", "id,d\n1,2024-02-30\n", &["\"2024-02-30\"", "date"]),
    ("d", "id,d\n1,2024-01-01T12:00:00\n", &["\"2024-01-01T12:00:00\"", "date"]),
    ("ts", "id,ts\n1,2024-01-01T00:00:00.1234567Z\n", &["\"2024-01-01T00:00:00.1234567Z\"", "timestamp"]),
    ("ts", "id,ts\n1,yesterday\n", &["\"yesterday\"", "timestamp"]),
];

#[tokio::test]
async fn csv_values_are_parsed_into_their_types_without_loss() {
    let (place, lake) = lake().await;
    let good = "id,b,i32,i64,f64,s,d,ts\n\
                1,true,2147483647,-9223372036854775808,1.5,text,2024-02-29,2024-01-01T12:00:00.123456Z\n\
                2,FALSE,1e3,7.0,12345678901,\"a, b\",2024-01-01,2024-01-01 00:00:00\n\
                3,True,-7,70E-1,-0.1,,,2024-01-01T01:00:00+01:00\n";
    let dir = output(&place, 0, "good.csv", good.as_bytes());
    assert_eq!(
        stored(&lake, &typed(), &dir, "csv").await,
        [
            "id=1|b=true|i32=2147483647|i64=-9223372036854775808|f64=1.5|s=text|d=2024-02-29|ts=2024-01-01T12:00:00.123456Z",
            "id=2|b=false|i32=1000|i64=7|f64=12345678901.0|s=a, b|d=2024-01-01|ts=2024-01-01T00:00:00Z",
            "id=3|b=true|i32=-7|i64=7|f64=-0.1|s=null|d=null|ts=2024-01-01T00:00:00Z",
        ]
    );
    assert_refused(&lake, &place, "bad.csv", "line", CSV_REFUSED).await;
}

/// JSON values carry their types: numbers convert between numeric types only without loss, a
/// string is never read as a number or a boolean (nor a number as a string), and text converts
/// into dates and timestamps (JSON has no such type) only strictly.
const JSON_REFUSED: &[Refused] = &[
    ("b", "{\"id\": 1, \"b\": 1}\n", &["1", "bool"]),
    ("b", "{\"id\": 1, \"b\": \"true\"}\n", &["\"true\"", "bool"]),
    ("i32", "{\"id\": 1, \"i32\": 2147483648}\n", &["2147483648", "int32"]),
    ("i32", "{\"id\": 1, \"i32\": 7.9}\n", &["7.9", "int32", "whole number"]),
    ("i64", "{\"id\": 1, \"i64\": 7.9}\n", &["7.9", "int64", "whole number"]),
    ("i64", "{\"id\": 1, \"i64\": \"7\"}\n", &["\"7\"", "int64", "string"]),
    ("i64", "{\"id\": 1, \"i64\": true}\n", &["true", "int64"]),
    ("i64", "{\"id\": 1, \"i64\": 9007199254740993.0}\n", &["int64"]),
    ("f64", "{\"id\": 1, \"f64\": \"1.5\"}\n", &["\"1.5\"", "float64", "string"]),
    ("f64", "{\"id\": 1, \"f64\": 9007199254740993}\n", &["9007199254740993", "float64"]),
    ("s", "{\"id\": 1, \"s\": 5}\n", &["5", "string"]),
    ("s", "{\"id\": 1, \"s\": true}\n", &["true", "string"]),
    ("d", "{\"id\": 1, \"d\": \"2024-02-30\"}\n", &["\"2024-02-30\"", "date"]),
    ("d", "{\"id\": 1, \"d\": 20240101}\n", &["20240101", "date"]),
    ("ts", "{\"id\": 1, \"ts\": 1704067200}\n", &["1704067200", "timestamp"]),
    (
        "ts",
        "{\"id\": 1, \"ts\": \"2024-01-01T00:00:00.0000001Z\"}\n",
        &["\"2024-01-01T00:00:00.0000001Z\"", "timestamp"],
    ),
];

#[tokio::test]
async fn json_values_keep_their_types_and_convert_only_without_loss() {
    let (place, lake) = lake().await;
    let good = concat!(
        "{\"id\": 1, \"b\": true, \"i32\": 2147483647, \"i64\": -9223372036854775808, \"f64\": 1.5, \"s\": \"text\", ",
        "\"d\": \"2024-02-29\", \"ts\": \"2024-01-01T12:00:00.123456Z\"}\n",
        "{\"id\": 2, \"b\": false, \"i32\": 7.0, \"i64\": 9007199254740993, \"f64\": 12345678901, \"s\": \"\", ",
        "\"d\": null, \"ts\": \"2024-01-01 00:00:00\"}\n",
    );
    let dir = output(&place, 0, "good.jsonl", good.as_bytes());
    assert_eq!(
        stored(&lake, &typed(), &dir, "json").await,
        [
            "id=1|b=true|i32=2147483647|i64=-9223372036854775808|f64=1.5|s=text|d=2024-02-29|ts=2024-01-01T12:00:00.123456Z",
            "id=2|b=false|i32=7|i64=9007199254740993|f64=12345678901.0|s=|d=null|ts=2024-01-01T00:00:00Z",
        ]
    );
    assert_refused(&lake, &place, "bad.jsonl", "row", JSON_REFUSED).await;
}

/// A Parquet column of one type: `id` 1 and `column` holding `values`.
fn parquet_case(column: &'static str, values: ArrayRef) -> (&'static str, RecordBatch) {
    (column, batch(vec![("id", ints(&[1])), (column, values)]))
}

fn ts_ns(value: i64) -> ArrayRef {
    Arc::new(TimestampNanosecondArray::from(vec![value]))
}

/// 2024-01-01T00:00:00Z in seconds since the epoch.
const NEW_YEAR_S: i64 = 1_704_067_200;

#[tokio::test]
async fn parquet_columns_convert_only_without_loss() {
    let (place, lake) = lake().await;
    let good = batch(vec![
        ("id", ints(&[1, 2])),
        ("b", bools(&[true, false])),
        // Narrowed, widened and converted where every value fits exactly.
        ("i32", ints(&[2_147_483_647, -7])),
        ("i64", floats(&[7.0, -9_007_199_254_740_991.0])),
        ("f64", Arc::new(Float32Array::from(vec![1.5, -0.25])) as ArrayRef),
        ("s", Arc::new(LargeStringArray::from(vec!["text", ""])) as ArrayRef),
        ("d", Arc::new(Date64Array::from(vec![NEW_YEAR_S * 1_000, 0])) as ArrayRef),
        ("ts", Arc::new(TimestampNanosecondArray::from(vec![NEW_YEAR_S * 1_000_000_000 + 123_456_000, 0])) as ArrayRef),
    ]);
    let dir = parquet_output(&place, 0, "good.parquet", &good);
    assert_eq!(
        stored(&lake, &typed(), &dir, "parquet").await,
        [
            "id=1|b=true|i32=2147483647|i64=7|f64=1.5|s=text|d=2024-01-01|ts=2024-01-01T00:00:00.123456Z",
            "id=2|b=false|i32=-7|i64=-9007199254740991|f64=-0.25|s=|d=1970-01-01|ts=1970-01-01T00:00:00Z",
        ]
    );

    let cases: Vec<((&str, RecordBatch), &[&str])> = vec![
        (parquet_case("b", ints(&[1])), &["1", "bool"]),
        (parquet_case("i32", ints(&[2_147_483_648])), &["2147483648", "int32"]),
        (parquet_case("i64", floats(&[1.9999])), &["1.9999", "int64", "whole number"]),
        (parquet_case("i64", bools(&[true])), &["true", "int64"]),
        (parquet_case("i64", strs(&["7"])), &["\"7\"", "int64", "string"]),
        (parquet_case("i64", floats(&[f64::NAN])), &["NaN", "int64"]),
        (parquet_case("i64", floats(&[1e19])), &["int64"]),
        (parquet_case("f64", ints(&[9_007_199_254_740_993])), &["9007199254740993", "float64"]),
        (parquet_case("s", ints(&[5])), &["5", "string"]),
        (parquet_case("d", Arc::new(TimestampMicrosecondArray::from(vec![NEW_YEAR_S * 1_000_000 + 1]))), &["date"]),
        (parquet_case("d", Arc::new(Int32Array::from(vec![19_723]))), &["19723", "date"]),
        (parquet_case("ts", ts_ns(1)), &["timestamp", "microsecond"]),
        (parquet_case("ts", ints(&[NEW_YEAR_S])), &["1704067200", "timestamp"]),
        (parquet_case("ts", Arc::new(Date32Array::from(vec![Some(19_723)]))), &[]),
    ];
    let ds = typed();
    let mut failures = Vec::new();
    let n_cases = cases.len();
    for (i, ((column, rows), says)) in cases.into_iter().enumerate() {
        let dir = parquet_output(&place, 100 + i, "bad.parquet", &rows);
        let shown = format!("{column} = {:?}", rows.column(1));
        let why = unrefused(&lake, &ds, &dir, "bad.parquet", ("row", 1), column, says).await;
        // A date is a timestamp at midnight: the one case here that must be stored, not refused.
        let widens = rows.column(1).data_type() == &tidegate_lake::arrow::datatypes::DataType::Date32;
        match (why, widens) {
            (Some(why), false) => failures.push(format!("{shown}: {why}")),
            (None, true) => failures.push(format!("{shown}: refused, but a date widens to a timestamp")),
            (Some(why), true) if !why.starts_with("staged 1 rows") => failures.push(format!("{shown}: {why}")),
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{} of {n_cases} cases fall short:\n{}", failures.len(), failures.join("\n"));
}

/// A dataset without declared columns takes the types of its first data, float32 and decimal
/// among them; later data converts into those the same way as into declared types.
#[tokio::test]
async fn an_undeclared_tables_own_types_take_values_only_without_loss() {
    let (place, lake) = lake().await;
    let ds = dataset(
        "free",
        WriteMode::Append { dedup_key: vec!["id".to_owned()], dedup_lookback: 0, order_by: None },
        vec![],
    );
    let decimals = |values: Vec<i128>, precision: u8, scale: i8| -> ArrayRef {
        Arc::new(Decimal128Array::from(values).with_precision_and_scale(precision, scale).expect("a decimal type"))
    };
    let first = batch(vec![
        ("id", ints(&[1])),
        ("f32", Arc::new(Float32Array::from(vec![0.5])) as ArrayRef),
        ("dec", decimals(vec![1_050], 10, 2)),
    ]);
    let dir = parquet_output(&place, 0, "first.parquet", &first);
    stored(&lake, &ds, &dir, "first").await;

    let csv = output(&place, 1, "more.csv", b"id,f32,dec\n2,0.1,12.30\n3,-16777216,-7\n");
    let json = output(&place, 2, "more.jsonl", b"{\"id\": 4, \"f32\": 0.25, \"dec\": 12.5}\n");
    // A decimal may come as a JSON string (JSON has no decimal type): parsed strictly.
    std::fs::write(json.join("strings.jsonl"), b"{\"id\": 5, \"dec\": \"0.01\"}\n").expect("an output file");
    let parquet = parquet_output(
        &place,
        3,
        "more.parquet",
        &batch(vec![("id", ints(&[6])), ("f32", floats(&[0.1])), ("dec", decimals(vec![12_300], 12, 4))]),
    );
    for (i, dir) in [csv, json, parquet].iter().enumerate() {
        stored(&lake, &ds, dir, &format!("more-{i}")).await;
    }
    assert_eq!(
        read_all(&lake, "free").await,
        [
            "id=1|f32=0.5|dec=10.50|tg_partition=p",
            "id=2|f32=0.1|dec=12.30|tg_partition=p",
            "id=3|f32=-16777216.0|dec=-7.00|tg_partition=p",
            "id=4|f32=0.25|dec=12.50|tg_partition=p",
            "id=5|f32=null|dec=0.01|tg_partition=p",
            "id=6|f32=0.1|dec=1.23|tg_partition=p",
        ]
    );

    let refused: Vec<RefusedIn> = vec![
        (
            output(&place, 10, "a.csv", b"id,f32\n7,16777217\n"),
            "a.csv",
            ("line", 2),
            "f32",
            &["\"16777217\"", "float32"],
        ),
        (
            output(&place, 11, "b.csv", b"id,dec\n7,1.234\n"),
            "b.csv",
            ("line", 2),
            "dec",
            &["\"1.234\"", "decimal(10,2)"],
        ),
        (
            output(&place, 12, "c.csv", b"id,dec\n7,123456789\n"),
            "c.csv",
            ("line", 2),
            "dec",
            &["\"123456789\"", "decimal(10,2)"],
        ),
        (
            output(&place, 13, "d.jsonl", b"{\"id\": 7, \"f32\": 3.14159265358979}\n"),
            "d.jsonl",
            ("row", 1),
            "f32",
            &["3.14159265358979", "float32"],
        ),
        (
            output(&place, 14, "e.jsonl", b"{\"id\": 7, \"dec\": 0.125}\n"),
            "e.jsonl",
            ("row", 1),
            "dec",
            &["0.125", "decimal(10,2)"],
        ),
        (
            parquet_output(
                &place,
                15,
                "f.parquet",
                &batch(vec![("id", ints(&[7])), ("dec", decimals(vec![12_345], 12, 4))]),
            ),
            "f.parquet",
            ("row", 1),
            "dec",
            &["1.2345", "decimal(10,2)"],
        ),
        (
            parquet_output(&place, 16, "g.parquet", &batch(vec![("id", ints(&[7])), ("f32", floats(&[1e-50]))])),
            "g.parquet",
            ("row", 1),
            "f32",
            &["float32"],
        ),
    ];
    let mut failures = Vec::new();
    for (dir, file, at, column, says) in &refused {
        if let Some(why) = unrefused(&lake, &ds, dir, file, *at, column, says).await {
            failures.push(format!("{file}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases fall short:\n{}", failures.len(), refused.len(), failures.join("\n"));
}

/// A refused output: its folder, the file, the place (`line` or `row`, and its number), the
/// column, and what the message says.
type RefusedIn = (PathBuf, &'static str, (&'static str, u64), &'static str, &'static [&'static str]);

/// A SQL task's rows take the same path: an average is not an int64 unless it is whole.
#[tokio::test]
async fn a_sql_tasks_rows_convert_only_without_loss() {
    let (_place, lake) = lake().await;
    let ds = dataset("counts", WriteMode::Replace, vec![col("n", "int64", true), col("ok", "bool", true)]);
    put(&lake, &ds, &[part("p")], batch(vec![("n", floats(&[3.0, -2.0]))]), "whole").await;
    assert_eq!(read_all(&lake, "counts").await, ["n=-2|ok=null|tg_partition=p", "n=3|ok=null|tg_partition=p"]);
    let err = lake
        .stage_batches(&ds, "avg", &[part("p")], vec![batch(vec![("n", floats(&[3.0, 2.5]))])])
        .await
        .expect_err("2.5 is not an int64");
    let text = err.to_string();
    assert!(matches!(&err, Error::SchemaMismatch { column, .. } if column == "n"), "{text}");
    assert!(text.contains("2.5") && text.contains("int64"), "{text}");
    let err = lake
        .stage_batches(&ds, "flag", &[part("p")], vec![batch(vec![("ok", ints(&[1]))])])
        .await
        .expect_err("1 is not a bool");
    assert!(matches!(&err, Error::SchemaMismatch { column, .. } if column == "ok"), "{err}");
    // `now()` in SQL has nanoseconds; a timestamp column holds microseconds, and says how to cut.
    let ds = dataset("stamped", WriteMode::Replace, vec![col("at", "timestamp", true)]);
    let now = NEW_YEAR_S * 1_000_000_000 + 123_456_789;
    let err = lake
        .stage_batches(&ds, "now", &[part("p")], vec![batch(vec![("at", ts_ns(now))])])
        .await
        .expect_err("nanoseconds are not microseconds");
    assert!(err.to_string().contains("date_trunc('microsecond'"), "{err}");
    put(&lake, &ds, &[part("p")], batch(vec![("at", ts_ns(now - 789))]), "cut").await;
    assert_eq!(read_all(&lake, "stamped").await, ["at=2024-01-01T00:00:00.123456Z|tg_partition=p"]);
}

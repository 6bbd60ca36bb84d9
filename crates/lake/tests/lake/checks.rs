//! Checks on staged data: each rule passes on good data and fails on bad data, on purpose.

use crate::common::*;
use tidegate_core::spec::model::{Aggregate, CheckRule, Dataset, WriteMode};
use tidegate_lake::{CheckResult, Lake, SCHEMA_CONTRACT};

/// Stages `batch` for `dataset` (partition `key`) and returns the result of the check `name`.
async fn check(
    lake: &Lake,
    ds: &Dataset,
    key: &tidegate_core::partition::Partition,
    batch: tidegate_lake::arrow::array::RecordBatch,
    name: &str,
) -> CheckResult {
    let staged = lake.stage_batches(ds, "chk", std::slice::from_ref(key), vec![batch]).await.expect("stage");
    let results = lake.check(ds, &staged).await.expect("check");
    results.into_iter().find(|r| r.name == name).expect("the check ran")
}

fn ds_with(rule: CheckRule) -> Dataset {
    with_checks(dataset("checked", WriteMode::Replace, basic_columns()), vec![("the_check", rule)])
}

#[tokio::test]
async fn not_null() {
    let (_dir, lake) = lake().await;
    let ds = ds_with(CheckRule::NotNull { columns: vec!["name".to_owned()] });
    let ok = check(&lake, &ds, &part("p"), rows(&[(1, None, Some("a"))], None), "the_check").await;
    assert!(ok.passed, "{ok:?}");
    let bad = check(&lake, &ds, &part("p"), rows(&[(1, None, Some("a")), (2, None, None)], None), "the_check").await;
    assert!(!bad.passed && bad.blocks() && bad.n_failing == 1, "{bad:?}");
}

#[tokio::test]
async fn unique() {
    let (_dir, lake) = lake().await;
    let ds = ds_with(CheckRule::Unique { columns: vec!["id".to_owned()] });
    let ok = check(&lake, &ds, &part("p"), rows(&[(1, None, None), (2, None, None)], None), "the_check").await;
    assert!(ok.passed, "{ok:?}");
    let bad =
        check(&lake, &ds, &part("p"), rows(&[(1, None, None), (1, None, None), (2, None, None)], None), "the_check")
            .await;
    assert_eq!((bad.passed, bad.n_failing), (false, 2), "{bad:?}");
}

#[tokio::test]
async fn accepted_values() {
    let (_dir, lake) = lake().await;
    let ds =
        ds_with(CheckRule::AcceptedValues { column: "name".to_owned(), values: vec!["a".to_owned(), "b".to_owned()] });
    let ok = check(&lake, &ds, &part("p"), rows(&[(1, None, Some("a")), (2, None, None)], None), "the_check").await;
    assert!(ok.passed, "{ok:?}");
    let bad =
        check(&lake, &ds, &part("p"), rows(&[(1, None, Some("a")), (2, None, Some("zzz"))], None), "the_check").await;
    assert!(!bad.passed && bad.detail.contains("zzz"), "{bad:?}");
}

#[tokio::test]
async fn row_count() {
    let (_dir, lake) = lake().await;
    let ds = ds_with(CheckRule::RowCount { min: Some(2), max: Some(3) });
    let ok = check(&lake, &ds, &part("p"), rows(&[(1, None, None), (2, None, None)], None), "the_check").await;
    assert!(ok.passed, "{ok:?}");
    let low = check(&lake, &ds, &part("p"), rows(&[(1, None, None)], None), "the_check").await;
    assert!(!low.passed, "{low:?}");
    let high = check(
        &lake,
        &ds,
        &part("p"),
        rows(&[(1, None, None), (2, None, None), (3, None, None), (4, None, None)], None),
        "the_check",
    )
    .await;
    assert!(!high.passed, "{high:?}");
}

#[tokio::test]
async fn aggregate_tolerance_against_the_published_version() {
    let (_dir, lake) = lake().await;
    let ds = ds_with(CheckRule::AggregateTolerance {
        column: "value".to_owned(),
        aggregate: Aggregate::Sum,
        tolerance_pct: 10.0,
    });
    // Nothing published yet: nothing to compare with, so it passes and says so.
    let first = check(&lake, &ds, &part("p"), rows(&[(1, Some(100), None)], None), "the_check").await;
    assert!(first.passed && first.detail.contains("no published rows"), "{first:?}");
    put(&lake, &ds, &[part("p")], rows(&[(1, Some(100), None)], None), "base").await;
    let ok = check(&lake, &ds, &part("p"), rows(&[(1, Some(105), None)], None), "the_check").await;
    assert!(ok.passed, "{ok:?}");
    let bad = check(&lake, &ds, &part("p"), rows(&[(1, Some(150), None)], None), "the_check").await;
    assert!(!bad.passed && bad.detail.contains("50.00%"), "{bad:?}");
}

/// The tolerance compares with what is published now, also when another handle published it
/// after this one last loaded the table (the other checks use the table as this handle has it).
#[tokio::test]
async fn aggregate_tolerance_compares_with_what_another_handle_published() {
    let (dir, a) = lake().await;
    let ds = ds_with(CheckRule::AggregateTolerance {
        column: "value".to_owned(),
        aggregate: Aggregate::Sum,
        tolerance_pct: 10.0,
    });
    put(&a, &ds, &[part("p")], rows(&[(1, Some(100), None)], None), "base").await;
    let b = Lake::open(&dir.url).await.expect("second handle");
    put(&b, &ds, &[part("p")], rows(&[(1, Some(200), None)], None), "newer").await;
    // 205 is within 10% of the 200 published now, and 105% above the 100 `a` last saw.
    let result = check(&a, &ds, &part("p"), rows(&[(1, Some(205), None)], None), "the_check").await;
    assert!(result.passed, "compared with a stale version: {result:?}");
}

#[tokio::test]
async fn freshness_against_the_partition_end() {
    let (_dir, lake) = lake().await;
    let ds = with_checks(
        dataset("fresh", WriteMode::Replace, vec![col("id", "int64", false), col("at", "timestamp", true)]),
        vec![("fresh_enough", CheckRule::Freshness { column: "at".to_owned(), max_age_s: 3600 })],
    );
    let d = day(2024, 3, 1);
    let at = |ts: &str| batch(vec![("id", ints(&[1])), ("at", strs(&[ts]))]);
    let ok = check(&lake, &ds, &d, at("2024-03-01T23:30:00Z"), "fresh_enough").await;
    assert!(ok.passed, "{ok:?}");
    let stale = check(&lake, &ds, &d, at("2024-03-01T12:00:00Z"), "fresh_enough").await;
    assert!(!stale.passed && stale.detail.contains("2024-03-01"), "{stale:?}");
}

#[tokio::test]
async fn custom_sql_returns_failing_rows() {
    let (_dir, lake) = lake().await;
    let ds = ds_with(CheckRule::Sql { query: "SELECT * FROM staged WHERE value < 0".to_owned() });
    let ok = check(&lake, &ds, &part("p"), rows(&[(1, Some(1), None)], None), "the_check").await;
    assert!(ok.passed, "{ok:?}");
    let bad = check(&lake, &ds, &part("p"), rows(&[(1, Some(-1), None), (2, Some(-2), None)], None), "the_check").await;
    assert_eq!((bad.passed, bad.n_failing), (false, 2), "{bad:?}");
    let broken = ds_with(CheckRule::Sql { query: "SELECT * FROM nowhere".to_owned() });
    let typo = check(&lake, &broken, &part("p"), rows(&[(1, Some(1), None)], None), "the_check").await;
    assert!(!typo.passed && typo.detail.contains("query failed"), "{typo:?}");
}

#[tokio::test]
async fn schema_contract_passes_for_conformed_data_and_non_blocking_checks_do_not_block() {
    let (_dir, lake) = lake().await;
    let mut ds = ds_with(CheckRule::RowCount { min: Some(10), max: None });
    ds.checks[0].blocking = false;
    let staged = lake.stage_batches(&ds, "c", &[part("p")], vec![rows(&[(1, None, None)], None)]).await.expect("stage");
    let results = lake.check(&ds, &staged).await.expect("check");
    let contract = results.iter().find(|r| r.name == SCHEMA_CONTRACT).expect("contract ran");
    assert!(contract.passed && contract.blocking, "{contract:?}");
    let soft = results.iter().find(|r| r.name == "the_check").expect("ran");
    assert!(!soft.passed && !soft.blocks(), "{soft:?}");
}

//! Backfill review: comparing staged versions with a published version (by key, as multisets, with
//! nothing published, with flags and slices), SQL inputs overlaid with staged partitions, and the
//! size of partitions.

use crate::common::*;
use serde_json::json;
use tidegate_core::partition::Partition;
use tidegate_core::spec::model::{Dataset, ReviewFlags, WriteMode};
use tidegate_lake::arrow::array::RecordBatch;
use tidegate_lake::{
    ColumnDelta, CompareSpec, Comparison, ComparisonTotals, Error, InputTable, Lake, PartitionSize, SliceDelta,
    StagedVersion,
};

fn sales() -> Dataset {
    dataset("sales", WriteMode::Replace, basic_columns())
}

/// Every flag off: the tests of counts and samples are not about flags.
const NO_FLAGS: ReviewFlags = ReviewFlags {
    row_count_pct: None,
    rows_changed_pct: None,
    mean_pct: None,
    null_rise_points: None,
    schema_change: false,
};

fn spec<'a>(ds: &'a Dataset, keys: &'a [String], slices: &'a [String]) -> CompareSpec<'a> {
    CompareSpec { dataset: ds, keys, slice_columns: slices, flags: NO_FLAGS, sample_rows: 5 }
}

async fn stage(
    lake: &Lake,
    ds: &Dataset,
    id: &str,
    partitions: &[Partition],
    batch: Vec<RecordBatch>,
) -> StagedVersion {
    lake.stage_batches(ds, id, partitions, batch).await.expect("stage")
}

fn slice(value: &str, counts: [u64; 5]) -> SliceDelta {
    let [rows_before, rows_after, n_added, n_removed, n_changed] = counts;
    SliceDelta {
        column: "name".to_owned(),
        value: value.to_owned(),
        rows_before,
        rows_after,
        n_added,
        n_removed,
        n_changed,
    }
}

fn text_column(name: &str, null_rate_before: f64, null_rate_after: f64) -> ColumnDelta {
    ColumnDelta {
        column: name.to_owned(),
        type_change: None,
        sum_before: None,
        sum_after: None,
        min_before: None,
        min_after: None,
        max_before: None,
        max_after: None,
        mean_before: None,
        mean_after: None,
        null_rate_before,
        null_rate_after,
    }
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

/// A backfill rewriting `eu` (one row kept, two changed, one added, one removed) and adding the new
/// partition `ap`, against the version published before `us` was rewritten.
#[tokio::test]
async fn keyed_comparison_counts_rows_and_moves_columns_per_partition() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let published = rows(
        &[(1, Some(10), Some("a")), (2, Some(20), Some("a")), (3, Some(30), Some("b")), (4, Some(40), Some("b"))],
        None,
    );
    put(&lake, &ds, &[part("eu")], published, "eu-1").await;
    let version = put(&lake, &ds, &[part("us")], rows(&[(1, Some(100), Some("a"))], None), "us-1").await;
    // A later publication must not leak into a comparison pinned to `version`.
    put(&lake, &ds, &[part("eu")], rows(&[(9, Some(9), None)], None), "eu-2").await;

    let eu = rows(
        &[(1, Some(10), Some("a")), (2, Some(25), Some("a")), (3, Some(30), Some("c")), (5, Some(50), Some("b"))],
        None,
    );
    let backfill = vec![
        stage(&lake, &ds, "bf-eu", &[part("eu")], vec![eu]).await,
        stage(&lake, &ds, "bf-ap", &[part("ap")], vec![rows(&[(7, Some(70), Some("a"))], None)]).await,
    ];
    let keys = strings(&["id"]);
    let slices = strings(&["name"]);
    let comparison = lake.compare(&spec(&ds, &keys, &slices), Some(version), &backfill).await.expect("compare");

    assert_eq!(comparison.dataset, "sales");
    assert_eq!(comparison.published_version, Some(version));
    assert_eq!(
        comparison.totals,
        ComparisonTotals { rows_before: 4, rows_after: 5, n_added: 2, n_removed: 1, n_changed: 2, n_flagged: 0 }
    );
    let names: Vec<&str> = comparison.partitions.iter().map(|p| p.partition.as_str()).collect();
    assert_eq!(names, ["ap", "eu"]);

    let ap = &comparison.partitions[0];
    assert_eq!((ap.rows_before, ap.rows_after, ap.n_added, ap.n_removed, ap.n_changed), (0, 1, 1, 0, 0));
    assert_eq!(ap.sample_added, vec![json!({"id": 7, "value": 70, "name": "a"})]);

    let eu = &comparison.partitions[1];
    assert_eq!((eu.rows_before, eu.rows_after, eu.n_added, eu.n_removed, eu.n_changed), (4, 4, 1, 1, 2));
    assert_eq!(
        eu.columns,
        vec![
            text_column("name", 0.0, 0.0),
            ColumnDelta {
                column: "value".to_owned(),
                type_change: None,
                sum_before: Some(100.0),
                sum_after: Some(115.0),
                min_before: Some(10.0),
                min_after: Some(10.0),
                max_before: Some(40.0),
                max_after: Some(50.0),
                mean_before: Some(25.0),
                mean_after: Some(28.75),
                null_rate_before: 0.0,
                null_rate_after: 0.0,
            },
        ]
    );
    assert_eq!(
        eu.sample_changed,
        vec![
            json!({"key": {"id": 2}, "before": {"value": 20, "name": "a"}, "after": {"value": 25, "name": "a"}}),
            json!({"key": {"id": 3}, "before": {"value": 30, "name": "b"}, "after": {"value": 30, "name": "c"}}),
        ]
    );
    assert_eq!(eu.sample_added, vec![json!({"id": 5, "value": 50, "name": "b"})]);
    assert_eq!(eu.sample_removed, vec![json!({"id": 4, "value": 40, "name": "b"})]);
    // A changed row counts under its staged value, a removed one under its published value.
    assert_eq!(eu.slices, vec![slice("a", [2, 2, 0, 0, 1]), slice("b", [2, 1, 1, 1, 0]), slice("c", [0, 1, 0, 0, 1])]);

    // Samples are the first rows by key; the output is the same on every call.
    let one = CompareSpec { sample_rows: 1, ..spec(&ds, &keys, &slices) };
    let limited = lake.compare(&one, Some(version), &backfill).await.expect("compare");
    assert_eq!(limited.partitions[1].sample_changed.len(), 1);
    assert_eq!(limited.partitions[1].sample_changed[0]["key"], json!({"id": 2}));
    let again = lake.compare(&spec(&ds, &keys, &slices), Some(version), &backfill).await.expect("compare");
    assert_eq!(serde_json::to_string(&again).expect("json"), serde_json::to_string(&comparison).expect("json"));
    let decoded: Comparison = serde_json::from_value(serde_json::to_value(&comparison).expect("json")).expect("decode");
    assert_eq!(decoded, comparison);
}

/// Without keys, rows are multisets: a duplicate more or less is one row added or removed, and rows
/// with nulls match themselves.
#[tokio::test]
async fn unkeyed_comparison_matches_whole_rows_with_duplicates_and_nulls() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let published =
        rows(&[(1, Some(10), Some("a")), (1, Some(10), Some("a")), (2, Some(20), Some("b")), (3, None, None)], None);
    let version = put(&lake, &ds, &[part("eu")], published, "eu-1").await;
    let staged = rows(
        &[
            (1, Some(10), Some("a")),
            (2, Some(20), Some("b")),
            (2, Some(20), Some("b")),
            (3, None, None),
            (4, Some(40), Some("d")),
        ],
        None,
    );
    let backfill = vec![stage(&lake, &ds, "bf", &[part("eu")], vec![staged]).await];
    let slices = strings(&["name"]);
    let comparison = lake.compare(&spec(&ds, &[], &slices), Some(version), &backfill).await.expect("compare");

    let eu = &comparison.partitions[0];
    assert_eq!((eu.rows_before, eu.rows_after, eu.n_added, eu.n_removed, eu.n_changed), (4, 5, 2, 1, 0));
    let names: Vec<&str> = eu.columns.iter().map(|c| c.column.as_str()).collect();
    assert_eq!(names, ["id", "name", "value"], "without keys every column is measured");
    assert_eq!(eu.columns[1], text_column("name", 0.25, 0.2));
    assert_eq!(eu.columns[2].sum_before, Some(40.0));
    assert_eq!(eu.columns[2].mean_after, Some(22.5));
    assert_eq!(
        eu.sample_added,
        vec![json!({"id": 2, "value": 20, "name": "b"}), json!({"id": 4, "value": 40, "name": "d"})]
    );
    assert_eq!(eu.sample_removed, vec![json!({"id": 1, "value": 10, "name": "a"})]);
    assert!(eu.sample_changed.is_empty());
    assert_eq!(
        eu.slices,
        vec![
            slice("(null)", [1, 1, 0, 0, 0]),
            slice("a", [2, 1, 0, 1, 0]),
            slice("b", [1, 2, 1, 0, 0]),
            slice("d", [0, 1, 1, 0, 0]),
        ]
    );
}

/// With nothing published every staged row is added, and a partition staged empty is compared too.
#[tokio::test]
async fn with_nothing_published_every_row_is_added() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let batch = rows(&[(1, Some(1), Some("a")), (2, None, Some("a")), (3, Some(5), None)], Some(&["eu", "eu", "eu"]));
    let backfill = vec![stage(&lake, &ds, "bf", &[part("eu"), part("us")], vec![batch]).await];
    let keys = strings(&["id"]);
    let comparison = lake.compare(&spec(&ds, &keys, &[]), None, &backfill).await.expect("compare");

    assert_eq!(comparison.published_version, None);
    assert_eq!(
        comparison.totals,
        ComparisonTotals { rows_before: 0, rows_after: 3, n_added: 3, n_removed: 0, n_changed: 0, n_flagged: 0 }
    );
    let eu = &comparison.partitions[0];
    assert_eq!(eu.partition, "eu");
    assert_eq!(eu.sample_added.len(), 3);
    assert_eq!(eu.sample_added[1], json!({"id": 2, "name": "a"}), "null values are left out");
    let value = &eu.columns[1];
    assert_eq!((value.mean_before, value.mean_after, value.sum_after), (None, Some(3.0), Some(6.0)));
    assert!((value.null_rate_after - 1.0 / 3.0).abs() < 1e-12);
    let us = &comparison.partitions[1];
    assert_eq!((us.partition.as_str(), us.rows_before, us.rows_after, us.n_added), ("us", 0, 0, 0));
}

/// A partition is flagged when its row count, its changed rows, a column's mean or a null rate
/// move past their limits; a partition staged empty shows every published row removed.
#[tokio::test]
async fn partitions_moving_past_the_threshold_are_flagged() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let steady: Vec<(i64, Option<i64>, Option<&str>)> = (0..20).map(|i| (i, Some(10), Some("x"))).collect();
    put(&lake, &ds, &[part("eu")], rows(&steady, None), "eu-1").await;
    put(&lake, &ds, &[part("us")], rows(&steady, None), "us-1").await;
    let version = put(&lake, &ds, &[part("gone")], rows(&steady[..2], None), "gone-1").await;

    // eu: ids 0 and 1 triple their value, ids 2 and 3 lose their name: 4 of 20 rows changed (20%),
    // the mean goes from 10 to 12 (20%), the name's null rate rises 10 points.
    let mut eu = steady.clone();
    eu[0].1 = Some(30);
    eu[1].1 = Some(30);
    eu[2].2 = None;
    eu[3].2 = None;
    // us: one row changes a little (5%, not more than 5%), the mean by 0.5%.
    let mut us = steady.clone();
    us[0].1 = Some(11);
    let backfill = vec![
        stage(&lake, &ds, "bf-eu", &[part("eu")], vec![rows(&eu, None)]).await,
        stage(&lake, &ds, "bf-us", &[part("us")], vec![rows(&us, None)]).await,
        stage(&lake, &ds, "bf-gone", &[part("gone")], Vec::new()).await,
    ];
    let keys = strings(&["id"]);
    let flagging = CompareSpec { flags: ReviewFlags::DEFAULT.all_pct(5.0), ..spec(&ds, &keys, &[]) };
    let comparison = lake.compare(&flagging, Some(version), &backfill).await.expect("compare");
    assert_eq!(comparison.flags, ReviewFlags::DEFAULT.all_pct(5.0), "the comparison says what flagged it");

    let by_name = |name: &str| comparison.partitions.iter().find(|p| p.partition == name).expect("partition");
    assert_eq!(
        by_name("eu").flagged,
        vec![
            "rows changed 20.0% > 5%",
            "null rate of name rose 10.0 points (0.0% -> 10.0%) > 5",
            "mean of value moved 20.0% (10 -> 12) > 5%",
        ]
    );
    assert_eq!(by_name("us").n_changed, 1);
    assert!(by_name("us").flagged.is_empty(), "{:?}", by_name("us").flagged);
    let gone = by_name("gone");
    assert_eq!((gone.rows_before, gone.rows_after, gone.n_removed), (2, 0, 2));
    assert_eq!(gone.flagged, vec!["row count fell 100.0% (2 -> 0) > 5%", "rows changed 100.0% > 5%"]);
    assert_eq!(comparison.totals.n_flagged, 2);

    // The defaults: rewriting 20% of the rows is no flag by itself, but the mean (20% > 10%), the
    // null rate (10 points > 5) and an emptied partition are.
    let by_default = CompareSpec { flags: ReviewFlags::DEFAULT, ..spec(&ds, &keys, &[]) };
    let comparison = lake.compare(&by_default, Some(version), &backfill).await.expect("compare");
    let by_name = |name: &str| comparison.partitions.iter().find(|p| p.partition == name).expect("partition");
    assert_eq!(
        by_name("eu").flagged,
        vec!["null rate of name rose 10.0 points (0.0% -> 10.0%) > 5", "mean of value moved 20.0% (10 -> 12) > 10%"]
    );
    assert!(by_name("us").flagged.is_empty(), "{:?}", by_name("us").flagged);
    assert_eq!(by_name("gone").flagged, vec!["row count fell 100.0% (2 -> 0) > 10%"]);

    // Each limit is its own: a higher mean limit and the null rate off leave eu unflagged.
    let loose = ReviewFlags { mean_pct: Some(25.0), null_rise_points: None, ..ReviewFlags::DEFAULT };
    let comparison = lake
        .compare(&CompareSpec { flags: loose, ..spec(&ds, &keys, &[]) }, Some(version), &backfill)
        .await
        .expect("compare");
    let eu = comparison.partitions.iter().find(|p| p.partition == "eu").expect("eu");
    assert!(eu.flagged.is_empty(), "{:?}", eu.flagged);
    assert_eq!(comparison.totals.n_flagged, 1, "only the emptied partition");

    let unflagged = lake.compare(&spec(&ds, &keys, &[]), Some(version), &backfill).await.expect("compare");
    assert!(unflagged.partitions.iter().all(|p| p.flagged.is_empty()));
    assert_eq!(unflagged.totals.n_flagged, 0);
}

/// The review's reason to exist: a backfill that moves every partition's mean by 85% is flagged
/// with nothing configured, and one that changes nothing is not.
#[tokio::test]
async fn by_default_a_mean_moved_85_percent_is_flagged_and_an_unchanged_backfill_is_not() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let days = ["d1", "d2", "d3"];
    let published: Vec<(i64, Option<i64>, Option<&str>)> = (0..10).map(|i| (i, Some(100), Some("x"))).collect();
    let mut version = 0;
    for day in days {
        version = put(&lake, &ds, &[part(day)], rows(&published, None), &format!("{day}-1")).await;
    }
    let moved: Vec<(i64, Option<i64>, Option<&str>)> = (0..10).map(|i| (i, Some(185), Some("x"))).collect();
    let mut moved_backfill = Vec::new();
    let mut same_backfill = Vec::new();
    for day in days {
        moved_backfill
            .push(stage(&lake, &ds, &format!("bf-moved-{day}"), &[part(day)], vec![rows(&moved, None)]).await);
        same_backfill
            .push(stage(&lake, &ds, &format!("bf-same-{day}"), &[part(day)], vec![rows(&published, None)]).await);
    }
    let keys = strings(&["id"]);
    let by_default = CompareSpec { flags: ds.review_flags, ..spec(&ds, &keys, &[]) };
    assert_eq!(by_default.flags, ReviewFlags::DEFAULT, "a dataset that sets nothing gets the defaults");

    let moved = lake.compare(&by_default, Some(version), &moved_backfill).await.expect("compare");
    assert_eq!(moved.totals.n_flagged, 3, "every partition is flagged");
    for p in &moved.partitions {
        assert_eq!(p.flagged, vec!["mean of value moved 85.0% (100 -> 185) > 10%"], "{}", p.partition);
    }

    let same = lake.compare(&by_default, Some(version), &same_backfill).await.expect("compare");
    assert_eq!(same.totals.n_flagged, 0);
    assert!(same.partitions.iter().all(|p| p.flagged.is_empty() && p.n_changed == 0));
}

/// A staged schema that differs from the published one flags every partition staged with it and
/// is named in the comparison; with `schema_change` off it flags nothing.
#[tokio::test]
async fn a_schema_change_is_flagged_and_named() {
    // Another writer (delta-rs itself) is handed the table's folder.
    let (dir, lake) = folder_lake().await;
    let ds = sales();
    let steady: Vec<(i64, Option<i64>, Option<&str>)> = (0..4).map(|i| (i, Some(10), Some("x"))).collect();
    let version = put(&lake, &ds, &[part("eu")], rows(&steady, None), "eu-1").await;
    // Another writer adds a nullable column; the backfill stages under the new schema.
    let table_dir = lake.root().expect("a folder lake").join("sales");
    let url = url::Url::from_directory_path(&table_dir).expect("table url");
    let table = deltalake_core::DeltaTableBuilder::from_url(url).expect("url").load().await.expect("load");
    let field = deltalake_core::kernel::StructField::new("score", deltalake_core::kernel::DataType::LONG, true);
    table.add_columns().with_fields([field]).await.expect("add a column");
    // A fresh handle: this one's table cache has not seen the other writer's commit.
    let lake = Lake::open(&dir.url).await.expect("open lake");
    let mut columns = basic_columns();
    columns.push(col("score", "int64", true));
    let evolved = dataset("sales", WriteMode::Replace, columns);
    let backfill = vec![stage(&lake, &evolved, "bf-eu", &[part("eu")], vec![rows(&steady, None)]).await];

    let keys = strings(&["id"]);
    let by_default = CompareSpec { flags: ReviewFlags::DEFAULT, ..spec(&ds, &keys, &[]) };
    let comparison = lake.compare(&by_default, Some(version), &backfill).await.expect("compare");
    assert_eq!(comparison.schema_changes, vec!["adds column score"]);
    assert_eq!(comparison.partitions[0].flagged, vec!["schema changed: adds column score"]);

    let quiet = ReviewFlags { schema_change: false, ..ReviewFlags::DEFAULT };
    let comparison =
        lake.compare(&CompareSpec { flags: quiet, ..by_default }, Some(version), &backfill).await.expect("compare");
    assert_eq!(comparison.schema_changes, vec!["adds column score"], "still named");
    assert!(comparison.partitions[0].flagged.is_empty(), "{:?}", comparison.partitions[0].flagged);
}

/// `value` in `ds`'s columns declared as `data_type`.
fn with_value_type(ds: &Dataset, data_type: &str) -> Dataset {
    let mut ds = ds.clone();
    for c in ds.columns.iter_mut().filter(|c| c.name == "value") {
        c.data_type = data_type.to_owned();
    }
    ds
}

/// Rows of `(id, value)` with `value` a float64.
fn float_rows(rows: &[(i64, f64)]) -> RecordBatch {
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let values: Vec<f64> = rows.iter().map(|r| r.1).collect();
    batch(vec![("id", ints(&ids)), ("value", floats(&values))])
}

/// Issue 31, item 8: a backfill that widens `value` from int64 to float64 and moves 1 to 1.5 is
/// a changed row, not "nothing changed": before and after are compared in a type that holds both
/// (never the old one), the samples show the values as they are, and the column's type change is
/// named on the column and in the comparison. The class: no value is converted lossily to be
/// compared, so 2^53 + 1 against the float64 nearest to it is a change too, by key and as multisets.
#[tokio::test]
async fn a_widening_backfill_is_compared_in_the_wider_type() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let big = 9_007_199_254_740_993_i64; // 2^53 + 1: no float64 holds it
    let published = rows(&[(1, Some(1), None), (2, Some(2), None), (3, Some(big), None)], None);
    let version = put(&lake, &ds, &[part("eu")], published, "eu-1").await;

    let widened = with_value_type(&ds, "float64");
    let after = float_rows(&[(1, 1.5), (2, 2.0), (3, big as f64)]);
    let backfill = vec![stage(&lake, &widened, "bf-eu", &[part("eu")], vec![after]).await];

    let keys = strings(&["id"]);
    let keyed = lake.compare(&spec(&widened, &keys, &[]), Some(version), &backfill).await.expect("compare");
    assert_eq!(keyed.schema_changes, vec!["column value changed from int64 to float64"]);
    let eu = &keyed.partitions[0];
    assert_eq!((eu.n_added, eu.n_removed, eu.n_changed), (0, 0, 2), "ids 1 and 3 changed; 2 is 2.0");
    assert_eq!(
        eu.sample_changed,
        vec![
            json!({"key": {"id": 1}, "before": {"value": 1}, "after": {"value": 1.5}}),
            json!({"key": {"id": 3}, "before": {"value": big}, "after": {"value": big as f64}}),
        ]
    );
    let value = eu.columns.iter().find(|c| c.column == "value").expect("value");
    assert_eq!(value.type_change.as_deref(), Some("int64 -> float64"));
    assert_eq!((value.min_before, value.min_after), (Some(1.0), Some(1.5)));
    let name = eu.columns.iter().find(|c| c.column == "name").expect("name");
    assert_eq!(name.type_change, None, "a column whose type stays says nothing");

    let multisets = lake.compare(&spec(&widened, &[], &[]), Some(version), &backfill).await.expect("compare");
    let eu = &multisets.partitions[0];
    assert_eq!((eu.n_added, eu.n_removed, eu.n_changed), (2, 2, 0), "{:?}", eu.sample_added);

    // Narrowing (float64 to int64) is compared in float64: 1.5 against 1 is a change too.
    let prices = Dataset { name: "prices".to_owned(), ..widened };
    let narrowed_ds = Dataset { name: "prices".to_owned(), ..ds };
    let floats_published = put(&lake, &prices, &[part("us")], float_rows(&[(1, 1.5), (2, 2.0)]), "us-1").await;
    let ints_staged = rows(&[(1, Some(1), None), (2, Some(2), None)], None);
    let narrowed = vec![stage(&lake, &narrowed_ds, "bf-us", &[part("us")], vec![ints_staged]).await];
    let c = lake.compare(&spec(&narrowed_ds, &keys, &[]), Some(floats_published), &narrowed).await.expect("compare");
    let us = &c.partitions[0];
    assert_eq!((us.n_added, us.n_removed, us.n_changed), (0, 0, 1), "{:?}", us.sample_changed);
}

/// A merge backfill is reviewed as the merge will publish it: a key it does not deliver is
/// untouched (not removed), a late row (older `seq` than the published row) changes nothing, a
/// newer one changes its key, a late delete deletes nothing and a newer one removes its key.
#[tokio::test]
async fn a_merge_backfill_is_compared_as_the_merge_publishes_it() {
    let (_dir, lake) = lake().await;
    let ds = dataset(
        "accounts",
        WriteMode::Merge {
            keys: strings(&["id"]),
            order_by: Some("seq".to_owned()),
            delete_marker: Some("deleted".to_owned()),
        },
        vec![col("id", "int64", false), col("seq", "int64", true), col("deleted", "bool", true)],
    );
    let accounts = |ids: &[i64], seqs: &[i64], deleted: &[bool]| {
        batch(vec![("id", ints(ids)), ("seq", ints(seqs)), ("deleted", bools(deleted))])
    };
    let published = accounts(&[1, 2, 3, 4, 5], &[5, 5, 5, 5, 5], &[false; 5]);
    let version = put(&lake, &ds, &[part("eu")], published, "m1").await;
    // 1 late, 2 newer, 3 untouched, 4 a late delete, 5 a newer delete, 6 new.
    let delivery = accounts(&[1, 2, 4, 5, 6], &[3, 6, 4, 7, 1], &[false, false, true, true, false]);
    let backfill = vec![stage(&lake, &ds, "bf-eu", &[part("eu")], vec![delivery]).await];

    let keys = strings(&["id"]);
    let c = lake.compare(&spec(&ds, &keys, &[]), Some(version), &backfill).await.expect("compare");
    let eu = &c.partitions[0];
    assert_eq!((eu.rows_before, eu.rows_after), (5, 5));
    assert_eq!((eu.n_added, eu.n_removed, eu.n_changed), (1, 1, 1), "6 added, 5 removed, 2 changed");
    assert_eq!(
        eu.sample_changed,
        vec![json!({"key": {"id": 2}, "before": {"seq": 5, "deleted": false}, "after": {"seq": 6, "deleted": false}})]
    );
    assert_eq!(eu.sample_removed, vec![json!({"id": 5, "seq": 5, "deleted": false})]);
}

/// An append backfill likewise: published rows stay (an append removes nothing), a re-delivered
/// key is a duplicate the append drops (even with other values), and only new keys are added.
#[tokio::test]
async fn an_append_backfill_is_compared_as_the_append_publishes_it() {
    let (_dir, lake) = lake().await;
    let ds = dataset(
        "clicks",
        WriteMode::Append { dedup_key: strings(&["id"]), dedup_lookback: 0, order_by: None },
        basic_columns(),
    );
    let version = put(&lake, &ds, &[part("d1")], rows(&[(1, Some(1), None), (2, Some(2), None)], None), "a1").await;
    let delivery = rows(&[(2, Some(20), None), (3, Some(3), None)], None);
    let backfill = vec![stage(&lake, &ds, "bf-d1", &[part("d1")], vec![delivery]).await];
    let keys = strings(&["id"]);
    let c = lake.compare(&spec(&ds, &keys, &[]), Some(version), &backfill).await.expect("compare");
    let d1 = &c.partitions[0];
    assert_eq!((d1.rows_before, d1.rows_after), (2, 3));
    assert_eq!((d1.n_added, d1.n_removed, d1.n_changed), (1, 0, 0), "{:?} {:?}", d1.sample_removed, d1.sample_changed);
    assert_eq!(d1.sample_added, vec![json!({"id": 3, "value": 3})]);
}

#[tokio::test]
async fn an_unknown_key_or_slice_column_is_named() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let backfill = vec![stage(&lake, &ds, "bf", &[part("eu")], vec![rows(&[(1, None, None)], None)]).await];
    let keys = strings(&["account"]);
    let err = lake.compare(&spec(&ds, &keys, &[]), None, &backfill).await.expect_err("unknown key");
    assert!(matches!(&err, Error::SchemaMismatch { column, .. } if column == "account"), "{err}");
    let slices = strings(&["tg_partition"]);
    let err = lake.compare(&spec(&ds, &[], &slices), None, &backfill).await.expect_err("partition column");
    assert!(matches!(&err, Error::SchemaMismatch { column, .. } if column == "tg_partition"), "{err}");
}

fn input(version: Option<u64>, partitions: &[&str], overlay: Vec<StagedVersion>) -> InputTable {
    InputTable {
        name: "sales".to_owned(),
        dataset: "sales".to_owned(),
        version,
        partitions: strings(partitions),
        overlay,
    }
}

async fn ids(lake: &Lake, input: InputTable) -> Vec<String> {
    render(&lake.sql_over("SELECT id FROM sales", &[input]).await.expect("sql_over"))
}

/// An overlaid partition reads the staged rows, the others the pinned version's.
#[tokio::test]
async fn an_overlay_replaces_the_pinned_rows_of_its_partitions() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    put(&lake, &ds, &[part("eu")], rows(&[(1, Some(1), None)], None), "eu-1").await;
    let version = put(&lake, &ds, &[part("us")], rows(&[(2, Some(2), None)], None), "us-1").await;
    let eu =
        stage(&lake, &ds, "bf-eu", &[part("eu")], vec![rows(&[(3, Some(3), None), (4, Some(4), None)], None)]).await;
    let empty_us = stage(&lake, &ds, "bf-us", &[part("us")], Vec::new()).await;
    let v = Some(version);

    assert_eq!(ids(&lake, input(v, &[], Vec::new())).await, ["id=1", "id=2"]);
    assert_eq!(ids(&lake, input(v, &[], vec![eu.clone()])).await, ["id=2", "id=3", "id=4"]);
    assert_eq!(ids(&lake, input(v, &["eu"], vec![eu.clone()])).await, ["id=3", "id=4"]);
    assert_eq!(ids(&lake, input(v, &["us"], vec![eu.clone()])).await, ["id=2"]);
    assert_eq!(ids(&lake, input(v, &[], vec![eu.clone(), empty_us.clone()])).await, ["id=3", "id=4"]);
    assert_eq!(ids(&lake, input(None, &[], vec![eu.clone()])).await, ["id=3", "id=4"]);
    // The overlay changes nothing published.
    assert_eq!(ids(&lake, input(v, &[], Vec::new())).await, ["id=1", "id=2"]);

    let columns = lake.sql_over("SELECT * FROM sales", &[input(v, &[], vec![eu])]).await.expect("sql_over");
    let names: Vec<String> = columns[0].schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["id", "value", "name"], "the partition column is dropped");

    let err = lake.sql_over("SELECT 1", &[input(None, &[], Vec::new())]).await.expect_err("no version");
    assert!(matches!(&err, Error::Query { detail } if detail.contains("no published version")), "{err}");
}

#[tokio::test]
async fn partition_sizes_come_from_the_published_files() {
    let (_dir, lake) = lake().await;
    let ds = sales();
    let zeros = |p: &str| PartitionSize { partition: p.to_owned(), n_rows: 0, n_bytes: 0, n_files: 0 };
    assert_eq!(lake.partition_sizes("sales", &strings(&["eu"])).await.expect("sizes"), vec![zeros("eu")]);

    let eu =
        stage(&lake, &ds, "eu", &[part("eu")], vec![rows(&[(1, None, None), (2, None, None), (3, None, None)], None)])
            .await;
    let eu_bytes: i64 = eu.files.iter().map(|f| f.size_bytes).sum();
    lake.publish(&release("r-eu", &ds, eu, "eu")).await.expect("publish");
    put(&lake, &ds, &[part("us")], rows(&[(1, None, None), (2, None, None)], None), "us").await;

    let sizes = lake.partition_sizes("sales", &strings(&["zz", "eu"])).await.expect("sizes");
    assert_eq!(
        sizes,
        vec![
            PartitionSize { partition: "eu".to_owned(), n_rows: 3, n_bytes: eu_bytes as u64, n_files: 1 },
            zeros("zz")
        ]
    );
    let all = lake.partition_sizes("sales", &[]).await.expect("sizes");
    let summary: Vec<(&str, u64, u64)> = all.iter().map(|s| (s.partition.as_str(), s.n_rows, s.n_files)).collect();
    assert_eq!(summary, [("eu", 3, 1), ("us", 2, 1)]);
    assert!(all.iter().all(|s| s.n_bytes > 0));
}

/// A snapshot is the whole dataset: a new week's snapshot is compared with every published row
/// (the previous week's snapshot), not with an empty partition of the same key; and an older
/// snapshot published after a newer one is refused, so readers never move backwards.
#[tokio::test]
async fn a_snapshot_compares_with_the_whole_published_snapshot_and_never_goes_backwards() {
    let (_dir, lake) = lake().await;
    let ds = dataset("training", WriteMode::Snapshot, basic_columns());
    let keys = strings(&["id"]);
    let w1 = put(&lake, &ds, &[part("2024-W01")], rows(&[(1, Some(10), None), (2, Some(20), None)], None), "w1").await;
    let staged = stage(
        &lake,
        &ds,
        "w2",
        &[part("2024-W02")],
        vec![rows(&[(1, Some(10), None), (2, Some(25), None), (3, Some(30), None)], None)],
    )
    .await;
    let c = lake.compare(&spec(&ds, &keys, &[]), Some(w1), std::slice::from_ref(&staged)).await.expect("compare");
    let p = &c.partitions[0];
    assert_eq!(p.partition, "2024-W02");
    assert_eq!((p.rows_before, p.rows_after, p.n_added, p.n_removed, p.n_changed), (2, 3, 1, 0, 1));

    lake.publish(&release("rel-w2", &ds, staged, "w2")).await.expect("publish w2");
    let late = stage(&lake, &ds, "w1-late", &[part("2024-W01")], vec![rows(&[(9, Some(90), None)], None)]).await;
    let err = lake.publish(&release("rel-w1-late", &ds, late, "w1-late")).await.expect_err("an older snapshot");
    assert!(matches!(err, Error::SupersededSnapshot { .. }), "{err:?}");
    assert_eq!(read_all(&lake, "training").await.len(), 3, "readers still see the 2024-W02 snapshot");
}

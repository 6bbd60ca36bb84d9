//! The four write modes: merge by key with ordering (against the table's rows too: late rows are
//! ignored and counted), ties and tombstones; append with
//! de-duplication; snapshot; and rollback of each mode back to identical rows.

use crate::common::*;
use tidegate_core::spec::model::{Dataset, WriteMode};
use tidegate_lake::arrow::array::RecordBatch;
use tidegate_lake::{Error, LATE_ROWS_IGNORED_KEY};

fn merge_dataset() -> Dataset {
    dataset(
        "accounts",
        WriteMode::Merge {
            keys: vec!["id".to_owned()],
            order_by: Some("seq".to_owned()),
            delete_marker: Some("deleted".to_owned()),
        },
        vec![
            col("id", "int64", false),
            col("seq", "int64", true),
            col("balance", "float64", true),
            col("deleted", "bool", true),
        ],
    )
}

fn accounts(ids: &[i64], seqs: &[i64], balances: &[f64], deleted: &[bool]) -> tidegate_lake::arrow::array::RecordBatch {
    batch(vec![("id", ints(ids)), ("seq", ints(seqs)), ("balance", floats(balances)), ("deleted", bools(deleted))])
}

#[tokio::test]
async fn merge_resolves_duplicates_by_order_by_and_tombstones_delete() {
    let (_dir, lake) = lake().await;
    let ds = merge_dataset();
    put(&lake, &ds, &[part("eu")], accounts(&[1, 2, 3], &[1, 1, 1], &[10.0, 20.0, 30.0], &[false; 3]), "m1").await;

    // Key 1 twice (seq 5 wins over seq 2), key 2 deleted, key 4 new; key 3 untouched.
    let changes = accounts(&[1, 1, 2, 4], &[2, 5, 3, 1], &[11.0, 15.0, 0.0, 40.0], &[false, false, true, false]);
    put(&lake, &ds, &[part("eu")], changes, "m2").await;
    assert_eq!(
        read_all(&lake, "accounts").await,
        vec![
            "id=1|seq=5|balance=15.0|deleted=false|tg_partition=eu",
            "id=3|seq=1|balance=30.0|deleted=false|tg_partition=eu",
            "id=4|seq=1|balance=40.0|deleted=false|tg_partition=eu",
        ]
    );
}

/// `accounts` with a null `seq` where `seqs` has `None`.
fn accounts_at(ids: &[i64], seqs: &[Option<i64>], balances: &[f64], deleted: &[bool]) -> RecordBatch {
    let seqs: tidegate_lake::arrow::array::ArrayRef =
        std::sync::Arc::new(tidegate_lake::arrow::array::Int64Array::from(seqs.to_vec()));
    batch(vec![("id", ints(ids)), ("seq", seqs), ("balance", floats(balances)), ("deleted", bools(deleted))])
}

/// Issue 31, item 6: a CDC feed's late row (an older `seq` than the published row of its key)
/// never takes the key back in time, nor does a late delete remove the newer row; a delivered row
/// with the same `seq` as the table's wins (a restatement); a null `seq` is older than any value.
/// The publication, and its commit, count the late rows ignored.
#[tokio::test]
async fn a_late_row_never_overwrites_a_newer_published_one() {
    let (_dir, lake) = lake().await;
    let ds = merge_dataset();
    let published = accounts_at(
        &[1, 2, 3, 4, 6],
        &[Some(5), Some(5), Some(5), None, Some(1)],
        &[50.0, 20.0, 30.0, 40.0, 60.0],
        &[false; 5],
    );
    put(&lake, &ds, &[part("eu")], published, "m1").await;

    let late = accounts_at(
        &[1, 2, 3, 4, 5, 6],
        &[Some(3), Some(5), Some(2), Some(1), None, None],
        &[-1.0, 22.0, 0.0, 44.0, 55.0, -6.0],
        &[false, false, true, false, false, false],
    );
    let staged = lake.stage_batches(&ds, "stg-m2", &[part("eu")], vec![late]).await.expect("stage");
    let publication = lake.publish(&release("rel-m2", &ds, staged, "m2")).await.expect("publish");
    assert_eq!(publication.items[0].n_late_rows_ignored, 3, "ids 1 (older seq), 3 (late delete), 6 (null seq)");
    assert_eq!(lake.history("accounts").await.expect("history")[0].metadata[LATE_ROWS_IGNORED_KEY], 3);
    assert_eq!(
        read_all(&lake, "accounts").await,
        vec![
            "id=1|seq=5|balance=50.0|deleted=false|tg_partition=eu",
            "id=2|seq=5|balance=22.0|deleted=false|tg_partition=eu",
            "id=3|seq=5|balance=30.0|deleted=false|tg_partition=eu",
            "id=4|seq=1|balance=44.0|deleted=false|tg_partition=eu",
            "id=5|seq=null|balance=55.0|deleted=false|tg_partition=eu",
            "id=6|seq=1|balance=60.0|deleted=false|tg_partition=eu",
        ]
    );

    // Duplicates inside a delivery are resolved first; the winner then meets the table's row.
    let mixed = accounts(&[1, 1, 2], &[4, 6, 9], &[-4.0, 66.0, 0.0], &[false, false, true]);
    let staged = lake.stage_batches(&ds, "stg-m3", &[part("eu")], vec![mixed]).await.expect("stage");
    let publication = lake.publish(&release("rel-m3", &ds, staged, "m3")).await.expect("publish");
    assert_eq!(publication.items[0].n_late_rows_ignored, 0, "seq 6 is newer than 5; seq 4 lost inside the delivery");
    let now = read_all(&lake, "accounts").await;
    assert!(now.contains(&"id=1|seq=6|balance=66.0|deleted=false|tg_partition=eu".to_owned()), "{now:?}");
    assert!(!now.iter().any(|r| r.starts_with("id=2|")), "a newer delete removes the key: {now:?}");
}

/// Without `order_by` there is no time to go back in: the delivered row always replaces the
/// table's, and nothing is counted as late.
#[tokio::test]
async fn a_merge_without_order_by_replaces_the_published_row_and_counts_nothing_late() {
    let (_dir, lake) = lake().await;
    let ds = dataset(
        "plain",
        WriteMode::Merge { keys: vec!["id".to_owned()], order_by: None, delete_marker: None },
        basic_columns(),
    );
    put(&lake, &ds, &[part("eu")], rows(&[(1, Some(10), Some("a"))], None), "p1").await;
    let staged = lake
        .stage_batches(&ds, "stg-p2", &[part("eu")], vec![rows(&[(1, Some(1), Some("b"))], None)])
        .await
        .expect("stage");
    let publication = lake.publish(&release("rel-p2", &ds, staged, "p2")).await.expect("publish");
    assert_eq!(publication.items[0].n_late_rows_ignored, 0);
    assert!(!lake.history("plain").await.expect("history")[0].metadata.contains_key(LATE_ROWS_IGNORED_KEY));
    assert_eq!(read_all(&lake, "plain").await, vec!["id=1|value=1|name=b|tg_partition=eu"]);
}

#[tokio::test]
async fn merge_leaves_other_partitions_alone() {
    let (_dir, lake) = lake().await;
    let ds = merge_dataset();
    let seed = accounts(&[1, 2], &[1, 1], &[1.0, 2.0], &[false, false]);
    let seed = seed.clone();
    put(&lake, &ds, &[part("eu")], seed.clone(), "eu-1").await;
    put(&lake, &ds, &[part("us")], seed, "us-1").await;
    put(&lake, &ds, &[part("us")], accounts(&[2], &[2], &[22.0], &[false]), "us-2").await;
    assert_eq!(
        read_all(&lake, "accounts").await,
        vec![
            "id=1|seq=1|balance=1.0|deleted=false|tg_partition=eu",
            "id=1|seq=1|balance=1.0|deleted=false|tg_partition=us",
            "id=2|seq=1|balance=2.0|deleted=false|tg_partition=eu",
            "id=2|seq=2|balance=22.0|deleted=false|tg_partition=us",
        ]
    );
}

/// Invariant 7: tied duplicates are rejected before anything is written: no staged file, no
/// commit, the published rows unchanged.
#[tokio::test]
async fn merge_with_tied_duplicates_is_rejected_before_writing() {
    let (dir, lake) = lake().await;
    let ds = merge_dataset();
    put(&lake, &ds, &[part("eu")], accounts(&[1], &[1], &[1.0], &[false]), "m1").await;
    let version = lake.table_version("accounts").await.expect("version");
    let before = read_all(&lake, "accounts").await;

    let tied = accounts(&[7, 7, 8], &[3, 3, 1], &[1.0, 2.0, 3.0], &[false; 3]);
    let err = lake.stage_batches(&ds, "tied", &[part("eu")], vec![tied]).await.expect_err("tie must be rejected");
    match &err {
        Error::TiedDuplicates { key, n_rows, .. } => {
            assert_eq!(key, "(id=7)");
            assert_eq!(*n_rows, 2);
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(err.to_string().contains("key (id=7)"), "{err}");
    let written = dir.list("accounts").await;
    assert!(!written.iter().any(|p| p.contains("tied")), "nothing may be written: {written:?}");
    assert_eq!(lake.table_version("accounts").await.expect("version"), version);
    assert_eq!(read_all(&lake, "accounts").await, before);

    // A lower duplicate under a unique winner is fine: the ordering decides.
    let decided = accounts(&[7, 7, 7], &[1, 1, 2], &[1.0, 2.0, 3.0], &[false; 3]);
    put(&lake, &ds, &[part("eu")], decided, "m2").await;
    assert!(
        read_all(&lake, "accounts").await.contains(&"id=7|seq=2|balance=3.0|deleted=false|tg_partition=eu".to_owned())
    );
}

#[tokio::test]
async fn merge_without_order_by_rejects_any_duplicate_key() {
    let (_dir, lake) = lake().await;
    let ds = dataset(
        "plain",
        WriteMode::Merge { keys: vec!["id".to_owned(), "name".to_owned()], order_by: None, delete_marker: None },
        basic_columns(),
    );
    let err = lake
        .stage_batches(
            &ds,
            "dup",
            &[part("eu")],
            vec![rows(&[(1, Some(1), Some("a")), (1, Some(2), Some("a")), (1, Some(2), Some("b"))], None)],
        )
        .await
        .expect_err("duplicates without ordering");
    assert!(matches!(&err, Error::TiedDuplicates { key, .. } if key == "(id=1, name=a)"), "{err}");
    assert!(err.to_string().contains("no order_by"), "{err}");
}

#[tokio::test]
async fn append_skips_rows_whose_dedup_key_is_published_and_a_replay_adds_nothing() {
    let (_dir, lake) = lake().await;
    let ds = dataset(
        "clicks",
        WriteMode::Append { dedup_key: vec!["id".to_owned()], dedup_lookback: 0, order_by: None },
        basic_columns(),
    );
    let first = rows(&[(1, Some(1), None), (2, Some(2), None)], None);
    put(&lake, &ds, &[part("d1")], first.clone(), "a1").await;
    let after_first = read_all(&lake, "clicks").await;

    // The same rows again under another step identity: every key is already there.
    put(&lake, &ds, &[part("d1")], first, "a2").await;
    assert_eq!(read_all(&lake, "clicks").await, after_first);

    // A mix: only the new key is added.
    put(&lake, &ds, &[part("d1")], rows(&[(2, Some(2), None), (3, Some(3), None)], None), "a3").await;
    assert_eq!(read_all(&lake, "clicks").await.len(), 3);

    // The exact publication replayed (same step identity) commits nothing at all.
    let version = lake.table_version("clicks").await.expect("version");
    let staged =
        lake.stage_batches(&ds, "again", &[part("d1")], vec![rows(&[(4, Some(4), None)], None)]).await.expect("stage");
    let replay = lake.publish(&release("x", &ds, staged, "a3")).await.expect("replay");
    assert!(replay.items[0].already_published);
    assert_eq!(lake.table_version("clicks").await.expect("version"), version);
    assert_eq!(read_all(&lake, "clicks").await.len(), 3);
}

#[tokio::test]
async fn snapshot_replaces_the_whole_table() {
    let (_dir, lake) = lake().await;
    let ds = dataset("snap", WriteMode::Snapshot, basic_columns());
    put(&lake, &ds, &[part("a"), part("b")], rows(&[(1, None, None), (2, None, None)], Some(&["a", "b"])), "s1").await;
    put(&lake, &ds, &[part("c")], rows(&[(3, None, None)], None), "s2").await;
    assert_eq!(read_all(&lake, "snap").await, vec!["id=3|value=null|name=null|tg_partition=c"]);
}

#[tokio::test]
async fn replace_swaps_several_partitions_as_one_unit() {
    let (_dir, lake) = lake().await;
    let ds = dataset("days", WriteMode::Replace, basic_columns());
    let d1 = day(2024, 1, 1);
    let d2 = day(2024, 1, 2);
    let d3 = day(2024, 1, 3);
    put(
        &lake,
        &ds,
        &[d1.clone(), d2.clone(), d3.clone()],
        rows(&[(1, None, None), (2, None, None), (3, None, None)], Some(&["2024-01-01", "2024-01-02", "2024-01-03"])),
        "r1",
    )
    .await;
    // Replacing d1 and d2, with d2 now empty.
    put(&lake, &ds, &[d1, d2], rows(&[(10, None, None)], Some(&["2024-01-01"])), "r2").await;
    assert_eq!(
        read_all(&lake, "days").await,
        vec!["id=10|value=null|name=null|tg_partition=2024-01-01", "id=3|value=null|name=null|tg_partition=2024-01-03",]
    );
}

/// Rolling back each mode's publication gives rows identical to those before it.
#[tokio::test]
async fn rollback_of_each_mode_restores_identical_rows() {
    let (_dir, lake) = lake().await;
    let cases: Vec<(Dataset, tidegate_lake::arrow::array::RecordBatch, tidegate_lake::arrow::array::RecordBatch)> = vec![
        (
            dataset("r_replace", WriteMode::Replace, basic_columns()),
            rows(&[(1, Some(1), Some("a"))], None),
            rows(&[(2, Some(2), Some("b"))], None),
        ),
        (
            dataset(
                "r_append",
                WriteMode::Append { dedup_key: vec!["id".to_owned()], dedup_lookback: 0, order_by: None },
                basic_columns(),
            ),
            rows(&[(1, Some(1), Some("a"))], None),
            rows(&[(1, Some(1), Some("a")), (2, Some(2), Some("b"))], None),
        ),
        (
            dataset("r_snapshot", WriteMode::Snapshot, basic_columns()),
            rows(&[(1, Some(1), Some("a"))], None),
            rows(&[(2, Some(2), Some("b"))], None),
        ),
        (
            Dataset { name: "r_merge".to_owned(), ..merge_dataset() },
            accounts(&[1, 2], &[1, 1], &[1.0, 2.0], &[false, false]),
            accounts(&[1, 2, 3], &[2, 2, 1], &[5.0, 0.0, 3.0], &[false, true, false]),
        ),
    ];
    for (ds, first, second) in cases {
        let v1 = put(&lake, &ds, &[part("p")], first, &format!("{}-1", ds.name)).await;
        let before = read_all(&lake, &ds.name).await;
        put(&lake, &ds, &[part("p")], second, &format!("{}-2", ds.name)).await;
        assert_ne!(read_all(&lake, &ds.name).await, before, "{}: the second publish changes rows", ds.name);
        let v3 = lake.rollback(&ds.name, v1, None, "rollback-release", None, None).await.expect("rollback");
        assert_eq!(v3, v1 + 2);
        assert_eq!(read_all(&lake, &ds.name).await, before, "{}: rollback restores the rows", ds.name);
        let history = lake.history(&ds.name).await.expect("history");
        assert_eq!(history[0].metadata["tidegate.operation"], "rollback");
        assert_eq!(history[0].metadata["tidegate.release_id"], "rollback-release");
    }
}

#[tokio::test]
async fn rollback_of_some_partitions_leaves_the_others() {
    let (_dir, lake) = lake().await;
    let ds = dataset("parts", WriteMode::Replace, basic_columns());
    let v1 =
        put(&lake, &ds, &[part("a"), part("b")], rows(&[(1, None, None), (2, None, None)], Some(&["a", "b"])), "p1")
            .await;
    put(&lake, &ds, &[part("a"), part("b")], rows(&[(10, None, None), (20, None, None)], Some(&["a", "b"])), "p2")
        .await;
    lake.rollback("parts", v1, Some(&["a".to_owned()]), "rb", None, None).await.expect("rollback");
    assert_eq!(
        read_all(&lake, "parts").await,
        vec!["id=1|value=null|name=null|tg_partition=a", "id=20|value=null|name=null|tg_partition=b"]
    );
    // And a diff between the versions names what moved.
    let latest = lake.table_version("parts").await.expect("version").expect("exists");
    let diff = lake.diff("parts", &["id".to_owned()], v1, latest).await.expect("diff");
    assert_eq!((diff.n_added, diff.n_removed, diff.n_changed), (1, 1, 0));
    assert_eq!(diff.added[0]["id"], 20);
    assert_eq!(diff.removed[0]["id"], 2);
}

/// A merge large enough to be written by several Parquet writers at once: each partition's rows
/// still land in that partition's own file, and the result is the merge's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_merge_written_by_several_writers_keeps_each_row_in_its_partition() {
    use tidegate_lake::arrow::array::{AsArray as _, Float64Array, Int64Array};
    use tidegate_lake::arrow::datatypes::{Float64Type, Int64Type};
    let (_dir, lake) = lake().await;
    let ds = merge_dataset();
    let keys = ["p0", "p1", "p2", "p3"];
    let partitions: Vec<_> = keys.iter().map(|k| part(k)).collect();
    let n: i64 = 600_000;
    let ids: Vec<i64> = (0..n).collect();
    let key_of = |id: i64| keys[usize::try_from(id % 4).expect("a small index")];
    let rows_for = |ids: &[i64], seq: i64, balance: f64, deleted: &dyn Fn(i64) -> bool| {
        let parts: Vec<&str> = ids.iter().map(|&i| key_of(i)).collect();
        let deleted: Vec<bool> = ids.iter().map(|&i| deleted(i)).collect();
        batch(vec![
            ("id", ints(ids)),
            ("seq", ints(&vec![seq; ids.len()])),
            ("balance", floats(&vec![balance; ids.len()])),
            ("deleted", bools(&deleted)),
            ("tg_partition", strs(&parts)),
        ])
    };
    put(&lake, &ds, &partitions, rows_for(&ids, 1, 1.0, &|_| false), "base").await;
    // Every 10th id changes; every 100th of those is a tombstone; 1,000 new ids arrive.
    let mut changed: Vec<i64> = (0..n).step_by(10).collect();
    changed.extend(n..n + 1_000);
    put(&lake, &ds, &partitions, rows_for(&changed, 2, 2.0, &|i| i % 1_000 == 0), "merge").await;

    let batches = lake.read("accounts", None, None).await.expect("read");
    let (mut count, mut updated, mut deleted_seen) = (0i64, 0i64, 0i64);
    for b in &batches {
        let id: &Int64Array = b.column_by_name("id").expect("id").as_primitive::<Int64Type>();
        let balance: &Float64Array = b.column_by_name("balance").expect("balance").as_primitive::<Float64Type>();
        let partition = b.column_by_name("tg_partition").expect("partition");
        let partition =
            tidegate_lake::arrow::compute::cast(partition, &tidegate_lake::arrow::datatypes::DataType::Utf8)
                .expect("partition as text");
        let partition = partition.as_string::<i32>();
        for row in 0..b.num_rows() {
            let i = id.value(row);
            assert_eq!(partition.value(row), key_of(i), "id {i} published in the wrong partition");
            count += 1;
            let expect = if i % 10 == 0 || i >= n { 2.0 } else { 1.0 };
            assert!((balance.value(row) - expect).abs() < f64::EPSILON, "id {i} has balance {}", balance.value(row));
            updated += i64::from(expect > 1.5);
            deleted_seen += i64::from(i % 1_000 == 0);
        }
    }
    let tombstones = (0..n + 1_000).filter(|i| i % 1_000 == 0).count() as i64;
    assert_eq!(deleted_seen, 0, "tombstoned ids are gone");
    assert_eq!(count, n + 1_000 - tombstones);
    assert_eq!(updated, (n / 10) + 1_000 - tombstones);
}

//! Exact de-duplication of appends (decision 0017): a dataset with a `dedup_key` holds each key
//! once within a partition and the `dedup_lookback` partitions either side of it, and publishes
//! the same rows whether its partitions share a commit or not, in whatever order they are handed
//! over. Within a partition, identical rows collapse and different rows of one key are a tie,
//! refused unless `order_by` picks one. A key further away than the lookback is a new row. The
//! count dropped is in the publication record and the commit's metadata. A null key refuses the
//! delivery.

use chrono::{TimeZone as _, Utc};
use tidegate_core::partition::{Grain, Partition};
use tidegate_core::spec::model::{Dataset, Partitioning, WriteMode};
use tidegate_lake::arrow::array::RecordBatch;
use tidegate_lake::{DUPLICATES_DROPPED_KEY, Error, Lake, PublishedItem};

use crate::common::*;

/// Daily clicks, appended, de-duplicated by `key` over `lookback` earlier days.
fn clicks(key: &[&str], lookback: u32) -> Dataset {
    clicks_ordered(key, lookback, None)
}

/// [`clicks`], with `order_by`.
fn clicks_ordered(key: &[&str], lookback: u32, order_by: Option<&str>) -> Dataset {
    let write = WriteMode::Append {
        dedup_key: key.iter().map(|k| (*k).to_owned()).collect(),
        dedup_lookback: lookback,
        order_by: order_by.map(str::to_owned),
    };
    let mut ds = dataset("clicks", write, basic_columns());
    let start = Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).single().expect("a date");
    ds.partitioning = Partitioning::Time { grain: Grain::Day, start, time_zone: None };
    ds
}

/// Stages and publishes `batch` for `partitions` as step `step`; the publication's item.
async fn deliver(lake: &Lake, ds: &Dataset, partitions: &[Partition], batch: RecordBatch, step: &str) -> PublishedItem {
    let staged = lake.stage_batches(ds, &format!("stg-{step}"), partitions, vec![batch]).await.expect("stage");
    let publication = lake.publish(&release(&format!("rel-{step}"), ds, staged, step)).await.expect("publish");
    publication.items[0].clone()
}

/// The newest commit's `tidegate.duplicates_dropped`.
async fn dropped_in_commit(lake: &Lake) -> serde_json::Value {
    lake.history("clicks").await.expect("history")[0].metadata[DUPLICATES_DROPPED_KEY].clone()
}

/// `(id, value)` of every published row of one day, sorted.
async fn day_rows(lake: &Lake, key: &str) -> Vec<(i64, Option<i64>)> {
    let batches = lake.read("clicks", Some(&[key.to_owned()]), None).await.expect("read");
    let mut out = Vec::new();
    for batch in &batches {
        use tidegate_lake::arrow::array::{Array as _, AsArray as _};
        use tidegate_lake::arrow::datatypes::Int64Type;
        let ids = batch.column_by_name("id").expect("id").as_primitive::<Int64Type>();
        let values = batch.column_by_name("value").expect("value").as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            out.push((ids.value(row), values.is_valid(row).then(|| values.value(row))));
        }
    }
    out.sort();
    out
}

fn clicks_of(rows: &[(i64, i64)]) -> RecordBatch {
    let rows: Vec<(i64, Option<i64>, Option<&str>)> = rows.iter().map(|(i, v)| (*i, Some(*v), None)).collect();
    crate::common::rows(&rows, None)
}

#[tokio::test]
async fn an_append_holds_each_key_once_within_the_delivery_the_partition_and_the_lookback() {
    let (_dir, lake) = lake().await;
    let ds = clicks(&["id"], 2);
    let d = |n| day(2024, 1, n);

    // Within one delivery: identical rows of a key collapse to one.
    let item = deliver(&lake, &ds, &[d(1)], clicks_of(&[(1, 10), (2, 20), (1, 10), (3, 30), (2, 20)]), "d1").await;
    assert_eq!((item.n_rows_added, item.n_duplicates_dropped), (3, 2));
    assert_eq!(dropped_in_commit(&lake).await, 2);
    assert_eq!(day_rows(&lake, "2024-01-01").await, vec![(1, Some(10)), (2, Some(20)), (3, Some(30))]);

    // Against the published partition: a second delivery of the day adds only the new key.
    let item = deliver(&lake, &ds, &[d(1)], clicks_of(&[(3, 31), (4, 40)]), "d1-late").await;
    assert_eq!((item.n_rows_added, item.n_duplicates_dropped), (1, 1));
    assert_eq!(dropped_in_commit(&lake).await, 1);
    assert_eq!(day_rows(&lake, "2024-01-01").await, vec![(1, Some(10)), (2, Some(20)), (3, Some(30)), (4, Some(40))]);

    // Against the lookback: day 3 looks back at days 2 and 1, so key 1 (on day 1) is a late
    // re-delivery and is dropped; key 5 is new.
    let item = deliver(&lake, &ds, &[d(3)], clicks_of(&[(1, 12), (5, 50)]), "d3").await;
    assert_eq!((item.n_rows_added, item.n_duplicates_dropped), (1, 1));
    assert_eq!(day_rows(&lake, "2024-01-03").await, vec![(5, Some(50))]);

    // After the window: day 4 looks back at days 3 and 2, where key 1 is not; it is kept.
    let item = deliver(&lake, &ds, &[d(4)], clicks_of(&[(1, 13), (6, 60)]), "d4").await;
    assert_eq!((item.n_rows_added, item.n_duplicates_dropped), (2, 0));
    assert_eq!(dropped_in_commit(&lake).await, 0);
    assert_eq!(day_rows(&lake, "2024-01-04").await, vec![(1, Some(13)), (6, Some(60))]);

    // A replay of a published step adds nothing and drops nothing.
    let staged = lake.stage_batches(&ds, "stg-d4-again", &[d(4)], vec![clicks_of(&[(1, 13)])]).await.expect("stage");
    let again = lake.publish(&release("rel-d4", &ds, staged, "d4")).await.expect("replay");
    assert!(again.items[0].already_published);
    assert_eq!(again.items[0].n_duplicates_dropped, 0);

    // Every key once in the whole table: 1 (twice: day 1 and, past the window, day 4), 2..6.
    let all = read_all(&lake, "clicks").await;
    assert_eq!(all.len(), 7, "{all:?}");
}

#[tokio::test]
async fn a_delivery_over_several_partitions_keeps_the_earliest_partitions_row_within_the_lookback() {
    let (_dir, lake) = lake().await;
    let ds = clicks(&["id"], 1);
    let batch = rows(
        &[(9, Some(80), None), (7, Some(70), None), (9, Some(90), None), (9, Some(90), None)],
        Some(&["2024-01-08", "2024-01-08", "2024-01-07", "2024-01-07"]),
    );
    let item = deliver(&lake, &ds, &[day(2024, 1, 7), day(2024, 1, 8)], batch, "two-days").await;
    // Partitions in time order: key 9 stays on day 7 (its two identical rows one), day 8's is dropped.
    assert_eq!((item.n_rows_added, item.n_duplicates_dropped), (2, 2));
    assert_eq!(day_rows(&lake, "2024-01-07").await, vec![(9, Some(90))]);
    assert_eq!(day_rows(&lake, "2024-01-08").await, vec![(7, Some(70))]);
    assert_eq!(dropped_in_commit(&lake).await, 2);

    // Without a lookback, each partition is its own: as two deliveries would, both days keep key 9.
    let (_dir, lake) = crate::common::lake().await;
    let ds = clicks(&["id"], 0);
    let batch = rows(&[(9, Some(80), None), (9, Some(90), None)], Some(&["2024-01-08", "2024-01-07"]));
    let item = deliver(&lake, &ds, &[day(2024, 1, 7), day(2024, 1, 8)], batch, "two-days").await;
    assert_eq!((item.n_rows_added, item.n_duplicates_dropped), (2, 0));
}

/// Five days of three events (`10d+1` .. `10d+3`, value = id); every day but the first
/// re-delivers the previous day's last event first.
fn redelivered(d: u32) -> RecordBatch {
    let d = i64::from(d);
    let mut ids: Vec<i64> = (1..=3).map(|i| 10 * d + i).collect();
    if d > 1 {
        ids.insert(0, 10 * (d - 1) + 3);
    }
    clicks_of(&ids.iter().map(|i| (*i, *i)).collect::<Vec<_>>())
}

#[tokio::test]
async fn one_shared_commit_publishes_what_a_commit_per_day_in_order_does() {
    let ds = clicks(&["id"], 2);
    let days: Vec<Partition> = (1..=5).map(|d| day(2024, 1, d)).collect();

    // One commit per day, in order.
    let (_one_dir, one) = lake().await;
    for (d, partition) in (1..=5).zip(&days) {
        deliver(&one, &ds, std::slice::from_ref(partition), redelivered(d), &format!("d{d}")).await;
    }
    // The same five steps handed over together, newest first: one shared commit.
    let (_shared_dir, shared) = lake().await;
    let mut releases = Vec::new();
    for (d, partition) in (1..=5_u32).zip(&days).collect::<Vec<_>>().into_iter().rev() {
        let staged = shared
            .stage_batches(&ds, &format!("stg-d{d}"), std::slice::from_ref(partition), vec![redelivered(d)])
            .await
            .expect("stage");
        releases.push(release(&format!("rel-d{d}"), &ds, staged, &format!("d{d}")));
    }
    let outcomes = shared.publish_many(&releases).await;
    let items: Vec<PublishedItem> = outcomes.into_iter().map(|o| o.expect("published").items[0].clone()).collect();
    assert!(items.iter().all(|i| i.table_version == items[0].table_version), "one commit: {items:?}");
    assert_eq!(items.iter().map(|i| i.n_duplicates_dropped).sum::<u64>(), 4);

    for partition in &days {
        assert_eq!(day_rows(&shared, &partition.key).await, day_rows(&one, &partition.key).await, "{}", partition.key);
    }
    assert_eq!(read_all(&shared, "clicks").await.len(), 15);
    assert_eq!(day_rows(&shared, "2024-01-01").await, vec![(11, Some(11)), (12, Some(12)), (13, Some(13))]);
}

#[tokio::test]
async fn a_day_published_after_a_later_one_does_not_publish_its_key_again() {
    let (_dir, lake) = lake().await;
    let ds = clicks(&["id"], 2);
    // Day 2 (re-delivering day 1's last event) first, then day 1.
    deliver(&lake, &ds, &[day(2024, 1, 2)], redelivered(2), "d2").await;
    let item = deliver(&lake, &ds, &[day(2024, 1, 1)], redelivered(1), "d1").await;
    assert_eq!((item.n_rows_added, item.n_duplicates_dropped), (2, 1), "key 13 is on day 2 already");
    assert_eq!(read_all(&lake, "clicks").await.len(), 6);
}

#[tokio::test]
async fn different_rows_of_one_key_in_a_partition_are_refused_unless_order_by_picks_one() {
    let (_dir, lake) = lake().await;
    let ds = clicks(&["id"], 0);
    let tied = clicks_of(&[(1, 10), (2, 20), (1, 11)]);
    let err = lake.stage_batches(&ds, "stg-tie", &[day(2024, 1, 1)], vec![tied.clone()]).await.expect_err("a tie");
    assert!(
        matches!(&err, Error::AppendTie { key, partition, n_rows: 2, .. } if key == "(id=1)" && partition == "2024-01-01"),
        "{err}"
    );
    assert!(err.to_string().contains("declare write.order_by"), "{err}");

    // With order_by the greatest value wins, whichever order the rows came in.
    let (_dir, lake) = crate::common::lake().await;
    let ds = clicks_ordered(&["id"], 0, Some("value"));
    deliver(&lake, &ds, &[day(2024, 1, 1)], tied, "d1").await;
    deliver(&lake, &ds, &[day(2024, 1, 2)], clicks_of(&[(1, 11), (1, 10)]), "d2").await;
    assert_eq!(day_rows(&lake, "2024-01-01").await, vec![(1, Some(11)), (2, Some(20))]);
    assert_eq!(day_rows(&lake, "2024-01-02").await, vec![(1, Some(11))]);

    // Different rows sharing the greatest value are still a tie.
    let same_value = rows(&[(3, Some(30), Some("a")), (3, Some(30), Some("b"))], None);
    let err = lake.stage_batches(&ds, "stg-tie-2", &[day(2024, 1, 3)], vec![same_value]).await.expect_err("a tie");
    assert!(matches!(&err, Error::AppendTie { key, .. } if key == "(id=3)"), "{err}");
    assert!(err.to_string().contains("greatest order_by value (value)"), "{err}");
}

#[tokio::test]
async fn a_null_dedup_key_refuses_the_delivery_naming_the_column() {
    let (_dir, lake) = lake().await;
    let ds = clicks(&["id", "value"], 0);
    let batch = rows(&[(1, Some(10), None), (2, None, None), (3, None, None)], None);
    let err = lake.stage_batches(&ds, "stg-nulls", &[day(2024, 1, 1)], vec![batch]).await.expect_err("refused");
    assert!(matches!(&err, Error::NullDedupKey { column, n_rows: 2, .. } if column == "value"), "{err}");
    assert!(err.to_string().contains("2 staged rows have a null in dedup_key column \"value\""), "{err}");
    // Nothing was published.
    assert!(read_all(&lake, "clicks").await.is_empty());
}

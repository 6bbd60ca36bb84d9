//! A reviewed release (a backfill) commits only on a table whose partitions did not move since the
//! version its comparison was approved against; a live commit to other partitions does not block
//! it. The live writer is a second `Lake` handle, as another process would be.

use std::collections::BTreeMap;

use crate::common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::{Error, Lake};

/// Two partitions published at one level, a backfill of `a` staged at another, and the table
/// version its comparison would have read.
async fn staged_backfill(lake: &Lake) -> (tidegate_core::spec::Dataset, tidegate_lake::Release, u64) {
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    let both = rows(&[(1, Some(10), Some("x")), (2, Some(10), Some("y"))], Some(&["a", "b"]));
    put(lake, &ds, &[part("a"), part("b")], both, "live-1").await;
    let approved = lake.table_version("events").await.expect("version").expect("a table");
    let batch = rows(&[(1, Some(20), Some("x"))], Some(&["a"]));
    let staged = lake.stage_batches(&ds, "stg-backfill", &[part("a")], vec![batch]).await.expect("stage");
    (ds.clone(), release("rel-backfill", &ds, staged, "backfill:bf-1:events"), approved)
}

fn approved_at(version: u64) -> BTreeMap<String, Option<u64>> {
    BTreeMap::from([("events".to_owned(), Some(version))])
}

#[tokio::test]
async fn a_reviewed_release_is_refused_when_a_live_commit_moved_its_partition() {
    let (dir, lake) = lake().await;
    let (ds, backfill, approved) = staged_backfill(&lake).await;
    let live = Lake::open(&dir.url).await.expect("second handle");
    put(&live, &ds, &[part("a")], rows(&[(1, Some(30), Some("x"))], Some(&["a"])), "live-2").await;
    let before = read_all(&lake, "events").await;

    match lake.publish_approved(&backfill, &approved_at(approved)).await {
        Err(Error::MovedSinceApproval { dataset, partitions, approved_version, found_version }) => {
            assert_eq!(dataset, "events");
            assert_eq!(partitions, ["a"]);
            assert_eq!(approved_version, Some(approved));
            assert_eq!(found_version, approved + 1);
        }
        other => panic!("expected a refusal naming partition a, got {other:?}"),
    }
    assert_eq!(read_all(&lake, "events").await, before, "the live rows stay");
    assert_eq!(lake.table_version("events").await.expect("version"), Some(approved + 1), "nothing committed");
}

#[tokio::test]
async fn a_live_commit_to_other_partitions_does_not_block_a_reviewed_release() {
    let (dir, lake) = lake().await;
    let (ds, backfill, approved) = staged_backfill(&lake).await;
    let live = Lake::open(&dir.url).await.expect("second handle");
    put(&live, &ds, &[part("b")], rows(&[(2, Some(30), Some("y"))], Some(&["b"])), "live-2").await;

    let publication = lake.publish_approved(&backfill, &approved_at(approved)).await.expect("publishes");
    assert_eq!(publication.items[0].table_version, approved + 2);
    assert_eq!(
        read_all(&lake, "events").await,
        ["id=1|value=20|name=x|tg_partition=a", "id=2|value=30|name=y|tg_partition=b"],
        "the backfill's a beside the live b"
    );
}

/// A reviewed release over two datasets whose first dataset an earlier, crashed attempt had
/// committed: when the second is refused, the first is restored too, so readers see none of it.
#[tokio::test]
async fn a_refused_resume_restores_the_dataset_an_earlier_attempt_committed() {
    let (dir, lake) = lake().await;
    let first = dataset("first", WriteMode::Replace, basic_columns());
    let second = dataset("second", WriteMode::Replace, basic_columns());
    let old = || rows(&[(1, Some(10), Some("x"))], Some(&["a"]));
    put(&lake, &first, &[part("a")], old(), "live-first").await;
    put(&lake, &second, &[part("a")], old(), "live-second").await;
    let approved = BTreeMap::from([
        ("first".to_owned(), lake.table_version("first").await.expect("version")),
        ("second".to_owned(), lake.table_version("second").await.expect("version")),
    ]);
    let before_first = read_all(&lake, "first").await;
    let new = || rows(&[(1, Some(20), Some("x"))], Some(&["a"]));
    let item = |ds: &tidegate_core::spec::Dataset, staged| tidegate_lake::ReleaseItem {
        dataset: ds.clone(),
        staged,
        step_identity: format!("backfill:bf-2:{}", ds.name),
    };
    let staged_first = lake.stage_batches(&first, "stg-bf-first", &[part("a")], vec![new()]).await.expect("stage");
    let staged_second = lake.stage_batches(&second, "stg-bf-second", &[part("a")], vec![new()]).await.expect("stage");
    let backfill = tidegate_lake::Release {
        release_id: "rel-bf-2".to_owned(),
        run_id: "run-bf-2".to_owned(),
        spec_hash: "spec-hash".to_owned(),
        items: vec![item(&first, staged_first), item(&second, staged_second)],
        anchor: None,
    };

    // The crashed attempt got as far as the first dataset's commit.
    let mut crashed = backfill.clone();
    crashed.items.truncate(1);
    lake.publish_approved(&crashed, &approved).await.expect("the first dataset commits");
    assert_ne!(read_all(&lake, "first").await, before_first);
    // A live run publishes the second dataset's partition before the resume.
    let live = Lake::open(&dir.url).await.expect("second handle");
    put(&live, &second, &[part("a")], rows(&[(1, Some(30), Some("x"))], Some(&["a"])), "live-second-2").await;
    let live_second = read_all(&live, "second").await;

    match lake.publish_approved(&backfill, &approved).await {
        Err(Error::ReleaseFailed { dataset, source, restored, not_restored, .. }) => {
            assert_eq!(dataset, "second");
            assert!(matches!(*source, Error::MovedSinceApproval { .. }), "{source}");
            assert_eq!(restored.iter().map(|(d, _)| d.as_str()).collect::<Vec<_>>(), ["first"]);
            assert!(not_restored.is_empty());
        }
        other => panic!("expected the second dataset refused and the first restored, got {other:?}"),
    }
    assert_eq!(read_all(&lake, "first").await, before_first, "the crashed attempt's commit was undone");
    assert_eq!(read_all(&lake, "second").await, live_second, "the live rows stay");
}

/// The restore of a refused release never replaces newer data: a live commit to the partition the
/// crashed attempt had published leaves that dataset as the live run made it, reported as not
/// restored.
#[tokio::test]
async fn a_refusal_does_not_restore_a_dataset_over_a_newer_live_commit() {
    let (dir, lake) = lake().await;
    let first = dataset("first", WriteMode::Replace, basic_columns());
    let second = dataset("second", WriteMode::Replace, basic_columns());
    let with = |v: i64| rows(&[(1, Some(v), Some("x"))], Some(&["a"]));
    put(&lake, &first, &[part("a")], with(10), "live-first").await;
    put(&lake, &second, &[part("a")], with(10), "live-second").await;
    let approved = BTreeMap::from([
        ("first".to_owned(), lake.table_version("first").await.expect("version")),
        ("second".to_owned(), lake.table_version("second").await.expect("version")),
    ]);
    let item = |ds: &tidegate_core::spec::Dataset, staged| tidegate_lake::ReleaseItem {
        dataset: ds.clone(),
        staged,
        step_identity: format!("backfill:bf-3:{}", ds.name),
    };
    let staged_first = lake.stage_batches(&first, "stg-bf3-first", &[part("a")], vec![with(20)]).await.expect("stage");
    let staged_second =
        lake.stage_batches(&second, "stg-bf3-second", &[part("a")], vec![with(20)]).await.expect("stage");
    let backfill = tidegate_lake::Release {
        release_id: "rel-bf-3".to_owned(),
        run_id: "run-bf-3".to_owned(),
        spec_hash: "spec-hash".to_owned(),
        items: vec![item(&first, staged_first), item(&second, staged_second)],
        anchor: None,
    };
    let mut crashed = backfill.clone();
    crashed.items.truncate(1);
    lake.publish_approved(&crashed, &approved).await.expect("the first dataset commits");
    // Live runs publish both datasets' partition after the crash.
    let live = Lake::open(&dir.url).await.expect("second handle");
    put(&live, &first, &[part("a")], with(30), "live-first-2").await;
    put(&live, &second, &[part("a")], with(30), "live-second-2").await;
    let live_first = read_all(&live, "first").await;

    let err = lake.publish_approved(&backfill, &approved).await.expect_err("second dataset moved");
    match &err {
        Error::ReleaseFailed { restored, not_restored, .. } => {
            assert!(restored.is_empty(), "{restored:?}");
            assert_eq!(not_restored, &["first"]);
        }
        other => panic!("expected a failed release, got {other:?}"),
    }
    assert!(err.to_string().contains("NOT restored"), "{err}");
    assert_eq!(read_all(&lake, "first").await, live_first, "the live rows of first stay");
}

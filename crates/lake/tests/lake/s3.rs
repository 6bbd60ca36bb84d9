//! `s3://` lakes. The round trip runs against a real S3-compatible server when
//! `TIDEGATE_TEST_S3_URL` names a bucket on one (`.ci/run` starts moto's server and sets it, with
//! the `AWS_*` variables the client reads); without it that test says it was skipped (fails under CI). The refusal
//! of a store without conditional put is a unit test in `src/s3.rs`, against a small HTTP server
//! that accepts every write, as a store ignoring `If-None-Match` would.

use crate::common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::Lake;

/// A fresh prefix in the test bucket, or `None` (test skipped) when no server is configured.
fn s3_prefix(test: &str) -> Option<String> {
    let Ok(base) = std::env::var("TIDEGATE_TEST_S3_URL") else {
        tidegate_testkit::service_missing(test, "TIDEGATE_TEST_S3_URL (and AWS_* for the client)");
        return None;
    };
    Some(format!("{}/{test}-{}", base.trim_end_matches('/'), uuid::Uuid::now_v7()))
}

/// Stage, publish, replay, read with SQL, publish concurrently from two processes' worth of lake
/// handles, and roll back: the same guarantees as a folder lake, on an object store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_lake_publishes_replays_and_rolls_back_like_a_folder() {
    let Some(url) = s3_prefix("roundtrip") else { return };
    let lake = Lake::open(&url).await.expect("open the s3 lake");
    assert!(lake.root().is_none(), "an s3 lake has no folder");
    let ds = dataset("events", WriteMode::Replace, basic_columns());

    let v1 = put(&lake, &ds, &[part("a"), part("b")], rows(&[(1, Some(10), Some("x"))], Some(&["a"])), "s1").await;
    assert_eq!(read_all(&lake, "events").await, vec!["id=1|value=10|name=x|tg_partition=a"]);
    assert_eq!(lake.datasets().await.expect("list"), vec!["events".to_owned()]);

    // A replay of the same step commits nothing.
    let staged = lake
        .stage_batches(&ds, "stg-s1-again", &[part("a")], vec![rows(&[(9, None, None)], Some(&["a"]))])
        .await
        .expect("stage");
    let replay = lake.publish(&release("rel-s1", &ds, staged, "s1")).await.expect("replay");
    assert!(replay.items[0].already_published);
    assert_eq!(replay.items[0].table_version, v1);

    // Two handles (as two schedulers would have) publish different partitions at once: both land,
    // in two versions, because the store refuses the second create of a version.
    let other = Lake::open(&url).await.expect("second handle");
    let (c, d) = ([part("c")], [part("d")]);
    let (va, vb) = tokio::join!(
        put(&lake, &ds, &c, rows(&[(3, Some(30), Some("c"))], Some(&["c"])), "s3"),
        put(&other, &ds, &d, rows(&[(4, Some(40), Some("d"))], Some(&["d"])), "s4"),
    );
    assert_ne!(va, vb);
    assert_eq!(va.max(vb), v1 + 2);
    let batches = lake.sql("SELECT COUNT(*) AS n FROM events").await.expect("sql");
    assert_eq!(render(&batches), vec!["n=3"]);

    // Rollback restores the first version's files in a new commit.
    lake.rollback("events", v1, None, "rb", None, None).await.expect("rollback");
    assert_eq!(read_all(&lake, "events").await, vec!["id=1|value=10|name=x|tg_partition=a"]);
}

#[tokio::test]
async fn other_object_stores_are_refused_with_a_clear_error() {
    let err = Lake::open("gs://bucket/prefix").await.expect_err("unsupported");
    assert_eq!(err.to_string(), "lake gs://bucket/prefix: gs:// lakes are not supported; use a folder or s3://");
}

//! Publication: atomic visibility under concurrent readers, replay protection, invisible staging,
//! concurrent publishers, and restoring a release that fails part-way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::arrow::array::AsArray as _;
use tidegate_lake::arrow::datatypes::Int64Type;
use tidegate_lake::{Error, Lake, Release, ReleaseItem};

const N_PUBLISHES: i64 = 200;
const ROWS_PER_PARTITION: i64 = 4;

fn marker_batch(publish: i64, keys: &[&str]) -> tidegate_lake::arrow::array::RecordBatch {
    let mut ids = Vec::new();
    let mut markers = Vec::new();
    let mut parts = Vec::new();
    for key in keys {
        for i in 0..ROWS_PER_PARTITION {
            ids.push(i);
            markers.push(publish);
            parts.push(*key);
        }
    }
    batch(vec![("id", ints(&ids)), ("marker", ints(&markers)), ("tg_partition", strs(&parts))])
}

/// Invariant 1: a reader loading the table afresh in a loop sees either the previous complete
/// version or the next one, never rows from two publications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_a_mixture_of_two_publications() {
    let (_dir, lake) = lake().await;
    let ds = dataset("markers", WriteMode::Replace, vec![col("id", "int64", false), col("marker", "int64", false)]);
    let keys = ["a", "b", "c"];
    let partitions: Vec<_> = keys.iter().map(|k| part(k)).collect();
    put(&lake, &ds, &partitions, marker_batch(0, &keys), "publish-0").await;

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let lake = lake.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut n_reads = 0u64;
            let mut markers_seen = std::collections::BTreeSet::new();
            loop {
                // `read` loads a fresh DeltaTable every time.
                let batches = lake.read("markers", None, None).await.expect("read");
                let n_rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                assert_eq!(n_rows as i64, 3 * ROWS_PER_PARTITION, "a read saw a partial version");
                let mut markers = std::collections::BTreeSet::new();
                for b in &batches {
                    let m = b.column_by_name("marker").expect("marker column");
                    markers.extend(m.as_primitive::<Int64Type>().values().iter().copied());
                }
                assert_eq!(markers.len(), 1, "a read mixed publications: {markers:?}");
                markers_seen.extend(markers);
                n_reads += 1;
                if done.load(Ordering::SeqCst) {
                    return (n_reads, markers_seen.len());
                }
            }
        })
    };
    for publish in 1..=N_PUBLISHES {
        put(&lake, &ds, &partitions, marker_batch(publish, &keys), &format!("publish-{publish}")).await;
    }
    done.store(true, Ordering::SeqCst);
    let (n_reads, n_distinct) = reader.await.expect("reader task");
    assert!(n_reads > 1 && n_distinct >= 1);
    let last = lake.read("markers", None, None).await.expect("read");
    let m = last[0].column_by_name("marker").expect("marker");
    assert_eq!(m.as_primitive::<Int64Type>().value(0), N_PUBLISHES);
    assert_eq!(lake.table_version("markers").await.expect("version"), Some(N_PUBLISHES as u64 + 1));
}

/// Invariant 2: publishing the same step identity again commits nothing and returns the version
/// recorded the first time, even with a different staged version.
#[tokio::test]
async fn replaying_a_publication_is_a_no_op_returning_the_recorded_version() {
    let (_dir, lake) = lake().await;
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    let staged = lake
        .stage_batches(&ds, "attempt-1", &[part("eu")], vec![rows(&[(1, Some(10), Some("x"))], None)])
        .await
        .expect("stage");
    let first = lake.publish(&release("r1", &ds, staged.clone(), "step-eu")).await.expect("publish");
    assert!(!first.items[0].already_published);
    let version = first.items[0].table_version;

    let other = lake
        .stage_batches(&ds, "attempt-2", &[part("eu")], vec![rows(&[(2, Some(20), None)], None)])
        .await
        .expect("stage");
    let replay = lake.publish(&release("r1", &ds, other, "step-eu")).await.expect("replay");
    assert!(replay.items[0].already_published);
    assert_eq!(replay.items[0].table_version, version);
    assert_eq!(lake.table_version("events").await.expect("version"), Some(version));
    assert_eq!(read_all(&lake, "events").await, vec!["id=1|value=10|name=x|tg_partition=eu"]);

    let history = lake.history("events").await.expect("history");
    let newest = &history[0];
    assert_eq!(newest.version, version);
    assert_eq!(newest.metadata["tidegate.step"], "step-eu");
    assert_eq!(newest.metadata["tidegate.release_id"], "r1");
    assert_eq!(newest.metadata["tidegate.run_id"], "run-r1");
    assert_eq!(newest.metadata["tidegate.spec_hash"], "spec-hash");
}

/// Staged files are not referenced by the log, so a fresh read sees only published rows.
#[tokio::test]
async fn staged_files_are_invisible_until_published() {
    let (dir, lake) = lake().await;
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    put(&lake, &ds, &[part("eu")], rows(&[(1, Some(1), None)], None), "old").await;
    let before = read_all(&lake, "events").await;
    let version = lake.table_version("events").await.expect("version");

    let staged = lake
        .stage_batches(&ds, "pending", &[part("eu")], vec![rows(&[(9, Some(9), None)], None)])
        .await
        .expect("stage");
    assert!(!staged.files.is_empty());
    for file in &staged.files {
        // In its partition's folder, named with the staging id that proves whose it is.
        assert!(file.path.starts_with("tg_partition=eu/part-pending-"), "{}", file.path);
        assert!(dir.exists(&format!("events/{}", file.path)).await, "{}", file.path);
    }
    assert_eq!(read_all(&lake, "events").await, before);
    assert_eq!(lake.table_version("events").await.expect("version"), version);
    assert_eq!(
        lake.sql("SELECT count(*) AS n FROM events")
            .await
            .map(|b| { b[0].column(0).as_primitive::<Int64Type>().value(0) })
            .expect("sql"),
        1
    );
}

/// Several publishers racing on one table all land, each re-planned against the newer table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_are_serialised_by_conflict_retries() {
    let (_dir, lake) = lake().await;
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    put(&lake, &ds, &[part("p0")], rows(&[(0, None, None)], None), "seed").await;
    let mut tasks = Vec::new();
    for i in 1..=6i64 {
        let lake = lake.clone();
        let ds = ds.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("p{}", i % 3);
            let staged = lake
                .stage_batches(&ds, &format!("s{i}"), &[part(&key)], vec![rows(&[(i, Some(i), None)], None)])
                .await
                .expect("stage");
            lake.publish(&release(&format!("r{i}"), &ds, staged, &format!("step-{i}")))
                .await
                .expect("publish despite conflicts")
        }));
    }
    let mut versions = Vec::new();
    for task in tasks {
        versions.push(task.await.expect("task").items[0].table_version);
    }
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(versions.len(), 6, "every publisher got its own commit");
    // Each partition holds exactly one row: replaces never stacked up.
    let rows = lake.read("events", None, None).await.expect("read");
    let ids: usize = rows.iter().map(|b| b.num_rows()).sum();
    assert_eq!(ids, 3);
}

/// A release whose second dataset fails restores the first dataset and says so; retrying the
/// release after the fault is fixed publishes both.
#[tokio::test]
async fn a_release_failing_on_its_second_dataset_restores_the_first() {
    let (dir, lake) = lake().await;
    let first = dataset("first", WriteMode::Replace, basic_columns());
    let second = dataset("second", WriteMode::Replace, basic_columns());
    put(&lake, &first, &[part("x")], rows(&[(1, Some(1), Some("old"))], None), "seed-1").await;
    put(&lake, &second, &[part("x")], rows(&[(1, Some(1), Some("old"))], None), "seed-2").await;
    let before_first = read_all(&lake, "first").await;
    let before_second = read_all(&lake, "second").await;

    let staged_first = lake
        .stage_batches(&first, "rel-a", &[part("x")], vec![rows(&[(2, Some(2), Some("new"))], None)])
        .await
        .expect("stage");
    let staged_second = lake
        .stage_batches(&second, "rel-b", &[part("x")], vec![rows(&[(2, Some(2), Some("new"))], None)])
        .await
        .expect("stage");
    // The second dataset's staged file disappears before publication: its commit must fail.
    let lost = format!("second/{}", staged_second.files[0].path);
    let saved = dir.read(&lost).await;
    dir.remove(&lost).await;

    let release = Release {
        release_id: "rel".to_owned(),
        run_id: "run".to_owned(),
        spec_hash: "h".to_owned(),
        items: vec![
            ReleaseItem { dataset: first.clone(), staged: staged_first, step_identity: "s-first".to_owned() },
            ReleaseItem { dataset: second.clone(), staged: staged_second, step_identity: "s-second".to_owned() },
        ],
        anchor: None,
    };
    let err = lake.publish(&release).await.expect_err("second dataset must fail");
    match &err {
        Error::ReleaseFailed { dataset, source, restored, not_restored, .. } => {
            assert_eq!(dataset, "second");
            assert!(matches!(**source, Error::MissingStagedFile { .. }), "{source}");
            assert_eq!(restored.len(), 1);
            assert_eq!(restored[0].0, "first");
            assert!(not_restored.is_empty());
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(err.to_string().contains("restored: first at version"), "{err}");
    assert_eq!(read_all(&lake, "first").await, before_first);
    assert_eq!(read_all(&lake, "second").await, before_second);

    // After the fault is repaired the same release publishes both datasets: the restore marked
    // the first step's txn as undone, so it is not mistaken for a replay.
    dir.write(&lost, &saved).await;
    let publication = lake.publish(&release).await.expect("retry");
    assert!(publication.items.iter().all(|i| !i.already_published));
    assert_eq!(read_all(&lake, "first").await, vec!["id=2|value=2|name=new|tg_partition=x"]);
    assert_eq!(read_all(&lake, "second").await, vec!["id=2|value=2|name=new|tg_partition=x"]);
}

/// Many releases published together share one commit per dataset where their partitions are
/// disjoint, yet each step stays replay-safe on its own: a second `publish_many` of the same
/// steps commits nothing, overlapping releases land in later commits in order, and one release
/// that cannot publish (its staged file is gone) fails alone.
#[tokio::test]
async fn releases_published_together_share_commits_and_stay_replay_safe() {
    let (dir, lake) = lake().await;
    let events = dataset("events", WriteMode::Replace, basic_columns());
    let other = dataset("other", WriteMode::Replace, basic_columns());
    let stage = |ds: &tidegate_core::spec::model::Dataset, id: &str, key: &str, value: i64| {
        let (lake, ds, id, key) = (lake.clone(), ds.clone(), id.to_owned(), key.to_owned());
        async move {
            lake.stage_batches(&ds, &id, &[part(&key)], vec![rows(&[(1, Some(value), Some(&key))], None)])
                .await
                .expect("stage")
        }
    };
    let releases = vec![
        release("r-eu", &events, stage(&events, "s-eu", "eu", 1).await, "step-eu"),
        release("r-us", &events, stage(&events, "s-us", "us", 2).await, "step-us"),
        // Same partition as r-eu: must land after it, in its own commit.
        release("r-eu-2", &events, stage(&events, "s-eu-2", "eu", 3).await, "step-eu-2"),
        release("r-o", &other, stage(&other, "s-o", "eu", 4).await, "step-o"),
    ];
    let gone = stage(&events, "s-gone", "ap", 5).await;
    dir.remove(&format!("events/{}", gone.files[0].path)).await;
    let mut all = releases.clone();
    all.push(release("r-gone", &events, gone, "step-gone"));

    let results = lake.publish_many(&all).await;
    let versions: Vec<u64> =
        results[..4].iter().map(|r| r.as_ref().expect("published").items[0].table_version).collect();
    assert_eq!(versions[0], versions[1], "disjoint releases of one dataset share a commit");
    assert!(versions[2] > versions[0], "an overlapping release commits after the one it overlaps");
    assert!(matches!(results[4], Err(Error::MissingStagedFile { .. })), "{:?}", results[4]);
    let mut events = read_all(&lake, "events").await;
    events.sort();
    assert_eq!(events, ["id=1|value=2|name=us|tg_partition=us", "id=1|value=3|name=eu|tg_partition=eu"]);
    assert_eq!(read_all(&lake, "other").await, vec!["id=1|value=4|name=eu|tg_partition=eu"]);
    let shared = lake.history("events").await.expect("history").into_iter().find(|h| h.version == versions[0]);
    let shared = shared.expect("the shared commit is in the history");
    assert_eq!(shared.metadata["tidegate.steps"], serde_json::json!(["step-eu", "step-us"]));

    // Replaying the whole batch commits nothing and reports where each step's effect is.
    let before = lake.table_version("events").await.expect("version");
    let replay = lake.publish_many(&releases).await;
    for (first, again) in results.iter().zip(&replay) {
        let (first, again) = (&first.as_ref().expect("ok").items[0], &again.as_ref().expect("replay").items[0]);
        assert!(again.already_published);
        assert_eq!(again.table_version, first.table_version);
    }
    assert_eq!(lake.table_version("events").await.expect("version"), before);
}

/// The replay guard with tables kept loaded between publications: two handles on one lake (as two
/// processes have), each with its own cached table and `txn` map, publish past several Delta
/// checkpoints. Each handle sees the other's steps as published (the map advances from the new
/// commits, and a fresh handle reads it from the checkpoint), and a step both publish at once is
/// committed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_with_cached_tables_never_publish_a_step_twice() {
    let (dir, a) = lake().await;
    let b = Lake::open(&dir.url).await.expect("second handle");
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    put(&a, &ds, &[part("p-seed")], rows(&[(0, None, None)], None), "seed").await;
    // Both handles have the table cached from here on.
    assert_eq!(b.table_version("events").await.expect("version"), Some(1));

    let stage = |lake: &Lake, id: String, key: String| {
        let (lake, ds) = (lake.clone(), ds.clone());
        async move {
            lake.stage_batches(&ds, &id, &[part(&key)], vec![rows(&[(1, Some(1), Some(&key))], None)])
                .await
                .expect("stage")
        }
    };
    // 25 publications by `a` cross the checkpoints written every 10 commits.
    let mut published = Vec::new();
    for i in 0..25 {
        let staged = stage(&a, format!("a-{i}"), format!("p{i}")).await;
        let r = release(&format!("r-a-{i}"), &ds, staged, &format!("step-a-{i}"));
        let version = a.publish(&r).await.expect("publish").items[0].table_version;
        published.push((r, version));
    }
    // `b` replays every one of them (with output staged anew): all are already published.
    let before = b.table_version("events").await.expect("version");
    for (r, version) in &published {
        let mut again = r.clone();
        again.items[0].staged = stage(&b, format!("b-{}", r.release_id), "p-other".to_owned()).await;
        let replay = b.publish(&again).await.expect("replay");
        assert!(replay.items[0].already_published, "{} was taken for new", r.release_id);
        assert_eq!(replay.items[0].table_version, *version);
    }
    assert_eq!(b.table_version("events").await.expect("version"), before, "a replay commits nothing");

    // A fresh handle reads the map from the last checkpoint and the commits after it.
    let cold = Lake::open(&dir.url).await.expect("third handle");
    let (r, version) = &published[3];
    let replay = cold.publish(r).await.expect("replay on a cold handle");
    assert!(replay.items[0].already_published);
    assert_eq!(replay.items[0].table_version, *version);

    // Both warm handles publish the same new step at once, ten times over: one commit each.
    for i in 0..10 {
        let key = format!("race-{i}");
        let step = format!("step-race-{i}");
        let ra = release(&format!("r-race-a-{i}"), &ds, stage(&a, format!("ra-{i}"), key.clone()).await, &step);
        let rb = release(&format!("r-race-b-{i}"), &ds, stage(&b, format!("rb-{i}"), key).await, &step);
        let (pa, pb) = tokio::join!(a.publish(&ra), b.publish(&rb));
        let (pa, pb) = (pa.expect("a").items[0].clone(), pb.expect("b").items[0].clone());
        assert_eq!(pa.table_version, pb.table_version, "both report the one commit");
        assert!(pa.already_published != pb.already_published, "exactly one of them committed: {pa:?} {pb:?}");
    }
    let history = a.history("events").await.expect("history");
    for i in 0..10 {
        let step = serde_json::json!(format!("step-race-{i}"));
        let commits = history.iter().filter(|c| c.metadata.get("tidegate.step") == Some(&step)).count();
        assert_eq!(commits, 1, "step-race-{i} is in exactly one commit");
    }
}

/// A table deleted under a handle that has it loaded reads as no table there, as it does for a
/// handle that never loaded it (the handle brings a cached table up to date without first
/// looking whether it exists; its commit is gone, so it looks then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_deleted_under_a_handle_that_loaded_it_reads_as_no_table() {
    let (dir, a) = lake().await;
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    put(&a, &ds, &[part("p-seed")], rows(&[(0, None, None)], None), "seed").await;
    assert!(a.table_version("events").await.expect("version").is_some(), "loaded, and cached");
    for file in dir.list("events/_delta_log").await {
        dir.remove(&file).await;
    }
    assert_eq!(a.table_version("events").await.expect("version"), None, "the handle that loaded it");
    let b = Lake::open(&dir.url).await.expect("second handle");
    assert_eq!(b.table_version("events").await.expect("version"), None, "a handle that never did");
}

/// A table deleted and created again with other columns after a step staged for the old one
/// (with as many versions, so the version numbers alone cannot tell): the handle that staged
/// notices the new table's schema, refuses the publication naming the column it would drop, and
/// leaves the new table as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_staged_for_a_replaced_table_is_not_published_into_it() {
    let (dir, a) = lake().await;
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    put(&a, &ds, &[part("p-seed")], rows(&[(0, None, None)], None), "seed").await;
    let staged =
        a.stage_batches(&ds, "late", &[part("p1")], vec![rows(&[(1, Some(1), Some("x"))], None)]).await.expect("stage");

    // The staged files stay where they are; only the table's log goes.
    for file in dir.list("events/_delta_log").await {
        dir.remove(&file).await;
    }
    let b = Lake::open(&dir.url).await.expect("second handle");
    let other = dataset("events", WriteMode::Replace, vec![col("id", "int64", false), col("note", "string", true)]);
    let seed = batch(vec![("id", ints(&[7])), ("note", strs(&["new table"])), ("tg_partition", strs(&["p-seed"]))]);
    put(&b, &other, &[part("p-seed")], seed, "seed-b").await;
    let version = b.table_version("events").await.expect("version");
    assert_eq!(version, Some(1), "the new table is at the version `a` last saw of the old one");
    let before = read_all(&b, "events").await;

    let err =
        a.publish(&release("r-late", &ds, staged, "step-late")).await.expect_err("a publication into the new table");
    // Publishing the old spec's columns into the new table would drop `note` from it, a change
    // only a rewrite of every file may make.
    assert!(
        matches!(&err, Error::SchemaNeedsRewrite { dataset, change, .. }
            if dataset == "events" && change == "column note dropped (or renamed)"),
        "{err}"
    );
    assert_eq!(b.table_version("events").await.expect("version"), version, "nothing was committed");
    assert_eq!(read_all(&b, "events").await, before);
}

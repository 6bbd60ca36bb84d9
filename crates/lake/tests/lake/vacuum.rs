//! Vacuum keeps every file a kept version needs, across a Delta checkpoint, never touches the log
//! or unpublished staging, and a rollback to a vacuumed version is refused instead of committing
//! references to missing files.

use std::collections::BTreeSet;

use crate::common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::Error;

/// Publications of partition `p`, each replacing the previous one: enough to cross the table's
/// checkpoint (every 10 commits).
const N_PUBLISHES: i64 = 12;

/// Whether every one of `files` (paths in table `vac`) is in the lake.
async fn all_exist(place: &Place, files: &[&String]) -> bool {
    for file in files {
        if !place.exists(&format!("vac/{file}")).await {
            return false;
        }
    }
    true
}

/// Whether none of `files` (paths in table `vac`) is in the lake.
async fn none_exist(place: &Place, files: &[String]) -> bool {
    for file in files {
        if place.exists(&format!("vac/{file}")).await {
            return false;
        }
    }
    true
}

#[tokio::test]
async fn vacuum_keeps_what_kept_versions_need_and_nothing_else() {
    let (dir, lake) = lake().await;
    let ds = dataset("vac", WriteMode::Replace, basic_columns());
    let mut files = Vec::new(); // files[i] is the file version i + 1 published
    for i in 1..=N_PUBLISHES {
        let staged = lake
            .stage_batches(&ds, &format!("s{i}"), &[part("p")], vec![rows(&[(i, None, None)], None)])
            .await
            .expect("stage");
        files.push(staged.files[0].path.clone());
        let version =
            lake.publish(&release(&format!("r{i}"), &ds, staged, &format!("step-{i}"))).await.expect("publish");
        assert_eq!(version.items[0].table_version, u64::try_from(i).expect("small"));
    }
    let q = lake.stage_batches(&ds, "q", &[part("q")], vec![rows(&[(100, None, None)], None)]).await.expect("stage");
    lake.publish(&release("rq", &ds, q.clone(), "step-q")).await.expect("publish q");
    let current = u64::try_from(N_PUBLISHES).expect("small") + 1;
    let live =
        lake.stage_batches(&ds, "live", &[part("p")], vec![rows(&[(7, None, None)], None)]).await.expect("stage");
    let dead =
        lake.stage_batches(&ds, "dead", &[part("p")], vec![rows(&[(8, None, None)], None)]).await.expect("stage");
    let log_before = dir.list("vac/_delta_log").await;
    let rows_before = read_all(&lake, "vac").await;

    // Keep version 5 (older than the checkpoint at 10) and the current one.
    let keep = BTreeSet::from([5]);
    let protected = ["live".to_owned()];
    let dry = lake.vacuum("vac", &keep, &protected, true).await.expect("dry run");
    let expected: Vec<String> = {
        let mut e: Vec<String> =
            files.iter().enumerate().filter(|(i, _)| ![4, 11].contains(i)).map(|(_, f)| f.clone()).collect();
        e.sort();
        e
    };
    assert_eq!(dry.deleted, expected, "every replaced file except version 5's and the current one");
    assert_eq!(dry.kept_versions, vec![5, current]);
    assert_eq!(dry.n_left_unpublished, live.files.len() + dead.files.len(), "staging is reconcile's");
    assert!(dry.dry_run);
    assert!(dry.n_bytes_deleted > 0);
    assert!(all_exist(&dir, &dry.deleted.iter().collect::<Vec<_>>()).await, "a dry run deletes nothing");

    let done = lake.vacuum("vac", &keep, &protected, false).await.expect("vacuum");
    assert_eq!(done.deleted, dry.deleted);
    assert_eq!(done.n_bytes_deleted, dry.n_bytes_deleted);
    assert!(none_exist(&dir, &done.deleted).await);
    assert!(all_exist(&dir, &[&files[4], &files[11], &q.files[0].path]).await);
    assert!(all_exist(&dir, &[&live.files[0].path, &dead.files[0].path]).await);
    assert_eq!(dir.list("vac/_delta_log").await, log_before, "the log is never touched");
    assert_eq!(read_all(&lake, "vac").await, rows_before, "the current version reads the same");

    // A kept version can still be restored; a vacuumed one is refused and nothing is committed.
    let err = lake.rollback("vac", 4, None, "rb-4", None, None).await.expect_err("version 4 was vacuumed");
    assert!(matches!(&err, Error::VacuumedVersion { version: 4, .. }), "{err}");
    assert!(err.to_string().contains("vacuum removed"), "{err}");
    assert_eq!(lake.table_version("vac").await.expect("version"), Some(current), "nothing committed");
    lake.rollback("vac", 5, None, "rb-5", None, None).await.expect("version 5 was kept");
    assert_eq!(read_all(&lake, "vac").await, vec!["id=5|value=null|name=null|tg_partition=p"]);

    // Version 12's and q's files are now only in history: protected staging ids still keep them.
    let protected = ["s12".to_owned(), "q".to_owned()];
    let again = lake.vacuum("vac", &BTreeSet::new(), &protected, false).await.expect("vacuum");
    assert!(again.deleted.is_empty(), "{:?}", again.deleted);
    let last = lake.vacuum("vac", &BTreeSet::new(), &[], false).await.expect("vacuum");
    let mut gone = vec![files[11].clone(), q.files[0].path.clone()];
    gone.sort();
    assert_eq!(last.deleted, gone);
    assert_eq!(read_all(&lake, "vac").await, vec!["id=5|value=null|name=null|tg_partition=p"]);
}

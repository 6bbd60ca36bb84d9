//! Reconciling the store with the lake: removing what Tidegate can prove is its own and abandoned
//! (staged files of finished attempts, attempt folders and old logs in the workspace's working
//! folders, old log copies in the lake), and reporting every other difference between what the
//! store declares and what the tables hold.

use std::collections::{BTreeSet, HashSet};
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_core::spec::model::DatasetKind;
use tidegate_engine::attempt::{attempt_name, default_work_dir, staging_attempt, staging_id};
use tidegate_engine::leftovers::{self, Swept};
use tidegate_lake::{
    Declared, Deletion, Differences, FILE_TIME_GRANULARITY, OBJECT_STORE_CLOCK_SKEW, Owner, Reconciliation, Scope,
    StagedVersion,
};
use tidegate_store::{ActiveStep, Decision, JournalMeta, Store};

use crate::actor::{Access, require};
use crate::workspace::{Workspace, open_lake, runtime};

/// How long finished attempts' logs are kept unless a reconcile is told otherwise.
pub const DEFAULT_KEEP_LOGS: &str = "30d";

/// The most releases read to learn which table versions the store knows.
pub const MAX_RELEASES_RECONCILED: u32 = 1_000_000;

/// What one reconciliation removed and found.
#[derive(Debug, Serialize)]
pub struct Reconciled {
    #[serde(flatten)]
    /// What was deleted, kept and left alone in the lake.
    pub cleaned: Reconciliation,
    #[serde(flatten)]
    /// Where the store and the lake disagree.
    pub differences: Differences,
    /// What finished attempts left in the workspace's working folders (its own and its
    /// workers'), removed.
    pub attempts: Swept,
    /// Copies of finished attempts' logs older than the logs are kept for, removed from the lake
    /// (`<step>/attempt-<n>.<stream>.log` under `_tidegate/logs`).
    pub log_copies_removed: Vec<String>,
}

/// Staging ids of attempts that may still publish: the current attempt of every step that is
/// not terminal, and every staging folder the versions of those steps use (a checkpointing task's
/// granules are staged apart and carried from attempt to attempt).
pub fn live_staging_ids(store: &dyn Store, active: &[ActiveStep]) -> Result<Vec<String>> {
    let mut live: Vec<String> = Vec::new();
    for a in active {
        live.push(staging_id(&a.step.id, a.step.state.attempt));
        for version in store.versions(&a.step.id)? {
            let paths = version.files.get("files").and_then(|f| f.as_array()).into_iter().flatten();
            for path in paths.filter_map(|f| f.get("path").and_then(|p| p.as_str())) {
                if let Some(staging_id) = path.split('/').nth(1) {
                    live.push(staging_id.to_owned());
                }
            }
        }
    }
    live.sort();
    live.dedup();
    Ok(live)
}

/// What the store declares: the table versions of its releases and the staged versions of steps
/// that may still publish.
fn declared(store: &dyn Store, active: &[ActiveStep], written: &BTreeSet<String>) -> Result<Declared> {
    let mut declared = Declared { datasets: written.clone(), ..Declared::default() };
    for release in store.releases(None, MAX_RELEASES_RECONCILED)? {
        for item in release.items {
            let version = u64::try_from(item.delta_version).context("a release records a negative table version")?;
            declared
                .release_ids
                .entry(item.dataset.clone())
                .or_default()
                .entry(version)
                .or_default()
                .insert(release.id.clone());
            declared.release_versions.entry(item.dataset).or_default().insert(version);
        }
    }
    for active in active {
        for record in store.versions(&active.step.id)?.into_iter().filter(|v| v.attempt == active.step.state.attempt) {
            let staged: StagedVersion = serde_json::from_value(record.files)
                .with_context(|| format!("decoding the staged version {}", record.id))?;
            declared.staged.push(staged);
        }
    }
    Ok(declared)
}

/// The datasets whose tables the workspace writes (not `[external]` ones).
fn written_datasets(ws: &Workspace) -> BTreeSet<String> {
    let managed = ws.spec.datasets.values().filter(|d| matches!(d.kind, DatasetKind::Managed { .. }));
    managed.map(|d| d.name.clone()).collect()
}

/// Who owns a staging id, as this workspace's store knows it now: an attempt of a step that may
/// still publish, an attempt of a finished step, or nobody it knows. Asked after the lake was
/// listed, so an attempt claimed since reconcile started is seen. Any attempt of an unfinished
/// step is kept, not only its current one: a checkpointing step carries earlier attempts'
/// granules into its version. Step ids are minted by the store (UUIDs), so another workspace's
/// staging ids are never this store's.
fn owner_of(store: &dyn Store, id: &str) -> Result<Owner> {
    let Some((step_id, attempt)) = staging_attempt(id) else { return Ok(Owner::Unknown) };
    let Some(step) = store.step(step_id)? else { return Ok(Owner::Unknown) };
    if !store.attempts(step_id)?.iter().any(|a| a.attempt == attempt) {
        return Ok(Owner::Unknown);
    }
    if !step.status().is_terminal() {
        return Ok(Owner::Live);
    }
    Ok(Owner::Finished)
}

/// Removes abandoned staging files and what finished attempts left in the workspace (logs older
/// than `keep_logs`), and compares what the store declares with what the tables hold.
pub fn reconciled(ws: &Workspace, store: &dyn Store, actor: &Actor, keep_logs: chrono::Duration) -> Result<Reconciled> {
    require(actor, Access::ChangeTables)?;
    // Taken before the store is read: log copies written after it may belong to an attempt the
    // read did not see, and are kept.
    let known_as_of = ws.now();
    let active = store.active_steps()?;
    let datasets = written_datasets(ws);
    let declared = declared(store, &active, &datasets)?;
    let logs_before = ws.now() - keep_logs;
    let unfinished: HashSet<&str> = active.iter().map(|a| a.step.id.as_str()).collect();
    let (cleaned, differences, log_copies_removed) = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        // Before anything loads a table: a broken commit is named, not misread.
        for dataset in datasets.iter().chain(declared.release_versions.keys()) {
            lake.check_commits(dataset).await?;
        }
        // Ownership is proven from the store: a store the lake contradicts proves nothing.
        crate::anchor::refuse_unvouched(ws, store, &lake, "reconcile").await?;
        let differences = lake.differences(&declared).await?;
        let held = differences.disputed();
        let scope = Scope { datasets, held };
        let owner = |id: &str| owner_of(store, id);
        let cleaned = lake.reconcile(&scope, owner, Deletion::Abandoned).await?;
        // A step claimed after the store was read writes copies after it (by the lake's clock:
        // an object store's may be behind or ahead of this machine's).
        let skew = if lake.root().is_some() { FILE_TIME_GRANULARITY } else { OBJECT_STORE_CLOCK_SKEW };
        let cutoff = logs_before.min(known_as_of - skew);
        let copies = lake.sweep_logs(cutoff, &|step| unfinished.contains(step)).await?;
        anyhow::Ok((cleaned, differences, copies))
    })?;
    // The workspace folders of the same unfinished attempts (named by step and attempt number).
    let running: HashSet<String> = active.iter().map(|a| attempt_name(&a.step.id, a.step.state.attempt)).collect();
    let folders_before = SystemTime::from(known_as_of - FILE_TIME_GRANULARITY);
    let logs_before = folders_before.min(SystemTime::from(logs_before));
    let mut attempts = Swept::default();
    for work_dir in work_dirs(ws)? {
        let swept = leftovers::sweep(&work_dir, &running, folders_before, logs_before)
            .with_context(|| format!("removing what finished attempts left in {}", work_dir.display()))?;
        attempts.absorb(swept);
    }
    Ok(Reconciled { cleaned, differences, attempts, log_copies_removed })
}

/// The workspace's working folders: its own `.tidegate`, and the folder of each worker started in
/// it without one of its own (`.tidegate/workers/<name>`).
fn work_dirs(ws: &Workspace) -> Result<Vec<std::path::PathBuf>> {
    let own = default_work_dir(&ws.root);
    let mut dirs = vec![own.clone()];
    let workers = own.join("workers");
    match std::fs::read_dir(&workers) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.with_context(|| format!("listing {}", workers.display()))?;
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("listing {}", workers.display())),
    }
    Ok(dirs)
}

/// Deletes exactly `files` (`DATASET/PATH`), each of which reconcile must report as not provably
/// Tidegate's, and journals who deleted them.
pub fn delete_reported(ws: &Workspace, store: &dyn Store, actor: &Actor, files: &[String]) -> Result<Reconciliation> {
    require(actor, Access::ChangeTables)?;
    let scope = Scope { datasets: written_datasets(ws), held: BTreeSet::new() };
    let report = runtime()?.block_on(async {
        let owner = |id: &str| owner_of(store, id);
        open_lake(ws).await?.reconcile(&scope, owner, Deletion::Named(files)).await
    })?;
    let decision = Decision {
        kind: "reported_files_deleted".to_owned(),
        run_id: None,
        task: None,
        partition: None,
        payload: serde_json::json!({ "deleted": report.deleted }),
    };
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: format!("reconcile-{}", uuid::Uuid::now_v7()),
        reason: "tidegate reconcile --delete".to_owned(),
        at: ws.now(),
    };
    store.record_decision(&decision, &meta).context("journaling the deleted files")?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use chrono::Duration;
    use tidegate_core::retry::ErrorClass;
    use tidegate_core::state::StepEvent;
    use tidegate_engine::attempt::staging_id;
    use tidegate_lake::Owner;
    use tidegate_store::Store;
    use tidegate_testkit::store::{event, meta, new_steps, run_request};

    use super::owner_of;

    fn commit(store: &dyn Store, step_id: &str, ev: StepEvent, at: chrono::DateTime<chrono::Utc>) {
        store.commit(&[event(step_id, ev, at)]).expect("committing an event");
    }

    /// The store's answer as a step moves on, read afresh each time: an attempt of a step that may still publish is live, the current one or an earlier
    /// one (its version may carry that attempt's granules); once the step has finished, every
    /// attempt of it is finished; an attempt or a step the store never recorded is nobody's.
    #[test]
    fn any_attempt_of_an_unfinished_step_is_live_and_every_attempt_of_a_finished_step_is_finished() {
        let dir = tempfile::tempdir().expect("a temp folder");
        let store = tidegate_store::open(dir.path().join("state.db").to_str().expect("utf-8")).expect("a store");
        let t0 = tidegate_testkit::fixed_instant();
        let run = store.create_run(&run_request("task_0"), &new_steps(1), &meta(t0)).expect("a run");
        let id = store.steps(&run.id).expect("its steps")[0].id.clone();
        let owner = |attempt: u32| owner_of(store.as_ref(), &staging_id(&id, attempt)).expect("an owner");

        commit(store.as_ref(), &id, StepEvent::DepsMet { inputs: vec![] }, t0);
        let first = store.claim_step(&id, "w1", t0, 30, &meta(t0)).expect("a claim").expect("ready");
        assert_eq!((owner(1), owner(2)), (Owner::Live, Owner::Unknown), "attempt 2 is not recorded yet");

        let expired = t0 + Duration::seconds(40);
        commit(store.as_ref(), &id, StepEvent::LeaseExpired { epoch: first.epoch, at: expired, jitter: 0.0 }, expired);
        commit(store.as_ref(), &id, StepEvent::RetryDue, t0 + Duration::seconds(100));
        let at = t0 + Duration::seconds(120);
        let second = store.claim_step(&id, "w2", at, 30, &meta(at)).expect("a claim").expect("ready");
        assert_eq!(second.attempt, 2);
        assert_eq!((owner(1), owner(2)), (Owner::Live, Owner::Live), "the step may still publish");

        let failed = StepEvent::AttemptFailed {
            epoch: second.epoch,
            class: ErrorClass::Deterministic,
            reason: "bad data".to_owned(),
            at,
            jitter: 0.0,
        };
        commit(store.as_ref(), &id, failed, at);
        assert_eq!((owner(1), owner(2)), (Owner::Finished, Owner::Finished), "a failed step never publishes");
        assert_eq!(owner(3), Owner::Unknown);

        let strangers = [staging_id("0192f5e4-0000-7000-8000-000000000000", 1), "notes".to_owned()];
        for id in strangers {
            assert_eq!(owner_of(store.as_ref(), &id).expect("an owner"), Owner::Unknown, "{id}");
        }
    }
}

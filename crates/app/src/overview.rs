//! The overview: every dataset Tidegate writes by its partitions, each partition in one state
//! (published, stale, failed, running, queued, waiting for its source, missed, never built), and
//! one partition's steps with their attempts and versions. What the web UI's grid shows; computed
//! from the store (the newest step of each partition, the publications replayed, the schedule's
//! debt and the staleness judgement), never from the lake.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::spec::DatasetKind;
use tidegate_core::state::StepStatus;
use tidegate_store::{AttemptRecord, StepRecord, Store, VersionRecord};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// What a partition of a dataset is now, as one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CellState {
    /// Visible to readers, built from the inputs and code it would be built from now.
    Published,
    /// Visible, but built on inputs or code that changed since (`tidegate stale`).
    Stale,
    /// Its newest step failed (whatever an earlier release left visible).
    Failed,
    /// An attempt holds a lease: computing, staged or validating.
    Running,
    /// Planned and not started: waiting for upstream steps, a slot or a retry's backoff.
    Queued,
    /// Waiting for a partition of an external source to arrive.
    Waiting,
    /// Owed by the schedule and not built (debt).
    Missed,
    /// Nothing: never planned, built or owed.
    None,
}

impl CellState {
    /// The state of a partition whose newest step is `newest`, from whether it is `published`,
    /// `stale` and `owed`: work in flight first (it is about to change what is visible), then a
    /// failure of the newest step, then what readers see, then debt.
    pub fn of(newest: Option<StepStatus>, published: bool, stale: bool, owed: bool) -> CellState {
        match newest {
            Some(s) if s.holds_lease() || s == StepStatus::Validated => return CellState::Running,
            Some(StepStatus::WaitingForSource) => return CellState::Waiting,
            Some(StepStatus::Pending | StepStatus::Ready | StepStatus::RetryWait) => return CellState::Queued,
            Some(StepStatus::Failed | StepStatus::UpstreamFailed) => return CellState::Failed,
            _ => {}
        }
        match (published, stale, owed) {
            (true, true, _) => CellState::Stale,
            (true, false, _) => CellState::Published,
            (false, _, true) => CellState::Missed,
            (false, _, false) => CellState::None,
        }
    }
}

/// Which part of the overview to compute.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GridQuery {
    /// The partitioning whose datasets to show (`day`, `week (Europe/Paris)`, `static keys`...,
    /// as [`Grid::axes`] names them); the one most datasets share unless given.
    pub axis: Option<String>,
    /// Only datasets whose name contains this.
    pub dataset: Option<String>,
    /// Only the datasets this task writes.
    pub task: Option<String>,
    /// Only partitions with a step or a publication: hides intervals the schedule owes and
    /// nothing has touched (they stay counted in [`Grid::hidden_missed`]).
    pub activity: bool,
    /// Only partitions before this key (the page before: the previous answer's `older`).
    pub before: Option<String>,
    /// Only partitions from this key on.
    pub from: Option<String>,
    /// Only partitions up to this key.
    pub to: Option<String>,
    /// How many partitions (columns), newest first: [`COLUMNS_DEFAULT`] unless asked, at most
    /// [`COLUMNS_MAX`].
    pub columns: Option<u32>,
}

impl GridQuery {
    /// Whether partition `key` is within the asked range (`before`, `from`, `to`).
    fn in_range(&self, key: &str) -> bool {
        self.before.as_deref().is_none_or(|b| key < b)
            && self.from.as_deref().is_none_or(|f| key >= f)
            && self.to.as_deref().is_none_or(|t| key <= t)
    }
}

/// Columns per answer unless asked.
pub const COLUMNS_DEFAULT: u32 = 90;
/// The most columns one answer holds.
pub const COLUMNS_MAX: u32 = 1000;

/// Datasets by partitions, for the datasets of one partitioning (their keys line up).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Grid {
    /// Every partitioning of the workspace's datasets, with how many datasets use it.
    pub axes: Vec<Axis>,
    /// The partitioning shown.
    pub axis: String,
    /// The partition keys shown, newest first: the union of the rows' partitions that have a
    /// step, a publication or debt (without debt when only `activity` was asked).
    pub columns: Vec<String>,
    /// One row per dataset Tidegate writes with this partitioning, by name.
    pub rows: Vec<GridRow>,
    /// The key to ask `before` for the next, older page; absent on the oldest.
    pub older: Option<String>,
    /// Cells per state over the whole answer.
    pub counts: BTreeMap<String, u64>,
    /// Owed intervals left out because only partitions with activity were asked for.
    pub hidden_missed: u64,
}

/// A partitioning and how many datasets use it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Axis {
    /// Its name: the grain with its time zone, or `static keys`.
    pub name: String,
    /// Datasets Tidegate writes with it.
    pub datasets: u32,
}

/// One dataset's partitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GridRow {
    /// The dataset.
    pub dataset: String,
    /// The task that writes it.
    pub task: Option<String>,
    /// One state per column.
    pub cells: Vec<CellState>,
}

/// The name of a dataset's partitioning: datasets with one name have keys that line up.
pub fn axis_name(dataset: &tidegate_core::spec::Dataset) -> String {
    match &dataset.partitioning {
        tidegate_core::spec::Partitioning::Time { grain, time_zone, .. } => match time_zone {
            Some(tz) => format!("{} ({})", grain.as_str(), tz.name()),
            None => grain.as_str().to_owned(),
        },
        tidegate_core::spec::Partitioning::Static { .. } => "static keys".to_owned(),
    }
}

/// What every partition of the datasets of one partitioning is, a page of columns at a time.
pub fn grid(ws: &Workspace, store: &dyn Store, actor: &Actor, query: &GridQuery, now: DateTime<Utc>) -> Result<Grid> {
    require(actor, Access::Read)?;
    let spec = &ws.spec;
    let managed: Vec<&tidegate_core::spec::Dataset> =
        spec.datasets.values().filter(|d| matches!(d.kind, DatasetKind::Managed { .. })).collect();
    let mut axes: BTreeMap<String, u32> = BTreeMap::new();
    for d in &managed {
        *axes.entry(axis_name(d)).or_default() += 1;
    }
    let axis = match &query.axis {
        Some(a) if axes.contains_key(a) => a.clone(),
        Some(a) => crate::refuse!(
            Invalid,
            "axis {a:?}: no dataset is partitioned so; the workspace's partitionings are {}",
            axes.keys().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
        ),
        // The most shared, the shorter grain first among equals.
        None => axes.iter().max_by_key(|(_, n)| **n).map(|(a, _)| a.clone()).unwrap_or_default(),
    };
    let owed = owed(ws, store, now)?;
    // One pass over the release items gives both what is stale and what is published.
    let judged = crate::stale::judge(ws, store, None)?;
    let mut stale: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in judged.stale {
        stale.entry(s.dataset).or_default().insert(s.partition);
    }
    let mut visible = judged.visible;
    let mut rows_found: Vec<Row> = Vec::new();
    for dataset in managed.into_iter().filter(|d| axis_name(d) == axis) {
        let task = spec.tasks.values().find(|t| t.outputs.contains(&dataset.name)).map(|t| t.name.clone());
        if query.dataset.as_deref().is_some_and(|f| !dataset.name.contains(f)) {
            continue;
        }
        if query.task.as_deref().is_some_and(|f| task.as_deref() != Some(f)) {
            continue;
        }
        let published = match visible.remove(&dataset.name) {
            Some(p) => p,
            None => store.visible_builds(&dataset.name)?,
        };
        let owed = task.as_ref().and_then(|t| owed.get(t)).cloned().unwrap_or_default();
        let stale = stale.remove(&dataset.name).unwrap_or_default();
        rows_found.push(Row { dataset: dataset.name.clone(), task, newest: Vec::new(), published, stale, owed });
    }
    let n = query.columns.unwrap_or(COLUMNS_DEFAULT).clamp(1, COLUMNS_MAX) as usize;
    let from = steps_from(&rows_found, query, n);
    for row in &mut rows_found {
        if let Some(t) = &row.task {
            row.newest = store.newest_steps(t, from.as_deref())?;
            // By key, byte-wise, whatever order the database returned them in.
            row.newest.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
    }
    // Every key some row has, borrowed from the rows: only the columns shown are copied.
    let mut keys: BTreeSet<&str> = BTreeSet::new();
    let mut owed_keys: BTreeSet<&str> = BTreeSet::new();
    for row in &rows_found {
        keys.extend(row.newest.iter().map(|(k, _)| k.as_str()));
        keys.extend(row.published.iter().map(|p| p.partition.as_str()));
        owed_keys.extend(row.owed.iter().map(String::as_str));
    }
    let hidden_missed = if query.activity { owed_keys.difference(&keys).count() as u64 } else { 0 };
    if !query.activity {
        keys.extend(owed_keys);
    }
    let (columns, older) = {
        let mut candidates = keys.into_iter().rev().filter(|k| query.in_range(k));
        let columns: Vec<String> = candidates.by_ref().take(n).map(str::to_owned).collect();
        let older = candidates.next().and(columns.last().cloned());
        (columns, older)
    };
    let mut by_state: std::collections::HashMap<CellState, u64> = std::collections::HashMap::new();
    let mut rows = Vec::new();
    for row in rows_found {
        let cells: Vec<CellState> = columns.iter().map(|k| row.cell(k)).collect();
        for c in &cells {
            *by_state.entry(*c).or_default() += 1;
        }
        rows.push(GridRow { dataset: row.dataset, task: row.task, cells });
    }
    let counts = by_state.into_iter().map(|(c, n)| (word(c), n)).collect();
    let axes = axes.into_iter().map(|(name, datasets)| Axis { name, datasets }).collect();
    Ok(Grid { axes, axis, columns, rows, older, counts, hidden_missed })
}

/// The least partition key whose newest steps can change the answer: the steps of older
/// partitions are left unread (most of a long history). The columns are the newest `n` keys in
/// range of the union of the partitions with a step, a publication or debt; when the
/// publications and debt alone have more than `n` such keys, every column and the next, older
/// one (for [`Grid::older`]) are at or above the (n+1)th of them, whatever the steps add. In
/// `activity` mode the debt that no step or publication touched is counted too, so the bound
/// also reaches down to the oldest owed key.
fn steps_from(rows: &[Row], query: &GridQuery, n: usize) -> Option<String> {
    let in_range = |k: &&str| query.in_range(k);
    let mut known: BTreeSet<&str> = BTreeSet::new();
    for row in rows {
        known.extend(row.published.iter().map(|p| p.partition.as_str()).filter(in_range));
        if !query.activity {
            known.extend(row.owed.iter().map(String::as_str).filter(in_range));
        }
    }
    let bound = known.iter().rev().nth(n).copied().or(query.from.as_deref());
    let oldest_owed = rows.iter().filter_map(|r| r.owed.first()).map(String::as_str).min();
    match (bound, query.activity, oldest_owed) {
        (Some(b), true, Some(o)) => Some(b.min(o).to_owned()),
        (Some(b), _, _) => Some(b.to_owned()),
        (None, _, _) => None,
    }
}

/// What the grid knows of one dataset before it picks its columns.
struct Row {
    dataset: String,
    task: Option<String>,
    /// The newest step's status per partition, by key.
    newest: Vec<(String, StepStatus)>,
    /// The visible partitions, in partition order.
    published: std::sync::Arc<Vec<tidegate_store::VisiblePartition>>,
    stale: BTreeSet<String>,
    owed: BTreeSet<String>,
}

impl Row {
    /// The state of partition `key`.
    fn cell(&self, key: &str) -> CellState {
        let newest = self.newest.binary_search_by(|(k, _)| k.as_str().cmp(key)).ok().map(|i| self.newest[i].1);
        let published = tidegate_store::VisiblePartition::find(&self.published, key).is_some();
        CellState::of(newest, published, self.stale.contains(key), self.owed.contains(key))
    }
}

fn word(state: CellState) -> String {
    serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// Per scheduled task, the intervals it owes now (gaps between publications and due ones), the
/// newest [`crate::schedule::LISTED_MAX`] of each.
fn owed(ws: &Workspace, store: &dyn Store, now: DateTime<Utc>) -> Result<BTreeMap<String, BTreeSet<String>>> {
    Ok(crate::schedule::decide(&ws.spec, store, now)?
        .into_iter()
        .map(|d| (d.task, d.gaps.into_iter().chain(d.due).chain(d.debt).collect()))
        .collect())
}

/// One partition of a dataset: its state, and the steps that built or tried to build it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartitionDetail {
    /// The dataset.
    pub dataset: String,
    /// The partition's key.
    pub partition: String,
    /// The task that writes it.
    pub task: Option<String>,
    /// Its state, as the overview shows it.
    pub state: CellState,
    /// Why it is stale, when it is (`tidegate stale`).
    pub stale: Vec<crate::stale::Reason>,
    /// The steps of its task for it, newest first ([`PARTITION_STEPS_MAX`] at most).
    pub steps: Vec<PartitionStep>,
}

/// A step of a partition with its attempts and the versions they staged.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartitionStep {
    /// The step.
    pub step: StepRecord,
    /// Its attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// The versions its attempts staged.
    pub versions: Vec<VersionRecord>,
}

/// The most steps [`partition`] lists.
pub const PARTITION_STEPS_MAX: u32 = 20;

/// One partition of `dataset`: its state and its steps, newest first.
pub fn partition(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    dataset: &str,
    key: &str,
    now: DateTime<Utc>,
) -> Result<PartitionDetail> {
    require(actor, Access::Read)?;
    let spec = &ws.spec;
    let Some(d) = spec.datasets.get(dataset) else {
        crate::refuse!(NotFound, "no dataset named {dataset:?} in this workspace's spec");
    };
    let task = spec.tasks.values().find(|t| t.outputs.contains(&d.name)).map(|t| t.name.clone());
    let mut steps = Vec::new();
    if let Some(t) = &task {
        for step in store.partition_steps(t, key, PARTITION_STEPS_MAX)? {
            let attempts = store.attempts(&step.id)?;
            let versions = store.versions(&step.id)?.into_iter().filter(|v| v.dataset == d.name).collect();
            steps.push(PartitionStep { step, attempts, versions });
        }
    }
    let newest = steps
        .iter()
        .map(|s| s.step.status())
        .find(|s| !matches!(s, StepStatus::Skipped | StepStatus::Superseded | StepStatus::Cancelled));
    let published = store.published_partitions(&d.name)?.contains(key);
    let stale: Vec<crate::stale::Reason> = crate::stale::stale_in(ws, store, Some(&d.name))?
        .into_iter()
        .filter(|s| s.partition == key)
        .flat_map(|s| s.reasons)
        .collect();
    let owed =
        task.as_ref().is_some_and(|t| owed(ws, store, now).is_ok_and(|o| o.get(t).is_some_and(|k| k.contains(key))));
    let state = CellState::of(newest, published, !stale.is_empty(), owed);
    Ok(PartitionDetail { dataset: d.name.clone(), partition: key.to_owned(), task, state, stale, steps })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row whose partitions published are `published` and owed `owed` (days of January 2024).
    fn row(published: &[u32], owed: &[u32]) -> Row {
        let key = |d: &u32| format!("2024-01-{d:02}");
        let mut published: Vec<tidegate_store::VisiblePartition> = published
            .iter()
            .map(|d| tidegate_store::VisiblePartition {
                partition: key(d),
                since_version: 0,
                origin_version: 0,
                contents: Vec::new(),
                build: None,
            })
            .collect();
        published.sort_by(|a, b| a.partition.cmp(&b.partition));
        Row {
            dataset: "d".into(),
            task: Some("t".into()),
            newest: Vec::new(),
            published: std::sync::Arc::new(published),
            stale: BTreeSet::new(),
            owed: owed.iter().map(key).collect(),
        }
    }

    #[test]
    fn the_steps_read_start_at_the_key_after_the_page_and_its_successor() {
        let q = GridQuery::default();
        // Ten published days, three columns: the page (10, 9, 8) and the next, older column (7)
        // are at or above the (n+1)th newest key, day 7.
        let rows = [row(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &[])];
        assert_eq!(steps_from(&rows, &q, 3).as_deref(), Some("2024-01-07"));
        // Debt counts as a key (10, 9, 8 owed; then 3)...
        let rows = [row(&[1, 2, 3], &[8, 9, 10])];
        assert_eq!(steps_from(&rows, &q, 3).as_deref(), Some("2024-01-03"));
        // ...unless only activity is asked: then publications bound it (day 2 for one column),
        // and the oldest debt too, when it is older (debt nothing touched is counted).
        let activity = GridQuery { activity: true, ..GridQuery::default() };
        assert_eq!(steps_from(&rows, &activity, 1).as_deref(), Some("2024-01-02"));
        let rows = [row(&[2, 3, 4, 5], &[1])];
        assert_eq!(steps_from(&rows, &activity, 2).as_deref(), Some("2024-01-01"));
        let rows = [row(&[1, 2, 3, 4, 5], &[4])];
        // Too few keys to bound: every step is read (or from `from`).
        assert_eq!(steps_from(&rows, &q, 5), None);
        let from = GridQuery { from: Some("2024-01-02".into()), ..GridQuery::default() };
        assert_eq!(steps_from(&rows, &from, 5).as_deref(), Some("2024-01-02"));
        // A page before a key bounds within what is before it.
        let before = GridQuery { before: Some("2024-01-04".into()), ..GridQuery::default() };
        assert_eq!(steps_from(&rows, &before, 1).as_deref(), Some("2024-01-02"));
        // Across rows: the union of their keys.
        let rows = [row(&[1, 3, 5], &[]), row(&[2, 4, 6], &[])];
        assert_eq!(steps_from(&rows, &q, 2).as_deref(), Some("2024-01-04"));
    }

    #[test]
    fn work_in_flight_then_failure_then_what_readers_see_then_debt() {
        use CellState as C;
        use StepStatus as S;
        assert_eq!(C::of(Some(S::Running), true, true, false), C::Running);
        assert_eq!(C::of(Some(S::Validated), false, false, false), C::Running);
        assert_eq!(C::of(Some(S::WaitingForSource), false, false, true), C::Waiting);
        assert_eq!(C::of(Some(S::RetryWait), true, false, false), C::Queued);
        assert_eq!(C::of(Some(S::Failed), true, false, false), C::Failed);
        assert_eq!(C::of(Some(S::UpstreamFailed), false, false, true), C::Failed);
        assert_eq!(C::of(Some(S::Published), true, true, false), C::Stale);
        assert_eq!(C::of(Some(S::AwaitingApproval), true, false, false), C::Published);
        assert_eq!(C::of(None, false, false, true), C::Missed);
        assert_eq!(C::of(None, false, false, false), C::None);
        assert_eq!(word(C::Waiting), "waiting");
    }
}

/// A dataset as its page shows it: its declaration, who feeds it and whom it feeds, what built
/// each visible partition, its releases and what is stale. Its Delta versions and partition sizes
/// come from the lake (`data::versions`, `data::partitions`).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetDetail {
    /// The dataset.
    pub name: String,
    /// Its declaration in the spec (kind and write mode, partitioning, columns, checks,
    /// consumers...), as `tidegate validate --json` shows it.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub spec: serde_json::Value,
    /// The task that writes it.
    pub task: Option<String>,
    /// The datasets its task reads.
    pub upstream: Vec<String>,
    /// The datasets written by tasks that read it.
    pub downstream: Vec<String>,
    /// Each visible partition and the step that built it, with its input versions and code version.
    pub builds: Vec<PartitionBuild>,
    /// Its newest releases, newest first.
    pub releases: Vec<tidegate_store::ReleaseRecord>,
    /// Its stale partitions and why.
    pub stale: Vec<crate::stale::StalePartition>,
}

/// What built one visible partition.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartitionBuild {
    /// The partition.
    pub partition: String,
    /// The table version its content became visible at.
    pub since_version: i64,
    /// The step whose output it is (unknown after a rollback to a state no step was recorded for).
    pub step_id: Option<String>,
    /// The code version that step ran.
    pub code_version: Option<String>,
    /// The input versions it read.
    pub inputs: Vec<tidegate_core::idempotency::PinnedInput>,
}

/// How many releases [`dataset`] lists.
pub const DATASET_RELEASES_MAX: u32 = 50;

/// The dataset called `name`.
pub fn dataset(ws: &Workspace, store: &dyn Store, actor: &Actor, name: &str) -> Result<DatasetDetail> {
    require(actor, Access::Read)?;
    let spec = &ws.spec;
    let Some(d) = spec.datasets.get(name) else {
        crate::refuse!(NotFound, "no dataset named {name:?} in this workspace's spec");
    };
    let writer = spec.tasks.values().find(|t| t.outputs.contains(&d.name));
    let upstream = writer.map(|t| t.inputs.iter().map(|i| i.dataset.clone()).collect()).unwrap_or_default();
    let downstream = spec
        .tasks
        .values()
        .filter(|t| t.inputs.iter().any(|i| i.dataset == d.name))
        .flat_map(|t| t.outputs.iter().cloned())
        .collect();
    let builds = store
        .visible_builds(&d.name)?
        .iter()
        .map(|p| PartitionBuild {
            partition: p.partition.clone(),
            since_version: p.since_version,
            step_id: p.build.as_ref().map(|b| b.step_id.clone()),
            code_version: p.build.as_ref().and_then(|b| b.code_version.clone()),
            inputs: p.build.as_ref().map(|b| b.inputs.clone()).unwrap_or_default(),
        })
        .collect();
    Ok(DatasetDetail {
        name: d.name.clone(),
        spec: serde_json::to_value(d)?,
        task: writer.map(|t| t.name.clone()),
        upstream,
        downstream,
        builds,
        releases: store.releases(Some(&d.name), DATASET_RELEASES_MAX)?,
        stale: crate::stale::stale_in(ws, store, Some(&d.name))?,
    })
}

/// Every attempt of the steps of run `run_id`, by step in plan order and attempt: what a run's
/// timeline draws.
pub fn run_attempts(store: &dyn Store, actor: &Actor, run_id: &str) -> Result<Vec<AttemptRecord>> {
    require(actor, Access::Read)?;
    let run = crate::run::find(store, run_id)?;
    let mut out = Vec::new();
    for step in store.steps(&run.id)? {
        out.extend(store.attempts(&step.id)?);
    }
    Ok(out)
}

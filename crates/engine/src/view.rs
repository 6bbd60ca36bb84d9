//! The scheduler's in-memory view of unfinished runs: every step with its upstream and
//! downstream links, rebuilt from the store at start-up (so a restart after kill -9 resumes where
//! the store says things are) and kept current from the outcomes the store returns.

use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use tidegate_core::state::{Step, StepStatus};
use tidegate_store::{Priority, Result, StepRecord, Store};

/// One step as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub record: StepRecord,
    pub priority: Priority,
    pub upstream_ids: Vec<String>,
    pub downstream_ids: Vec<String>,
    /// The backfill the step's run belongs to, if any.
    pub backfill_id: Option<String>,
}

impl Entry {
    pub fn status(&self) -> StepStatus {
        self.record.state.status
    }
}

/// What a pending step's upstream steps say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dependency {
    /// Every upstream published, skipped or superseded.
    Met,
    /// This upstream failed or was cancelled, so the step cannot run.
    Failed { upstream: String },
}

/// Unfinished runs and their steps.
#[derive(Debug, Default)]
pub struct View {
    steps: HashMap<String, Entry>,
    /// Pending steps whose upstream changed since they were last examined.
    dirty: BTreeSet<String>,
    /// The runs whose steps the view holds.
    runs: HashSet<String>,
}

impl View {
    /// Loads every unfinished run's steps (terminal steps too, since they decide dependencies).
    pub fn load(store: &dyn Store) -> Result<View> {
        let active = store.active_steps()?;
        let mut view = View::default();
        let runs: BTreeSet<(DateTime<Utc>, String)> =
            active.iter().map(|a| (a.run_created_at, a.step.run_id.clone())).collect();
        let runs_of: HashMap<String, (Priority, Option<String>)> =
            active.iter().map(|a| (a.step.run_id.clone(), (a.priority, a.backfill_id.clone()))).collect();
        for (_, run_id) in runs {
            let (priority, backfill_id) = runs_of[&run_id].clone();
            view.add_run(store.steps(&run_id)?, priority, backfill_id);
        }
        Ok(view)
    }

    /// Adds a run's steps (all of them, as the store returns them).
    pub fn add_run(&mut self, steps: Vec<StepRecord>, priority: Priority, backfill_id: Option<String>) {
        self.runs.extend(steps.iter().map(|s| s.run_id.clone()));
        let ids: HashMap<String, String> = steps.iter().map(|s| (s.name.clone(), s.id.clone())).collect();
        let mut links = Vec::new();
        for s in steps {
            let upstream_ids: Vec<String> = s.upstream.iter().filter_map(|n| ids.get(n).cloned()).collect();
            links.extend(upstream_ids.iter().map(|u| (u.clone(), s.id.clone())));
            if s.state.status == StepStatus::Pending {
                self.dirty.insert(s.id.clone());
            }
            let entry = Entry {
                record: s,
                priority,
                upstream_ids,
                downstream_ids: Vec::new(),
                backfill_id: backfill_id.clone(),
            };
            self.steps.insert(entry.record.id.clone(), entry);
        }
        for (up, down) in links {
            if let Some(e) = self.steps.get_mut(&up) {
                e.downstream_ids.push(down);
            }
        }
    }

    pub fn get(&self, step_id: &str) -> Option<&Entry> {
        self.steps.get(step_id)
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.steps.values()
    }

    /// Whether the view holds a run.
    pub fn has_run(&self, run_id: &str) -> bool {
        self.runs.contains(run_id)
    }

    /// Records a step's new state; when it settled (terminal, or staged awaiting a backfill's
    /// approval), its downstream steps need a look.
    pub fn update(&mut self, step_id: &str, state: Step) {
        let Some(entry) = self.steps.get_mut(step_id) else { return };
        let settled = |s: StepStatus| s.is_terminal() || s == StepStatus::AwaitingApproval;
        let settled_now = !settled(entry.record.state.status) && settled(state.status);
        entry.record.state = state;
        if settled_now {
            let downstream = entry.downstream_ids.clone();
            self.dirty.extend(downstream);
        }
    }

    /// Decisions for pending steps whose upstream changed: met, or failed because of which upstream.
    pub fn take_dependency_decisions(&mut self) -> Vec<(String, Dependency)> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut out = Vec::new();
        for id in dirty {
            let Some(entry) = self.steps.get(&id) else { continue };
            if entry.status() != StepStatus::Pending {
                continue;
            }
            let mut all_met = true;
            let mut failed = None;
            for up in &entry.upstream_ids {
                match self.steps.get(up).map(Entry::status) {
                    Some(s) if s.satisfies_downstream() => {}
                    // Inside a backfill, a downstream step reads its upstream's staged output.
                    Some(StepStatus::AwaitingApproval) if entry.record.state.needs_approval => {}
                    Some(s) if s.is_terminal() => {
                        failed = Some(self.steps[up].record.name.clone());
                        break;
                    }
                    _ => all_met = false,
                }
            }
            match (failed, all_met) {
                (Some(upstream), _) => out.push((id, Dependency::Failed { upstream })),
                (None, true) => out.push((id, Dependency::Met)),
                (None, false) => {}
            }
        }
        out
    }

    /// Steps in `status`, oldest run first.
    pub fn in_status(&self, status: StepStatus) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.steps.values().filter(|e| e.status() == status).collect();
        v.sort_by(|a, b| {
            a.priority.cmp(&b.priority).then(a.record.run_id.cmp(&b.record.run_id)).then(a.record.id.cmp(&b.record.id))
        });
        v
    }

    /// Whether anything is left that the engine can move forward without a person.
    pub fn has_work(&self) -> bool {
        self.has_work_outside(&[])
    }

    /// Like [`View::has_work`], ignoring the steps of paused backfills (and a backfill's validated
    /// steps, which wait for `backfill publish`).
    pub fn has_work_outside(&self, paused_backfills: &[String]) -> bool {
        self.steps.values().any(|e| {
            let waits_for_a_person = e.status() == StepStatus::AwaitingApproval
                || (e.status() == StepStatus::Validated && e.record.state.needs_approval)
                || (e.backfill_id.as_ref().is_some_and(|b| paused_backfills.contains(b))
                    && matches!(e.status(), StepStatus::Pending | StepStatus::Ready));
            !e.status().is_terminal() && !waits_for_a_person
        })
    }

    /// Counts per status across the view.
    pub fn tally(&self) -> HashMap<StepStatus, usize> {
        let mut t = HashMap::new();
        for e in self.steps.values() {
            *t.entry(e.status()).or_insert(0) += 1;
        }
        t
    }

    /// Drops runs whose steps are all terminal, to keep the view small in a long-lived server.
    pub fn forget_finished_runs(&mut self) {
        let mut open_runs = HashSet::new();
        for e in self.steps.values() {
            if !e.status().is_terminal() {
                open_runs.insert(e.record.run_id.clone());
            }
        }
        self.steps.retain(|_, e| open_runs.contains(&e.record.run_id));
        self.runs.retain(|r| open_runs.contains(r));
    }
}

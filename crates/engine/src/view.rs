//! The scheduler's in-memory view of unfinished runs: every step with its upstream and
//! downstream links, rebuilt from the store at start-up (so a restart after kill -9 resumes where
//! the store says things are) and kept current from the outcomes the store returns.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use tidegate_core::state::{RunEvent, RunStatus, Step, StepStatus, StepTally, apply_run};
use tidegate_store::{Priority, Result, StepRecord, Store, Trigger, VersionRecord};

/// One step as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The step as last read or applied.
    pub record: StepRecord,
    /// Its run's priority class.
    pub priority: Priority,
    /// What started its run.
    pub trigger: Trigger,
    /// The steps it waits for.
    pub upstream_ids: Vec<String>,
    /// The steps that wait for it.
    pub downstream_ids: Vec<String>,
    /// The backfill the step's run belongs to, if any.
    pub backfill_id: Option<String>,
}

impl Entry {
    /// Its status.
    pub fn status(&self) -> StepStatus {
        self.record.state.status
    }

    /// Whether the step is one of its task's scheduled intervals (a schedule or catch-up run's).
    pub fn is_scheduled(&self) -> bool {
        matches!(self.trigger, Trigger::Schedule | Trigger::Catchup)
    }

    /// Whether the step's interval is active, as `max_active_runs` counts: from its first claim
    /// (its first attempt) until it settles (published, failed, skipped, superseded, cancelled or
    /// staged for approval). A step waiting for a retry, or ready for one, stays active.
    pub fn is_active(&self) -> bool {
        self.record.state.attempt > 0 && self.status().keeps_run_active()
    }
}

/// What a pending step's upstream steps say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dependency {
    /// Every upstream published, skipped or superseded.
    Met,
    /// This upstream failed or was cancelled, so the step cannot run.
    Failed {
        /// The upstream step's name (task@partition).
        upstream: String,
    },
}

/// Where a step sits in its status's queue: class first, then the oldest run, then the step.
/// Run ids are time-ordered (UUIDv7), so this is the order the scheduler takes work in. Catch-up
/// steps go newest interval first, whatever their run (DESIGN: catch-up runs newest first).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey {
    priority: Priority,
    /// The interval's start for a catch-up step, `None` (sorting after any start) for others.
    newest_first: Reverse<Option<DateTime<Utc>>>,
    run_id: String,
    step_id: String,
}

impl QueueKey {
    fn of(record: &StepRecord, priority: Priority) -> Self {
        let start = if priority == Priority::Catchup { record.interval.map(|i| i.start) } else { None };
        Self { priority, newest_first: Reverse(start), run_id: record.run_id.clone(), step_id: record.id.clone() }
    }

    /// The first key of class `priority`.
    fn first_of(priority: Priority) -> Self {
        let newest = Reverse(Some(DateTime::<Utc>::MAX_UTC));
        Self { priority, newest_first: newest, run_id: String::new(), step_id: String::new() }
    }

    /// The first key after every step of this key's run: `run_id + "\0"` sorts after `run_id`
    /// and at or before every longer id that starts with it, and ids hold no NUL. (Only for
    /// classes whose keys do not order by interval, where a run's steps are contiguous.)
    fn after_run(&self) -> Self {
        Self {
            priority: self.priority,
            newest_first: self.newest_first,
            run_id: format!("{}\0", self.run_id),
            step_id: String::new(),
        }
    }
}

/// The indexes of the view's steps: kept beside the steps (not inside them), so a step's entry
/// can be changed in place while its index entries move.
#[derive(Debug, Default)]
struct Queues {
    /// Every step, by status, in taking order.
    by_status: HashMap<StepStatus, BTreeSet<QueueKey>>,
    /// Ready steps by pool, in taking order.
    ready: HashMap<String, BTreeSet<QueueKey>>,
}

impl Queues {
    fn insert(&mut self, e: &Entry) {
        let key = QueueKey::of(&e.record, e.priority);
        if e.status() == StepStatus::Ready {
            self.ready.entry(e.record.pool.clone()).or_default().insert(key.clone());
        }
        self.by_status.entry(e.status()).or_default().insert(key);
    }

    fn remove(&mut self, e: &Entry) {
        let key = QueueKey::of(&e.record, e.priority);
        if e.status() == StepStatus::Ready
            && let Some(q) = self.ready.get_mut(&e.record.pool)
        {
            q.remove(&key);
        }
        if let Some(q) = self.by_status.get_mut(&e.status()) {
            q.remove(&key);
        }
    }
}

/// Unfinished runs and their steps, indexed so that one scheduler tick costs what it touches,
/// not the size of the view: every status keeps its steps in taking order, and ready steps are
/// also kept per pool. (A view of 100,000 steps used to be filtered and sorted several times a
/// tick, which made a drain's rate fall with its size.)
#[derive(Debug, Default)]
pub struct View {
    steps: HashMap<String, Entry>,
    queues: Queues,
    /// Pending steps whose upstream changed since they were last examined.
    dirty: BTreeSet<String>,
    /// The runs whose steps the view holds.
    runs: HashSet<String>,
    /// The backfills whose runs the view holds.
    backfills: BTreeSet<String>,
    /// The versions each step's last attempt staged, as this scheduler recorded them, kept until
    /// the step is published or moves on: publication takes them from here instead of reading
    /// them back from the store (steps staged before a restart are read back).
    staged: HashMap<String, Vec<VersionRecord>>,
}

impl View {
    /// Loads every unfinished run's steps (terminal steps too, since they decide dependencies), or
    /// only `only_run`'s.
    pub fn load(store: &dyn Store, only_run: Option<&str>) -> Result<View> {
        let mut active = store.active_steps()?;
        active.retain(|a| only_run.is_none_or(|only| a.step.run_id == only));
        let mut view = View::default();
        let runs: BTreeSet<(DateTime<Utc>, String)> =
            active.iter().map(|a| (a.run_created_at, a.step.run_id.clone())).collect();
        let runs_of: HashMap<String, (Priority, Option<String>)> =
            active.iter().map(|a| (a.step.run_id.clone(), (a.priority, a.backfill_id.clone()))).collect();
        for (_, run_id) in runs {
            let (priority, backfill_id) = runs_of[&run_id].clone();
            let trigger = store.run(&run_id)?.map_or(Trigger::Manual, |r| r.request.trigger);
            view.add_run(store.steps(&run_id)?, priority, trigger, backfill_id);
        }
        Ok(view)
    }

    /// Adds a run's steps (all of them, as the store returns them).
    pub fn add_run(
        &mut self,
        steps: Vec<StepRecord>,
        priority: Priority,
        trigger: Trigger,
        backfill_id: Option<String>,
    ) {
        self.runs.extend(steps.iter().map(|s| s.run_id.clone()));
        self.backfills.extend(backfill_id.iter().cloned());
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
                trigger,
                upstream_ids,
                downstream_ids: Vec::new(),
                backfill_id: backfill_id.clone(),
            };
            if let Some(old) = self.steps.remove(&entry.record.id) {
                self.queues.remove(&old);
            }
            self.queues.insert(&entry);
            self.steps.insert(entry.record.id.clone(), entry);
        }
        for (up, down) in links {
            if let Some(e) = self.steps.get_mut(&up) {
                e.downstream_ids.push(down);
            }
        }
    }

    /// The entry of a step, if it is in the view.
    pub fn get(&self, step_id: &str) -> Option<&Entry> {
        self.steps.get(step_id)
    }

    /// Every entry.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.steps.values()
    }

    /// Whether the view holds a run.
    pub fn has_run(&self, run_id: &str) -> bool {
        self.runs.contains(run_id)
    }

    /// The backfills whose runs the view holds.
    pub fn backfill_ids(&self) -> impl Iterator<Item = &String> {
        self.backfills.iter()
    }

    /// Records a step's new state; when it settled (terminal, or staged awaiting a backfill's
    /// approval), its downstream steps need a look.
    pub fn update(&mut self, step_id: &str, state: Step) {
        let Some(entry) = self.steps.get_mut(step_id) else { return };
        if !publishes_staged(state.status) {
            self.staged.remove(step_id);
        }
        let settled = |s: StepStatus| s.is_terminal() || s == StepStatus::AwaitingApproval;
        let settled_now = !settled(entry.record.state.status) && settled(state.status);
        let moved = entry.record.state.status != state.status;
        if moved {
            self.queues.remove(entry);
        }
        entry.record.state = state;
        if moved {
            self.queues.insert(entry);
        }
        if settled_now {
            self.dirty.extend(entry.downstream_ids.iter().cloned());
        }
    }

    /// Notes the versions a step's attempt staged, as recorded in the store, if the step is on
    /// its way to publishing them (a step whose checks failed is not).
    pub fn note_staged(&mut self, step_id: &str, versions: Vec<VersionRecord>) {
        if self.steps.get(step_id).is_some_and(|e| publishes_staged(e.status())) {
            self.staged.insert(step_id.to_owned(), versions);
        }
    }

    /// The versions noted for a staged step, if this scheduler recorded them.
    pub fn staged(&self, step_id: &str) -> Option<&[VersionRecord]> {
        self.staged.get(step_id).map(Vec::as_slice)
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

    /// Steps in `status`, in taking order: live before catch-up before backfill, oldest run first.
    pub fn in_status(&self, status: StepStatus) -> impl Iterator<Item = &Entry> {
        self.queues.by_status.get(&status).into_iter().flatten().map(|k| &self.steps[&k.step_id])
    }

    /// Steps in every status `which` selects, each status in taking order.
    pub fn in_statuses(&self, which: impl Fn(StepStatus) -> bool) -> impl Iterator<Item = &Entry> {
        self.queues
            .by_status
            .iter()
            .filter(move |(s, _)| which(**s))
            .flat_map(|(_, q)| q.iter().map(|k| &self.steps[&k.step_id]))
    }

    /// How many steps are in `status`.
    pub fn count(&self, status: StepStatus) -> usize {
        self.queues.by_status.get(&status).map_or(0, BTreeSet::len)
    }

    /// Up to `limit` ready steps of `pool` in class `priority`, in taking order. `admit` is asked
    /// about each candidate; when it refuses one, the rest of that step's run is skipped too
    /// (what refuses a step is its backfill's gate, which is the same for its whole run), so a
    /// paused backfill of many steps costs one look per run, not one per step.
    pub fn take_ready(
        &self,
        pool: &str,
        priority: Priority,
        limit: usize,
        mut admit: impl FnMut(&Entry) -> bool,
    ) -> Vec<String> {
        let mut taken = Vec::new();
        let Some(queue) = self.queues.ready.get(pool) else { return taken };
        let mut from = QueueKey::first_of(priority);
        'runs: while taken.len() < limit {
            for key in queue.range(&from..) {
                if key.priority != priority {
                    break 'runs;
                }
                if !admit(&self.steps[&key.step_id]) {
                    from = key.after_run();
                    continue 'runs;
                }
                taken.push(key.step_id.clone());
                if taken.len() >= limit {
                    break 'runs;
                }
            }
            break;
        }
        taken
    }

    /// Like [`View::take_ready`], but a step `admit` refuses is skipped alone, not with the rest
    /// of its run: for catch-up steps, which are refused one task at a time (`max_active_runs`).
    pub fn take_ready_each(
        &self,
        pool: &str,
        priority: Priority,
        limit: usize,
        mut admit: impl FnMut(&Entry) -> bool,
    ) -> Vec<String> {
        let Some(queue) = self.queues.ready.get(pool) else { return Vec::new() };
        queue
            .range(QueueKey::first_of(priority)..)
            .take_while(|k| k.priority == priority)
            .filter(|k| admit(&self.steps[&k.step_id]))
            .take(limit)
            .map(|k| k.step_id.clone())
            .collect()
    }

    /// Whether any step of class `priority` is ready, in any pool.
    pub fn has_ready(&self, priority: Priority) -> bool {
        let Some(ready) = self.queues.by_status.get(&StepStatus::Ready) else { return false };
        ready.range(QueueKey::first_of(priority)..).next().is_some_and(|k| k.priority == priority)
    }

    /// Per task, how many of its scheduled intervals (schedule and catch-up runs) are active
    /// ([`Entry::is_active`]) or about to be: a live one that is ready counts already, since live
    /// work is never held back and is claimed first.
    pub fn scheduled_active(&self) -> HashMap<String, u32> {
        let mut out: HashMap<String, u32> = HashMap::new();
        for e in self.in_statuses(|s| s.keeps_run_active() && s != StepStatus::Pending) {
            let starting_live = e.priority == Priority::Live && e.status() == StepStatus::Ready;
            if e.is_scheduled() && (e.is_active() || starting_live) {
                *out.entry(e.record.task.clone()).or_default() += 1;
            }
        }
        out
    }

    /// Whether anything is left that the engine can move forward without a person.
    pub fn has_work(&self) -> bool {
        self.has_work_outside(&[])
    }

    /// Like [`View::has_work`], ignoring the steps of paused backfills (and a backfill's validated
    /// steps, which wait for `backfill publish`).
    pub fn has_work_outside(&self, paused_backfills: &[String]) -> bool {
        self.queues.by_status.iter().filter(|(s, _)| !s.is_terminal() && **s != StepStatus::AwaitingApproval).any(
            |(&status, queue)| {
                queue.iter().any(|k| {
                    let e = &self.steps[&k.step_id];
                    let waits_for_a_person = (status == StepStatus::Validated && e.record.state.needs_approval)
                        || (e.backfill_id.as_ref().is_some_and(|b| paused_backfills.contains(b))
                            && matches!(
                                status,
                                StepStatus::Pending | StepStatus::WaitingForSource | StepStatus::Ready
                            ));
                    !waits_for_a_person
                })
            },
        )
    }

    /// Counts per status across the view (statuses with no step left out).
    pub fn tally(&self) -> HashMap<StepStatus, usize> {
        self.queues.by_status.iter().filter(|(_, q)| !q.is_empty()).map(|(s, q)| (*s, q.len())).collect()
    }

    /// Steps not settled yet: neither terminal nor waiting for an approval.
    pub fn backlog(&self) -> usize {
        self.queues
            .by_status
            .iter()
            .filter(|(s, _)| !s.is_terminal() && **s != StepStatus::AwaitingApproval)
            .map(|(_, q)| q.len())
            .sum()
    }

    /// Whether `run_id` succeeded: the run status `core::state::apply_run` derives from its steps
    /// here. Stops at the first step that keeps the run active (the common case mid-run).
    pub fn run_succeeded(&self, run_id: &str) -> bool {
        let mut tally = StepTally::default();
        for e in self.steps.values().filter(|e| e.record.run_id == run_id) {
            if e.status().keeps_run_active() {
                return false;
            }
            tally.add(e.status());
        }
        tally != StepTally::default()
            && matches!(apply_run(RunStatus::Running, &RunEvent::StepsChanged { tally }), Ok(RunStatus::Succeeded))
    }

    /// Drops runs whose steps are all terminal, to keep the view small in a long-lived server.
    /// Called every refresh: the look for an unfinished step borrows the run ids and stops as
    /// soon as every run has one, so a busy view costs a short scan, not a copy of every id.
    pub fn forget_finished_runs(&mut self) {
        let mut open: HashSet<&str> = HashSet::new();
        for e in self.steps.values() {
            if !e.status().is_terminal() && open.insert(e.record.run_id.as_str()) && open.len() == self.runs.len() {
                return;
            }
        }
        let finished: HashSet<String> = self.runs.iter().filter(|r| !open.contains(r.as_str())).cloned().collect();
        if finished.is_empty() {
            return;
        }
        let gone: Vec<String> =
            self.steps.values().filter(|e| finished.contains(&e.record.run_id)).map(|e| e.record.id.clone()).collect();
        for id in gone {
            if let Some(e) = self.steps.remove(&id) {
                self.queues.remove(&e);
            }
        }
        self.runs.retain(|r| !finished.contains(r));
        let backfills: BTreeSet<String> = self.steps.values().filter_map(|e| e.backfill_id.clone()).collect();
        self.backfills = backfills;
    }
}

/// Whether a step in `status` will publish what its last attempt staged.
fn publishes_staged(status: StepStatus) -> bool {
    matches!(status, StepStatus::Staged | StepStatus::Validating | StepStatus::Validated | StepStatus::AwaitingApproval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidegate_core::spec::RetryPolicy;

    fn step(run: &str, id: &str, pool: &str, status: StepStatus, upstream: &[&str]) -> StepRecord {
        let mut state = Step::new(RetryPolicy::default(), false);
        state.status = status;
        StepRecord {
            id: id.to_owned(),
            run_id: run.to_owned(),
            name: id.to_owned(),
            task: "t".to_owned(),
            partition: String::new(),
            interval: None,
            step_key: id.to_owned(),
            pool: pool.to_owned(),
            upstream: upstream.iter().map(|s| (*s).to_owned()).collect(),
            inputs: Vec::new(),
            state,
            updated_at: tidegate_testkit::fixed_instant(),
            code_version: None,
        }
    }

    fn ids<'a>(entries: impl Iterator<Item = &'a Entry>) -> Vec<&'a str> {
        entries.map(|e| e.record.id.as_str()).collect()
    }

    fn with_status(status: StepStatus) -> Step {
        let mut s = Step::new(RetryPolicy::default(), false);
        s.status = status;
        s
    }

    /// A view of three runs: a backfill run (oldest), a live run and a catch-up run.
    fn view() -> View {
        let mut v = View::default();
        let ready = StepStatus::Ready;
        v.add_run(
            vec![step("r1", "b1", "p", ready, &[]), step("r1", "b2", "p", ready, &[])],
            Priority::Backfill,
            Trigger::Backfill,
            Some("bf".to_owned()),
        );
        v.add_run(
            vec![
                step("r2", "l2", "p", ready, &[]),
                step("r2", "l1", "q", ready, &[]),
                step("r2", "l3", "p", StepStatus::Pending, &["l2"]),
            ],
            Priority::Live,
            Trigger::Manual,
            None,
        );
        v.add_run(vec![step("r3", "c1", "p", ready, &[])], Priority::Catchup, Trigger::Catchup, None);
        v
    }

    #[test]
    fn statuses_are_kept_in_taking_order_and_follow_updates() {
        let mut v = view();
        assert_eq!(ids(v.in_status(StepStatus::Ready)), ["l1", "l2", "c1", "b1", "b2"]);
        assert_eq!(v.count(StepStatus::Ready), 5);
        v.update("l2", with_status(StepStatus::Running));
        assert_eq!(ids(v.in_status(StepStatus::Ready)), ["l1", "c1", "b1", "b2"]);
        assert_eq!(ids(v.in_status(StepStatus::Running)), ["l2"]);
        assert!(v.take_ready("p", Priority::Live, 10, |_| true).is_empty(), "l2 left the ready queue of pool p");
        let tally = v.tally();
        assert_eq!((tally[&StepStatus::Ready], tally[&StepStatus::Running], tally[&StepStatus::Pending]), (4, 1, 1));
        assert_eq!(v.backlog(), 6);
        // Settling the upstream makes the pending step's dependency decidable.
        v.update("l2", with_status(StepStatus::Published));
        assert_eq!(v.take_dependency_decisions(), vec![("l3".to_owned(), Dependency::Met)]);
        assert_eq!(v.count(StepStatus::Running), 0);
        assert_eq!(v.backlog(), 5);
    }

    #[test]
    fn take_ready_is_per_pool_and_class_bounded_and_skips_refused_runs() {
        let v = view();
        assert_eq!(v.take_ready("p", Priority::Live, 10, |_| true), ["l2"]);
        assert_eq!(v.take_ready("q", Priority::Live, 10, |_| true), ["l1"]);
        assert_eq!(v.take_ready("p", Priority::Catchup, 10, |_| true), ["c1"]);
        assert_eq!(v.take_ready("p", Priority::Backfill, 1, |_| true), ["b1"], "bounded by the limit");
        assert!(v.take_ready("nowhere", Priority::Live, 10, |_| true).is_empty());
        // A refused step's whole run is skipped: admit is asked once for run r1, not per step.
        let mut asked = 0;
        let taken = v.take_ready("p", Priority::Backfill, 10, |_| {
            asked += 1;
            false
        });
        assert!(taken.is_empty());
        assert_eq!(asked, 1);
    }

    #[test]
    fn refusing_one_run_does_not_hide_the_next_one() {
        let mut v = View::default();
        let ready = StepStatus::Ready;
        // "r1" and "r10": the second id starts with the first, the case `after_run` must get right.
        v.add_run(
            vec![step("r1", "a", "p", ready, &[]), step("r1", "b", "p", ready, &[])],
            Priority::Backfill,
            Trigger::Backfill,
            Some("x".to_owned()),
        );
        v.add_run(vec![step("r10", "c", "p", ready, &[])], Priority::Backfill, Trigger::Backfill, Some("y".to_owned()));
        let taken = v.take_ready("p", Priority::Backfill, 10, |e| e.backfill_id.as_deref() == Some("y"));
        assert_eq!(taken, ["c"]);
    }

    #[test]
    fn work_left_ignores_paused_backfills_and_forgetting_finished_runs_clears_the_indexes() {
        let mut v = view();
        assert!(v.has_work());
        assert_eq!(v.backfill_ids().collect::<Vec<_>>(), ["bf"]);
        for id in ["l1", "l2", "l3", "c1"] {
            v.update(id, with_status(StepStatus::Published));
        }
        assert!(v.has_work(), "the backfill's ready steps are work");
        assert!(!v.has_work_outside(&["bf".to_owned()]), "unless the backfill is paused");
        v.forget_finished_runs();
        assert!(!v.has_run("r2") && !v.has_run("r3") && v.has_run("r1"));
        assert_eq!(v.count(StepStatus::Published), 0);
        assert_eq!(ids(v.in_status(StepStatus::Ready)), ["b1", "b2"]);
        for id in ["b1", "b2"] {
            v.update(id, with_status(StepStatus::Cancelled));
        }
        v.forget_finished_runs();
        assert_eq!(v.tally(), HashMap::new());
        assert_eq!(v.backfill_ids().count(), 0);
        assert!(v.take_ready("p", Priority::Backfill, 10, |_| true).is_empty());
    }

    /// A ready step of task `t` in pool `p` for day `d` of January 2024.
    fn day(run: &str, id: &str, d: u32) -> StepRecord {
        let mut s = step(run, id, "p", StepStatus::Ready, &[]);
        let start = DateTime::from_timestamp(1_704_067_200 + i64::from(d - 1) * 86_400, 0).expect("a valid day");
        s.interval = Some(tidegate_core::partition::Interval { start, end: start + chrono::Duration::days(1) });
        s
    }

    fn attempted(status: StepStatus) -> Step {
        let mut s = with_status(status);
        s.attempt = 1;
        s
    }

    #[test]
    fn catch_up_steps_are_taken_newest_interval_first_and_refused_one_by_one() {
        let mut v = View::default();
        v.add_run(vec![day("r1", "a", 1), day("r1", "b", 3)], Priority::Catchup, Trigger::Catchup, None);
        v.add_run(vec![day("r2", "c", 2)], Priority::Catchup, Trigger::Catchup, None);
        assert_eq!(v.take_ready_each("p", Priority::Catchup, 10, |_| true), ["b", "c", "a"], "newest day first");
        assert_eq!(v.take_ready_each("p", Priority::Catchup, 1, |_| true), ["b"]);
        // Refusing a step leaves the rest of its run (a, in r1 with b) takeable.
        assert_eq!(v.take_ready_each("p", Priority::Catchup, 10, |e| e.record.id != "b"), ["c", "a"]);
        assert!(v.has_ready(Priority::Catchup) && !v.has_ready(Priority::Live) && !v.has_ready(Priority::Backfill));

        // Active from the first claim until the step settles, retries included.
        assert!(v.scheduled_active().is_empty(), "ready, never claimed: not active");
        v.update("b", attempted(StepStatus::Running));
        assert_eq!(v.scheduled_active()["t"], 1);
        v.update("b", attempted(StepStatus::RetryWait));
        assert_eq!(v.scheduled_active()["t"], 1, "waiting for a retry still holds its place");
        v.update("b", attempted(StepStatus::Published));
        assert!(v.scheduled_active().is_empty());
        // A ready live interval of the schedule counts before it is claimed: it goes first.
        v.add_run(vec![day("r4", "l", 5)], Priority::Live, Trigger::Schedule, None);
        assert_eq!(v.scheduled_active()["t"], 1);
        v.update("l", attempted(StepStatus::Published));
        // A manual run's steps are not scheduled intervals.
        v.add_run(vec![day("r3", "m", 4)], Priority::Live, Trigger::Manual, None);
        v.update("m", attempted(StepStatus::Running));
        assert!(v.scheduled_active().is_empty());
    }

    fn version(step_id: &str) -> VersionRecord {
        VersionRecord {
            id: format!("{step_id}-1:out"),
            step_id: step_id.to_owned(),
            attempt: 1,
            dataset: "out".to_owned(),
            partition: "2024-01-01".to_owned(),
            files: serde_json::json!({}),
            n_rows: 0,
            schema_hash: String::new(),
            checksum: String::new(),
            stats: serde_json::json!([]),
            created_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn staged_versions_are_kept_only_while_the_step_is_on_its_way_to_publishing_them() {
        let mut v = view();
        // A step whose checks failed, or one not in the view, keeps nothing.
        v.update("l1", with_status(StepStatus::Failed));
        v.note_staged("l1", vec![version("l1")]);
        v.note_staged("nowhere", vec![version("nowhere")]);
        assert!(v.staged("l1").is_none() && v.staged("nowhere").is_none());
        // Validated: kept through approval, dropped once published.
        v.update("l2", with_status(StepStatus::Validated));
        v.note_staged("l2", vec![version("l2")]);
        v.update("l2", with_status(StepStatus::AwaitingApproval));
        assert_eq!(v.staged("l2").map(|s| s[0].id.as_str()), Some("l2-1:out"));
        v.update("l2", with_status(StepStatus::Published));
        assert!(v.staged("l2").is_none());
        // A retry's new attempt will stage versions of its own.
        v.update("b1", with_status(StepStatus::Validated));
        v.note_staged("b1", vec![version("b1")]);
        v.update("b1", with_status(StepStatus::RetryWait));
        assert!(v.staged("b1").is_none());
    }
}

//! Reading each rule's condition: per subject, the value now and whether it is past the rule's
//! limit. One pass reads the store once per kind of condition the spec's rules use, never per
//! rule.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use chrono::{DateTime, Duration, Utc};
use tidegate_core::alert::Reading;
use tidegate_core::spec::{AlertCondition, AlertRule, DatasetKind, FailureScope, Spec};
use tidegate_core::state::StepStatus;
use tidegate_store::{AttemptRecord, BackfillStatus, Store};

use crate::monitor::{Monitor, SchedulerGauge};
use crate::workspace::Workspace;

/// How far back `consecutive_failures` looks for a task's attempts.
const CONSECUTIVE_LOOKBACK: Duration = Duration::days(7);
/// The most attempts one pass reads.
const ATTEMPTS_READ_MAX: u32 = 50_000;
/// A scheduler gauge older than this says nothing about now (the scheduler stopped).
const GAUGE_MAX_AGE_S: f64 = 120.0;
/// Backfills looked at for `approval_waiting`.
const BACKFILLS_READ: u32 = 500;

/// One rule's reading for one subject.
#[derive(Debug, Clone, PartialEq)]
pub struct Subjected {
    /// What the rule watches here: a task, pool, dataset or backfill, or `*`.
    pub subject: String,
    /// What was read; `None` when nothing can be said (too few attempts, nothing published).
    pub reading: Option<Reading>,
}

/// What the store says, read once for every rule.
#[derive(Default)]
struct Facts {
    /// Ended attempts since the longest window any rule needs, newest first, with their task.
    attempts: Option<Vec<(String, AttemptRecord)>>,
    freshness_lag_s: Option<BTreeMap<String, f64>>,
    gauge: Option<Option<SchedulerGauge>>,
    /// Per task: when its longest-waiting step began waiting for a source.
    waiting_since: Option<BTreeMap<String, DateTime<Utc>>>,
    stale: Option<BTreeMap<String, u64>>,
    /// Per compared backfill awaiting approval: since when.
    awaiting_approval: Option<Vec<(String, DateTime<Utc>)>>,
}

/// Every rule's subjects and readings at `now`.
pub fn read_all(ws: &Workspace, store: &dyn Store, now: DateTime<Utc>) -> Result<BTreeMap<String, Vec<Subjected>>> {
    let facts = gather(ws, store, now)?;
    Ok(ws.spec.alerts.values().map(|rule| (rule.name.clone(), read(&ws.spec, rule, &facts, now))).collect())
}

fn gather(ws: &Workspace, store: &dyn Store, now: DateTime<Utc>) -> Result<Facts> {
    let spec = &ws.spec;
    let uses = |f: fn(&AlertCondition) -> bool| spec.alerts.values().any(|r| f(&r.condition));
    let mut facts = Facts::default();
    let window = spec
        .alerts
        .values()
        .map(|r| match r.condition {
            AlertCondition::FailureRate { window_s, .. } => {
                Duration::seconds(i64::try_from(window_s).unwrap_or(i64::MAX / 2))
            }
            AlertCondition::ConsecutiveFailures { .. } => CONSECUTIVE_LOOKBACK,
            _ => Duration::zero(),
        })
        .max()
        .unwrap_or_else(Duration::zero);
    if window > Duration::zero() {
        let attempts = store.recent_attempts(now - window, ATTEMPTS_READ_MAX).context("reading recent attempts")?;
        facts.attempts = Some(attempts.into_iter().filter(|(_, a)| a.ended_at.is_some()).collect());
    }
    if uses(|c| matches!(c, AlertCondition::FreshnessLag { .. })) {
        facts.freshness_lag_s = Some(Monitor::schedules(ws, store, now)?.1);
    }
    if uses(|c| matches!(c, AlertCondition::BacklogEta { .. } | AlertCondition::RetryBudgetExhausted { .. })) {
        let (_, _, gauge, _) = Monitor::read_store(store, now)?;
        facts.gauge = Some(gauge.filter(|g| g.age_s <= GAUGE_MAX_AGE_S));
    }
    if uses(|c| matches!(c, AlertCondition::SourceWaiting { .. })) {
        let mut waiting: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
        for active in store.active_steps().context("reading active steps")? {
            if active.step.status() == StepStatus::WaitingForSource {
                let since = waiting.entry(active.step.task.clone()).or_insert(active.step.updated_at);
                *since = (*since).min(active.step.updated_at);
            }
        }
        facts.waiting_since = Some(waiting);
    }
    if uses(|c| matches!(c, AlertCondition::StalePartitions { .. })) {
        let mut stale: BTreeMap<String, u64> = BTreeMap::new();
        for s in crate::stale::stale_in(ws, store, None).context("finding stale partitions")? {
            *stale.entry(s.dataset).or_default() += 1;
        }
        facts.stale = Some(stale);
    }
    if uses(|c| matches!(c, AlertCondition::ApprovalWaiting { .. })) {
        let backfills = store.backfills(BACKFILLS_READ).context("listing backfills")?;
        facts.awaiting_approval = Some(
            backfills
                .into_iter()
                .filter(|b| b.status == BackfillStatus::Staged && b.comparison_hash.is_some())
                .map(|b| (b.id, b.updated_at))
                .collect(),
        );
    }
    Ok(facts)
}

fn seconds(d: Duration) -> f64 {
    #[allow(clippy::cast_precision_loss, reason = "a duration far below 2^52 milliseconds")]
    let ms = d.num_milliseconds().max(0) as f64;
    ms / 1000.0
}

#[allow(clippy::cast_precision_loss, reason = "limits and counts far below 2^52")]
fn read(spec: &Spec, rule: &AlertRule, facts: &Facts, now: DateTime<Utc>) -> Vec<Subjected> {
    let over = |value: f64, limit: f64| Some(Reading { holds: value > limit, value });
    let one = |subject: &str, reading: Option<Reading>| Subjected { subject: subject.to_owned(), reading };
    let all_tasks = || spec.tasks.keys().cloned().collect::<Vec<_>>();
    let attempts = facts.attempts.as_deref().unwrap_or_default();
    match &rule.condition {
        AlertCondition::FailureRate { scope, above, window_s, min_attempts } => {
            let since = now - Duration::seconds(i64::try_from(*window_s).unwrap_or(i64::MAX / 2));
            let rate = |in_scope: &dyn Fn(&str) -> bool| {
                let (mut ended, mut failed) = (0u32, 0u32);
                for (_, a) in attempts.iter().filter(|(t, a)| in_scope(t) && a.started_at >= since) {
                    match a.outcome.as_deref() {
                        Some("failed" | "lease_expired") => (ended, failed) = (ended + 1, failed + 1),
                        Some("succeeded") => ended += 1,
                        _ => {}
                    }
                }
                (ended >= *min_attempts).then(|| f64::from(failed) / f64::from(ended))
            };
            match scope {
                FailureScope::Pool(pool) => {
                    let in_pool = |t: &str| spec.tasks.get(t).is_some_and(|task| &task.pool == pool);
                    vec![one(pool, rate(&in_pool).and_then(|r| over(r, *above)))]
                }
                FailureScope::Task(task) => vec![one(task, rate(&|t: &str| t == task).and_then(|r| over(r, *above)))],
                FailureScope::EveryTask => all_tasks()
                    .iter()
                    .map(|task| one(task, rate(&|t: &str| t == task).and_then(|r| over(r, *above))))
                    .collect(),
            }
        }
        AlertCondition::ConsecutiveFailures { task, at_least } => {
            let tasks = task.clone().map_or_else(all_tasks, |t| vec![t]);
            tasks
                .iter()
                .map(|task| {
                    let mut run = 0u32;
                    let mut any = false;
                    // Newest first: count failures until the first attempt that did not fail.
                    for (_, a) in attempts.iter().filter(|(t, _)| t == task) {
                        match a.outcome.as_deref() {
                            Some("failed" | "lease_expired") => {
                                run += 1;
                                any = true;
                            }
                            Some("succeeded") => {
                                any = true;
                                break;
                            }
                            _ => {}
                        }
                    }
                    let reading = any.then_some(Reading { holds: run >= *at_least, value: f64::from(run) });
                    one(task, reading)
                })
                .collect()
        }
        AlertCondition::FreshnessLag { dataset, above_s } => {
            let lags = facts.freshness_lag_s.clone().unwrap_or_default();
            let datasets: Vec<String> = dataset.clone().map_or_else(|| lags.keys().cloned().collect(), |d| vec![d]);
            datasets.iter().map(|d| one(d, lags.get(d).and_then(|lag| over(*lag, *above_s as f64)))).collect()
        }
        AlertCondition::BacklogEta { above_s } => {
            let eta = facts.gauge.clone().flatten().and_then(|g| g.backlog_eta_s);
            vec![one("*", eta.and_then(|eta| over(eta, *above_s as f64)))]
        }
        AlertCondition::RetryBudgetExhausted { pool } => {
            let gauge = facts.gauge.clone().flatten();
            let pools: Vec<String> = pool.clone().map_or_else(|| spec.pools.keys().cloned().collect(), |p| vec![p]);
            pools
                .iter()
                .map(|p| {
                    let left = gauge.as_ref().and_then(|g| g.pools.get(p)).map(|g| g.retry_budget_left);
                    one(p, left.map(|left| Reading { holds: left == 0, value: left as f64 }))
                })
                .collect()
        }
        AlertCondition::SourceWaiting { dataset, above_s } => {
            let waiting = facts.waiting_since.clone().unwrap_or_default();
            let reads = |task: &str| {
                dataset
                    .as_ref()
                    .is_none_or(|d| spec.tasks.get(task).is_some_and(|t| t.inputs.iter().any(|i| &i.dataset == d)))
            };
            let oldest = waiting.iter().filter(|(task, _)| reads(task)).map(|(_, since)| *since).min();
            let waited = oldest.map_or(0.0, |since| seconds(now - since));
            vec![one(dataset.as_deref().unwrap_or("*"), over(waited, *above_s as f64))]
        }
        AlertCondition::StalePartitions { dataset, above } => {
            let stale = facts.stale.clone().unwrap_or_default();
            let managed = spec
                .datasets
                .values()
                .filter(|d| matches!(d.kind, DatasetKind::Managed { .. }))
                .map(|d| d.name.clone());
            let datasets: Vec<String> = dataset.clone().map_or_else(|| managed.collect(), |d| vec![d]);
            datasets.iter().map(|d| one(d, over(stale.get(d).copied().unwrap_or(0) as f64, *above as f64))).collect()
        }
        AlertCondition::ApprovalWaiting { above_s } => facts
            .awaiting_approval
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|(id, since)| one(id, over(seconds(now - *since), *above_s as f64)))
            .collect(),
    }
}

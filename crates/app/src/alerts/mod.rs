//! Alerts (issue 34, decision 0023): rules in `tidegate.toml` watched over time. Each pass
//! ([`evaluate`], run by `tidegate serve` beside its scheduler and by `tidegate alerts check`)
//! reads every rule's condition per subject ([`read`]), moves each episode with
//! [`tidegate_core::alert::apply`], and writes each move to the store with its journal entry
//! (`alert_fired`, `alert_resolved`) in one transaction that holds only if the state is still
//! the one this pass read: one fire per episode, however many passes run at once. Receivers are
//! told from the journal ([`crate::notify`]), so a notification survives a crash the way the
//! entry does. A silence holds an alert's notifications back; the episode itself is journaled.

pub mod prometheus;
pub mod read;

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::alert::{self, Episode, Reading, Transition};
use tidegate_core::spec::{AlertCondition, AlertRule};
use tidegate_store::{AlertMove, JournalMeta, SilenceRecord, Store};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// The actor the journal names for alert decisions.
pub const EVALUATOR: &str = "alerts";

/// One rule's episode for one subject, as `alerts status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AlertLine {
    /// The rule.
    pub rule: String,
    /// What it watches here.
    pub subject: String,
    /// `clear`, `pending` or `firing`.
    pub state: String,
    /// When the condition began to hold (pending and firing).
    pub since: Option<DateTime<Utc>>,
    /// When it fired (firing).
    pub fired_at: Option<DateTime<Utc>>,
    /// How many episodes fired so far.
    pub episodes: u64,
    /// Whether a silence holds its notifications back now.
    pub silenced: bool,
    /// The condition in words.
    pub condition: String,
}

/// What one pass decided.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Evaluation {
    /// Episodes read.
    pub n_read: usize,
    /// Alerts that fired in this pass: `rule subject`.
    pub fired: Vec<String>,
    /// Alerts that resolved in this pass.
    pub resolved: Vec<String>,
    /// Episodes another pass moved first (left to it).
    pub n_raced: usize,
}

/// The condition of `rule` in words, for messages and notifications.
pub fn describe(rule: &AlertRule) -> String {
    #[allow(clippy::cast_precision_loss, reason = "durations far below 2^52 seconds")]
    let d = |s: u64| crate::human::duration(s as f64);
    let on = |o: &Option<String>, every: &str| o.clone().unwrap_or_else(|| every.to_owned());
    let cond = match &rule.condition {
        AlertCondition::FailureRate { scope, above, window_s, min_attempts } => {
            let whose = match scope {
                tidegate_core::spec::FailureScope::Task(t) => format!("task {t}"),
                tidegate_core::spec::FailureScope::Pool(p) => format!("pool {p}"),
                tidegate_core::spec::FailureScope::EveryTask => "any task".to_owned(),
            };
            format!(
                "failures of {whose} above {:.0}% of the attempts ended in {} (at least {min_attempts})",
                above * 100.0,
                d(*window_s)
            )
        }
        AlertCondition::ConsecutiveFailures { task, at_least } => {
            format!("{at_least} or more failed attempts in a row of {}", on(task, "any task"))
        }
        AlertCondition::FreshnessLag { dataset, above_s } => {
            format!("{} more than {} behind", on(dataset, "a scheduled dataset"), d(*above_s))
        }
        AlertCondition::BacklogEta { above_s } => format!("the backlog's ETA above {}", d(*above_s)),
        AlertCondition::RetryBudgetExhausted { pool } => {
            format!("the retry budget of {} exhausted", on(pool, "a pool"))
        }
        AlertCondition::SourceWaiting { dataset, above_s } => {
            format!("a step waiting for {} longer than {}", on(dataset, "a source"), d(*above_s))
        }
        AlertCondition::StalePartitions { dataset, above } => {
            format!("more than {above} stale partitions in {}", on(dataset, "a dataset"))
        }
        AlertCondition::ApprovalWaiting { above_s } => {
            format!("a compared backfill waiting for approval longer than {}", d(*above_s))
        }
    };
    if rule.for_s == 0 { cond } else { format!("{cond}, for {}", d(rule.for_s)) }
}

fn parse_state(text: &str) -> Result<Episode> {
    serde_json::from_str(text)
        .with_context(|| format!("reading an alert state {text:?} (the store holds a state this build cannot read)"))
}

fn state_text(state: &Episode) -> Result<String> {
    serde_json::to_string(state).context("writing an alert state")
}

fn ts(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// One pass over every rule at the workspace's now, as the evaluator (a system decision: the
/// caller is the scheduler's loop or an operator's `alerts check`).
pub fn evaluate(ws: &Workspace, store: &dyn Store) -> Result<Evaluation> {
    let now = ws.now();
    let mut out = Evaluation::default();
    if ws.spec.alerts.is_empty() {
        return Ok(out);
    }
    let readings = read::read_all(ws, store, now)?;
    let stored: BTreeMap<(String, String), tidegate_store::AlertStateRecord> =
        store.alert_states()?.into_iter().map(|s| ((s.rule.clone(), s.subject.clone()), s)).collect();
    let silences = store.silences(Some(now))?;
    for rule in ws.spec.alerts.values() {
        let read = readings.get(&rule.name).cloned().unwrap_or_default();
        // Subjects read now, and those with a state whose subject is gone (they resolve).
        let mut subjects: BTreeMap<String, Option<Reading>> =
            read.into_iter().map(|s| (s.subject, s.reading)).collect();
        for (r, subject) in stored.keys() {
            if r == &rule.name {
                subjects.entry(subject.clone()).or_insert(None);
            }
        }
        for (subject, reading) in subjects {
            out.n_read += 1;
            let held = stored.get(&(rule.name.clone(), subject.clone()));
            let (state, episodes, quiet) = match held {
                Some(h) => (parse_state(&h.state)?, h.episodes, h.quiet),
                None => (Episode::Clear, 0, false),
            };
            let hold_for = Duration::seconds(i64::try_from(rule.for_s).unwrap_or(i64::MAX / 2));
            let (next, transition) = alert::apply(state, reading, hold_for, now);
            if next == state {
                continue;
            }
            let silenced = silences.iter().any(|s| s.covers(&rule.name, &subject, now));
            let (episodes, quiet, entry) = match transition {
                Some(Transition::Fired { since }) => {
                    let payload = payload(rule, &subject, reading, since, now, episodes + 1, silenced);
                    (episodes + 1, silenced, Some(("alert_fired".to_owned(), payload.to_string())))
                }
                Some(Transition::Resolved { since, fired_at }) => {
                    let mut payload = payload(rule, &subject, reading, since, fired_at, episodes, quiet);
                    payload["resolved_at"] = ts(now).into();
                    (episodes, quiet, Some(("alert_resolved".to_owned(), payload.to_string())))
                }
                None => (episodes, quiet, None),
            };
            let change = AlertMove {
                rule: rule.name.clone(),
                subject: subject.clone(),
                from: held.map(|h| h.state.clone()),
                to: state_text(&next)?,
                episodes,
                quiet,
                entry,
            };
            let meta = JournalMeta {
                actor: EVALUATOR.to_owned(),
                correlation_id: String::new(),
                reason: describe(rule),
                at: now,
                via: None,
            };
            if !store.move_alert(&change, &meta)? {
                out.n_raced += 1;
                continue;
            }
            match transition {
                Some(Transition::Fired { .. }) => out.fired.push(format!("{} {subject}", rule.name)),
                Some(Transition::Resolved { .. }) => out.resolved.push(format!("{} {subject}", rule.name)),
                None => {}
            }
        }
    }
    Ok(out)
}

/// What an `alert_fired` or `alert_resolved` entry says: everything a receiver shows, so that
/// telling it needs nothing but the entry.
fn payload(
    rule: &AlertRule,
    subject: &str,
    reading: Option<Reading>,
    since: DateTime<Utc>,
    fired_at: DateTime<Utc>,
    episode: u64,
    silenced: bool,
) -> serde_json::Value {
    serde_json::json!({
        "rule": rule.name,
        "subject": subject,
        "when": rule.condition.when(),
        "condition": describe(rule),
        "severity": rule.severity.as_str(),
        "value": reading.map(|r| r.value).filter(|v| v.is_finite()),
        "since": ts(since),
        "fired_at": ts(fired_at),
        "for_s": rule.for_s,
        "episode": episode,
        "receivers": rule.receivers,
        "silenced": silenced,
    })
}

/// What `tidegate alerts check` did: one pass, then the receivers told of what it and anything
/// before it journaled.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checked {
    /// The pass.
    #[serde(flatten)]
    pub evaluation: Evaluation,
    /// Per receiver: notifications delivered, refused for good, and why the rest waits.
    pub notified: Vec<crate::notify::Told>,
}

/// One pass now and its notifications, for `actor` (operator): `tidegate alerts check`, the way
/// to evaluate the rules of a workspace no `serve` watches (from cron, say).
pub fn check(ws: &Workspace, store: &dyn Store, actor: &Actor) -> Result<Checked> {
    require(actor, Access::RunWork)?;
    // A receiver seen for the first time starts before this pass, so it hears of what it fires.
    crate::notify::start(ws, store);
    let evaluation = evaluate(ws, store)?;
    let notified = crate::notify::deliver(ws, store);
    Ok(Checked { evaluation, notified })
}

/// Every rule's episodes, for `actor` (viewer and above): the rules the spec declares, each
/// with the subjects it has a state for (a rule never read yet shows as one clear line).
pub fn status(ws: &Workspace, store: &dyn Store, actor: &Actor) -> Result<Vec<AlertLine>> {
    require(actor, Access::Read)?;
    let now = ws.now();
    let silences = store.silences(Some(now))?;
    let mut stored: BTreeMap<String, Vec<tidegate_store::AlertStateRecord>> = BTreeMap::new();
    for s in store.alert_states()? {
        stored.entry(s.rule.clone()).or_default().push(s);
    }
    let mut out = Vec::new();
    for rule in ws.spec.alerts.values() {
        let condition = describe(rule);
        let held = stored.remove(&rule.name).unwrap_or_default();
        if held.is_empty() {
            out.push(AlertLine {
                rule: rule.name.clone(),
                subject: "*".to_owned(),
                state: "clear".to_owned(),
                since: None,
                fired_at: None,
                episodes: 0,
                silenced: silences.iter().any(|s| s.covers(&rule.name, "*", now)),
                condition,
            });
            continue;
        }
        for h in held {
            let state = parse_state(&h.state)?;
            let (since, fired_at) = match state {
                Episode::Clear => (None, None),
                Episode::Pending { since } => (Some(since), None),
                Episode::Firing { since, fired_at } => (Some(since), Some(fired_at)),
            };
            out.push(AlertLine {
                silenced: silences.iter().any(|s| s.covers(&rule.name, &h.subject, now)),
                rule: h.rule,
                subject: h.subject,
                state: state.as_str().to_owned(),
                since,
                fired_at,
                episodes: h.episodes,
                condition: condition.clone(),
            });
        }
    }
    Ok(out)
}

/// A request to silence a rule's notifications.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SilenceRequest {
    /// The rule.
    pub rule: String,
    /// One subject only (a task, pool, dataset, backfill); every subject when absent.
    #[serde(default)]
    pub subject: Option<String>,
    /// How long, in seconds (at most 30 days).
    pub for_s: u64,
    /// Why, in words: the journal keeps it.
    pub reason: String,
}

/// The longest a silence may hold: 30 days (a longer one is a rule to change).
pub const SILENCE_MAX_S: u64 = 30 * 24 * 3600;

/// Silences `request.rule`'s notifications for `request.for_s`, journaled as `silenced`.
pub fn silence(ws: &Workspace, store: &dyn Store, actor: &Actor, request: &SilenceRequest) -> Result<SilenceRecord> {
    require(actor, Access::RunWork)?;
    crate::input::require_reason(&request.reason)?;
    if !ws.spec.alerts.contains_key(&request.rule) {
        let names: BTreeSet<&str> = ws.spec.alerts.keys().map(String::as_str).collect();
        let known = if names.is_empty() {
            "tidegate.toml declares no [alerts]".to_owned()
        } else {
            format!("the rules: {}", names.into_iter().collect::<Vec<_>>().join(", "))
        };
        crate::refuse!(Invalid, "no alert rule {:?} in tidegate.toml ({known})", request.rule);
    }
    if request.for_s == 0 || request.for_s > SILENCE_MAX_S {
        crate::refuse!(Invalid, "a silence lasts from a second to 30 days, not {} s", request.for_s);
    }
    let now = ws.now();
    let record = SilenceRecord {
        id: format!("sil-{}", &uuid::Uuid::now_v7().simple().to_string()[..16]),
        rule: request.rule.clone(),
        subject: request.subject.clone().filter(|s| !s.trim().is_empty()),
        actor: actor.name.clone(),
        reason: request.reason.trim().to_owned(),
        created_at: now,
        expires_at: now + Duration::seconds(i64::try_from(request.for_s).unwrap_or(i64::MAX / 2)),
        ended_at: None,
    };
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: record.id.clone(),
        reason: record.reason.clone(),
        at: now,
    };
    store.silence(&record, &meta)?;
    Ok(record)
}

/// Ends silence `id` before it expires, journaled as `unsilenced`.
pub fn unsilence(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str, reason: &str) -> Result<SilenceRecord> {
    require(actor, Access::RunWork)?;
    crate::input::require_reason(reason)?;
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: id.to_owned(),
        reason: reason.trim().to_owned(),
        at: ws.now(),
    };
    match store.end_silence(id, &meta)? {
        Some(record) => Ok(record),
        None => crate::refuse!(NotFound, "no silence {id:?} is in force (`tidegate alerts silences` lists them)"),
    }
}

/// The silences in force (or every silence, with `all`), oldest first.
pub fn silences(ws: &Workspace, store: &dyn Store, actor: &Actor, all: bool) -> Result<Vec<SilenceRecord>> {
    require(actor, Access::Read)?;
    Ok(store.silences((!all).then(|| ws.now()))?)
}

/// Evaluates the rules every `every` until `stop` is cancelled (beside `tidegate serve`'s scheduler),
/// reporting each pass that fired or resolved something, and each that failed.
pub async fn watch(
    ws: std::sync::Arc<Workspace>,
    store: std::sync::Arc<dyn Store>,
    every: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
    report: tokio::sync::mpsc::UnboundedSender<crate::serve::Event>,
) {
    if ws.spec.alerts.is_empty() {
        return;
    }
    while !stop.is_cancelled() {
        let evaluated = tokio::task::block_in_place(|| evaluate(&ws, store.as_ref()));
        // The receiving end is gone only when serve is ending.
        let _ = match evaluated {
            Ok(e) if e.fired.is_empty() && e.resolved.is_empty() => Ok(()),
            Ok(e) => report.send(crate::serve::Event::Alerts(e)),
            Err(e) => report.send(crate::serve::Event::AlertsFailed { reason: format!("{e:#}") }),
        };
        let until = tokio::time::Instant::now() + every;
        let _ = tokio::time::timeout_at(until, stop.cancelled()).await;
    }
}

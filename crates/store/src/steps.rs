//! Steps and their attempts: reading them, and applying step events to them. Every change of a
//! step's status goes through [`apply_event`], which runs `tidegate_core::state::apply`, keeps the
//! attempts and leases in step, and journals the event or its rejection. An [`Applier`] holds the
//! step the last event changed, so that a batch writes each step once and re-derives each run once.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use tidegate_core::partition::Interval;
use tidegate_core::state::{self, StepEvent};

use crate::codec::{fmt_ts, from_json, parse_opt_ts, parse_ts, to_i64, to_json, to_u32, to_u64};
use crate::journal::{Appender, Draft};
use crate::runs;
use crate::sql::{Row, Tx, Value, query_in_chunks};
use crate::{AttemptRecord, Error, JournalMeta, Outcome, Result, StepEventRecord, StepRecord};

pub(crate) const STEP_COLUMNS: &str = "id, run_id, name, task, partition_key, interval_start, interval_end, step_key, \
                                       pool, upstream_json, inputs_json, state_json, updated_at, code_version";

const ATTEMPT_COLUMNS: &str = "step_id, attempt, epoch, worker, started_at, ended_at, outcome, reason";

pub(crate) fn step_from_row(row: &Row) -> Result<StepRecord> {
    let id = row.text(0)?;
    let interval = match (parse_opt_ts(row.opt_text(5)?)?, parse_opt_ts(row.opt_text(6)?)?) {
        (Some(start), Some(end)) => Some(Interval { start, end }),
        (None, None) => None,
        _ => return Err(Error::Corrupt(format!("step {id} has half an interval"))),
    };
    Ok(StepRecord {
        run_id: row.text(1)?,
        name: row.text(2)?,
        task: row.text(3)?,
        partition: row.text(4)?,
        interval,
        step_key: row.text(7)?,
        pool: row.text(8)?,
        upstream: from_json(&format!("the upstream list of step {id}"), &row.text(9)?)?,
        inputs: from_json(&format!("the pinned inputs of step {id}"), &row.text(10)?)?,
        state: from_json(&format!("the state of step {id}"), &row.text(11)?)?,
        updated_at: parse_ts(&row.text(12)?)?,
        code_version: row.opt_text(13)?,
        id,
    })
}

pub(crate) fn attempt_from_row(row: &Row) -> Result<AttemptRecord> {
    Ok(AttemptRecord {
        step_id: row.text(0)?,
        attempt: to_u32("attempt number", row.int(1)?)?,
        epoch: to_u64("attempt epoch", row.int(2)?)?,
        worker: row.text(3)?,
        started_at: parse_ts(&row.text(4)?)?,
        ended_at: parse_opt_ts(row.opt_text(5)?)?,
        outcome: row.opt_text(6)?,
        reason: row.opt_text(7)?,
    })
}

pub(crate) fn load_step(tx: &mut dyn Tx, step_id: &str) -> Result<Option<StepRecord>> {
    tx.query(&format!("SELECT {STEP_COLUMNS} FROM steps WHERE id = ?1"), &[step_id.into()])?
        .first()
        .map(step_from_row)
        .transpose()
}

/// The body of [`crate::Store::steps_by_id`].
pub(crate) fn load_steps(tx: &mut dyn Tx, step_ids: &[String]) -> Result<Vec<StepRecord>> {
    query_in_chunks(tx, &[], step_ids, |ids| format!("SELECT {STEP_COLUMNS} FROM steps WHERE id IN ({ids})"))?
        .iter()
        .map(step_from_row)
        .collect()
}

/// The body of [`crate::Store::attempts_of_steps`].
pub(crate) fn attempts_of(tx: &mut dyn Tx, step_ids: &[String]) -> Result<Vec<AttemptRecord>> {
    let sql = |ids: &str| {
        format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE step_id IN ({ids}) ORDER BY step_id, attempt")
    };
    let mut attempts =
        query_in_chunks(tx, &[], step_ids, sql)?.iter().map(attempt_from_row).collect::<Result<Vec<_>>>()?;
    // Each chunk is sorted; the whole is too once the chunks are merged.
    attempts.sort_by(|a, b| (&a.step_id, a.attempt).cmp(&(&b.step_id, b.attempt)));
    Ok(attempts)
}

/// Writes a step's new state to its row.
fn write_step(tx: &mut dyn Tx, step_id: &str, state: &state::Step, at: DateTime<Utc>) -> Result<()> {
    tx.execute(
        "UPDATE steps SET status = ?1, attempt = ?2, epoch = ?3, state_json = ?4, updated_at = ?5 WHERE id = ?6",
        &[
            state.status.as_str().into(),
            Value::Int(state.attempt.into()),
            Value::Int(to_i64("epoch", state.epoch)?),
            to_json(state)?.into(),
            fmt_ts(at).into(),
            step_id.into(),
        ],
    )?;
    Ok(())
}

/// Applies step events inside one transaction. The step the last event changed is held in
/// memory, so consecutive events of one step (staged, validation started, checks passed) read and
/// write its row once; each event still has its own journal entry. [`finish_applying`]
/// writes the held step and re-derives each affected run once.
///
/// An applier made [`Applier::reading`] the steps its events will touch reads them all in one
/// query first; each is used once, for the first event that touches it, and a step touched
/// again after another one is read afresh (its row was written in between).
#[derive(Default)]
pub(crate) struct Applier {
    /// The step the last event touched, and whether its row is behind its state.
    held: Option<(StepRecord, bool)>,
    /// Each affected run and the metadata of the last event that touched it.
    /// The runs whose steps changed, each with the last change's meta and whether every change
    /// kept its step active ([`runs::rederive_run`]).
    runs: BTreeMap<String, (JournalMeta, bool)>,
    /// Steps read ahead, not touched yet.
    read_ahead: HashMap<String, StepRecord>,
}

impl Applier {
    /// An applier that reads `step_ids` in one query (a few, for many hundreds) instead of one
    /// query per step as events reach each: on PostgreSQL, a round trip per step less, and the
    /// journal entries the events append reach the database together (a query sends the
    /// deferred ones first).
    pub(crate) fn reading<'a>(tx: &mut dyn Tx, step_ids: impl IntoIterator<Item = &'a str>) -> Result<Self> {
        let mut ids: Vec<String> = step_ids.into_iter().map(str::to_owned).collect();
        ids.sort_unstable();
        ids.dedup();
        let read_ahead = load_steps(tx, &ids)?.into_iter().map(|step| (step.id.clone(), step)).collect();
        Ok(Applier { read_ahead, ..Applier::default() })
    }

    /// `step_id` as this transaction has it now, without taking it: the held step's state if it
    /// is the one held (its row may be behind), else as read ahead, else as read.
    pub(crate) fn current(&self, tx: &mut dyn Tx, step_id: &str) -> Result<Option<StepRecord>> {
        if let Some((held, _)) = self.held.as_ref().filter(|(held, _)| held.id == step_id) {
            return Ok(Some(held.clone()));
        }
        match self.read_ahead.get(step_id) {
            Some(step) => Ok(Some(step.clone())),
            None => load_step(tx, step_id),
        }
    }

    /// `step_id` as stored now: read ahead if it was (once), else read.
    pub(crate) fn take_step(&mut self, tx: &mut dyn Tx, step_id: &str) -> Result<Option<StepRecord>> {
        match self.read_ahead.remove(step_id) {
            Some(step) => Ok(Some(step)),
            None => load_step(tx, step_id),
        }
    }

    fn flush(tx: &mut dyn Tx, held: Option<(StepRecord, bool)>) -> Result<()> {
        match held {
            Some((step, true)) => write_step(tx, &step.id, &step.state, step.updated_at),
            _ => Ok(()),
        }
    }
}

/// Applies one event to `step` (already loaded in this transaction): the new state (written
/// to the step's row only if `write`: a caller applying several events to one step in a row
/// writes it once, after the last), the attempt and lease bookkeeping, and the journal entry,
/// or journals the rejection. `now` is when an attempt that this event starts began.
/// `detail`, when given, is one more field of the journal payload beside the event's own (for
/// example the versions a `staged` event recorded).
pub(crate) fn apply_event(
    tx: &mut dyn Tx,
    journal: &mut Appender,
    step: &StepRecord,
    rec: &StepEventRecord,
    now: DateTime<Utc>,
    detail: Option<(&str, &serde_json::Value)>,
    write: bool,
) -> Result<Outcome> {
    let from = step.state.status;
    let payload = match detail {
        None => to_json(&rec.event)?,
        Some((key, value)) => {
            let mut object = match serde_json::to_value(&rec.event) {
                Ok(serde_json::Value::Object(object)) => object,
                other => {
                    return Err(Error::Corrupt(format!("a step event serialized to {other:?}, not an object")));
                }
            };
            object.insert(key.to_owned(), value.clone());
            to_json(&object)?
        }
    };
    let draft = |kind, to_status, reason| Draft {
        meta: &rec.meta,
        kind,
        run_id: Some(&step.run_id),
        step_id: Some(&step.id),
        task: Some(&step.task),
        partition: Some(&step.partition),
        interval: step.interval,
        from_status: Some(from.as_str()),
        to_status,
        reason,
        payload: payload.clone(),
    };
    match state::apply(&step.state, &rec.event) {
        Ok(next) => {
            if write {
                write_step(tx, &step.id, &next, rec.meta.at)?;
            }
            record_attempt(tx, step, &next, rec, now)?;
            journal.append(tx, draft(rec.event.kind(), Some(next.status.as_str()), &rec.meta.reason))?;
            Ok(Outcome::Applied { step: next })
        }
        Err(e) => {
            let reason = e.to_string();
            // The rejection rests on the step's row as this transaction read it, and its entry
            // records that status. Writing the row (without changing it) makes a concurrent
            // transition of the step conflict with it, so that the two commit in the order of
            // their transaction ids and the chain shows the rejection where the step was
            // (decision 0024); a read alone would let it commit after the change it missed.
            tx.execute("UPDATE steps SET updated_at = updated_at WHERE id = ?1", &[step.id.as_str().into()])?;
            journal.append(tx, draft("rejected", None, &reason))?;
            Ok(Outcome::Rejected { reason })
        }
    }
}

/// Applies one event with `applier`, which holds the step the last event changed.
pub(crate) fn apply_held(
    tx: &mut dyn Tx,
    journal: &mut Appender,
    applier: &mut Applier,
    rec: &StepEventRecord,
    detail: Option<(&str, &serde_json::Value)>,
) -> Result<Outcome> {
    let (mut step, mut dirty) = match applier.held.take() {
        Some(held) if held.0.id == rec.step_id => held,
        other => {
            Applier::flush(tx, other)?;
            let step = applier
                .take_step(tx, &rec.step_id)?
                .ok_or_else(|| Error::NotFound { what: "step", id: rec.step_id.clone() })?;
            (step, false)
        }
    };
    let outcome = apply_event(tx, journal, &step, rec, rec.meta.at, detail, false)?;
    if let Outcome::Applied { step: next, .. } = &outcome {
        let kept_active = step.state.status.keeps_run_active() && next.status.keeps_run_active();
        step.state = next.clone();
        step.updated_at = rec.meta.at;
        dirty = true;
        let entry = applier.runs.entry(step.run_id.clone()).or_insert_with(|| (rec.meta.clone(), true));
        *entry = (rec.meta.clone(), entry.1 && kept_active);
    }
    applier.held = Some((step, dirty));
    Ok(outcome)
}

/// Writes the step `applier` holds, then re-derives each affected run once: a group commit of
/// a thousand events of one run re-derives its status once.
pub(crate) fn finish_applying(tx: &mut dyn Tx, journal: &mut Appender, mut applier: Applier) -> Result<()> {
    Applier::flush(tx, applier.held.take())?;
    for (run_id, (meta, kept_active)) in &applier.runs {
        runs::rederive_run(tx, journal, run_id, meta, *kept_active)?;
    }
    Ok(())
}

/// Applies `events` in order (each with [`apply_event`] to its step's stored state), then
/// re-derives each affected run once: the whole of a group commit, inside the caller's
/// transaction. An unknown step is [`Error::NotFound`], which rolls the transaction back.
pub(crate) fn apply_events(
    tx: &mut dyn Tx,
    journal: &mut Appender,
    events: &[StepEventRecord],
    detail: Option<(&str, &serde_json::Value)>,
) -> Result<Vec<Outcome>> {
    let mut applier = Applier::reading(tx, events.iter().map(|rec| rec.step_id.as_str()))?;
    let outcomes =
        events.iter().map(|rec| apply_held(tx, journal, &mut applier, rec, detail)).collect::<Result<_>>()?;
    finish_applying(tx, journal, applier)?;
    Ok(outcomes)
}

/// Keeps `attempts` and `leases` in step with an applied event: a claim starts an attempt; an
/// event that ends the attempt records its outcome and drops its lease; an event that takes
/// the step out of the statuses that hold a lease drops the lease.
fn record_attempt(
    tx: &mut dyn Tx,
    step: &StepRecord,
    next: &state::Step,
    rec: &StepEventRecord,
    now: DateTime<Utc>,
) -> Result<()> {
    let ended = match &rec.event {
        StepEvent::Claimed { epoch, worker } => {
            tx.execute(
                "INSERT INTO attempts (step_id, attempt, epoch, worker, started_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                &[
                    step.id.as_str().into(),
                    Value::Int(next.attempt.into()),
                    Value::Int(to_i64("epoch", *epoch)?),
                    worker.as_str().into(),
                    fmt_ts(now).into(),
                ],
            )?;
            return Ok(());
        }
        StepEvent::AttemptFailed { reason, .. } | StepEvent::ChecksFailed { reason, .. } => {
            ("failed", Some(reason.clone()))
        }
        StepEvent::LeaseExpired { .. } => ("lease_expired", next.last_failure.as_ref().map(|f| f.reason.clone())),
        StepEvent::Published { .. } => ("succeeded", None),
        StepEvent::Cancelled { reason } => ("cancelled", Some(reason.clone())),
        // The attempt goes on (a validated step is yet to be published, an approved one too),
        // but its execution is over: a lease left behind would expire and be reported as an
        // illegal `lease_expired` on every pass while the step waits for its approval.
        _ if step.state.status.holds_lease() && !next.status.holds_lease() => {
            tx.execute("DELETE FROM leases WHERE step_id = ?1", &[step.id.as_str().into()])?;
            return Ok(());
        }
        _ => return Ok(()),
    };
    let (outcome, reason) = ended;
    // Only the open attempt ends: cancelling a step that waits for a retry touches none.
    tx.execute(
        "UPDATE attempts SET ended_at = ?1, outcome = ?2, reason = ?3 \
         WHERE step_id = ?4 AND attempt = ?5 AND ended_at IS NULL",
        &[
            fmt_ts(rec.meta.at).into(),
            outcome.into(),
            reason.into(),
            step.id.as_str().into(),
            Value::Int(step.state.attempt.into()),
        ],
    )?;
    tx.execute("DELETE FROM leases WHERE step_id = ?1", &[step.id.as_str().into()])?;
    Ok(())
}

/// The body of [`crate::Store::steps`].
pub(crate) fn list(tx: &mut dyn Tx, run_id: &str) -> Result<Vec<StepRecord>> {
    tx.query(&format!("SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ?1 ORDER BY step_idx"), &[run_id.into()])?
        .iter()
        .map(step_from_row)
        .collect()
}

/// The body of [`crate::Store::attempts`].
pub(crate) fn attempts(tx: &mut dyn Tx, step_id: &str) -> Result<Vec<AttemptRecord>> {
    tx.query(&format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE step_id = ?1 ORDER BY attempt"), &[step_id.into()])?
        .iter()
        .map(attempt_from_row)
        .collect()
}

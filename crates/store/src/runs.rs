//! Runs and the client idempotency keys that make submitting one safe to retry: claiming a key,
//! creating or submitting a run with its planned steps, reading runs back, and re-deriving a
//! run's status from the statuses of its steps.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use chrono::{DateTime, Duration, Utc};
use tidegate_core::state::{self, RunEvent, RunStatus, StepStatus, StepTally};

use crate::codec::{fmt_ts, from_json, parse_ts, to_i64, to_json};
use crate::journal::{Appender, Draft};
use crate::sql::{Row, Tx, Value};
use crate::{Claim, Error, IN_FLIGHT_TIMEOUT_S, JournalMeta, NewStep, Result, RunRecord, RunRequest, Submission};

/// The most runs one `runs` call returns.
const RUNS_MAX: u32 = 10_000;

/// A query for any step of a run (`?1`) whose status keeps the run active: one index seek per
/// such status on `steps_by_run_status`. The statuses are the core's constants, not input.
static ANY_ACTIVE_STEP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let active: Vec<String> =
        StepStatus::ALL.iter().filter(|s| s.keeps_run_active()).map(|s| format!("'{}'", s.as_str())).collect();
    format!("SELECT 1 FROM steps WHERE run_id = ?1 AND status IN ({}) LIMIT 1", active.join(", "))
});

const RUN_COLUMNS: &str = "id, request_json, status, created_at, updated_at";

fn run_from_row(row: &Row) -> Result<RunRecord> {
    let id = row.text(0)?;
    let status = row.text(2)?;
    Ok(RunRecord {
        request: from_json(&format!("the request of run {id}"), &row.text(1)?)?,
        status: RunStatus::parse(&status)
            .ok_or_else(|| Error::Corrupt(format!("run {id} has unknown status {status:?}")))?,
        created_at: parse_ts(&row.text(3)?)?,
        updated_at: parse_ts(&row.text(4)?)?,
        id,
    })
}

/// The names of the request fields that differ, comparing everything but the idempotency key.
fn differing_fields(stored: &RunRequest, request: &RunRequest) -> Result<BTreeSet<String>> {
    let as_map = |r: &RunRequest| -> Result<BTreeMap<String, serde_json::Value>> {
        match serde_json::to_value(r).map_err(|e| Error::Corrupt(format!("serializing a run request: {e}")))? {
            serde_json::Value::Object(map) => Ok(map.into_iter().filter(|(k, _)| k != "idempotency_key").collect()),
            other => Err(Error::Corrupt(format!("a run request serialized to {other}, not an object"))),
        }
    };
    let (a, b) = (as_map(stored)?, as_map(request)?);
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    Ok(keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).cloned().collect())
}

/// A stored idempotency record.
struct KeyRecord {
    request: RunRequest,
    done: bool,
    run_id: Option<String>,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

const KEY_IN_PROGRESS: &str = "in_progress";
const KEY_DONE: &str = "done";

/// The body of [`crate::Store::run`].
pub(crate) fn load_run(tx: &mut dyn Tx, run_id: &str) -> Result<Option<RunRecord>> {
    tx.query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"), &[run_id.into()])?
        .first()
        .map(run_from_row)
        .transpose()
}

fn load_key(tx: &mut dyn Tx, key: &str) -> Result<Option<KeyRecord>> {
    let rows = tx.query(
        "SELECT request_json, state, run_id, created_at, expires_at FROM idempotency_records WHERE idem_key = ?1",
        &[key.into()],
    )?;
    let Some(row) = rows.first() else { return Ok(None) };
    let state = row.text(1)?;
    Ok(Some(KeyRecord {
        request: from_json(&format!("the request of idempotency key {key:?}"), &row.text(0)?)?,
        done: match state.as_str() {
            KEY_DONE => true,
            KEY_IN_PROGRESS => false,
            other => return Err(Error::Corrupt(format!("idempotency key {key:?} has unknown state {other:?}"))),
        },
        run_id: row.opt_text(2)?,
        created_at: parse_ts(&row.text(3)?)?,
        expires_at: parse_ts(&row.text(4)?)?,
    }))
}

/// Checks that step names are unique and that every upstream name is a step of the same run;
/// the run is refused otherwise, as the caller's mistake.
pub(crate) fn validate_steps(steps: &[NewStep]) -> Result<()> {
    let mut names = HashSet::new();
    for step in steps {
        if !names.insert(step.name.as_str()) {
            return Err(Error::InvalidRequest(format!("two steps are named {:?}", step.name)));
        }
    }
    for step in steps {
        for upstream in &step.upstream {
            if upstream == &step.name {
                return Err(Error::InvalidRequest(format!("step {:?} waits for itself", step.name)));
            }
            if !names.contains(upstream.as_str()) {
                return Err(Error::InvalidRequest(format!(
                    "step {:?} waits for {upstream:?}, which is not a step of this run",
                    step.name
                )));
            }
        }
    }
    Ok(())
}

/// The body of [`crate::Store::claim_idempotency_key`].
pub(crate) fn claim_key(
    tx: &mut dyn Tx,
    key: &str,
    request: &RunRequest,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<Claim> {
    let expires_at = fmt_ts(now + ttl);
    let claim_anew = |tx: &mut dyn Tx, replace: bool| -> Result<Claim> {
        let sql = if replace {
            "UPDATE idempotency_records SET request_json = ?2, state = ?3, run_id = NULL, created_at = ?4, \
             expires_at = ?5 WHERE idem_key = ?1"
        } else {
            "INSERT INTO idempotency_records (idem_key, request_json, state, created_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5)"
        };
        tx.execute(
            sql,
            &[
                key.into(),
                to_json(request)?.into(),
                KEY_IN_PROGRESS.into(),
                fmt_ts(now).into(),
                expires_at.as_str().into(),
            ],
        )?;
        Ok(Claim::Proceed)
    };
    let Some(stored) = load_key(tx, key)? else { return claim_anew(tx, false) };
    // An expired key is forgotten: whatever it was used for, this is a new request.
    if stored.expires_at <= now {
        return claim_anew(tx, true);
    }
    let fields = differing_fields(&stored.request, request)?;
    if !fields.is_empty() {
        return Err(Error::IdempotencyMismatch { key: key.to_owned(), fields });
    }
    if stored.done {
        let run_id =
            stored.run_id.ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} is done but names no run")))?;
        return Ok(Claim::Done { run_id });
    }
    // The submitter that claimed the key has had long enough; assume it crashed.
    if now - stored.created_at >= Duration::seconds(IN_FLIGHT_TIMEOUT_S) {
        return claim_anew(tx, true);
    }
    Err(Error::Conflict(format!(
        "idempotency key {key:?} is in use by a concurrent request claimed at {}; retry later",
        fmt_ts(stored.created_at)
    )))
}

/// The body of [`crate::Store::create_run`].
pub(crate) fn create(
    tx: &mut dyn Tx,
    request: &RunRequest,
    steps: &[NewStep],
    meta: &JournalMeta,
) -> Result<RunRecord> {
    if let Some(key) = &request.idempotency_key {
        let stored = load_key(tx, key)?.ok_or_else(|| Error::KeyNotClaimed { key: key.clone() })?;
        let fields = differing_fields(&stored.request, request)?;
        if !fields.is_empty() {
            return Err(Error::IdempotencyMismatch { key: key.clone(), fields });
        }
        if stored.done {
            return Err(Error::Conflict(format!(
                "idempotency key {key:?} already created run {}; claim the key to get it",
                stored.run_id.unwrap_or_default()
            )));
        }
    }
    let mut journal = Appender::default();
    let run = insert_run(tx, &mut journal, request, steps, meta)?;
    if let Some(key) = &request.idempotency_key {
        tx.execute(
            "UPDATE idempotency_records SET state = ?1, run_id = ?2 WHERE idem_key = ?3",
            &[KEY_DONE.into(), run.id.as_str().into(), key.as_str().into()],
        )?;
    }
    Ok(run)
}

/// The body of [`crate::Store::submit_run`].
pub(crate) fn submit(
    tx: &mut dyn Tx,
    request: &RunRequest,
    steps: &[NewStep],
    meta: &JournalMeta,
    ttl: Duration,
) -> Result<Submission> {
    let now = meta.at;
    let mut replace = false;
    if let Some(key) = &request.idempotency_key
        && let Some(stored) = load_key(tx, key)?
    {
        replace = true;
        if stored.expires_at > now {
            let fields = differing_fields(&stored.request, request)?;
            if !fields.is_empty() {
                return Err(Error::IdempotencyMismatch { key: key.clone(), fields });
            }
            match (stored.done, stored.run_id) {
                (true, Some(run_id)) => {
                    let run = load_run(tx, &run_id)?
                        .ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} names missing run {run_id}")))?;
                    return Ok(Submission { run, created: false });
                }
                (true, None) => {
                    return Err(Error::Corrupt(format!("idempotency key {key:?} is done but names no run")));
                }
                (false, _) if now - stored.created_at < Duration::seconds(IN_FLIGHT_TIMEOUT_S) => {
                    return Err(Error::Conflict(format!(
                        "idempotency key {key:?} is in use by a concurrent request claimed at {}; retry later",
                        fmt_ts(stored.created_at)
                    )));
                }
                (false, _) => {}
            }
        }
    }
    let mut journal = Appender::default();
    let run = insert_run(tx, &mut journal, request, steps, meta)?;
    if let Some(key) = &request.idempotency_key {
        let params = [
            key.as_str().into(),
            to_json(request)?.into(),
            KEY_DONE.into(),
            run.id.as_str().into(),
            fmt_ts(now).into(),
            fmt_ts(now + ttl).into(),
        ];
        let sql = if replace {
            "UPDATE idempotency_records SET request_json = ?2, state = ?3, run_id = ?4, created_at = ?5, \
             expires_at = ?6 WHERE idem_key = ?1"
        } else {
            "INSERT INTO idempotency_records (idem_key, request_json, state, run_id, created_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        };
        tx.execute(sql, &params)?;
    }
    Ok(Submission { run, created: true })
}

/// The body of [`crate::Store::runs`].
pub(crate) fn list(tx: &mut dyn Tx, limit: u32) -> Result<Vec<RunRecord>> {
    tx.query(
        &format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at DESC, id DESC LIMIT ?1"),
        &[Value::Int(limit.min(RUNS_MAX).into())],
    )?
    .iter()
    .map(run_from_row)
    .collect()
}

/// The body of [`crate::Store::purge_idempotency_keys`].
pub(crate) fn purge_keys(tx: &mut dyn Tx, now: DateTime<Utc>) -> Result<u64> {
    tx.execute("DELETE FROM idempotency_records WHERE expires_at <= ?1", &[fmt_ts(now).into()])
}

/// Re-derives a run's status from its steps with `apply_run`; journals a change.
/// Re-derives run `run_id`'s status from its steps' after some of them changed. `kept_active`:
/// every change kept its step active (ready to running, running to staged), so a running run
/// stays running without a look at its other steps. That look is a read of the run's part of the
/// `(run, status)` index, which every concurrent write to a step of the run conflicts with under
/// serializable isolation: skipping it where it cannot change the answer keeps those writes from
/// being run again.
pub(crate) fn rederive_run(
    tx: &mut dyn Tx,
    journal: &mut Appender,
    run_id: &str,
    meta: &JournalMeta,
    kept_active: bool,
) -> Result<()> {
    // A change that may end the run writes the run's row even when its status stays: two
    // transactions ending the last two active steps of a run each see the other's step still
    // active in their snapshots, and would each leave the run running; writing the row makes
    // them conflict, so that PostgreSQL refuses the second (at snapshot isolation too) and it
    // runs again, seeing the first's step ended.
    let rows = if kept_active {
        tx.query("SELECT status FROM runs WHERE id = ?1", &[run_id.into()])?
    } else {
        tx.query("UPDATE runs SET updated_at = updated_at WHERE id = ?1 RETURNING status", &[run_id.into()])?
    };
    let row = rows.first().ok_or_else(|| Error::Corrupt(format!("run {run_id} of a stored step does not exist")))?;
    let text = row.text(0)?;
    let from =
        RunStatus::parse(&text).ok_or_else(|| Error::Corrupt(format!("run {run_id} has unknown status {text:?}")))?;
    // A running run with a step still active stays running whatever the other counts are
    // (`state::apply_run`). One look in the (run, status) index answers that; the full tally
    // below reads every step of the run, which made each group commit of a large run cost in
    // proportion to the run's size.
    if from == RunStatus::Running && (kept_active || !tx.query(&ANY_ACTIVE_STEP, &[run_id.into()])?.is_empty()) {
        return Ok(());
    }
    let mut tally = StepTally::default();
    let counts = tx.query("SELECT status, COUNT(*) FROM steps WHERE run_id = ?1 GROUP BY status", &[run_id.into()])?;
    for row in counts {
        let text = row.text(0)?;
        let status = StepStatus::parse(&text)
            .ok_or_else(|| Error::Corrupt(format!("a step of run {run_id} has unknown status {text:?}")))?;
        let n = u32::try_from(row.int(1)?)
            .map_err(|_| Error::Corrupt(format!("run {run_id} counts more steps than fit a u32")))?;
        tally.add_n(status, n);
    }
    // A finished run stays finished: a late event on one of its steps changes the step only.
    let Ok(to) = state::apply_run(from, &RunEvent::StepsChanged { tally }) else { return Ok(()) };
    if to == from {
        return Ok(());
    }
    tx.execute(
        "UPDATE runs SET status = ?1, updated_at = ?2 WHERE id = ?3",
        &[to.as_str().into(), fmt_ts(meta.at).into(), run_id.into()],
    )?;
    journal.append(
        tx,
        Draft {
            run_id: Some(run_id),
            from_status: Some(from.as_str()),
            to_status: Some(to.as_str()),
            reason: "re-derived from the statuses of its steps",
            ..Draft::new(meta, "run_status", to_json(&tally)?)
        },
    )?;
    Ok(())
}

fn insert_run(
    tx: &mut dyn Tx,
    journal: &mut Appender,
    request: &RunRequest,
    steps: &[NewStep],
    meta: &JournalMeta,
) -> Result<RunRecord> {
    let run = RunRecord {
        id: uuid::Uuid::now_v7().to_string(),
        request: request.clone(),
        status: RunStatus::Queued,
        created_at: parse_ts(&fmt_ts(meta.at))?,
        updated_at: parse_ts(&fmt_ts(meta.at))?,
    };
    let request_json = to_json(request)?;
    tx.execute(
        "INSERT INTO runs (id, target, trigger_kind, priority, requester, backfill_id, idempotency_key, \
         request_json, status, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        &[
            run.id.as_str().into(),
            request.target.as_str().into(),
            to_json(&request.trigger)?.trim_matches('"').into(),
            to_json(&request.priority)?.trim_matches('"').into(),
            request.requester.as_str().into(),
            request.backfill_id.as_deref().into(),
            request.idempotency_key.as_deref().into(),
            request_json.as_str().into(),
            run.status.as_str().into(),
            fmt_ts(meta.at).into(),
            fmt_ts(meta.at).into(),
        ],
    )?;
    journal.append(
        tx,
        Draft {
            run_id: Some(&run.id),
            to_status: Some(run.status.as_str()),
            ..Draft::new(meta, "run_created", request_json)
        },
    )?;
    for (step_idx, step) in steps.iter().enumerate() {
        let step_id = uuid::Uuid::now_v7().to_string();
        let status = step.state.status.as_str();
        tx.execute(
            "INSERT INTO steps (id, run_id, step_idx, name, task, partition_key, interval_start, interval_end, \
             step_key, pool, upstream_json, inputs_json, status, attempt, epoch, state_json, created_at, updated_at, \
             code_version) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
            &[
                step_id.as_str().into(),
                run.id.as_str().into(),
                Value::Int(to_i64("step index", step_idx as u64)?),
                step.name.as_str().into(),
                step.task.as_str().into(),
                step.partition.as_str().into(),
                step.interval.map(|i| fmt_ts(i.start)).into(),
                step.interval.map(|i| fmt_ts(i.end)).into(),
                step.step_key.as_str().into(),
                step.pool.as_str().into(),
                to_json(&step.upstream)?.into(),
                to_json(&step.inputs)?.into(),
                status.into(),
                Value::Int(step.state.attempt.into()),
                Value::Int(to_i64("epoch", step.state.epoch)?),
                to_json(&step.state)?.into(),
                fmt_ts(meta.at).into(),
                fmt_ts(meta.at).into(),
                step.code_version.as_deref().into(),
            ],
        )?;
        journal.append(
            tx,
            Draft {
                meta,
                kind: "step_planned",
                run_id: Some(&run.id),
                step_id: Some(&step_id),
                task: Some(&step.task),
                partition: Some(&step.partition),
                interval: step.interval,
                from_status: None,
                to_status: Some(status),
                reason: &meta.reason,
                payload: to_json(step)?,
            },
        )?;
    }
    Ok(run)
}

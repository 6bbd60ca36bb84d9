//! Claims and leases: claiming ready steps for workers (each claim a new epoch, attempt and
//! lease), a worker process taking the leases in its name (each lease started by one process
//! only), renewing a lease, and listing the expired leases, the leases of a worker and the steps
//! the scheduler still has to drive.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use tidegate_core::state::{RunStatus, StepEvent, StepStatus};

use crate::checkpoints;
use crate::codec::{fmt_ts, from_json, parse_ts, to_i64, to_u32, to_u64};
use crate::journal::Appender;
use crate::runs;
use crate::sql::{Row, Tx, Value};
use crate::steps::{self, STEP_COLUMNS};
use crate::store::expiry;
use crate::workers;
use crate::{
    ActiveStep, ClaimRequest, Claimed, Error, JournalMeta, Lease, Outcome, Result, StepEventRecord, StepRecord,
    WorkerIdentity,
};

const LEASE_COLUMNS: &str = "step_id, attempt, epoch, worker, expires_at";

fn lease_from_row(row: &Row) -> Result<Lease> {
    Ok(Lease {
        step_id: row.text(0)?,
        attempt: to_u32("lease attempt", row.int(1)?)?,
        epoch: to_u64("lease epoch", row.int(2)?)?,
        worker: row.text(3)?,
        expires_at: parse_ts(&row.text(4)?)?,
    })
}

/// [`STEP_COLUMNS`] qualified with a table alias, for joins.
fn step_columns_of(alias: &str) -> String {
    STEP_COLUMNS.split(',').map(|c| format!("{alias}.{}", c.trim())).collect::<Vec<_>>().join(", ")
}

/// `'a', 'b'`: a SQL list of literals, for the store's own constants only (never caller input).
fn sql_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.map(|s| format!("'{s}'")).collect::<Vec<_>>().join(", ")
}

/// Claims each requested step that is ready (epoch + 1, `Claimed` applied, attempt and lease
/// recorded, journaled), then re-derives each affected run once; `None` for a step that is not
/// ready, else its lease and the step as the claim left it. A lease claimed for `local` (the
/// claiming process itself) is started by it at once: no worker process can take it
/// ([`take`]). Shared by the claim methods, inside the caller's transaction.
fn claim_batch(
    tx: &mut dyn Tx,
    journal: &mut Appender,
    claims: &[ClaimRequest],
    local: Option<&str>,
    now: DateTime<Utc>,
    ttl_s: u32,
) -> Result<Vec<Option<(Lease, StepRecord)>>> {
    let (expires_text, expires_at) = expiry(now, ttl_s)?;
    let mut leases = Vec::with_capacity(claims.len());
    let mut runs: BTreeMap<String, &JournalMeta> = BTreeMap::new();
    // Every claimed step read in one query; a step asked for twice is read again the second time.
    let mut steps = steps::Applier::reading(tx, claims.iter().map(|c| c.step_id.as_str()))?;
    for claim in claims {
        let step = steps
            .take_step(tx, &claim.step_id)?
            .ok_or_else(|| Error::NotFound { what: "step", id: claim.step_id.clone() })?;
        if step.state.status != StepStatus::Ready {
            leases.push(None);
            continue;
        }
        let epoch = step.state.epoch + 1;
        let rec = StepEventRecord {
            step_id: claim.step_id.clone(),
            event: StepEvent::Claimed { epoch, worker: claim.worker.clone() },
            meta: claim.meta.clone(),
        };
        let next = match steps::apply_event(tx, journal, &step, &rec, now, None, true)? {
            Outcome::Applied { step, .. } => step,
            Outcome::Rejected { reason, .. } => {
                return Err(Error::Corrupt(format!("a ready step refused a claim at epoch {epoch}: {reason}")));
            }
        };
        let runner = local.filter(|l| *l == claim.worker);
        tx.execute(
            "INSERT INTO leases (step_id, attempt, epoch, worker, acquired_at, heartbeat_at, expires_at, runner) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
             ON CONFLICT (step_id) DO UPDATE SET attempt = excluded.attempt, epoch = excluded.epoch, \
             worker = excluded.worker, acquired_at = excluded.acquired_at, \
             heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at, runner = excluded.runner",
            &[
                claim.step_id.as_str().into(),
                Value::Int(next.attempt.into()),
                Value::Int(to_i64("epoch", epoch)?),
                claim.worker.as_str().into(),
                fmt_ts(now).into(),
                fmt_ts(now).into(),
                expires_text.as_str().into(),
                runner.map_or(Value::Null, Value::from),
            ],
        )?;
        let lease = Lease {
            step_id: claim.step_id.clone(),
            attempt: next.attempt,
            epoch,
            worker: claim.worker.clone(),
            expires_at,
        };
        runs.insert(step.run_id.clone(), &claim.meta);
        leases.push(Some((lease, StepRecord { state: next, updated_at: claim.meta.at, ..step })));
    }
    // A claim takes a ready step to running: it keeps the step active.
    for (run_id, meta) in runs {
        runs::rederive_run(tx, journal, &run_id, meta, true)?;
    }
    Ok(leases)
}

/// The body of [`crate::Store::claim_step`].
pub(crate) fn claim_one(
    tx: &mut dyn Tx,
    claim: &ClaimRequest,
    now: DateTime<Utc>,
    ttl_s: u32,
) -> Result<Option<Lease>> {
    let mut claimed = claim_batch(tx, &mut Appender::default(), std::slice::from_ref(claim), None, now, ttl_s)?;
    Ok(claimed.pop().flatten().map(|(lease, _)| lease))
}

/// The body of [`crate::Store::claim_steps`].
pub(crate) fn claim(
    tx: &mut dyn Tx,
    claims: &[ClaimRequest],
    now: DateTime<Utc>,
    ttl_s: u32,
) -> Result<Vec<Option<Lease>>> {
    let claimed = claim_batch(tx, &mut Appender::default(), claims, None, now, ttl_s)?;
    Ok(claimed.into_iter().map(|c| c.map(|(lease, _)| lease)).collect())
}

/// The body of [`crate::Store::claim_steps_to_start`].
pub(crate) fn claim_to_start(
    tx: &mut dyn Tx,
    claims: &[ClaimRequest],
    local: &str,
    now: DateTime<Utc>,
    ttl_s: u32,
) -> Result<Vec<Option<Claimed>>> {
    let claimed = claim_batch(tx, &mut Appender::default(), claims, Some(local), now, ttl_s)?;
    claimed
        .into_iter()
        .map(|c| {
            let Some((lease, step)) = c else { return Ok(None) };
            let resume_from =
                if lease.worker == local && lease.may_resume() { checkpoints::load_last(tx, &step.id)? } else { None };
            Ok(Some(Claimed { lease, step, resume_from }))
        })
        .collect()
}

/// The body of [`crate::Store::heartbeat`].
pub(crate) fn heartbeat(tx: &mut dyn Tx, lease: &Lease, now: DateTime<Utc>, ttl_s: u32) -> Result<Lease> {
    // Heartbeats are not journaled: they change no state, and one per lease per few seconds
    // would drown the decisions the journal exists to explain.
    let step = steps::load_step(tx, &lease.step_id)?
        .ok_or_else(|| Error::NotFound { what: "step", id: lease.step_id.clone() })?;
    let fenced = || Error::Fenced { step_id: lease.step_id.clone(), got: lease.epoch, current: step.state.epoch };
    if step.state.epoch != lease.epoch || !step.state.status.holds_lease() {
        return Err(fenced());
    }
    let (expires_text, expires_at) = expiry(now, ttl_s)?;
    let n = tx.execute(
        "UPDATE leases SET heartbeat_at = ?1, expires_at = ?2 WHERE step_id = ?3 AND epoch = ?4",
        &[
            fmt_ts(now).into(),
            expires_text.into(),
            lease.step_id.as_str().into(),
            Value::Int(to_i64("epoch", lease.epoch)?),
        ],
    )?;
    if n == 0 {
        return Err(fenced());
    }
    Ok(Lease { expires_at, ..lease.clone() })
}

/// The body of [`crate::Store::expired_leases`].
pub(crate) fn expired(tx: &mut dyn Tx, now: DateTime<Utc>) -> Result<Vec<Lease>> {
    tx.query(
        &format!("SELECT {LEASE_COLUMNS} FROM leases WHERE expires_at < ?1 ORDER BY expires_at, step_id"),
        &[fmt_ts(now).into()],
    )?
    .iter()
    .map(lease_from_row)
    .collect()
}

/// The body of [`crate::Store::leases_of`].
pub(crate) fn of_worker(tx: &mut dyn Tx, worker: &str) -> Result<Vec<Lease>> {
    tx.query(
        &format!("SELECT {LEASE_COLUMNS} FROM leases WHERE worker = ?1 ORDER BY acquired_at, step_id"),
        &[worker.into()],
    )?
    .iter()
    .map(lease_from_row)
    .collect()
}

/// The leases in `worker`'s name that no process has started yet: what [`take`] would take.
pub(crate) fn untaken(tx: &mut dyn Tx, worker: &str) -> Result<Vec<Lease>> {
    tx.query(
        &format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE worker = ?1 AND runner IS NULL ORDER BY acquired_at, step_id"
        ),
        &[worker.into()],
    )?
    .iter()
    .map(lease_from_row)
    .collect()
}

/// The body of [`crate::Store::take_leases`]: marks the untaken leases in `w`'s name as started
/// by `w`'s process and returns them, oldest claim first; nothing while the name is registered to
/// another process. One conditional update takes them all (a statement, not one per lease): only
/// a lease still untaken passes its condition, re-checked on a row another writer changed first,
/// and only the rows this statement changed are returned, so no two processes ever start the same
/// attempt, even without the journal's order ([`crate::sql::Driver::write_unjournaled`]).
pub(crate) fn take(tx: &mut dyn Tx, w: &WorkerIdentity) -> Result<Vec<Lease>> {
    match workers::load(tx, &w.name)? {
        Some(holder) if holder.instance == w.instance => {}
        Some(holder) => return Err(workers::taken(&holder)),
        None => return Ok(Vec::new()),
    }
    let rows = tx.query(
        &format!(
            "UPDATE leases SET runner = ?1 WHERE worker = ?2 AND runner IS NULL RETURNING {LEASE_COLUMNS}, acquired_at"
        ),
        &[w.instance.as_str().into(), w.name.as_str().into()],
    )?;
    let mut taken = rows.iter().map(|row| Ok((row.text(5)?, lease_from_row(row)?))).collect::<Result<Vec<_>>>()?;
    taken.sort_by(|(a_at, a), (b_at, b)| (a_at, &a.step_id).cmp(&(b_at, &b.step_id)));
    Ok(taken.into_iter().map(|(_, lease)| lease).collect())
}

/// The body of [`crate::Store::active_steps`].
pub(crate) fn active(tx: &mut dyn Tx) -> Result<Vec<ActiveStep>> {
    // One query, driven from the few unfinished runs (`runs_by_status`) to their steps
    // (`steps_by_run`), so that a long history of finished runs costs nothing. The status
    // lists are the core's own definitions of terminal, written in as literals.
    let sql = format!(
        "SELECT {}, r.priority, r.created_at, r.backfill_id FROM runs r JOIN steps s ON s.run_id = r.id \
         WHERE r.status IN ({}) AND s.status IN ({}) ORDER BY r.created_at, r.id, s.step_idx",
        step_columns_of("s"),
        sql_list(RunStatus::ALL.iter().filter(|s| !s.is_terminal()).map(|s| s.as_str())),
        sql_list(StepStatus::ALL.iter().filter(|s| !s.is_terminal()).map(|s| s.as_str())),
    );
    let n_step_columns = STEP_COLUMNS.split(',').count();
    tx.query(&sql, &[])?
        .iter()
        .map(|row| {
            let step = steps::step_from_row(row)?;
            let priority = row.text(n_step_columns)?;
            Ok(ActiveStep {
                priority: from_json(&format!("the priority of run {}", step.run_id), &format!("\"{priority}\""))?,
                run_created_at: parse_ts(&row.text(n_step_columns + 1)?)?,
                backfill_id: row.opt_text(n_step_columns + 2)?,
                step,
            })
        })
        .collect()
}

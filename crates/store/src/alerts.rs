//! Alert episodes and silences (issue 34, decision 0023). The store keeps each (rule, subject)'s
//! state as the application wrote it and moves it only from the state the writer read, journaling
//! the transition in the same transaction; silences are rows with an expiry, journaled when
//! made and when ended early.

use crate::codec::{fmt_ts, parse_ts, to_i64, to_u64};
use crate::journal::{Appender, Draft};
use crate::sql::{Row, Tx, Value};
use crate::{AlertMove, AlertStateRecord, JournalMeta, Result, SilenceRecord};

/// An alert's journal entries share one correlation id per rule and subject, so `history`
/// follows an alert's episodes.
fn correlation_id(rule: &str, subject: &str) -> String {
    format!("alert-{rule}-{subject}")
}

/// The body of [`crate::Store::alert_states`].
pub(crate) fn states(tx: &mut dyn Tx) -> Result<Vec<AlertStateRecord>> {
    tx.query("SELECT rule, subject, state, episodes, quiet, updated_at FROM alert_states ORDER BY rule, subject", &[])?
        .iter()
        .map(|row| {
            Ok(AlertStateRecord {
                rule: row.text(0)?,
                subject: row.text(1)?,
                state: row.text(2)?,
                episodes: to_u64("alert episodes", row.int(3)?)?,
                quiet: row.int(4)? != 0,
                updated_at: parse_ts(&row.text(5)?)?,
            })
        })
        .collect()
}

/// The body of [`crate::Store::move_alert`].
pub(crate) fn move_alert(tx: &mut dyn Tx, change: &AlertMove, meta: &JournalMeta) -> Result<bool> {
    let episodes = Value::Int(to_i64("alert episodes", change.episodes)?);
    let quiet = Value::Int(i64::from(change.quiet));
    let moved = match &change.from {
        None => tx.execute(
            "INSERT INTO alert_states (rule, subject, state, episodes, quiet, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (rule, subject) DO NOTHING",
            &[
                change.rule.as_str().into(),
                change.subject.as_str().into(),
                change.to.as_str().into(),
                episodes,
                quiet,
                fmt_ts(meta.at).into(),
            ],
        )?,
        Some(from) => tx.execute(
            "UPDATE alert_states SET state = ?3, episodes = ?4, quiet = ?5, updated_at = ?6 \
             WHERE rule = ?1 AND subject = ?2 AND state = ?7",
            &[
                change.rule.as_str().into(),
                change.subject.as_str().into(),
                change.to.as_str().into(),
                episodes,
                quiet,
                fmt_ts(meta.at).into(),
                from.as_str().into(),
            ],
        )?,
    };
    if moved == 0 {
        return Ok(false);
    }
    if let Some((kind, payload)) = &change.entry {
        let meta = JournalMeta { correlation_id: correlation_id(&change.rule, &change.subject), ..meta.clone() };
        Appender::default().append(tx, Draft::new(&meta, kind, payload.clone()))?;
    }
    Ok(true)
}

fn silence_from_row(row: &Row) -> Result<SilenceRecord> {
    Ok(SilenceRecord {
        id: row.text(0)?,
        rule: row.text(1)?,
        subject: row.opt_text(2)?,
        actor: row.text(3)?,
        reason: row.text(4)?,
        created_at: parse_ts(&row.text(5)?)?,
        expires_at: parse_ts(&row.text(6)?)?,
        ended_at: row.opt_text(7)?.map(|t| parse_ts(&t)).transpose()?,
    })
}

const SILENCE_COLUMNS: &str = "id, rule, subject, actor, reason, created_at, expires_at, ended_at";

/// The body of [`crate::Store::silence`].
pub(crate) fn silence(tx: &mut dyn Tx, silence: &SilenceRecord, meta: &JournalMeta) -> Result<()> {
    tx.execute(
        &format!("INSERT INTO silences ({SILENCE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL)"),
        &[
            silence.id.as_str().into(),
            silence.rule.as_str().into(),
            silence.subject.as_deref().map_or(Value::Null, Value::from),
            silence.actor.as_str().into(),
            silence.reason.as_str().into(),
            fmt_ts(silence.created_at).into(),
            fmt_ts(silence.expires_at).into(),
        ],
    )?;
    let payload = serde_json::json!({
        "silence": silence.id,
        "rule": silence.rule,
        "subject": silence.subject,
        "expires_at": fmt_ts(silence.expires_at),
    });
    let meta = JournalMeta { correlation_id: silence.id.clone(), ..meta.clone() };
    Appender::default().append(tx, Draft::new(&meta, "silenced", payload.to_string()))?;
    Ok(())
}

/// The body of [`crate::Store::end_silence`].
pub(crate) fn end_silence(tx: &mut dyn Tx, id: &str, meta: &JournalMeta) -> Result<Option<SilenceRecord>> {
    let rows = tx.query(
        &format!("SELECT {SILENCE_COLUMNS} FROM silences WHERE id = ?1 AND ended_at IS NULL AND expires_at > ?2"),
        &[id.into(), fmt_ts(meta.at).into()],
    )?;
    let Some(held) = rows.first().map(silence_from_row).transpose()? else { return Ok(None) };
    tx.execute("UPDATE silences SET ended_at = ?2 WHERE id = ?1", &[id.into(), fmt_ts(meta.at).into()])?;
    let payload = serde_json::json!({ "silence": id, "rule": held.rule, "subject": held.subject });
    let meta = JournalMeta { correlation_id: id.to_owned(), ..meta.clone() };
    Appender::default().append(tx, Draft::new(&meta, "unsilenced", payload.to_string()))?;
    Ok(Some(SilenceRecord { ended_at: Some(meta.at), ..held }))
}

/// The body of [`crate::Store::silences`]: those in force at `now`, or every one.
pub(crate) fn silences(
    tx: &mut dyn Tx,
    in_force_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Vec<SilenceRecord>> {
    let rows = match in_force_at {
        Some(now) => tx.query(
            &format!(
                "SELECT {SILENCE_COLUMNS} FROM silences WHERE ended_at IS NULL AND expires_at > ?1 \
                 ORDER BY created_at, id"
            ),
            &[fmt_ts(now).into()],
        )?,
        None => tx.query(&format!("SELECT {SILENCE_COLUMNS} FROM silences ORDER BY created_at, id"), &[])?,
    };
    rows.iter().map(silence_from_row).collect()
}

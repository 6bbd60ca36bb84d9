//! Idempotency keys of API requests (`Idempotency-Key` over HTTP): a client's key, scoped to
//! the caller, is claimed by one request at a time, held while that request is in progress (its
//! holder renews the hold), then completed with the response to replay, or released when the
//! request failed and may run again. Claiming is one `INSERT ... ON CONFLICT DO UPDATE` on the
//! key's primary key, which only takes over a record that expired, or one whose hold lapsed
//! for an equal request (its holder died): of two concurrent claims, exactly one gets the key.
//! Not journaled: the operation a request runs journals what it does.

use chrono::{DateTime, Duration, Utc};

use crate::codec::{fmt_ts, parse_opt_ts, parse_ts};
use crate::sql::{Row, Tx, Value};
use crate::{Error, RequestKey, RequestKeyClaim, RequestKeyRecord, Result, StoredResponse};

const COLUMNS: &str = "scope, idem_key, method, path, body_hash, claim_id, created_at, expires_at, held_until, \
                       response_status, response_type, response_body";

fn from_row(row: &Row) -> Result<RequestKeyRecord> {
    let response = match row.opt_int(9)? {
        None => None,
        Some(status) => Some(StoredResponse {
            status: u16::try_from(status)
                .map_err(|_| Error::Corrupt(format!("a request key stores status {status}")))?,
            content_type: row.opt_text(10)?,
            body: row.opt_text(11)?.unwrap_or_default(),
        }),
    };
    Ok(RequestKeyRecord {
        request: RequestKey {
            scope: row.text(0)?,
            key: row.text(1)?,
            method: row.text(2)?,
            path: row.text(3)?,
            body_hash: row.text(4)?,
        },
        claim_id: row.text(5)?,
        created_at: parse_ts(&row.text(6)?)?,
        expires_at: parse_ts(&row.text(7)?)?,
        held_until: parse_opt_ts(row.opt_text(8)?)?,
        response,
    })
}

/// The body of [`crate::Store::claim_request_key`].
pub(crate) fn claim(
    tx: &mut dyn Tx,
    request: &RequestKey,
    now: DateTime<Utc>,
    hold_s: u32,
    ttl_h: u32,
) -> Result<RequestKeyClaim> {
    let claim_id = format!("rk-{}", uuid::Uuid::new_v4());
    let held_until = fmt_ts(now + Duration::seconds(hold_s.into()));
    let expires_at = fmt_ts(now + Duration::hours(ttl_h.into()));
    // A conflicting row is replaced only when it expired, or when it is an equal request still
    // in progress whose holder stopped renewing its hold (it died; the request may run again).
    let n = tx.execute(
        "INSERT INTO request_keys (scope, idem_key, claim_id, method, path, body_hash, created_at, expires_at, \
         held_until) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (scope, idem_key) DO UPDATE SET claim_id = excluded.claim_id, method = excluded.method, \
         path = excluded.path, body_hash = excluded.body_hash, created_at = excluded.created_at, \
         expires_at = excluded.expires_at, held_until = excluded.held_until, response_status = NULL, \
         response_type = NULL, response_body = NULL, completed_at = NULL \
         WHERE request_keys.expires_at <= ?7 \
         OR (request_keys.response_status IS NULL AND request_keys.held_until <= ?7 \
         AND request_keys.method = excluded.method AND request_keys.path = excluded.path \
         AND request_keys.body_hash = excluded.body_hash)",
        &[
            request.scope.as_str().into(),
            request.key.as_str().into(),
            claim_id.as_str().into(),
            request.method.as_str().into(),
            request.path.as_str().into(),
            request.body_hash.as_str().into(),
            fmt_ts(now).into(),
            expires_at.into(),
            held_until.into(),
        ],
    )?;
    if n == 1 {
        return Ok(RequestKeyClaim::Claimed { claim_id });
    }
    let record = load(tx, &request.scope, &request.key)?.ok_or_else(|| {
        Error::Corrupt(format!("request key {:?} neither claimed nor found in its own transaction", request.key))
    })?;
    Ok(RequestKeyClaim::Taken(Box::new(record)))
}

/// The body of [`crate::Store::renew_request_key`].
pub(crate) fn renew(tx: &mut dyn Tx, claim_id: &str, now: DateTime<Utc>, hold_s: u32) -> Result<bool> {
    let held_until = fmt_ts(now + Duration::seconds(hold_s.into()));
    let n = tx.execute(
        "UPDATE request_keys SET held_until = ?2 WHERE claim_id = ?1 AND response_status IS NULL",
        &[claim_id.into(), held_until.into()],
    )?;
    Ok(n == 1)
}

/// The body of [`crate::Store::complete_request_key`].
pub(crate) fn complete(tx: &mut dyn Tx, claim_id: &str, response: &StoredResponse, now: DateTime<Utc>) -> Result<bool> {
    let n = tx.execute(
        "UPDATE request_keys SET response_status = ?2, response_type = ?3, response_body = ?4, completed_at = ?5, \
         held_until = NULL WHERE claim_id = ?1 AND response_status IS NULL",
        &[
            claim_id.into(),
            Value::Int(response.status.into()),
            response.content_type.as_deref().into(),
            response.body.as_str().into(),
            fmt_ts(now).into(),
        ],
    )?;
    Ok(n == 1)
}

/// The body of [`crate::Store::release_request_key`].
pub(crate) fn release(tx: &mut dyn Tx, claim_id: &str) -> Result<bool> {
    let n =
        tx.execute("DELETE FROM request_keys WHERE claim_id = ?1 AND response_status IS NULL", &[claim_id.into()])?;
    Ok(n == 1)
}

/// The body of [`crate::Store::request_key`].
pub(crate) fn load(tx: &mut dyn Tx, scope: &str, key: &str) -> Result<Option<RequestKeyRecord>> {
    tx.query(
        &format!("SELECT {COLUMNS} FROM request_keys WHERE scope = ?1 AND idem_key = ?2"),
        &[scope.into(), key.into()],
    )?
    .first()
    .map(from_row)
    .transpose()
}

/// The body of [`crate::Store::purge_request_keys`].
pub(crate) fn purge(tx: &mut dyn Tx, now: DateTime<Utc>) -> Result<u64> {
    tx.execute("DELETE FROM request_keys WHERE expires_at <= ?1", &[fmt_ts(now).into()])
}

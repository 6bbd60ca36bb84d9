//! Tokens: identities an admin mints for people. The store keeps a token's hash and the identity
//! it carries; presenting the token establishes that identity. Minting and revoking are journaled
//! (without the hash); using a token is not a state change and is not.

use tidegate_core::actor::{Role, identity_key};

use crate::codec::{fmt_ts, parse_opt_ts, parse_ts};
use crate::journal::{Appender, Draft};
use crate::sql::{Row, Tx};
use crate::{Error, JournalMeta, NewToken, Result, TokenRecord};

const COLUMNS: &str = "id, name, role, created_by, created_at, expires_at, revoked_at";

fn from_row(row: &Row) -> Result<TokenRecord> {
    let role = row.text(2)?;
    Ok(TokenRecord {
        id: row.text(0)?,
        name: row.text(1)?,
        role: Role::parse(&role).ok_or_else(|| Error::Corrupt(format!("a token has unknown role {role:?}")))?,
        created_by: row.text(3)?,
        created_at: parse_ts(&row.text(4)?)?,
        expires_at: parse_opt_ts(row.opt_text(5)?)?,
        revoked_at: parse_opt_ts(row.opt_text(6)?)?,
    })
}

pub(crate) fn create(tx: &mut dyn Tx, token: &NewToken, meta: &JournalMeta) -> Result<TokenRecord> {
    let key = identity_key(&token.name);
    let same = tx.query(
        "SELECT name FROM tokens WHERE identity_key = ?1 AND name <> ?2",
        &[key.as_str().into(), token.name.as_str().into()],
    )?;
    if let Some(row) = same.first() {
        let other = row.text(0)?;
        return Err(Error::InvalidRequest(format!(
            "{:?} reads the same as the existing identity {other:?}; one person has one name: mint the \
             token for {other:?}, or choose a name no one else's resembles",
            token.name
        )));
    }
    tx.execute(
        &format!(
            "INSERT INTO tokens ({COLUMNS}, identity_key, token_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, ?8)"
        ),
        &[
            token.id.as_str().into(),
            token.name.as_str().into(),
            token.role.as_str().into(),
            token.created_by.as_str().into(),
            fmt_ts(meta.at).into(),
            token.expires_at.map(fmt_ts).into(),
            key.into(),
            token.token_hash.as_str().into(),
        ],
    )?;
    let payload = serde_json::json!({
        "token_id": token.id,
        "name": token.name,
        "role": token.role,
        "expires_at": token.expires_at.map(fmt_ts),
    });
    Appender::default().append(tx, Draft::new(meta, "token_created", payload.to_string()))?;
    load(tx, &token.id)?.ok_or_else(|| Error::Corrupt(format!("token {} vanished as it was created", token.id)))
}

fn load(tx: &mut dyn Tx, id: &str) -> Result<Option<TokenRecord>> {
    tx.query(&format!("SELECT {COLUMNS} FROM tokens WHERE id = ?1"), &[id.into()])?.first().map(from_row).transpose()
}

pub(crate) fn by_hash(tx: &mut dyn Tx, token_hash: &str) -> Result<Option<TokenRecord>> {
    tx.query(&format!("SELECT {COLUMNS} FROM tokens WHERE token_hash = ?1"), &[token_hash.into()])?
        .first()
        .map(from_row)
        .transpose()
}

pub(crate) fn list(tx: &mut dyn Tx) -> Result<Vec<TokenRecord>> {
    tx.query(&format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, id"), &[])?.iter().map(from_row).collect()
}

pub(crate) fn revoke(tx: &mut dyn Tx, id: &str, meta: &JournalMeta) -> Result<TokenRecord> {
    let token = load(tx, id)?
        .ok_or_else(|| Error::InvalidRequest(format!("no token {id:?}; `tidegate token list` names them")))?;
    if token.revoked_at.is_some() {
        return Ok(token);
    }
    tx.execute("UPDATE tokens SET revoked_at = ?1 WHERE id = ?2", &[fmt_ts(meta.at).into(), id.into()])?;
    let payload = serde_json::json!({ "token_id": id, "name": token.name, "role": token.role });
    Appender::default().append(tx, Draft::new(meta, "token_revoked", payload.to_string()))?;
    load(tx, id)?.ok_or_else(|| Error::Corrupt(format!("token {id} vanished as it was revoked")))
}

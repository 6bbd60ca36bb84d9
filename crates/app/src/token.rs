//! Tokens: identities for people. An admin mints a token for a named person with a role and
//! hands it over; its holder presents it and acts as that person. The store keeps only its hash.

use anyhow::Result;
use chrono::Duration;
use serde::Serialize;
use tidegate_core::actor::{self, Actor, Role, token_hash};
use tidegate_store::{JournalMeta, NewToken, Store, TokenRecord};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// The longest a token may be valid for.
pub const EXPIRY_DAYS_MAX: u32 = 3_650;

/// A token just minted: the secret, shown this once, and its record.
#[derive(Debug, Serialize)]
pub struct Minted {
    /// The token itself; the store keeps only its hash.
    pub token: String,
    /// Its identity, role and expiry.
    #[serde(flatten)]
    pub record: TokenRecord,
}

/// Whether a token can be used now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    /// It establishes its identity.
    Active,
    /// An admin revoked it.
    Revoked,
    /// Its expiry has passed.
    Expired,
}

/// A token as listed: its record and its state now (never the token itself).
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Listed {
    /// Its identity, role and expiry.
    #[serde(flatten)]
    pub record: TokenRecord,
    /// Whether it can be used now.
    pub state: TokenState,
}

/// Mints a token for `name` with `role`, recorded as minted by `minter` (an admin); returns the
/// token (shown once) and its record.
pub fn mint(
    ws: &Workspace,
    store: &dyn Store,
    minter: &Actor,
    name: &str,
    role: Role,
    expires_in_days: u32,
) -> Result<Minted> {
    require(minter, Access::ManageTokens)?;
    let name = match actor::validate_name(name) {
        Ok(name) => name,
        Err(e) => crate::refuse!(Invalid, "--name: {e}"),
    };
    if expires_in_days == 0 || expires_in_days > EXPIRY_DAYS_MAX {
        crate::refuse!(Invalid, "--expires-in-days {expires_in_days}: must be 1 to {EXPIRY_DAYS_MAX}");
    }
    let token = mint_secret();
    let new = NewToken {
        id: format!("tk-{}", uuid::Uuid::now_v7().simple()),
        name: name.clone(),
        role,
        token_hash: token_hash(&token),
        created_by: minter.describe(),
        expires_at: Some(ws.now() + Duration::days(expires_in_days.into())),
    };
    let meta = JournalMeta {
        via: Some(minter.via()),
        actor: minter.name.clone(),
        correlation_id: new.id.clone(),
        reason: format!("token minted for {name} ({role})"),
        at: ws.now(),
    };
    Ok(Minted { token, record: store.create_token(&new, &meta)? })
}

/// Every token with its state now, oldest first.
pub fn list(ws: &Workspace, store: &dyn Store, actor: &Actor) -> Result<Vec<Listed>> {
    require(actor, Access::ManageTokens)?;
    let now = ws.now();
    Ok(store
        .tokens()?
        .into_iter()
        .map(|record| {
            let state = match (record.revoked_at, record.unusable(now)) {
                (Some(_), _) => TokenState::Revoked,
                (None, Some(_)) => TokenState::Expired,
                (None, None) => TokenState::Active,
            };
            Listed { record, state }
        })
        .collect())
}

/// Stops token `id` from working (journaled); returns its record.
pub fn revoke(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str) -> Result<TokenRecord> {
    require(actor, Access::ManageTokens)?;
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: uuid::Uuid::now_v7().to_string(),
        reason: format!("token {id} revoked"),
        at: ws.now(),
    };
    Ok(store.revoke_token(id, &meta)?)
}

/// A new token: 244 random bits from the operating system (two version-4 UUIDs), with a prefix
/// that makes a leaked token easy to recognise in a log or a repository.
fn mint_secret() -> String {
    format!("tgt_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

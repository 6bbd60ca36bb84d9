//! Tokens: identities for people. An admin mints a token for a named person with a role and
//! hands it over; its holder presents it and acts as that person. The store keeps only its hash.

use anyhow::{Result, bail};
use chrono::{Duration, Utc};
use tidegate_core::actor::{self, Actor, Role, token_hash};
use tidegate_store::{JournalMeta, NewToken, Store, TokenRecord};

/// The longest a token may be valid for.
pub const EXPIRY_DAYS_MAX: u32 = 3_650;

/// Mints a token for `name` with `role`, recorded as minted by `minter`; returns the
/// token (shown once) and its record.
pub fn mint(
    store: &dyn Store,
    minter: &Actor,
    name: &str,
    role: Role,
    expires_in_days: u32,
) -> Result<(String, TokenRecord)> {
    let name = actor::validate_name(name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    if expires_in_days == 0 || expires_in_days > EXPIRY_DAYS_MAX {
        bail!("--expires-in-days {expires_in_days}: must be 1 to {EXPIRY_DAYS_MAX}");
    }
    let token = mint_secret();
    let new = NewToken {
        id: format!("tk-{}", uuid::Uuid::now_v7().simple()),
        name: name.clone(),
        role,
        token_hash: token_hash(&token),
        created_by: minter.describe(),
        expires_at: Some(Utc::now() + Duration::days(expires_in_days.into())),
    };
    let meta = JournalMeta {
        actor: minter.name.clone(),
        correlation_id: new.id.clone(),
        reason: format!("token minted for {name} ({role})"),
        at: Utc::now(),
    };
    Ok((token, store.create_token(&new, &meta)?))
}

/// A new token: 244 random bits from the operating system (two version-4 UUIDs), with a prefix
/// that makes a leaked token easy to recognise in a log or a repository.
fn mint_secret() -> String {
    format!("tgt_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

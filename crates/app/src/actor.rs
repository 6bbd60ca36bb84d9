//! Who asks. An actor is established, never typed: the operating-system account that runs a
//! local command, or the identity of a token its holder presents. The CLI reads a token from its
//! environment and the server from a request's header; both end here, in [`authenticate`], and
//! every operation that records a decision takes the actor it records as an argument.

use anyhow::{Result, bail};
use chrono::{DateTime, Utc};
use tidegate_core::actor::{Actor, Authentication, Role, token_hash};
use tidegate_store::Store;

/// Where a command run on this machine comes from.
pub const LOCAL_ORIGIN: &str = "local";

/// The operating-system account running this process: its login name, or `uid-N` when the
/// account has no name (a container's arbitrary uid). Never "unknown".
pub fn os_account() -> Actor {
    let uid = nix::unistd::getuid();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| format!("uid-{uid}"));
    Actor { name, authentication: Authentication::OsAccount { uid: uid.as_raw() }, origin: LOCAL_ORIGIN.to_owned() }
}

/// The identity a token establishes for a request from `origin`, or an error saying why the
/// token cannot be used (`presented_as` names where it came from, for the message).
pub fn authenticate(
    store: &dyn Store,
    token: &str,
    origin: &str,
    presented_as: &str,
    now: DateTime<Utc>,
) -> Result<Actor> {
    let Some(record) = store.token_by_hash(&token_hash(token))? else {
        bail!(
            "the token presented ({presented_as}) is not known to this workspace's store; ask an admin for a token \
             (`tidegate token create`)"
        );
    };
    if let Some(why) = record.unusable(now) {
        bail!("{why}; ask an admin for a new token (`tidegate token create`)");
    }
    Ok(Actor {
        name: record.name,
        authentication: Authentication::Token { token_id: record.id, role: record.role },
        origin: origin.to_owned(),
    })
}

/// Refuses when `actor`'s role is below `role`, naming what was asked and who asked.
pub fn require(actor: &Actor, role: Role, what: &str) -> Result<()> {
    if actor.role() < role {
        bail!(
            "{} may not {what}: that needs the {role} role or above, and the token carries {}",
            actor.describe(),
            actor.role()
        );
    }
    Ok(())
}

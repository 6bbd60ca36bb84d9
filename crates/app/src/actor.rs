//! Who asks. An actor is established, never typed: the operating-system account that runs a
//! local command, or the identity of a token its holder presents. The CLI reads a token from its
//! environment and the server from a request's header; both end here, in [`authenticate`], and
//! every operation that records a decision takes the actor it records as an argument.

use anyhow::Result;
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
    // The store looks the token up by its hash, never by the token: no comparison of secrets
    // happens here whose time could leak how much of a guess was right.
    let Some(record) = store.token_by_hash(&token_hash(token))? else {
        crate::refuse!(
            Unauthenticated,
            "the token presented ({presented_as}) is not known to this workspace's store; ask an admin for a token \
             (`tidegate token create`)"
        );
    };
    if let Some(why) = record.unusable(now) {
        crate::refuse!(Unauthenticated, "{why}; ask an admin for a new token (`tidegate token create`)");
    }
    Ok(Actor {
        name: record.name,
        authentication: Authentication::Token { token_id: record.id, role: record.role },
        origin: origin.to_owned(),
    })
}

/// What an operation does, as far as who may do it is concerned: the one table of roles that
/// every front end enforces, because every operation checks its own access first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read published data, runs, the journal and the status (viewer).
    Read,
    /// Read backfills and their reviews (viewer).
    ReadBackfills,
    /// Submit, run, schedule and execute work (operator).
    RunWork,
    /// Plan, start, compare, publish, pause, cancel or roll back a backfill (operator).
    ChangeBackfill,
    /// Approve a backfill someone else requested (approver).
    ApproveBackfill,
    /// Roll back, vacuum or reconcile published tables (operator).
    ChangeTables,
    /// Mint, list and revoke tokens (admin).
    ManageTokens,
}

impl Access {
    /// Every kind of access, for tables and tests.
    pub const ALL: [Access; 7] = [
        Access::Read,
        Access::ReadBackfills,
        Access::RunWork,
        Access::ChangeBackfill,
        Access::ApproveBackfill,
        Access::ChangeTables,
        Access::ManageTokens,
    ];

    /// The least role that grants this access.
    pub fn role(self) -> Role {
        match self {
            Access::Read | Access::ReadBackfills => Role::Viewer,
            Access::RunWork | Access::ChangeBackfill | Access::ChangeTables => Role::Operator,
            Access::ApproveBackfill => Role::Approver,
            Access::ManageTokens => Role::Admin,
        }
    }

    /// What is asked, in words, for the refusal.
    pub fn what(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::ReadBackfills => "read backfills",
            Access::RunWork => "run work",
            Access::ChangeBackfill => "change a backfill",
            Access::ApproveBackfill => "approve a backfill",
            Access::ChangeTables => "change published tables",
            Access::ManageTokens => "manage tokens",
        }
    }
}

/// Refuses when `actor`'s role is below what `access` needs, naming what was asked and who asked.
pub fn require(actor: &Actor, access: Access) -> Result<()> {
    let role = access.role();
    if actor.role() < role {
        crate::refuse!(
            Forbidden,
            "{} may not {}: that needs the {role} role or above, and the token carries {}",
            actor.describe(),
            access.what(),
            actor.role()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidegate_core::actor::Authentication;

    fn holder(role: Role) -> Actor {
        Actor {
            name: "ana".to_owned(),
            authentication: Authentication::Token { token_id: "tk-1".to_owned(), role },
            origin: LOCAL_ORIGIN.to_owned(),
        }
    }

    #[test]
    fn each_role_is_granted_exactly_the_access_at_or_below_it() {
        for access in Access::ALL {
            for role in Role::ALL {
                let granted = require(&holder(role), access).is_ok();
                assert_eq!(granted, role >= access.role(), "{role} asking to {}", access.what());
            }
        }
        let refusal = require(&holder(Role::Viewer), Access::RunWork).expect_err("a viewer may not run work");
        assert!(refusal.to_string().contains("may not run work: that needs the operator role"), "{refusal}");
    }

    #[test]
    fn the_os_account_is_the_local_admin() {
        for access in Access::ALL {
            assert!(require(&os_account(), access).is_ok(), "{}", access.what());
        }
    }
}

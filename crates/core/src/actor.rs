//! Who acts, and how that was established. Every operation has an actor; a decision that needs
//! two people (a backfill's approval) compares actors the way people would compare names.
//!
//! An actor is established, never typed: in local mode it is the operating-system account that
//! runs the command; with a token (minted by an admin and presented by its holder) it is the
//! token's identity and role. The HTTP server authenticates bearer tokens into the same type.

use std::fmt;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization as _;

use crate::idempotency::Canonical;

/// The longest identity name accepted, in characters.
pub const NAME_CHARS_MAX: usize = 64;

/// What an actor may do. Ordered: each role may do what the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads status, history and data.
    Viewer,
    /// Also submits and runs work, plans and starts backfills, rolls back.
    Operator,
    /// Also approves backfills.
    Approver,
    /// Also mints and revokes tokens.
    Admin,
}

impl Role {
    /// Every role, from the least to the most allowed.
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Operator, Role::Approver, Role::Admin];

    /// The role's name as stored and typed: `viewer`, `operator`, `approver` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }

    /// Parses a role name (`viewer`, `operator`, `approver`, `admin`).
    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an actor's identity was established.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "method")]
pub enum Authentication {
    /// The operating-system account running the command. Whoever can run commands on a local
    /// workspace can also write its store, so this account is the workspace's admin.
    OsAccount {
        /// The account's numeric user id.
        uid: u32,
    },
    /// A token minted by an admin, presented by its holder.
    Token {
        /// The id of the token presented (not the secret), as the store records it.
        token_id: String,
        /// The role the token was minted with.
        role: Role,
    },
}

/// Who acts, how that was established and from where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The identity's name: the OS account's name, or the name the token was minted for.
    pub name: String,
    /// How the identity was established, which also decides the actor's role.
    pub authentication: Authentication,
    /// Where the request came from: `local` for a command on this machine, an address behind
    /// the server.
    pub origin: String,
}

impl Actor {
    /// The actor's role: an OS account is its local workspace's admin.
    pub fn role(&self) -> Role {
        match &self.authentication {
            Authentication::OsAccount { .. } => Role::Admin,
            Authentication::Token { role, .. } => *role,
        }
    }

    /// Whether this actor is the person called `name`, compared as people compare names.
    pub fn is(&self, name: &str) -> bool {
        same_person(&self.name, name)
    }

    /// How the actor was established and from where, as the journal records it beside the name:
    /// `OS account uid 1000, local` or `token tk-0193... (approver), http 127.0.0.1:53012`.
    pub fn via(&self) -> String {
        match &self.authentication {
            Authentication::OsAccount { uid } => format!("OS account uid {uid}, {}", self.origin),
            Authentication::Token { token_id, role } => format!("token {token_id} ({role}), {}", self.origin),
        }
    }

    /// `ana (OS account, uid 1000)` or `bo (token tk-0193..., approver)`: for messages and the journal.
    pub fn describe(&self) -> String {
        match &self.authentication {
            Authentication::OsAccount { uid } => format!("{} (OS account, uid {uid})", self.name),
            Authentication::Token { token_id, role } => format!("{} (token {token_id}, {role})", self.name),
        }
    }
}

/// The form two names are compared in: Unicode compatibility-normalised, case-folded, with
/// look-alike characters replaced by their prototype (the UTS #39 skeleton), so `Bob`, `bob `,
/// `ｂｏｂ` and `bоb` (a Cyrillic `о`) are one person.
pub fn identity_key(name: &str) -> String {
    use unicode_security::confusable_detection::skeleton;
    // The skeleton before folding case keeps look-alikes that only one case has (a capital `I`
    // reads as `l`); the one after it maps what folding produced (a Cyrillic capital to Latin).
    let compatible: String = name.trim().nfkc().collect();
    let lower = skeleton(&compatible).collect::<String>().to_lowercase();
    skeleton(&lower).collect()
}

/// Whether two names denote the same person, as people would read them.
pub fn same_person(a: &str, b: &str) -> bool {
    identity_key(a) == identity_key(b)
}

/// Checks a name given to an identity: not blank, no control characters, at most
/// [`NAME_CHARS_MAX`] characters. Returns the trimmed name.
pub fn validate_name(name: &str) -> Result<String, String> {
    let trimmed = name.trim();
    if trimmed.is_empty() {
        return Err("a name cannot be empty".to_owned());
    }
    if trimmed.chars().any(char::is_control) {
        return Err(format!("name {trimmed:?} holds control characters"));
    }
    if trimmed.chars().count() > NAME_CHARS_MAX {
        return Err(format!("name {trimmed:?} is longer than {NAME_CHARS_MAX} characters"));
    }
    Ok(trimmed.to_owned())
}

/// What the store keeps of a token: its hash, never the token.
pub fn token_hash(token: &str) -> String {
    Canonical::new("tidegate.token.v1").str("token", token).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_compared_as_people_read_them() {
        for (a, b) in [
            ("bob", "Bob"),
            ("bob", " BOB "),
            ("bob", "ｂｏｂ"),         // full-width letters
            ("bob", "b\u{043E}b"),     // Cyrillic o
            ("ana", "\u{0430}na"),     // Cyrillic a
            ("alice", "a\u{006C}ice"), // plain, for symmetry
            ("will", "wiII"),          // capital I looks like l
            ("mary", "rnary"),         // rn looks like m
            ("ana", "an\u{200B}a"),    // zero-width space
        ] {
            assert!(same_person(a, b), "{a:?} and {b:?} are one person");
        }
        for (a, b) in [("ana", "bo"), ("bob", "rob"), ("ana", "anna")] {
            assert!(!same_person(a, b), "{a:?} and {b:?} are two people");
        }
    }

    #[test]
    fn names_must_say_something_printable() {
        assert!(validate_name("  ").is_err());
        assert!(validate_name("a\u{7}b").is_err());
        assert!(validate_name(&"x".repeat(NAME_CHARS_MAX + 1)).is_err());
        assert_eq!(validate_name(" bo ").as_deref(), Ok("bo"));
    }

    #[test]
    fn an_os_account_is_its_workspaces_admin_and_a_token_has_its_role() {
        let os = Actor {
            name: "ana".into(),
            authentication: Authentication::OsAccount { uid: 1000 },
            origin: "local".into(),
        };
        assert_eq!(os.role(), Role::Admin);
        let token = Actor {
            name: "bo".into(),
            authentication: Authentication::Token { token_id: "tk-1".into(), role: Role::Approver },
            origin: "local".into(),
        };
        assert_eq!(token.role(), Role::Approver);
        assert!(Role::Approver > Role::Operator && Role::Admin > Role::Approver);
        assert_eq!(token.describe(), "bo (token tk-1, approver)");
    }
}

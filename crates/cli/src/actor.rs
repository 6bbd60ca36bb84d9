//! Who runs this command. Established, never typed: the operating-system account that runs the
//! process, or the identity of a token its holder presents in `TIDEGATE_TOKEN` (or a file named
//! by `TIDEGATE_TOKEN_FILE`). No flag and no other variable changes it.
//!
//! The actor is established once per process, before the command runs (`establish`), and read
//! wherever a decision is recorded (`current`). The demo, which plays two people in one process,
//! switches to an actor it authenticated with a token it minted (`act_as`), as a second person
//! would present their own.

use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use tidegate_core::actor::{Actor, Authentication, Role, token_hash};
use tidegate_store::Store;

/// The variable holding a token.
pub const TOKEN_VAR: &str = "TIDEGATE_TOKEN";
/// The variable naming a file that holds a token (its first line).
pub const TOKEN_FILE_VAR: &str = "TIDEGATE_TOKEN_FILE";
/// Variables earlier versions read a name from; now ignored, with a note when set.
const IGNORED_NAME_VARS: &[&str] = &["TIDEGATE_USER"];
/// Where a command run on this machine comes from.
pub const LOCAL_ORIGIN: &str = "local";

/// The actor established for this process, if any (else the OS account).
static ACTOR: Mutex<Option<Actor>> = Mutex::new(None);

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

/// The token this process was given, if any.
pub fn presented_token() -> Result<Option<String>> {
    if let Some(token) = std::env::var(TOKEN_VAR).ok().filter(|t| !t.trim().is_empty()) {
        return Ok(Some(token.trim().to_owned()));
    }
    let Some(path) = std::env::var_os(TOKEN_FILE_VAR).filter(|p| !p.is_empty()) else { return Ok(None) };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the token file {} named by {TOKEN_FILE_VAR}", Path::new(&path).display()))?;
    match text.lines().next().map(str::trim).filter(|t| !t.is_empty()) {
        Some(token) => Ok(Some(token.to_owned())),
        None => bail!("the token file {} named by {TOKEN_FILE_VAR} is empty", Path::new(&path).display()),
    }
}

/// The identity a token establishes, or an error saying why the token cannot be used.
pub fn authenticate(store: &dyn Store, token: &str) -> Result<Actor> {
    let Some(record) = store.token_by_hash(&token_hash(token))? else {
        bail!(
            "the token presented ({TOKEN_VAR} or {TOKEN_FILE_VAR}) is not known to this workspace's store; \
             ask an admin for a token (`tidegate token create`), or unset the variable to act as your OS account"
        );
    };
    if let Some(why) = record.unusable(Utc::now()) {
        bail!("{why}; ask an admin for a new token (`tidegate token create`)");
    }
    Ok(Actor {
        name: record.name,
        authentication: Authentication::Token { token_id: record.id, role: record.role },
        origin: LOCAL_ORIGIN.to_owned(),
    })
}

/// Establishes this process's actor: the presented token's identity, else the OS account. Only
/// a command that has a workspace reads a token (it is checked against the workspace's store).
pub fn establish(open_store: impl FnOnce() -> Result<std::sync::Arc<dyn Store>>) -> Result<()> {
    for var in IGNORED_NAME_VARS {
        if std::env::var_os(var).is_some() {
            eprintln!(
                "note: {var} is ignored: you act as your OS account, or as the identity of a token in {TOKEN_VAR}"
            );
        }
    }
    let actor = match presented_token()? {
        None => os_account(),
        Some(token) => {
            let store = open_store().context("checking the presented token")?;
            authenticate(store.as_ref(), &token)?
        }
    };
    act_as(actor);
    Ok(())
}

/// Makes `actor` this process's actor from now on.
pub fn act_as(actor: Actor) {
    if let Ok(mut current) = ACTOR.lock() {
        *current = Some(actor);
    }
}

/// The actor of this process: the one established, else the OS account.
pub fn current() -> Actor {
    ACTOR.lock().ok().and_then(|a| a.clone()).unwrap_or_else(os_account)
}

/// The name decisions are recorded under.
pub fn name() -> String {
    current().name
}

/// Refuses when the current actor's role is below `role`, naming what was asked and who asked.
pub fn require(role: Role, what: &str) -> Result<()> {
    let actor = current();
    if actor.role() < role {
        bail!(
            "{} may not {what}: that needs the {role} role or above, and the token carries {}",
            actor.describe(),
            actor.role()
        );
    }
    Ok(())
}

//! Who runs this command: the identity of a token presented in a file named by `--token-file`,
//! in `TIDEGATE_TOKEN` or in a file named by `TIDEGATE_TOKEN_FILE`, else the operating-system
//! account that runs the process. No flag names an identity, and no token is ever a flag's value
//! (`ps` would show it). Established once, in `main`, and passed to every command that records a
//! decision (see `tidegate_app::actor`); with `--server` the server establishes it from the token
//! (`crate::remote`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use tidegate_app::actor::{LOCAL_ORIGIN, authenticate, os_account};
use tidegate_core::actor::Actor;
use tidegate_store::Store;

/// The variable holding a token.
pub const TOKEN_VAR: &str = "TIDEGATE_TOKEN";
/// The variable naming a file that holds a token (its first line).
pub const TOKEN_FILE_VAR: &str = "TIDEGATE_TOKEN_FILE";
/// Variables earlier versions read a name from; now ignored, with a note when set.
const IGNORED_NAME_VARS: &[&str] = &["TIDEGATE_USER"];

/// The token this process was given by `TIDEGATE_TOKEN` or `TIDEGATE_TOKEN_FILE`, if any.
pub fn presented_token() -> Result<Option<String>> {
    if let Some(token) = std::env::var(TOKEN_VAR).ok().filter(|t| !t.trim().is_empty()) {
        return Ok(Some(token.trim().to_owned()));
    }
    let Some(path) = std::env::var_os(TOKEN_FILE_VAR).filter(|p| !p.is_empty()) else { return Ok(None) };
    token_in_file(Path::new(&path), &format!("named by {TOKEN_FILE_VAR}")).map(Some)
}

/// The token on the first line of the file at `path` (`named`: how the user gave the path).
pub fn token_in_file(path: &Path, named: &str) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading the token file {} {named}", path.display()))?;
    match text.lines().next().map(str::trim).filter(|t| !t.is_empty()) {
        Some(token) => Ok(token.to_owned()),
        None => bail!("the token file {} {named} is empty", path.display()),
    }
}

/// The identity a token given to this process establishes.
pub fn authenticate_local(store: &dyn Store, token: &str) -> Result<Actor> {
    authenticate(store, token, LOCAL_ORIGIN, &format!("{TOKEN_VAR} or {TOKEN_FILE_VAR}"), Utc::now())
        .map_err(|e| anyhow::anyhow!("{e:#}, or unset {TOKEN_VAR} and {TOKEN_FILE_VAR} to act as your OS account"))
}

/// This process's actor: the presented token's identity, else the OS account. Only a command
/// that has a workspace reads a token (it is checked against the workspace's store).
pub fn establish(
    token_file: Option<&Path>,
    open_store: impl FnOnce() -> Result<std::sync::Arc<dyn Store>>,
) -> Result<Actor> {
    for var in IGNORED_NAME_VARS {
        if std::env::var_os(var).is_some() {
            eprintln!(
                "note: {var} is ignored: you act as your OS account, or as the identity of a token in {TOKEN_VAR}"
            );
        }
    }
    let token = match token_file {
        Some(path) => Some(token_in_file(path, "given by --token-file")?),
        None => presented_token()?,
    };
    match token {
        None => Ok(os_account()),
        Some(token) => {
            let store = open_store().context("checking the presented token")?;
            authenticate_local(store.as_ref(), &token)
        }
    }
}

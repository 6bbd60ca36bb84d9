//! Ids as people type them: a run, a backfill or a release named by its whole id or by a unique
//! prefix of it, as git names a commit. Every operation that takes one of these ids resolves it
//! here first, so the command line and the HTTP API accept the same short forms.

use anyhow::Result;
use tidegate_store::{IdKind, Store};

/// The fewest characters a prefix may have: shorter ones match too much to be worth a lookup.
pub const PREFIX_LEN_MIN: usize = 4;

/// How many matches an ambiguous prefix lists.
pub const MATCHES_SHOWN_MAX: u32 = 5;

/// The whole id of the run `given` names: its id, or the one id that starts with it.
pub fn run(store: &dyn Store, given: &str) -> Result<String> {
    resolve(store, IdKind::Run, given, |id| Ok(store.run(id)?.is_some()))
}

/// The whole id of the backfill `given` names, as [`run`] finds a run's.
pub fn backfill(store: &dyn Store, given: &str) -> Result<String> {
    resolve(store, IdKind::Backfill, given, |id| Ok(store.backfill(id)?.is_some()))
}

/// The whole id of the release `given` names, as [`run`] finds a run's.
pub fn release(store: &dyn Store, given: &str) -> Result<String> {
    resolve(store, IdKind::Release, given, |id| Ok(store.release(id)?.is_some()))
}

/// Where a person finds the ids of `kind`.
fn listed_by(kind: IdKind) -> &'static str {
    match kind {
        IdKind::Run => "`tidegate status` lists the recent runs",
        IdKind::Backfill => "`tidegate backfill list` shows the known backfills",
        IdKind::Release => "`tidegate history` shows the releases",
    }
}

/// `given` when it is an id of `kind` (`exists`), else the one id it begins; a refusal when it
/// begins none (not found), or is too short or begins several (invalid: the request must say more).
fn resolve(store: &dyn Store, kind: IdKind, given: &str, exists: impl Fn(&str) -> Result<bool>) -> Result<String> {
    let noun = kind.noun();
    if given.is_empty() {
        crate::refuse!(Invalid, "give a {noun} id");
    }
    if exists(given)? {
        return Ok(given.to_owned());
    }
    // Ids are lower case; a UUID may be copied from somewhere that writes it upper case.
    let prefix = given.to_ascii_lowercase();
    if !tidegate_store::is_id_prefix(&prefix) {
        crate::refuse!(NotFound, "no {noun} {given:?} ({noun} ids are made of a-z, 0-9 and -); {}", listed_by(kind));
    }
    if prefix.chars().count() < PREFIX_LEN_MIN {
        crate::refuse!(
            Invalid,
            "no {noun} {given:?}; give the whole id, or at least its first {PREFIX_LEN_MIN} characters"
        );
    }
    let matches = store.ids_with_prefix(kind, &prefix, MATCHES_SHOWN_MAX + 1)?;
    match matches.as_slice() {
        [] => crate::refuse!(NotFound, "no {noun} id starts with {given:?}; {}", listed_by(kind)),
        [one] => Ok(one.clone()),
        several => {
            let shown = several.len().min(MATCHES_SHOWN_MAX as usize);
            let more = if several.len() > shown { ", and more" } else { "" };
            crate::refuse!(
                Invalid,
                "{given:?} begins more than one {noun} id: {}{more}; give more of the id",
                several[..shown].join(", ")
            )
        }
    }
}

//! Governed backfills. `plan` freezes what will be rebuilt and sizes its blast radius; `start`
//! runs it into staging only, throttled below live work; `compare` reports what would change;
//! `approve` binds a second person to the exact spec and comparison; `publish` makes it visible
//! as one release; `rollback` restores what was there before.

pub mod exec;
pub mod page;
pub mod plan;
pub mod release;
pub mod review;

use anyhow::{Context, Result};
use tidegate_core::actor::Actor;
use tidegate_store::{BackfillRecord, JournalMeta, Store};

use crate::workspace::Workspace;

pub use exec::{Begun, Cancelled, Report, cancel, list, pause, settle, start, status};
pub use plan::{BlastRadius, FrozenSpec, Impact, PlanRequest, Planned, Reprocess, plan};
pub use release::{Published, Restored, RolledBack, publish, rollback};
pub use review::{ApproveRequest, CompareRequest, Compared, FlagOverrides, Review, approve, compare, compare_with};

/// A backfill (named by its whole id or a unique prefix, `ids::backfill`) and its frozen spec, or
/// an error that says how to list the known ones.
pub fn load(store: &dyn Store, id: &str) -> Result<(BackfillRecord, FrozenSpec)> {
    let id = &crate::ids::backfill(store, id)?;
    let Some(record) = store.backfill(id)? else {
        crate::refuse!(NotFound, "no backfill {id:?}; `tidegate backfill list` shows the known ones");
    };
    let spec: FrozenSpec = serde_json::from_value(record.spec.clone())
        .with_context(|| format!("decoding the frozen spec of backfill {id}"))?;
    Ok((record, spec))
}

/// Refuses to act when `tidegate.toml` changed since the backfill was planned: the frozen spec
/// is what was reviewed, so running or publishing under another one would break the contract.
pub fn ensure_spec_unchanged(ws: &Workspace, record: &BackfillRecord, spec: &FrozenSpec) -> Result<()> {
    if ws.spec.hash != spec.workspace_spec_hash {
        crate::refuse!(
            Conflict,
            "{} changed since backfill {} was planned (spec hash {} then, {} now); its frozen spec no longer \
             describes this workspace. Restore the file, or cancel this backfill and plan a new one",
            ws.spec.file,
            record.id,
            short(&spec.workspace_spec_hash),
            short(&ws.spec.hash)
        );
    }
    Ok(())
}

fn meta(ws: &Workspace, actor: &Actor, reason: impl Into<String>, correlation_id: &str) -> JournalMeta {
    JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: correlation_id.to_owned(),
        reason: reason.into(),
        at: ws.now(),
    }
}

/// The first 12 characters of a hash, as messages show it.
pub fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

//! `backfill publish` and `backfill rollback` (`tidegate_app::backfill::release`): make an
//! approved backfill visible as one release, and restore exactly what it replaced.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::backfill::{Published, RolledBack};
use tidegate_core::actor::Actor;

use crate::cmd::{Json, LockWait};
use crate::output;

/// Publish an approved backfill: one atomic commit per dataset, upstream first.
///
/// Refused unless the approval still matches the backfill's spec hash and a freshly computed
/// comparison; and each dataset's commit is refused if, meanwhile, a live run changed one of its
/// partitions after the table version the approved comparison read (the refusal names them, and
/// the approval is withdrawn). Consumers are told through the journal and OpenLineage events
/// (to .tidegate/openlineage.jsonl unless [lineage] in tidegate.toml says otherwise).
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// The backfill's id (`bf-...`, see `tidegate backfill list`), or a unique prefix of it.
    pub id: String,
    #[command(flatten)]
    pub out: Json,
}

/// Undo a published backfill: restore the exact previous version of every partition it changed.
#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    /// The backfill's id (`bf-...`, see `tidegate backfill list`), or a unique prefix of it.
    pub id: String,
    /// Why (recorded in the journal).
    #[arg(long, default_value = "backfill rolled back by operator", value_parser = tidegate_app::input::reason)]
    pub reason: String,
    #[command(flatten)]
    pub out: Json,
    #[command(flatten)]
    pub lock: LockWait,
}

pub fn publish(ws: Option<&Path>, actor: &Actor, args: PublishArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let published = tidegate_app::backfill::publish(&ws, &store, actor, &args.id)?;
    output::emit(args.out.json, &published, print_published)
}

/// A publication for people, with how to undo it.
pub(crate) fn print_published(published: &Published) {
    println!("Published backfill {} as release {}:", published.backfill_id, published.release_id);
    for item in &published.publication.items {
        let mut note = if item.already_published { " (already committed before; nothing new)" } else { "" }.to_owned();
        if item.n_duplicates_dropped > 0 {
            note.push_str(&format!("; {} duplicate rows dropped by dedup_key", item.n_duplicates_dropped));
        }
        if item.n_late_rows_ignored > 0 {
            note.push_str(&format!(
                "; {} late rows ignored by merge (the table holds a newer row of their key by order_by)",
                item.n_late_rows_ignored
            ));
        }
        println!("  {} -> table version {}{note}", item.dataset, item.table_version);
    }
    println!("Consumers notified through the journal and {}", published.lineage);
    println!("Undo with: tidegate backfill rollback {}", published.backfill_id);
}

pub fn rollback(ws: Option<&Path>, actor: &Actor, args: RollbackArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let done = tidegate_app::backfill::rollback(&ws, &store, actor, &args.id, &args.reason, args.lock.duration())?;
    output::emit(args.out.json, &done, print_rolled_back)
}

/// A backfill rollback for people.
pub(crate) fn print_rolled_back(done: &RolledBack) {
    println!("Rolled back backfill {} as release {}:", done.backfill_id, done.release_id);
    for r in &done.restored {
        println!(
            "  {}: {} restored to their table version {} files (new version {})",
            r.dataset,
            tidegate_app::human::count(r.partitions.len(), "partition", "partitions"),
            r.version,
            r.new_version
        );
    }
}

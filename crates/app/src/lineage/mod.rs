//! OpenLineage: a START and a COMPLETE, FAIL or ABORT run event for every step attempt, every run
//! and every backfill, derived from the journal (decision 0010).
//!
//! The journal already records every decision; [`build`] turns entries into events (a pure
//! function, with the records they name looked up beforehand), and an [`Exporter`] reads the
//! entries after each transport's cursor, hands their events to the transport (a JSON-lines file,
//! an HTTP receiver) and moves that cursor only past what the transport took. Publication never
//! waits on lineage: the export runs after an operation (`tidegate run`, a backfill's start,
//! publication and rollback) or beside the scheduler ([`follow`], in `tidegate serve`), and a
//! receiver that is down keeps its events until it is back. Delivery is at least once: a crash
//! between a delivery and its cursor re-sends that batch (consumers dedupe by runId, eventType
//! and eventTime, which a re-sent event repeats exactly).

pub mod build;
mod export;
mod transport;

pub use export::{Delivery, Exporter, Sent, export, follow};

/// Where the schema of the `tidegate` run facet is published: `docs/openlineage/` in the
/// repository, at a path that stays.
pub const FACET_SCHEMA_URL: &str =
    concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/docs/openlineage/TidegateRunFacet.json#/$defs/TidegateRunFacet");

/// The events' `producer`: this repository at this version.
pub fn producer() -> String {
    format!("{}/tree/v{}", env!("CARGO_PKG_REPOSITORY"), env!("CARGO_PKG_VERSION"))
}

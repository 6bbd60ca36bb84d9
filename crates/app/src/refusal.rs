//! Why an operation refused, as a kind a front end can act on: the server chooses its status
//! code from it (403, 404, 409, 422), the CLI keeps printing the message. Operations stay
//! `anyhow`; a refusal is one error in the chain, raised where the operation knows what went
//! wrong (`actor::require` refuses with [`Kind::Forbidden`], a lookup of an unknown id with
//! [`Kind::NotFound`]), and [`kind`] also reads the typed errors of the crates below.

use serde::Serialize;

/// What kind of refusal: whose move it is next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The request cannot be carried out as asked: a value out of range, an unknown task or
    /// partition key, a query that does not parse. The caller must change the request.
    Invalid,
    /// The token presented establishes no identity: unknown, revoked or expired.
    Unauthenticated,
    /// The actor may not do this (role too low, or approving their own backfill).
    Forbidden,
    /// What the request names does not exist: a run, a backfill, a release, a dataset.
    NotFound,
    /// The request is valid but collides with the state: a backfill not in the state the
    /// operation needs, an overlapping backfill, a lock held, a changed spec.
    Conflict,
    /// The store or the lake cannot be reached now; the same request may succeed later.
    Unavailable,
}

/// An operation's refusal: its kind and the message a person reads (the same words the CLI prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What kind of refusal.
    pub kind: Kind,
    /// What went wrong and what to do, in words.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind` saying `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// The request cannot be carried out as asked.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Kind::Invalid, message)
    }

    /// The actor may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(Kind::Forbidden, message)
    }

    /// What the request names does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Kind::NotFound, message)
    }

    /// The request collides with the current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(Kind::Conflict, message)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

/// The kind of refusal an operation's error is, reading every error of its chain: a [`Refusal`],
/// or a typed error of the store, the lake or the planner that says the caller must act. `None`
/// means nothing the caller did explains it: an internal failure.
pub fn kind(error: &anyhow::Error) -> Option<Kind> {
    error.chain().find_map(kind_of_cause)
}

fn kind_of_cause(cause: &(dyn std::error::Error + 'static)) -> Option<Kind> {
    if let Some(r) = cause.downcast_ref::<Refusal>() {
        return Some(r.kind);
    }
    if let Some(e) = cause.downcast_ref::<tidegate_store::Error>() {
        return store_kind(e);
    }
    if let Some(e) = cause.downcast_ref::<tidegate_lake::Error>() {
        return lake_kind(e);
    }
    if let Some(tidegate_engine::Error::SchedulerBusy) = cause.downcast_ref::<tidegate_engine::Error>() {
        return Some(Kind::Conflict);
    }
    if cause.downcast_ref::<tidegate_core::plan::Error>().is_some()
        || cause.downcast_ref::<tidegate_core::partition::Error>().is_some()
    {
        return Some(Kind::Invalid);
    }
    None
}

fn store_kind(e: &tidegate_store::Error) -> Option<Kind> {
    use tidegate_store::Error as E;
    match e {
        E::NotFound { .. } => Some(Kind::NotFound),
        E::IdempotencyMismatch { .. } | E::InvalidRequest(_) => Some(Kind::Invalid),
        E::Conflict(_) | E::Fenced { .. } | E::WorkerNameTaken { .. } => Some(Kind::Conflict),
        E::Unavailable(_) => Some(Kind::Unavailable),
        _ => None,
    }
}

fn lake_kind(e: &tidegate_lake::Error) -> Option<Kind> {
    use tidegate_lake::Error as E;
    match e {
        E::InvalidName { .. }
        | E::InvalidLake { .. }
        | E::UnsupportedLake { .. }
        | E::Query { .. }
        | E::UnknownTable { .. }
        | E::ReadOnlyQuery { .. }
        | E::QueryLimit { .. }
        | E::NotReported { .. }
        | E::QueryFault { .. } => Some(Kind::Invalid),
        E::UnknownDataset { .. } | E::UnknownVersion { .. } => Some(Kind::NotFound),
        // A release refused part-way is the refusal of the dataset that stopped it.
        E::ReleaseFailed { source, .. } => lake_kind(source),
        E::Conflict { .. }
        | E::UnreadableCommit { .. }
        | E::SupersededSnapshot { .. }
        | E::MovedSinceApproval { .. }
        | E::ChangedSinceCommit { .. }
        | E::VacuumedVersion { .. }
        | E::SchemaNeedsRewrite { .. }
        | E::SchemaChangedSince { .. }
        // What staged output or a table holds stops the operation until someone acts on it.
        | E::LegacyLayout { .. }
        | E::CorruptLog { .. }
        | E::SchemaMismatch { .. }
        | E::UnreadableFile { .. }
        | E::PartitionMismatch { .. }
        | E::TiedDuplicates { .. }
        | E::AppendTie { .. }
        | E::NullDedupKey { .. }
        | E::MissingStagedFile { .. }
        | E::StagedForOtherSchema { .. } => Some(Kind::Conflict),
        E::Storage { .. } => Some(Kind::Unavailable),
        _ => None,
    }
}

/// `Err` of a refusal of `kind` saying `message`, for `return refuse(..)` where `bail!` was.
pub fn refuse<T>(kind: Kind, message: impl Into<String>) -> anyhow::Result<T> {
    Err(Refusal::new(kind, message).into())
}

/// Returns early from an operation with a [`Refusal`] of the [`Kind`] named, its message
/// formatted as `format!` does: `refuse!(NotFound, "no run {id:?}")` where `bail!` was.
#[macro_export]
macro_rules! refuse {
    ($kind:ident, $($arg:tt)+) => {
        return ::std::result::Result::Err(
            $crate::refusal::Refusal::new($crate::refusal::Kind::$kind, format!($($arg)+)).into(),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn a_refusal_keeps_its_message_and_its_kind_under_context() {
        let e: anyhow::Error = Refusal::not_found("no backfill \"bf-1\"").into();
        assert_eq!(format!("{e:#}"), "no backfill \"bf-1\"");
        let wrapped = Err::<(), _>(e).context("publishing").expect_err("an error");
        assert_eq!(kind(&wrapped), Some(Kind::NotFound));
        assert_eq!(kind(&anyhow::anyhow!("disk on fire")), None);
        let conflict: anyhow::Error = tidegate_store::Error::Conflict("overlaps bf-2".to_owned()).into();
        assert_eq!(kind(&conflict), Some(Kind::Conflict));
        let busy: anyhow::Error = tidegate_engine::Error::SchedulerBusy.into();
        assert_eq!(kind(&busy), Some(Kind::Conflict));
    }
}

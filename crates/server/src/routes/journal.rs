//! The journal: a subject's story after verifying the hash chain and the lake's anchors, and
//! the raw entries page by page.

use axum::Json;
use axum::extract::State as Shared;
use axum::http::StatusCode;
use serde::Deserialize;
use tidegate_app::listing::{PAGE_ITEMS_MAX, Page};
use tidegate_store::JournalEntry;
use utoipa::IntoParams;

use super::{Errors, call};
use crate::State;
use crate::auth::Caller;
use crate::extract::Query;
use crate::problem::Problem;

/// Whose story.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct HistoryQuery {
    /// A run id, a step id, TASK@PARTITION or DATASET:PARTITION (the newest entries without one).
    subject: Option<String>,
    /// At most this many entries (1 to 1000; 100 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

fn limit(asked: Option<u32>, default: u32) -> Result<u32, Problem> {
    match asked.unwrap_or(default) {
        n @ 1..=PAGE_ITEMS_MAX => Ok(n),
        _ => Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", "limit: must be 1 to 1000")),
    }
}

/// What was intended, what happened and what became visible, after verifying the journal's
/// chain and checking it against the lake (as `tidegate history --json`).
#[utoipa::path(get, path = "/api/journal", tag = "journal", params(HistoryQuery),
    responses((status = 200, description = "the verified story", body = tidegate_app::history::History), Errors))]
pub(crate) async fn history(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<tidegate_app::history::History>, Problem> {
    let n = limit(q.limit, 100)?;
    let subject = crate::extract::given(q.subject);
    call(&state, move |ws, store| tidegate_app::history::history(ws, store.as_ref(), &actor, subject.as_deref(), n))
        .await
}

/// Where a page of entries starts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EntriesQuery {
    /// The `next_cursor` of the previous page (a sequence number); from the first entry without one.
    cursor: Option<String>,
    /// Entries per page (1 to 1000; 100 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// The journal's entries, oldest first, page by page.
#[utoipa::path(get, path = "/api/journal/entries", tag = "journal", params(EntriesQuery),
    responses((status = 200, description = "a page of journal entries, oldest first", body = Page<JournalEntry>), Errors))]
pub(crate) async fn entries(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Query(q): Query<EntriesQuery>,
) -> Result<Json<Page<JournalEntry>>, Problem> {
    let n = limit(q.limit, 100)?;
    let after = match crate::extract::given(q.cursor).as_deref().map(str::parse::<u64>) {
        None => None,
        Some(Ok(seq)) => Some(seq),
        Some(Err(_)) => {
            return Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", "cursor: a journal sequence number"));
        }
    };
    call(&state, move |_, store| {
        // One more than asked says whether another page follows.
        let mut items = tidegate_app::history::journal(store.as_ref(), &actor, after, n + 1)?;
        let more = items.len() > n as usize;
        items.truncate(n as usize);
        let next_cursor = if more { items.last().map(|e| e.seq.to_string()) } else { None };
        Ok(Page { items, next_cursor })
    })
    .await
}

//! Pages of a list that grows (runs, releases, backfills, journal entries): at most a limit of
//! items, and a cursor naming the last one, from which the next page starts. A cursor is an item's
//! id, not an offset, so items added at the front between two pages shift nothing.

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// The most items a page holds, whatever is asked.
pub const PAGE_ITEMS_MAX: u32 = 1_000;

/// One page of a list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Page<T> {
    /// The items, in the list's order.
    pub items: Vec<T>,
    /// The cursor of the next page (the last item's id), absent on the last page.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The page of `all` (in the list's order) that follows the item whose id is `after`, at most
    /// `limit` items (1 to [`PAGE_ITEMS_MAX`]). A cursor naming no item is refused (invalid).
    pub fn of(all: Vec<T>, id: impl Fn(&T) -> &str, limit: u32, after: Option<&str>) -> Result<Page<T>> {
        if limit == 0 || limit > PAGE_ITEMS_MAX {
            crate::refuse!(Invalid, "limit {limit}: must be 1 to {PAGE_ITEMS_MAX}");
        }
        let start = match after {
            None => 0,
            Some(cursor) => match all.iter().position(|item| id(item) == cursor) {
                Some(i) => i + 1,
                None => crate::refuse!(Invalid, "cursor {cursor:?} names no item of this list (it may have aged out)"),
            },
        };
        let n_rest = all.len().saturating_sub(start);
        let items: Vec<T> = all.into_iter().skip(start).take(limit as usize).collect();
        let next_cursor = if n_rest > items.len() { items.last().map(|last| id(last).to_owned()) } else { None };
        Ok(Page { items, next_cursor })
    }

    /// The same page with each item converted by `f`.
    pub fn try_map<U>(self, f: impl FnMut(T) -> Result<U>) -> Result<Page<U>> {
        Ok(Page { items: self.items.into_iter().map(f).collect::<Result<_>>()?, next_cursor: self.next_cursor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_their_cursor_to_the_end() {
        let all: Vec<String> = (1..=5).map(|i| format!("r{i}")).collect();
        let first = Page::of(all.clone(), String::as_str, 2, None).expect("a page");
        assert_eq!(
            (first.items.as_slice(), first.next_cursor.as_deref()),
            (&["r1".to_owned(), "r2".to_owned()][..], Some("r2"))
        );
        let last = Page::of(all.clone(), String::as_str, 3, Some("r2")).expect("a page");
        assert_eq!((last.items.len(), last.next_cursor), (3, None));
        let refused = Page::of(all, String::as_str, 2, Some("r9")).expect_err("an unknown cursor");
        assert_eq!(crate::refusal::kind(&refused), Some(crate::Kind::Invalid));
    }
}

//! `review_flags` of a dataset: the limits past which a backfill comparison flags a partition.

use super::reader::{Ctx, Field};
use crate::spec::{Limit, ReviewFlags};

/// Reads `review_flags = { ... }`; every setting left out keeps its default. `None` when invalid
/// (already reported).
pub(crate) fn review_flags(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<ReviewFlags> {
    let obj = f.obj(ctx)?;
    obj.allow_only(ctx, &ReviewFlags::KEYS);
    let d = ReviewFlags::DEFAULT;
    let mut read = |key: &str, default: Limit| match obj.get(ctx, key) {
        None => Some(default),
        Some(field) => limit(ctx, &field),
    };
    let row_count_pct = read("row_count_pct", d.row_count_pct);
    let rows_changed_pct = read("rows_changed_pct", d.rows_changed_pct);
    let mean_pct = read("mean_pct", d.mean_pct);
    let null_rise_points = read("null_rise_points", d.null_rise_points);
    let schema_change = obj.bool_or(ctx, "schema_change", d.schema_change);
    Some(ReviewFlags {
        row_count_pct: row_count_pct?,
        rows_changed_pct: rows_changed_pct?,
        mean_pct: mean_pct?,
        null_rise_points: null_rise_points?,
        schema_change: schema_change?,
    })
}

/// A limit: a number of at least 0, or `"off"`.
fn limit(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Limit> {
    if let Some(text) = f.value.as_str() {
        return match ReviewFlags::parse_limit(text) {
            Ok(limit) => Some(limit),
            Err(why) => {
                f.invalid(ctx, format!("\"{text}\""), &why, None);
                None
            }
        };
    }
    let n = f.number(ctx)?;
    match ReviewFlags::parse_limit(&n.to_string()) {
        Ok(limit) => Some(limit),
        Err(why) => {
            f.invalid(ctx, n, &why, None);
            None
        }
    }
}

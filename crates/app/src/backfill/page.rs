//! The self-contained HTML review page of a backfill comparison: no scripts, no external assets,
//! every value escaped, so it can be attached to a ticket or mailed to the approver.

use std::fmt::Write as _;

use tidegate_store::BackfillRecord;

use super::{FrozenSpec, Review, short};

fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.4}"))
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}\
tr.flag td{background:#fff1e0}code{background:#f6f6f6;padding:1px 4px}.muted{color:#777}";

/// The review of `record` as one HTML document.
pub fn report(record: &BackfillRecord, spec: &FrozenSpec, review: &Review, hash: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Backfill {id}</title><style>{STYLE}</style></head><body>\
         <h1>Backfill {id}</h1><p>{reason}</p>\
         <p class=\"muted\">Requested by {req}; target <code>{target}</code> from {from} to {to} (reprocess {repr:?}); \
         spec <code>{spec_hash}</code>; comparison <code>{cmp}</code></p>",
        id = esc(&record.id),
        reason = esc(&spec.reason),
        req = esc(&record.requester),
        target = esc(&spec.target),
        from = esc(&spec.from),
        to = esc(&spec.to),
        repr = spec.reprocess,
        spec_hash = esc(short(&record.spec_hash)),
        cmp = esc(short(hash)),
    );
    for d in &review.datasets {
        let t = &d.totals;
        let _ = write!(
            h,
            "<h2>{name}</h2><p>{before} rows before, {after} after: {added} added, {removed} removed, {changed} changed; \
             {flagged} partitions flagged. Compared with table version {ver}.</p>\
             <table><tr><th>partition</th><th>before</th><th>after</th><th>added</th><th>removed</th><th>changed</th><th>flags</th></tr>",
            name = esc(&d.dataset),
            before = t.rows_before,
            after = t.rows_after,
            added = t.n_added,
            removed = t.n_removed,
            changed = t.n_changed,
            flagged = t.n_flagged,
            ver = d.published_version.map_or_else(|| "none".to_owned(), |v| v.to_string()),
        );
        for p in &d.partitions {
            let _ = write!(
                h,
                "<tr{cls}><td>{part}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                p.rows_before,
                p.rows_after,
                p.n_added,
                p.n_removed,
                p.n_changed,
                esc(&p.flagged.join("; ")),
                cls = if p.flagged.is_empty() { "" } else { " class=\"flag\"" },
                part = esc(&p.partition),
            );
        }
        h.push_str("</table>");
        for p in &d.partitions {
            let _ = write!(
                h,
                "<h3>{} {}</h3><table><tr><th>column</th><th>sum before</th><th>sum after</th><th>min before</th><th>min after</th><th>max before</th><th>max after</th><th>mean before</th><th>mean after</th><th>null rate before</th><th>null rate after</th></tr>",
                esc(&d.dataset),
                esc(&p.partition)
            );
            for c in &p.columns {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4}</td><td>{:.4}</td></tr>",
                    esc(&c.column),
                    num(c.sum_before),
                    num(c.sum_after),
                    num(c.min_before),
                    num(c.min_after),
                    num(c.max_before),
                    num(c.max_after),
                    num(c.mean_before),
                    num(c.mean_after),
                    c.null_rate_before,
                    c.null_rate_after
                );
            }
            h.push_str("</table>");
            if !p.slices.is_empty() {
                h.push_str("<table><tr><th>slice</th><th>value</th><th>rows before</th><th>rows after</th><th>changed</th></tr>");
                for s in &p.slices {
                    let _ = write!(
                        h,
                        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                        esc(&s.column),
                        esc(&s.value),
                        s.rows_before,
                        s.rows_after,
                        s.n_changed
                    );
                }
                h.push_str("</table>");
            }
            for (label, rows) in
                [("changed", &p.sample_changed), ("added", &p.sample_added), ("removed", &p.sample_removed)]
            {
                if rows.is_empty() {
                    continue;
                }
                let _ = write!(h, "<p>Sample of {label} rows:</p><pre>");
                for r in rows.iter() {
                    let _ = writeln!(h, "{}", esc(&r.to_string()));
                }
                h.push_str("</pre>");
            }
        }
    }
    h.push_str("</body></html>\n");
    h
}

//! `backfill compare` and `backfill approve` (`tidegate_app::backfill::review`): what publishing
//! would change, partition by partition, and an approval bound to what the approver saw.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use tidegate_app::backfill::{CompareRequest, Compared, FlagOverrides, Review, short};
use tidegate_core::actor::Actor;
use tidegate_core::spec::model::{Limit, ReviewFlags};
use tidegate_store::BackfillRecord;

use crate::cmd::Json;
use crate::output;

/// How many partitions per dataset the terminal table shows (all are in --json and --html).
const MAX_PARTITIONS_SHOWN: usize = 8;

/// Compare a staged backfill with the published data, partition by partition.
///
/// Rows before and after, keys added, removed and changed, per-column sum, min, max, mean and
/// null-rate deltas, per-slice differences and a sample of changed rows. A partition is flagged
/// when any statistic passes its limit. The limits are each dataset's `review_flags` in
/// tidegate.toml, by default: row count moved more than 10%, a numeric column's mean moved more
/// than 10%, a column's null rate rose more than 5 points, or the schema changed (rows added,
/// removed or changed together: off). The plan's --flag-change-pct, then the flags below, replace
/// them for every dataset of the backfill. The comparison's hash, which covers the limits and the
/// flags, is what an approval binds.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate backfill compare bf-1a2b3c4d\n  tidegate backfill compare bf-1a2b3c4d --html review.html\n  tidegate backfill compare bf-1a2b3c4d --flag-mean-pct 25 --flag-null-rise-points off\n  tidegate backfill compare bf-1a2b3c4d --json"
)]
pub struct CompareArgs {
    /// The backfill's id (`bf-...`, see `tidegate backfill list`), or a unique prefix of it.
    pub id: String,
    /// Also write a self-contained HTML report to this file.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub out: Json,
    /// Set every percentage limit below to PCT at once (the single ones still win).
    #[arg(long, value_name = "PCT", value_parser = percent)]
    pub flag_change_pct: Option<f64>,
    /// Flag a partition whose row count moves by more than PCT% of its published rows (default 10).
    #[arg(long, value_name = "PCT|off", value_parser = limit)]
    pub flag_row_count_pct: Option<LimitArg>,
    /// Flag a partition whose rows added, removed and changed exceed PCT% of its published rows (default off).
    #[arg(long, value_name = "PCT|off", value_parser = limit)]
    pub flag_rows_changed_pct: Option<LimitArg>,
    /// Flag a partition where a numeric column's mean moves by more than PCT% (default 10).
    #[arg(long, value_name = "PCT|off", value_parser = limit)]
    pub flag_mean_pct: Option<LimitArg>,
    /// Flag a partition where a column's null rate rises by more than N percentage points (default 5).
    #[arg(long, value_name = "N|off", value_parser = limit)]
    pub flag_null_rise_points: Option<LimitArg>,
    /// Whether a schema change flags the partitions staged with it (default true).
    #[arg(long, value_name = "BOOL")]
    pub flag_schema_change: Option<bool>,
}

/// A flag limit from the command line: a number of at least 0, or `off`.
#[derive(Debug, Clone, Copy)]
pub struct LimitArg(Limit);

fn limit(text: &str) -> Result<LimitArg, String> {
    ReviewFlags::parse_limit(text).map(LimitArg)
}

fn percent(text: &str) -> Result<f64, String> {
    match ReviewFlags::parse_limit(text)? {
        Some(pct) => Ok(pct),
        None => Err("must be a number of at least 0".to_owned()),
    }
}

impl CompareArgs {
    /// Whether a flag limit was given on the command line.
    pub(crate) fn has_flags(&self) -> bool {
        let o = self.overrides();
        o.change_pct.is_some()
            || o.row_count_pct.is_some()
            || o.rows_changed_pct.is_some()
            || o.mean_pct.is_some()
            || o.null_rise_points.is_some()
            || o.schema_change.is_some()
    }

    /// The flag limits given on the command line.
    fn overrides(&self) -> FlagOverrides {
        FlagOverrides {
            change_pct: self.flag_change_pct,
            row_count_pct: self.flag_row_count_pct.map(|l| l.0),
            rows_changed_pct: self.flag_rows_changed_pct.map(|l| l.0),
            mean_pct: self.flag_mean_pct.map(|l| l.0),
            null_rise_points: self.flag_null_rise_points.map(|l| l.0),
            schema_change: self.flag_schema_change,
        }
    }
}

/// Approve a compared backfill, binding you to its spec hash and the comparison you reviewed.
///
/// You are who runs the command: your OS account, or the person whose token is in
/// TIDEGATE_TOKEN (`tidegate token create` mints one). The requester cannot approve their own
/// backfill, under any spelling of their name, unless `allow_self_approval = true` in [project].
/// You name the comparison you reviewed with --comparison (its hash, which `backfill compare`,
/// `backfill status` and the HTML page show): if the backfill was compared again since (with
/// other flag limits, say), or the data moved under it, the approval is refused.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  TIDEGATE_TOKEN=tgt_... tidegate backfill approve bf-1a2b3c4d --comparison 3fa9c2d1e0ab   # as the token's holder\n  tidegate backfill approve bf-1a2b3c4d --comparison 3fa9c2d1e0ab                          # as your OS account"
)]
pub struct ApproveArgs {
    /// The backfill's id (`bf-...`, see `tidegate backfill list`), or a unique prefix of it.
    pub id: String,
    /// The hash of the comparison you reviewed (12 or more of its characters, as shown).
    #[arg(long, value_name = "HASH")]
    pub comparison: String,
    /// Your comment as the reviewer, recorded in the journal with the approval.
    #[arg(long, value_name = "TEXT")]
    pub comment: Option<String>,
    /// Refused: an approver is established, not named. Run the command as the approver.
    #[arg(long = "as", value_name = "NAME", hide = true)]
    pub approver: Option<String>,
    #[command(flatten)]
    pub out: Json,
}

pub fn compare(ws: Option<&Path>, actor: &Actor, args: CompareArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let request = CompareRequest { id: args.id.clone(), flags: args.overrides() };
    let compared = tidegate_app::backfill::compare_with(&ws, store.as_ref(), actor, &request)?;
    if let Some(path) = &args.html {
        write_html(&compared, path)?;
    }
    output::emit(args.out.json, &compared, |c| print_compared(c, args.html.as_deref()))
}

/// Writes the comparison's self-contained HTML review page to `path`.
pub(crate) fn write_html(compared: &Compared, path: &Path) -> Result<()> {
    let (record, spec, review, hash) = (&compared.record, &compared.spec, &compared.review, &compared.comparison_hash);
    let html = tidegate_app::backfill::page::report(record, spec, review, hash)?;
    std::fs::write(path, html).with_context(|| format!("writing the HTML report to {}", path.display()))
}

/// The comparison for people, then what to do next.
pub(crate) fn print_compared(compared: &Compared, html: Option<&Path>) {
    let record = &compared.record;
    print_review(&compared.review, &compared.comparison_hash);
    if let Some(path) = html {
        println!("HTML report: {}", path.display());
    }
    if compared.approval_withdrawn {
        println!("The comparison changed since it was approved: the approval no longer holds.");
    }
    say!(
        "Approve (someone other than {}, as themselves): tidegate backfill approve {} --comparison {}",
        record.requester,
        record.id,
        short(&compared.comparison_hash)
    );
}

fn print_review(review: &Review, hash: &str) {
    println!("Comparison of backfill {} with the published data (hash {})", review.backfill_id, short(hash));
    for d in &review.datasets {
        let t = &d.totals;
        println!();
        say!(
            "{}: {} -> {} {}; {} added, {} removed, {} changed{}; compared with table version {}",
            d.dataset,
            t.rows_before,
            t.rows_after,
            tidegate_app::human::noun(t.rows_after, "row", "rows"),
            t.n_added,
            t.n_removed,
            t.n_changed,
            if t.n_flagged > 0 {
                format!("; {} flagged", tidegate_app::human::count(t.n_flagged, "partition", "partitions"))
            } else {
                String::new()
            },
            d.published_version.map_or_else(|| "none".to_owned(), |v| v.to_string()),
        );
        for change in &d.schema_changes {
            say!("  schema change: {change}");
        }
        let shown: Vec<_> = d.partitions.iter().take(MAX_PARTITIONS_SHOWN).collect();
        let header = ["partition", "before", "after", "added", "removed", "changed", "column means", "flag"];
        output::print_table(&header, &[0], &shown, |p| {
            let moved: Vec<String> = p
                .columns
                .iter()
                .filter_map(|c| match (c.mean_before, c.mean_after) {
                    (Some(a), Some(b)) if (a - b).abs() > f64::EPSILON * a.abs().max(1.0) => {
                        Some(format!("{} {a:.4}->{b:.4}", c.column))
                    }
                    _ => None,
                })
                .collect();
            vec![
                p.partition.clone(),
                p.rows_before.to_string(),
                p.rows_after.to_string(),
                p.n_added.to_string(),
                p.n_removed.to_string(),
                p.n_changed.to_string(),
                if moved.is_empty() { "-".to_owned() } else { moved.join("; ") },
                if p.flagged.is_empty() { String::new() } else { "FLAG".to_owned() },
            ]
        });
        if d.partitions.len() > shown.len() {
            let more = d.partitions.len() - shown.len();
            println!(
                "  ... and {} more {} (see --json or --html)",
                more,
                tidegate_app::human::noun(more, "partition", "partitions")
            );
        }
        for p in shown.iter().filter(|p| !p.flagged.is_empty()) {
            say!("  {} flagged: {}", p.partition, p.flagged.join("; "));
        }
        if let Some(p) = d.partitions.iter().find(|p| !p.sample_changed.is_empty()) {
            println!("  sample of changed rows in {}:", p.partition);
            print!(
                "{}",
                output::table_at(4, &["key", "column", "before", "after"], &sample_rows(&p.sample_changed), &[])
            );
        }
    }
}

/// A sample of changed rows (`{"key": {..}, "before": {..}, "after": {..}}`) as table rows: each
/// row's key, then one line per column whose value changed, with its value before and after.
fn sample_rows(sample: &[serde_json::Value]) -> Vec<Vec<String>> {
    let text = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "-".to_owned(),
    };
    let mut rows = Vec::new();
    for row in sample {
        let key = row["key"].as_object().map_or_else(String::new, |k| {
            k.iter().map(|(c, v)| format!("{c}={}", text(Some(v)))).collect::<Vec<_>>().join(" ")
        });
        let (before, after) = (&row["before"], &row["after"]);
        let mut columns: Vec<&String> =
            before.as_object().into_iter().chain(after.as_object()).flat_map(|m| m.keys()).collect();
        columns.sort();
        columns.dedup();
        let mut first = true;
        for c in columns {
            if before.get(c) == after.get(c) {
                continue;
            }
            let shown_key = if first { key.clone() } else { String::new() };
            first = false;
            rows.push(vec![shown_key, c.clone(), text(before.get(c)), text(after.get(c))]);
        }
        if first {
            rows.push(vec![key, "-".to_owned(), "(no column differs)".to_owned(), String::new()]);
        }
    }
    rows
}

pub fn approve(ws: Option<&Path>, actor: &Actor, args: ApproveArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    // An unknown id first, as every backfill command answers it.
    tidegate_app::backfill::load(store.as_ref(), &args.id)?;
    if let Some(name) = &args.approver {
        bail!(approver_named(name, &args.id));
    }
    let request = tidegate_app::backfill::ApproveRequest {
        id: args.id.clone(),
        comparison: args.comparison.clone(),
        comment: args.comment.clone(),
    };
    let updated = tidegate_app::backfill::approve(&ws, store.as_ref(), actor, &request)?;
    if args.out.json {
        output::json(&updated)?;
    } else {
        print_approved(&updated)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The refusal of `--as NAME`.
pub(crate) fn approver_named(name: &str, id: &str) -> String {
    format!(
        "--as {name:?} is refused: an approver is established, not named. The approver runs `tidegate backfill \
         approve {id}` as themselves (their OS account, or their token in {})",
        crate::actor::TOKEN_VAR
    )
}

/// An approval for people, with what to do next.
pub(crate) fn print_approved(updated: &BackfillRecord) -> Result<()> {
    let approval = updated.approval.as_ref().context("an approved backfill holds its approval")?;
    println!(
        "Backfill {} approved by {} (spec {}, comparison {}).",
        updated.id,
        approval.by,
        short(&approval.spec_hash),
        short(&approval.comparison_hash)
    );
    println!("Publish it with: tidegate backfill publish {}", updated.id);
    Ok(())
}

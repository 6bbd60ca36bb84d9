//! `[datasets.NAME]` and `[external.NAME]`: partitioning, write mode, schema contract and checks.

use std::collections::BTreeMap;

use toml_span::Span;

use super::reader::{Ctx, Field, Obj, Path, Text, check_name, clip, did_you_mean};
use super::values::{self, START_HELP};
use crate::partition::{Grain, is_valid_static_key};
use crate::spec::{
    Aggregate, COLUMN_NAME_FORBIDDEN_CHARS, Check, CheckRule, Column, DEFAULT_PARTITION_COLUMN,
    DEFAULT_READY_COMMAND_TIMEOUT_S, DEFAULT_READY_POLL_S, DEFAULT_READY_TIMEOUT_S, Dataset, DatasetKind, Loc,
    MAX_DEDUP_LOOKBACK, Partitioning, ReadyCheck, ReviewFlags, Rewrites, SourceReadiness, WriteMode,
    partition_column_type,
};

const MANAGED_KEYS: &[&str] =
    &["partitioning", "write", "consumers", "slice_columns", "columns", "checks", "review_flags", "rewrites", "stale"];
const EXTERNAL_KEYS: &[&str] =
    &["partitioning", "location", "consumers", "columns", "ready", "ready_timeout_s", "ready_poll_s"];
const READY_KEYS: &[&str] = &["command", "command_timeout_s"];
const READY_CHECKS: &[&str] = &["location", "none"];
const WRITE_KEYS: &[&str] = &["mode", "keys", "order_by", "delete_marker", "dedup_key", "dedup_lookback"];
const WRITE_MODES: &[&str] = &["replace", "merge", "snapshot", "append"];
const COLUMN_KEYS: &[&str] = &["name", "type", "nullable"];
const COLUMN_TYPES: &[&str] = &["string", "int64", "int32", "float64", "bool", "date", "timestamp"];
const CHECK_TYPES: &[&str] =
    &["not_null", "unique", "accepted_values", "row_count", "aggregate_tolerance", "freshness", "sql"];
const AGGREGATES: &[&str] = &["sum", "mean", "min", "max", "count"];
/// The most static partitions a dataset may declare; each becomes a folder and a step.
const MAX_STATIC_KEYS: usize = 10_000;

/// A dataset as read, before the cross-checks that need the whole file.
pub(crate) struct DatasetDraft {
    pub(crate) name: String,
    pub(crate) path: Path,
    pub(crate) loc: Loc,
    pub(crate) external: bool,
    /// `None` when invalid (already reported), so cross-checks stay quiet about it.
    pub(crate) partitioning: Option<Partitioning>,
    partition_column: Option<String>,
    write: Option<WriteMode>,
    location: Option<String>,
    ready: Option<SourceReadiness>,
    consumers: Vec<String>,
    slice_columns: Vec<String>,
    columns: Vec<Column>,
    checks: Vec<Check>,
    review_flags: Option<ReviewFlags>,
    rewrites: Option<Rewrites>,
    stale: Option<crate::spec::StalePolicy>,
}

impl DatasetDraft {
    /// Whether this is an external source whose arrival Tidegate looks at (`ready` is not
    /// `"none"`).
    pub(crate) fn watches_arrival(&self) -> bool {
        self.external && self.ready.as_ref().is_some_and(|r| r.check != crate::spec::ReadyCheck::None)
    }

    /// The model value; `None` only if an error was reported for this dataset.
    pub(crate) fn finish(self) -> Option<Dataset> {
        let kind = if self.external {
            DatasetKind::External { location: self.location, ready: self.ready? }
        } else {
            DatasetKind::Managed { write: self.write? }
        };
        Some(Dataset {
            name: self.name,
            loc: self.loc,
            partitioning: self.partitioning?,
            partition_column: self.partition_column?,
            kind,
            consumers: self.consumers,
            slice_columns: self.slice_columns,
            columns: self.columns,
            checks: self.checks,
            review_flags: self.review_flags?,
            rewrites: self.rewrites?,
            stale: self.stale?,
        })
    }
}

/// Reads `[datasets]` then `[external]` into one map; a name in both is an error.
pub(crate) fn datasets(ctx: &mut Ctx<'_>, root: &Obj<'_, '_>) -> BTreeMap<String, DatasetDraft> {
    let mut out = BTreeMap::new();
    for (table, external) in [("datasets", false), ("external", true)] {
        let Some(obj) = root.get(ctx, table).and_then(|f| f.obj(ctx)) else { continue };
        for (name, key_span, value) in obj.entries() {
            let path = Path::item(table, name);
            ctx.record(&path, key_span);
            check_name(ctx, "dataset", name, key_span, &path);
            if let Some(first) = out.get(name).map(|d: &DatasetDraft| d.loc) {
                let message = format!(
                    "dataset \"{}\" is declared both in [datasets] (at {}) and in [external]",
                    clip(name),
                    ctx.at(first)
                );
                let help = "keep [datasets.NAME] if a task of this workspace writes it, [external.NAME] if \
                            something outside the workspace produces it";
                ctx.report(key_span, &path, message, Some(help.to_owned()));
                continue;
            }
            let draft = dataset(ctx, path, name, key_span, value, external);
            if let Some(draft) = draft {
                out.insert(name.to_owned(), draft);
            }
        }
    }
    out
}

fn dataset(
    ctx: &mut Ctx<'_>,
    path: Path,
    name: &str,
    key_span: Span,
    value: &toml_span::Value<'_>,
    external: bool,
) -> Option<DatasetDraft> {
    let loc = ctx.loc(key_span);
    let obj = Obj::open(ctx, path.clone(), value)?;
    allow_dataset_keys(ctx, &obj, external);
    let partitioning_field =
        obj.require(ctx, "partitioning", "partitioning = { grain = \"day\", start = \"2024-01-01\" }");
    let partitioning = partitioning_field.as_ref().and_then(|f| partitioning(ctx, f));
    let partition_column =
        partitioning_field.as_ref().filter(|_| partitioning.is_some()).and_then(|f| partition_column(ctx, f));
    let mut refs = Vec::new();
    let write = if external {
        None
    } else {
        obj.require(ctx, "write", "write = { mode = \"replace\" }").and_then(|f| write(ctx, &f, &mut refs))
    };
    if let (Some(Partitioning::Static { .. }), Some(WriteMode::Append { dedup_lookback, .. })) = (&partitioning, &write)
        && *dedup_lookback > 0
        && let Some(f) = obj.get(ctx, "write")
    {
        let message = "write.dedup_lookback counts earlier time partitions, but this dataset is partitioned by \
                       static keys, which have no order"
            .to_owned();
        let help = "remove dedup_lookback (each key's partition is de-duplicated on its own), or partition by time";
        ctx.report(f.span(), &f.path, message, Some(help.to_owned()));
    }
    let location_field = obj.get(ctx, "location").filter(|_| external);
    let location = location_field.as_ref().and_then(|f| f.non_empty_string(ctx));
    if let (Some(f), Some(l), Some(p)) = (&location_field, &location, &partitioning)
        && crate::source::is_template(l)
        && let Err(reason) = crate::source::check_template(l, !matches!(p, Partitioning::Static { .. }))
    {
        let help = "for example location = \"landing/events/{date}\" or \"s3://bucket/events/{yyyy}/{mm}/{dd}\"";
        f.invalid(ctx, format!("\"{}\"", clip(l)), &reason, Some(help.to_owned()));
    }
    let ready = if external { readiness(ctx, &obj, location.is_some()) } else { None };
    let consumers = obj.strings_or_empty(ctx, "consumers").unwrap_or_default();
    let slice_columns = obj.strings_or_empty(ctx, "slice_columns").unwrap_or_default();
    refs.extend(slice_columns.iter().cloned());
    let columns = obj.get(ctx, "columns").map(|f| columns(ctx, &f, external));
    let checks = match obj.get(ctx, "checks") {
        Some(f) => checks(ctx, &f, &mut refs),
        None => Vec::new(),
    };
    let review_flags = match obj.get(ctx, "review_flags").filter(|_| !external) {
        Some(f) => super::review::review_flags(ctx, &f),
        None => Some(ReviewFlags::DEFAULT),
    };
    let rewrites = match obj.get(ctx, "rewrites").filter(|_| !external) {
        Some(f) => rewrites(ctx, &f),
        None => Some(Rewrites::Review),
    };
    let stale = match obj.get(ctx, "stale").filter(|_| !external) {
        Some(f) => match f.str(ctx) {
            Some("report") => Some(crate::spec::StalePolicy::Report),
            Some("rebuild") => Some(crate::spec::StalePolicy::Rebuild),
            Some(other) => {
                let help = did_you_mean(other, ["report", "rebuild"])
                    .unwrap_or_else(|| "\"report\" (the default) or \"rebuild\"".to_owned());
                f.invalid(ctx, format!("\"{}\"", clip(other)), "expected \"report\" or \"rebuild\"", Some(help));
                None
            }
            None => None,
        },
        None => Some(crate::spec::StalePolicy::Report),
    };
    if let Some(Some(columns)) = &columns {
        check_column_refs(ctx, &obj.path, columns, &refs);
        if let (Some(p), Some((name, site)), Some(f)) = (&partitioning, &partition_column, &partitioning_field) {
            check_partition_column(ctx, f, p, name, *site, columns);
        }
    }
    Some(DatasetDraft {
        name: name.to_owned(),
        path,
        loc,
        external,
        partitioning,
        partition_column: partition_column.map(|(name, _)| name),
        write,
        location,
        ready,
        consumers: consumers.into_iter().map(|t| t.value).collect(),
        slice_columns: slice_columns.into_iter().map(|t| t.value).collect(),
        columns: columns.flatten().unwrap_or_default(),
        checks,
        review_flags,
        rewrites,
        stale,
    })
}

/// `ready`, `ready_timeout_s` and `ready_poll_s` of an external dataset; `None` when invalid.
fn readiness(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, has_location: bool) -> Option<SourceReadiness> {
    let timeout_s = obj.u32_or(ctx, "ready_timeout_s", DEFAULT_READY_TIMEOUT_S as u32, 1, u32::MAX);
    let poll_s = obj.u32_or(ctx, "ready_poll_s", DEFAULT_READY_POLL_S as u32, 1, 86_400);
    let check = match obj.get(ctx, "ready") {
        None if has_location => Some(ReadyCheck::Location),
        None => Some(ReadyCheck::None),
        Some(f) => match f.value.as_str() {
            Some("none") => Some(ReadyCheck::None),
            Some("location") if has_location => Some(ReadyCheck::Location),
            Some("location") => {
                let help = "add location = \"landing/events/{date}\" (a folder per partition) or the Delta \
                            table's URI, or say how to tell with ready = { command = [...] }";
                f.invalid(ctx, "\"location\"", "this source has no location to look at", Some(help.to_owned()));
                None
            }
            Some(other) => {
                let help = super::reader::did_you_mean(other, READY_CHECKS.iter().copied())
                    .unwrap_or_else(|| "\"location\", \"none\" or { command = [...] }".to_owned());
                f.invalid(ctx, format!("\"{}\"", clip(other)), "not a readiness check", Some(help));
                None
            }
            None => {
                let ready = Obj::open(ctx, f.path.clone(), f.value)?;
                ready.allow_only(ctx, READY_KEYS);
                let command = ready.require(ctx, "command", "command = [\"test\", \"-e\", \"/landing/done\"]");
                let argv = command.and_then(|c| super::task::argv(ctx, &c));
                let timeout = ready.u32_or(ctx, "command_timeout_s", DEFAULT_READY_COMMAND_TIMEOUT_S as u32, 1, 3_600);
                Some(ReadyCheck::Command { argv: argv?, timeout_s: u64::from(timeout?) })
            }
        },
    };
    Some(SourceReadiness { check: check?, timeout_s: u64::from(timeout_s?), poll_s: u64::from(poll_s?) })
}

/// `rewrites = "review" | "free"`.
fn rewrites(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Rewrites> {
    match f.str(ctx)? {
        "review" => Some(Rewrites::Review),
        "free" => Some(Rewrites::Free),
        other => {
            let help = did_you_mean(other, Rewrites::NAMES.iter().copied()).or_else(|| {
                Some(
                    "\"review\" (the default) sends a run that would replace partitions published by other code \
                     to a governed backfill; \"free\" lets any run replace them (scratch data)"
                        .to_owned(),
                )
            });
            f.invalid(ctx, format!("\"{}\"", clip(other)), "expected \"review\" or \"free\"", help);
            None
        }
    }
}

/// Unknown keys, with a specific message for the settings that belong to the other kind of dataset.
fn allow_dataset_keys(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, external: bool) {
    let name = obj.path.full();
    let (misplaced, message, help) = if external {
        (
            "write",
            "an external dataset is produced outside the workspace, so it has no write mode",
            format!(
                "remove write, or move the dataset to [{}] and list it in the outputs of the task that writes it",
                name.replacen("external.", "datasets.", 1)
            ),
        )
    } else {
        (
            "location",
            "location only applies to external datasets; tidegate places the tables it writes under project.lake",
            format!(
                "remove location, or move the dataset to [{}] if something outside the workspace produces it",
                name.replacen("datasets.", "external.", 1)
            ),
        )
    };
    let known = if external { EXTERNAL_KEYS } else { MANAGED_KEYS };
    let mut allowed = known.to_vec();
    allowed.push(misplaced);
    if external {
        allowed.push("rewrites");
    }
    obj.allow_only(ctx, &allowed);
    if let Some(f) = obj.get(ctx, misplaced) {
        ctx.report(f.span(), &f.path, message.to_owned(), Some(help));
    }
    if external && let Some(f) = obj.get(ctx, "rewrites") {
        let message = "rewrites is a policy for the partitions Tidegate publishes, but an external dataset is \
                       produced outside the workspace: Tidegate never writes it"
            .to_owned();
        let help = format!(
            "remove rewrites, or move the dataset to [{}] and list it in the outputs of the task that writes it",
            name.replacen("external.", "datasets.", 1)
        );
        ctx.report(f.span(), &f.path, message, Some(help));
    }
}

fn partitioning(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Partitioning> {
    let obj = f.obj(ctx)?;
    match (obj.has("keys"), obj.has("grain")) {
        (true, true) => {
            let grain = obj.get(ctx, "grain").map(|g| ctx.loc(g.span()));
            let keys = obj.get(ctx, "keys")?;
            let message = format!(
                "a partitioning is either by time (grain, start, time_zone) or by static keys, not both; grain is set at {}",
                grain.map_or_else(|| "the same table".to_owned(), |l| ctx.at(l))
            );
            ctx.report(keys.span(), &keys.path, message, None);
            None
        }
        (true, false) => static_partitioning(ctx, &obj),
        (false, true) => time_partitioning(ctx, &obj),
        (false, false) => {
            obj.allow_only(ctx, &["grain", "start", "time_zone", "keys", "column"]);
            let message = "partitioning needs grain and start (time partitions) or keys (static partitions)";
            let help = "write { grain = \"day\", start = \"2024-01-01\" } or { keys = [\"eu\", \"us\"] }";
            ctx.report(f.span(), &f.path, message.to_owned(), Some(help.to_owned()));
            None
        }
    }
}

/// The most characters of a partition column's name.
const MAX_PARTITION_COLUMN_LEN: usize = 64;

/// `partitioning.column`: the partition column's name ([`DEFAULT_PARTITION_COLUMN`] when unset)
/// and, when set, where. The name becomes the table's `<column>=<value>` folder names, so it is an
/// identifier: an ASCII letter, then ASCII letters, digits and `_`.
fn partition_column(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<(String, Option<Span>)> {
    let obj = f.obj(ctx)?;
    let Some(field) = obj.get(ctx, "column") else { return Some((DEFAULT_PARTITION_COLUMN.to_owned(), None)) };
    let name = field.str(ctx)?;
    let valid = name.len() <= MAX_PARTITION_COLUMN_LEN
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        let reason = format!(
            "a partition column's name starts with an ASCII letter and holds only ASCII letters, digits and \"_\", \
             at most {MAX_PARTITION_COLUMN_LEN} characters, because it names the table's <column>=<value> folders"
        );
        field.invalid(ctx, format!("\"{}\"", clip(name)), &reason, Some("for example column = \"day\"".to_owned()));
        return None;
    }
    Some((name.to_owned(), Some(field.span())))
}

/// A declared column with the partition column's name is the partition column: it must have the
/// partition column's type (`date`, `timestamp` or `string`); every row then holds its partition.
fn check_partition_column(
    ctx: &mut Ctx<'_>,
    f: &Field<'_, '_>,
    partitioning: &Partitioning,
    name: &str,
    site: Option<Span>,
    columns: &[Column],
) {
    if let Some(column) = columns.iter().find(|c| c.name != name && c.name.to_lowercase() == name.to_lowercase()) {
        let setting = if site.is_some() { "partitioning.column" } else { "the default partition column" };
        let message = format!(
            "column \"{}\" differs from the partition column \"{}\" ({setting}) only in case; Delta compares \
             column names ignoring case, so one table cannot hold both",
            clip(&column.name),
            clip(name)
        );
        let help =
            format!("name it \"{}\" to declare the partition column itself, or give it another name", clip(name));
        ctx.report(site.unwrap_or_else(|| f.span()), &f.path, message, Some(help));
        return;
    }
    let Some(column) = columns.iter().find(|c| c.name == name) else { return };
    let wanted = partition_column_type(partitioning);
    if column.data_type == wanted {
        return;
    }
    let what = match partitioning {
        Partitioning::Time { grain: Grain::Hour, .. } => "the start of each row's hour (UTC)",
        Partitioning::Time { .. } => "the first day of each row's partition",
        Partitioning::Static { .. } => "each row's partition key",
    };
    let setting = if site.is_some() { "partitioning.column" } else { "the default partition column" };
    let message = format!(
        "column \"{}\" is declared as {}, but it is the partition column ({setting}), which holds {what} as a \
         {wanted}",
        clip(name),
        column.data_type
    );
    let help = format!(
        "declare it as {{ name = \"{}\", type = \"{wanted}\" }}, or set partitioning.column to a name no declared \
         column has",
        clip(name)
    );
    ctx.report(site.unwrap_or_else(|| f.span()), &f.path, message, Some(help));
}

fn static_partitioning(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Option<Partitioning> {
    obj.allow_only(ctx, &["keys", "column"]);
    let field = obj.get(ctx, "keys")?;
    let keys = field.unique_strings(ctx)?;
    let mut ok = true;
    for key in &keys {
        if !is_valid_static_key(&key.value) {
            let message = format!(
                "invalid static partition key \"{}\": keys start with a letter or digit and contain only \
                 letters, digits, \"_\", \"-\" and \".\" (no \"..\"), at most 64 characters, because they become folder names",
                clip(&key.value)
            );
            ctx.report(key.span, &key.path, message, None);
            ok = false;
        }
    }
    if keys.len() > MAX_STATIC_KEYS {
        field.invalid(
            ctx,
            format!("[{} keys]", keys.len()),
            &format!("at most {MAX_STATIC_KEYS} keys are allowed"),
            None,
        );
        ok = false;
    }
    ok.then(|| Partitioning::Static { keys: keys.into_iter().map(|k| k.value).collect() })
}

fn time_partitioning(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Option<Partitioning> {
    obj.allow_only(ctx, &["grain", "start", "time_zone", "column"]);
    let grain = obj.get(ctx, "grain").and_then(|f| grain(ctx, &f));
    let start_field = obj.require(ctx, "start", "start = \"2024-01-01\"");
    let start = start_field.as_ref().and_then(|f| {
        let s = f.str(ctx)?;
        values::start(s)
            .map_err(|why| f.invalid(ctx, format!("\"{}\"", clip(s)), &why, Some(START_HELP.to_owned())))
            .ok()
    });
    let time_zone = match obj.get(ctx, "time_zone") {
        None => Some(None),
        Some(f) => zone(ctx, &f).map(Some),
    };
    let (grain, start, time_zone, start_field) = (grain?, start?, time_zone?, start_field?);
    let instant = values::start_instant(start, time_zone);
    if let Err(aligned) = values::aligned(instant, grain, time_zone) {
        let zone = time_zone.map_or_else(|| "UTC".to_owned(), |tz| tz.name().to_owned());
        let reason = match grain {
            Grain::Week => "a start must begin a week (ISO weeks start on Monday)".to_owned(),
            _ => format!("a start must begin a {grain} in {zone}"),
        };
        let help = format!("the {grain} containing it starts at \"{aligned}\"; write start = \"{aligned}\"");
        let shown = start_field.value.as_str().map(clip).unwrap_or_default();
        start_field.invalid(ctx, format!("\"{shown}\""), &reason, Some(help));
        return None;
    }
    Some(Partitioning::Time { grain, start: instant, time_zone })
}

fn grain(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Grain> {
    let s = f.str(ctx)?;
    if let Some(g) = Grain::parse(s) {
        return Some(g);
    }
    // People often write the schedule word ("daily") for the partition width ("day").
    let alias = match s {
        "hourly" => Some("hour"),
        "daily" => Some("day"),
        "weekly" => Some("week"),
        "monthly" => Some("month"),
        _ => None,
    };
    let help = alias
        .map(|a| format!("did you mean \"{a}\"?"))
        .or_else(|| did_you_mean(s, Grain::ALL.iter().map(|g| g.as_str())));
    f.invalid(ctx, format!("\"{}\"", clip(s)), "expected \"hour\", \"day\", \"week\" or \"month\"", help);
    None
}

pub(crate) fn zone(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<chrono_tz::Tz> {
    let s = f.str(ctx)?;
    match values::zone(s) {
        Ok(tz) => Some(tz),
        Err(suggestion) => {
            let help = suggestion.map(|z| format!("did you mean \"{z}\"?"));
            let reason = "not a known IANA time zone; expected a name such as \"Europe/Paris\" or \"UTC\"";
            f.invalid(ctx, format!("\"{}\"", clip(s)), reason, help);
            None
        }
    }
}

/// `write = { mode = ..., ... }`; column names it refers to are added to `refs`.
fn write(ctx: &mut Ctx<'_>, f: &Field<'_, '_>, refs: &mut Vec<Text>) -> Option<WriteMode> {
    let obj = f.obj(ctx)?;
    obj.allow_only(ctx, WRITE_KEYS);
    let mode_field = obj.require(ctx, "mode", "mode = \"replace\"")?;
    let mode = mode_field.str(ctx)?;
    let allowed: &[&str] = match mode {
        "merge" => &["keys", "order_by", "delete_marker"],
        "append" => &["dedup_key", "dedup_lookback", "order_by"],
        "replace" | "snapshot" => &[],
        _ => {
            let help = did_you_mean(mode, WRITE_MODES.iter().copied());
            let reason = "expected \"replace\", \"merge\", \"snapshot\" or \"append\"";
            mode_field.invalid(ctx, format!("\"{}\"", clip(mode)), reason, help);
            return None;
        }
    };
    let mode_at = ctx.at(ctx.loc(mode_field.span()));
    let mut ok = true;
    for key in ["keys", "order_by", "delete_marker", "dedup_key", "dedup_lookback"] {
        if let Some(setting) = obj.get(ctx, key).filter(|_| !allowed.contains(&key)) {
            let owner = if key.starts_with("dedup_") { "append" } else { "merge" };
            let applies_to = if key == "order_by" { "merge and append" } else { owner };
            let message = format!(
                "{} only applies to {applies_to} writes, but write.mode = \"{mode}\" at {mode_at}",
                setting.path.short()
            );
            let help = format!("remove {key}, or set mode = \"{owner}\"");
            ctx.report(setting.span(), &setting.path, message, Some(help));
            ok = false;
        }
    }
    let written = match mode {
        "merge" => merge(ctx, &obj, &mode_field, refs),
        "append" => append(ctx, &obj, &mode_field, refs),
        "snapshot" => Some(WriteMode::Snapshot),
        _ => Some(WriteMode::Replace),
    };
    written.filter(|_| ok)
}

fn merge(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, mode: &Field<'_, '_>, refs: &mut Vec<Text>) -> Option<WriteMode> {
    let keys = match obj.get(ctx, "keys") {
        Some(f) => f.unique_strings(ctx),
        None => {
            let message = "write.mode = \"merge\" needs write.keys, the columns that identify a row: \
                           without them a merge cannot tell an update from a new row"
                .to_owned();
            let help = Some("add keys = [\"user_id\"] to write, naming your key columns".to_owned());
            ctx.report(mode.span(), &mode.path, message, help);
            None
        }
    };
    let order_by = obj.get(ctx, "order_by").map(|f| f.text(ctx));
    let delete_marker = obj.get(ctx, "delete_marker").map(|f| f.text(ctx));
    let keys = keys?;
    refs.extend(keys.iter().cloned());
    refs.extend(order_by.iter().flatten().cloned());
    refs.extend(delete_marker.iter().flatten().cloned());
    Some(WriteMode::Merge {
        keys: keys.into_iter().map(|t| t.value).collect(),
        order_by: optional(order_by)?,
        delete_marker: optional(delete_marker)?,
    })
}

/// `None` when the setting was present but invalid; `Some(None)` when absent.
fn optional(setting: Option<Option<Text>>) -> Option<Option<String>> {
    match setting {
        None => Some(None),
        Some(t) => t.map(|t| Some(t.value)),
    }
}

fn append(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, mode: &Field<'_, '_>, refs: &mut Vec<Text>) -> Option<WriteMode> {
    let Some(f) = obj.get(ctx, "dedup_key") else {
        let message = "write.mode = \"append\" needs write.dedup_key, the columns that identify a row, \
                       so that a replayed step adds nothing twice"
            .to_owned();
        let help = Some("add dedup_key = [\"event_id\"] to write, naming your key columns".to_owned());
        ctx.report(mode.span(), &mode.path, message, help);
        return None;
    };
    let dedup_key = f.unique_strings(ctx)?;
    refs.extend(dedup_key.iter().cloned());
    let order_by = obj.get(ctx, "order_by").map(|f| f.text(ctx));
    refs.extend(order_by.iter().flatten().cloned());
    let dedup_lookback = obj.u32_or(ctx, "dedup_lookback", 0, 0, MAX_DEDUP_LOOKBACK)?;
    Some(WriteMode::Append {
        dedup_key: dedup_key.into_iter().map(|t| t.value).collect(),
        dedup_lookback,
        order_by: optional(order_by)?,
    })
}

/// `columns = [{ name, type, nullable }]`. `None` when any column is invalid. Names are compared
/// ignoring case, as Delta compares them; a dataset's (not an external's, whose table is another
/// system's) must also be names a Delta table can hold.
fn columns(ctx: &mut Ctx<'_>, f: &Field<'_, '_>, external: bool) -> Option<Vec<Column>> {
    let items = f.array(ctx, "an array of tables such as { name = \"user_id\", type = \"string\" }")?;
    let mut out = Vec::new();
    let mut seen: Vec<(String, Span)> = Vec::new();
    let mut ok = true;
    for item in &items {
        let Some(column) = column(ctx, item) else {
            ok = false;
            continue;
        };
        let folded = column.name.to_lowercase();
        if let Some((first_name, first)) = seen.iter().find(|(n, _)| n.to_lowercase() == folded) {
            let at = ctx.at(ctx.loc(*first));
            let message = if *first_name == column.name {
                format!("column \"{}\" is declared twice (first at {at})", clip(&column.name))
            } else {
                format!(
                    "column \"{}\" differs from column \"{}\" (at {at}) only in case; Delta compares column names \
                     ignoring case, so one table cannot hold both",
                    clip(&column.name),
                    clip(first_name)
                )
            };
            ctx.report(item.span(), &item.path, message, None);
            ok = false;
        } else if let Some(message) = (!external).then(|| unholdable_name(&column.name)).flatten() {
            ctx.report(item.span(), &item.path, message, Some("use letters, digits and \"_\"".to_owned()));
            ok = false;
        }
        seen.push((column.name.clone(), item.span()));
        out.push(column);
    }
    ok.then_some(out)
}

/// Why a Delta table cannot hold a column named `name` (its characters), if it cannot.
fn unholdable_name(name: &str) -> Option<String> {
    let mut found: Vec<char> = name.chars().filter(|c| COLUMN_NAME_FORBIDDEN_CHARS.contains(c)).collect();
    found.dedup();
    if found.is_empty() {
        return None;
    }
    let shown: Vec<String> = found.iter().map(|c| format!("{c:?}")).collect();
    Some(format!(
        "column \"{}\" holds {}, which a Delta table cannot hold in a column name (Parquet's schema syntax uses \
         space , ; {{ }} ( ) = tab and newline)",
        clip(name),
        shown.join(", ")
    ))
}

fn column(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Column> {
    let obj = f.obj(ctx)?;
    obj.allow_only(ctx, COLUMN_KEYS);
    let name = obj.require(ctx, "name", "name = \"user_id\"").and_then(|n| n.non_empty_string(ctx));
    let data_type = obj.require(ctx, "type", "type = \"string\"").and_then(|t| column_type(ctx, &t));
    let nullable = obj.bool_or(ctx, "nullable", true);
    Some(Column { name: name?, data_type: data_type?, nullable: nullable? })
}

fn column_type(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<String> {
    let s = f.str(ctx)?;
    if COLUMN_TYPES.contains(&s) {
        return Some(s.to_owned());
    }
    // The names other systems use for the same types.
    let alias = match s.to_ascii_lowercase().as_str() {
        "int" | "integer" | "bigint" | "long" | "i64" => Some("int64"),
        "float" | "double" | "f64" | "number" => Some("float64"),
        "boolean" => Some("bool"),
        "str" | "text" | "varchar" | "utf8" => Some("string"),
        "datetime" => Some("timestamp"),
        _ => None,
    };
    let help =
        alias.map(|a| format!("did you mean \"{a}\"?")).or_else(|| did_you_mean(s, COLUMN_TYPES.iter().copied()));
    let reason = format!("expected one of {}", COLUMN_TYPES.join(", "));
    f.invalid(ctx, format!("\"{}\"", clip(s)), &reason, help);
    None
}

fn checks(ctx: &mut Ctx<'_>, f: &Field<'_, '_>, refs: &mut Vec<Text>) -> Vec<Check> {
    let Some(items) = f.array(ctx, "an array of tables ([[datasets.NAME.checks]])") else { return Vec::new() };
    let mut out: Vec<Check> = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(check) = check(ctx, item, i, refs) else { continue };
        if let Some(j) = out.iter().position(|c| c.name == check.name) {
            let message =
                format!("two checks are named \"{}\" (the other at {})", check.name, ctx.at(ctx.loc(spans[j])));
            let help = Some("give each check a distinct name = \"...\"".to_owned());
            ctx.report(item.span(), &item.path, message, help);
        }
        spans.push(item.span());
        out.push(check);
    }
    out
}

fn check(ctx: &mut Ctx<'_>, f: &Field<'_, '_>, index: usize, refs: &mut Vec<Text>) -> Option<Check> {
    let obj = f.obj(ctx)?;
    let kind_field = obj.require(ctx, "type", "type = \"not_null\"")?;
    let kind = kind_field.str(ctx)?;
    let specific = check_keys(kind);
    if specific.is_empty() {
        let help = did_you_mean(kind, CHECK_TYPES.iter().copied())
            .or_else(|| Some(format!("the check types are {}", CHECK_TYPES.join(", "))));
        kind_field.invalid(ctx, format!("\"{}\"", clip(kind)), "unknown check type", help);
        return None;
    }
    let mut known = vec!["type", "name", "blocking"];
    known.extend_from_slice(specific);
    report_settings_of_other_checks(ctx, &obj, kind, &known);
    obj.allow_only(ctx, &[known, other_check_keys(kind)].concat());
    let rule = check_rule(ctx, &obj, kind, refs);
    let name = obj.get(ctx, "name").map(|n| n.non_empty_string(ctx));
    let blocking = obj.bool_or(ctx, "blocking", true);
    let rule = rule?;
    let name = match name {
        Some(n) => n?,
        None => default_check_name(&rule, index),
    };
    Some(Check { name, blocking: blocking?, rule })
}

/// The settings that some other check type has and `kind` lacks.
fn other_check_keys(kind: &str) -> Vec<&'static str> {
    let mut keys: Vec<&str> = Vec::new();
    for t in CHECK_TYPES.iter().filter(|t| **t != kind) {
        keys.extend(check_keys(t).iter().filter(|k| !check_keys(kind).contains(k)));
    }
    keys
}

fn check_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "not_null" | "unique" => &["columns"],
        "accepted_values" => &["column", "values"],
        "row_count" => &["min", "max"],
        "aggregate_tolerance" => &["column", "aggregate", "tolerance_pct"],
        "freshness" => &["column", "max_age_s"],
        "sql" => &["query"],
        _ => &[],
    }
}

/// `min` in an `accepted_values` check: say which check type it belongs to.
fn report_settings_of_other_checks(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, kind: &str, known: &[&str]) {
    for (key, span, _) in obj.entries() {
        if known.contains(&key) {
            continue;
        }
        let owners: Vec<&str> = CHECK_TYPES.iter().copied().filter(|t| check_keys(t).contains(&key)).collect();
        if owners.is_empty() {
            continue;
        }
        let message = format!("{key} is a setting of {} checks, but this check's type is {kind}", owners.join(" and "));
        let help = format!("the settings of {kind} checks are {}", check_keys(kind).join(", "));
        ctx.report(span, &obj.path.join(key), message, Some(help));
    }
}

fn check_rule(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, kind: &str, refs: &mut Vec<Text>) -> Option<CheckRule> {
    let mut column = |ctx: &mut Ctx<'_>| {
        let t = obj.require(ctx, "column", "column = \"user_id\"").and_then(|f| f.text(ctx))?;
        refs.push(t.clone());
        Some(t.value)
    };
    match kind {
        "not_null" | "unique" => {
            let cols = obj.require(ctx, "columns", "columns = [\"user_id\"]").and_then(|f| f.unique_strings(ctx))?;
            refs.extend(cols.iter().cloned());
            let columns = cols.into_iter().map(|t| t.value).collect();
            Some(if kind == "unique" { CheckRule::Unique { columns } } else { CheckRule::NotNull { columns } })
        }
        "accepted_values" => {
            let column = column(ctx);
            let values = obj.require(ctx, "values", "values = [\"a\", \"b\"]").and_then(|f| f.unique_strings(ctx));
            Some(CheckRule::AcceptedValues { column: column?, values: values?.into_iter().map(|t| t.value).collect() })
        }
        "row_count" => row_count(ctx, obj),
        "aggregate_tolerance" => {
            let column = column(ctx);
            let aggregate = obj.require(ctx, "aggregate", "aggregate = \"sum\"").and_then(|f| aggregate(ctx, &f));
            let tolerance = obj.require(ctx, "tolerance_pct", "tolerance_pct = 5.0").and_then(|f| {
                let n = f.number(ctx)?;
                let ok = n >= 0.0 && n.is_finite();
                if !ok {
                    f.invalid(ctx, n, "must be 0 or more (a percentage)", None);
                }
                ok.then_some(n)
            });
            Some(CheckRule::AggregateTolerance { column: column?, aggregate: aggregate?, tolerance_pct: tolerance? })
        }
        "freshness" => {
            let column = column(ctx);
            let max_age_s = obj
                .require(ctx, "max_age_s", "max_age_s = 3600")
                .and_then(|f| f.int_in(ctx, 1, i64::MAX))
                .and_then(|n| u64::try_from(n).ok());
            Some(CheckRule::Freshness { column: column?, max_age_s: max_age_s? })
        }
        _ => {
            let help =
                "a check's query returns the failing rows, as in query = \"SELECT * FROM staged WHERE amount < 0\"";
            let query = obj.require(ctx, "query", "query = \"SELECT * FROM staged WHERE ...\"")?.query(ctx, help)?;
            Some(CheckRule::Sql { query })
        }
    }
}

fn row_count(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Option<CheckRule> {
    let bound = |ctx: &mut Ctx<'_>, key: &str| match obj.get(ctx, key) {
        None => Some(None),
        Some(f) => f.int_in(ctx, 0, i64::MAX).and_then(|n| u64::try_from(n).ok()).map(Some),
    };
    let (min, max) = (bound(ctx, "min")?, bound(ctx, "max")?);
    match (min, max) {
        (None, None) => {
            let message = "a row_count check needs min, max or both".to_owned();
            ctx.report(obj.span, &obj.path, message, Some("add min = 1".to_owned()));
            None
        }
        (Some(lo), Some(hi)) if lo > hi => {
            let min_at = ctx.site(&obj.path.join("min").full()).map(|l| ctx.at(l)).unwrap_or_default();
            let max_field = obj.get(ctx, "max")?;
            max_field.invalid(ctx, hi, &format!("must be at least min = {lo} at {min_at}"), None);
            None
        }
        _ => Some(CheckRule::RowCount { min, max }),
    }
}

fn aggregate(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Aggregate> {
    let s = f.str(ctx)?;
    let agg = match s {
        "sum" => Aggregate::Sum,
        "mean" => Aggregate::Mean,
        "min" => Aggregate::Min,
        "max" => Aggregate::Max,
        "count" => Aggregate::Count,
        _ => {
            let help = did_you_mean(s, AGGREGATES.iter().copied());
            f.invalid(ctx, format!("\"{}\"", clip(s)), "expected sum, mean, min, max or count", help);
            return None;
        }
    };
    Some(agg)
}

/// A name that says what the check does, such as `not_null(user_id)`.
fn default_check_name(rule: &CheckRule, index: usize) -> String {
    match rule {
        CheckRule::NotNull { columns } => format!("not_null({})", columns.join(", ")),
        CheckRule::Unique { columns } => format!("unique({})", columns.join(", ")),
        CheckRule::AcceptedValues { column, .. } => format!("accepted_values({column})"),
        CheckRule::RowCount { min, max } => {
            let min = min.map_or_else(String::new, |m| format!("min={m}"));
            let max = max.map_or_else(String::new, |m| format!("max={m}"));
            let sep = if min.is_empty() || max.is_empty() { "" } else { ", " };
            format!("row_count({min}{sep}{max})")
        }
        CheckRule::AggregateTolerance { column, aggregate, tolerance_pct } => {
            let agg = format!("{aggregate:?}").to_lowercase();
            format!("aggregate_tolerance({agg}({column}), {tolerance_pct}%)")
        }
        CheckRule::Freshness { column, max_age_s } => format!("freshness({column}, {max_age_s}s)"),
        CheckRule::Sql { .. } => format!("sql(check {})", index + 1),
    }
}

/// When `columns` is declared, every setting that names a column must name a declared one.
fn check_column_refs(ctx: &mut Ctx<'_>, dataset: &Path, columns: &[Column], refs: &[Text]) {
    let columns_at = ctx.site(&dataset.join("columns").full()).map(|l| ctx.at(l)).unwrap_or_default();
    for r in refs {
        if columns.iter().any(|c| c.name == r.value) {
            continue;
        }
        let message = format!(
            "{} names column \"{}\", which is not in the columns declared at {columns_at}",
            r.path.short(),
            clip(&r.value)
        );
        let help = did_you_mean(&r.value, columns.iter().map(|c| c.name.as_str()))
            .or_else(|| Some(format!("add {{ name = \"{}\", type = \"...\" }} to columns", clip(&r.value))));
        ctx.report(r.span, &r.path, message, help);
    }
}

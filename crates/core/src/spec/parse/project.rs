//! `[project]` and `[pools.NAME]`: where state lives, lease timing and shared resource caps.

use std::collections::BTreeMap;

use toml_span::Span;

use super::reader::{Ctx, Field, Obj, Path, check_name, clip};
use crate::spec::{DEFAULT_POOL, Pool, PoolWindow, Project};

/// The most seconds a lease may live: a dead worker's step waits this long before it is re-run.
const MAX_LEASE_TTL_S: u32 = 3_600;
/// The longest client idempotency keys may be remembered: one year.
const MAX_IDEMPOTENCY_TTL_H: u32 = 24 * 366;
/// The most attempts one pool may run at once.
const MAX_SLOTS: u32 = 100_000;
/// The most retries a pool may spend before its ratio applies.
const MAX_RETRY_BUDGET_BURST: u32 = 100_000;
/// The slots of the `default` pool when the file does not declare it.
const DEFAULT_POOL_SLOTS: u32 = 4;

/// The smallest log cap: one longest log line (64 KiB).
pub(crate) const MIN_LOG_MAX_BYTES: u64 = 64 * 1024;
/// The largest log cap: 1 TiB (memory holds at most 1 MiB of a log's tail whatever the cap).
pub(crate) const MAX_LOG_MAX_BYTES: u64 = 1 << 40;

const PROJECT_KEYS: &[&str] = &[
    "name",
    "state",
    "lake",
    "lease_ttl_s",
    "heartbeat_s",
    "allow_self_approval",
    "idempotency_ttl_h",
    "log_max_bytes",
];
const POOL_KEYS: &[&str] = &["slots", "rate_per_s", "retry_budget_ratio", "retry_budget_burst", "time_zone", "windows"];
const WINDOW_KEYS: &[&str] = &["days", "from", "to", "slots"];
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// `[project]` with the timing settings kept apart: `None` means invalid (already reported), so
/// checks that compare them with other settings stay quiet instead of piling up.
pub(crate) struct ProjectDraft {
    pub(crate) project: Project,
    pub(crate) heartbeat_s: Option<u32>,
}

pub(crate) fn project(ctx: &mut Ctx<'_>, root: &Obj<'_, '_>) -> ProjectDraft {
    let path = Path::root("project");
    let Some(field) = root.get(ctx, "project") else {
        let message = "missing [project] table: every workspace needs at least project.name".to_owned();
        let help = Some("add [project] with name = \"my_pipeline\" at the top of the file".to_owned());
        ctx.report(Span::new(0, 0), &path, message, help);
        return ProjectDraft { project: default_project(), heartbeat_s: None };
    };
    let Some(obj) = field.obj(ctx) else {
        return ProjectDraft { project: default_project(), heartbeat_s: None };
    };
    obj.allow_only(ctx, PROJECT_KEYS);
    let name = obj.require(ctx, "name", "name = \"my_pipeline\"").and_then(|f| f.non_empty_string(ctx));
    let defaults = default_project();
    let lease_ttl_s = obj.u32_or(ctx, "lease_ttl_s", defaults.lease_ttl_s, 1, MAX_LEASE_TTL_S);
    let heartbeat_s = obj.u32_or(ctx, "heartbeat_s", defaults.heartbeat_s, 1, MAX_LEASE_TTL_S);
    if let (Some(hb), Some(ttl)) = (heartbeat_s, lease_ttl_s) {
        check_heartbeat(ctx, &obj, hb, ttl);
    }
    let project = Project {
        name: name.unwrap_or_default(),
        state_url: obj.string_or(ctx, "state", &defaults.state_url).unwrap_or_default(),
        lake_url: obj.string_or(ctx, "lake", &defaults.lake_url).unwrap_or_default(),
        lease_ttl_s: lease_ttl_s.unwrap_or(defaults.lease_ttl_s),
        heartbeat_s: heartbeat_s.unwrap_or(defaults.heartbeat_s),
        allow_self_approval: obj.bool_or(ctx, "allow_self_approval", false).unwrap_or_default(),
        idempotency_ttl_h: obj
            .u32_or(ctx, "idempotency_ttl_h", defaults.idempotency_ttl_h, 1, MAX_IDEMPOTENCY_TTL_H)
            .unwrap_or(defaults.idempotency_ttl_h),
        log_max_bytes: log_max_bytes(ctx, &obj).unwrap_or(defaults.log_max_bytes),
    };
    ProjectDraft { project, heartbeat_s }
}

/// `log_max_bytes` of the project or a task: `None` when absent or invalid (reported).
pub(crate) fn log_max_bytes(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Option<u64> {
    let min = i64::try_from(MIN_LOG_MAX_BYTES).unwrap_or(i64::MAX);
    let max = i64::try_from(MAX_LOG_MAX_BYTES).unwrap_or(i64::MAX);
    obj.get(ctx, "log_max_bytes").and_then(|f| f.int_in(ctx, min, max)).and_then(|n| u64::try_from(n).ok())
}

fn default_project() -> Project {
    Project {
        name: String::new(),
        state_url: ".tidegate/state.db".to_owned(),
        lake_url: ".tidegate/lake".to_owned(),
        lease_ttl_s: 30,
        heartbeat_s: 10,
        allow_self_approval: false,
        idempotency_ttl_h: 24,
        log_max_bytes: crate::spec::DEFAULT_LOG_MAX_BYTES,
    }
}

/// A worker renews its lease every `heartbeat_s`; if that is not shorter than the lease, a healthy
/// worker loses its claim between two heartbeats.
fn check_heartbeat(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, heartbeat_s: u32, lease_ttl_s: u32) {
    if heartbeat_s < lease_ttl_s {
        return;
    }
    let hb_path = obj.path.join("heartbeat_s");
    let ttl = ctx.mention("project.lease_ttl_s", lease_ttl_s);
    let message = format!(
        "invalid value {heartbeat_s} for project.heartbeat_s: must be below {ttl}, or a healthy \
         worker loses its lease between two heartbeats"
    );
    let help = Some(format!(
        "a heartbeat of at most a third of the lease is safe: heartbeat_s = {}",
        (lease_ttl_s / 3).max(1)
    ));
    let loc = ctx.site(&hb_path.full()).or_else(|| ctx.site("project.lease_ttl_s"));
    let loc = loc.unwrap_or_else(|| ctx.loc(obj.span));
    ctx.report_at(loc, &hb_path.full(), message, help);
}

/// `[pools.NAME]`, plus the `default` pool unless the file declares it. `None` values mark invalid
/// pools (already reported) so that tasks naming them are not reported a second time.
pub(crate) fn pools(ctx: &mut Ctx<'_>, root: &Obj<'_, '_>) -> BTreeMap<String, Option<Pool>> {
    let mut out = BTreeMap::new();
    if let Some(obj) = root.get(ctx, "pools").and_then(|f| f.obj(ctx)) {
        for (name, key_span, value) in obj.entries() {
            let path = Path::item("pools", name);
            ctx.record(&path, key_span);
            let named = check_name(ctx, "pool", name, key_span, &path);
            let pool = Obj::open(ctx, path, value).and_then(|p| pool(ctx, &p));
            out.insert(name.to_owned(), pool.filter(|_| named));
        }
    }
    out.entry(DEFAULT_POOL.to_owned()).or_insert(Some(Pool {
        slots: DEFAULT_POOL_SLOTS,
        rate_per_s: None,
        retry_budget_ratio: 0.2,
        retry_budget_burst: 5,
        time_zone: None,
        windows: Vec::new(),
    }));
    out
}

fn pool(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Option<Pool> {
    obj.allow_only(ctx, POOL_KEYS);
    let slots = obj
        .require(ctx, "slots", "slots = 4")
        .and_then(|f| f.int_in(ctx, 1, i64::from(MAX_SLOTS)))
        .and_then(|n| u32::try_from(n).ok());
    let rate_per_s = match obj.get(ctx, "rate_per_s") {
        None => Some(None),
        Some(f) => match f.number(ctx) {
            Some(r) if r > 0.0 && r.is_finite() => Some(Some(r)),
            Some(r) => {
                f.invalid(ctx, r, "must be above 0", Some("leave rate_per_s out for no rate limit".to_owned()));
                None
            }
            None => None,
        },
    };
    let retry_budget_ratio = match obj.get(ctx, "retry_budget_ratio") {
        None => Some(0.2),
        Some(f) => f.number(ctx).and_then(|r| {
            let ok = (0.0..=1.0).contains(&r);
            if !ok {
                f.invalid(ctx, r, "must be between 0 and 1, a share of first attempts", None);
            }
            ok.then_some(r)
        }),
    };
    let retry_budget_burst = obj.u32_or(ctx, "retry_budget_burst", 5, 0, MAX_RETRY_BUDGET_BURST);
    let time_zone = match obj.get(ctx, "time_zone") {
        None => Some(None),
        Some(f) => super::dataset::zone(ctx, &f).map(Some),
    };
    let windows = match obj.get(ctx, "windows") {
        None => Some(Vec::new()),
        Some(f) => f
            .array(
                ctx,
                "an array of windows such as [{ days = \"mon-fri\", from = \"09:00\", to = \"18:00\", slots = 1 }]",
            )
            .and_then(|items| {
                let windows: Vec<Option<PoolWindow>> = items.iter().map(|item| window(ctx, item)).collect();
                windows.into_iter().collect::<Option<Vec<_>>>()
            }),
    };
    Some(Pool {
        slots: slots?,
        rate_per_s: rate_per_s?,
        retry_budget_ratio: retry_budget_ratio?,
        retry_budget_burst: retry_budget_burst?,
        time_zone: time_zone?,
        windows: windows?,
    })
}

/// One of a pool's `windows`: `{ days = "mon-fri", from = "09:00", to = "18:00", slots = 1 }`.
fn window(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<PoolWindow> {
    let obj = f.obj(ctx)?;
    obj.allow_only(ctx, WINDOW_KEYS);
    let days = obj.require(ctx, "days", "days = \"mon-fri\"").and_then(|d| {
        let text = d.str(ctx)?;
        let parsed = days(text);
        if parsed.is_none() {
            let reason = "expected days of the week such as \"mon-fri\", \"sat,sun\" or \"wed\" (mon, tue, wed, thu, fri, sat, sun)";
            d.invalid(ctx, format!("\"{}\"", clip(text)), reason, None);
        }
        parsed
    });
    let time = |ctx: &mut Ctx<'_>, key: &str, example: &str| {
        let t = obj.require(ctx, key, example)?;
        let text = t.str(ctx)?;
        let parsed = if text == "24:00" && key == "to" {
            Some(None)
        } else {
            chrono::NaiveTime::parse_from_str(text, "%H:%M").ok().map(Some)
        };
        if parsed.is_none() {
            let reason = if key == "to" {
                "expected a time of day \"HH:MM\" (00:00 to 24:00)"
            } else {
                "expected a time of day \"HH:MM\" (00:00 to 23:59)"
            };
            t.invalid(ctx, format!("\"{}\"", clip(text)), reason, None);
        }
        Some((parsed?, t))
    };
    let from = time(ctx, "from", "from = \"09:00\"");
    let to = time(ctx, "to", "to = \"18:00\"");
    let slots = obj
        .require(ctx, "slots", "slots = 1")
        .and_then(|s| s.int_in(ctx, 0, i64::from(MAX_SLOTS)))
        .and_then(|n| u32::try_from(n).ok());
    let (from, (to, to_field)) = (from?.0.unwrap_or_default(), to?);
    if to.is_some_and(|to| to <= from) {
        let help =
            Some("a window ends after it starts on the same day; split one that spans midnight in two".to_owned());
        to_field.invalid(
            ctx,
            format!("\"{}\"", to.map(|t| t.format("%H:%M").to_string()).unwrap_or_default()),
            &format!("must be after from = \"{}\"", from.format("%H:%M")),
            help,
        );
        return None;
    }
    Some(PoolWindow { days: days?, from, to, slots: slots? })
}

/// `"mon-fri"`, `"sat,sun"`, `"mon"`, `"fri-mon"` (wrapping): the days named, Monday first.
fn days(text: &str) -> Option<[bool; 7]> {
    let index = |d: &str| DAYS.iter().position(|k| k.eq_ignore_ascii_case(d.trim()));
    let mut out = [false; 7];
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (mut i, j) = (index(a)?, index(b)?);
                loop {
                    out[i] = true;
                    if i == j {
                        break;
                    }
                    i = (i + 1) % 7;
                }
            }
            None => out[index(part)?] = true,
        }
    }
    Some(out)
}

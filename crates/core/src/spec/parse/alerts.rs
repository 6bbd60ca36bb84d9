//! `[receivers.NAME]` and `[alerts.NAME]`: where notifications go, and the conditions watched
//! over time that send them (decision 0023). Every name an alert gives (a task, pool, dataset or
//! receiver) must exist, and a URL's secret is never in a message.

use std::collections::BTreeMap;

use super::reader::{Ctx, Field, Obj, Path, clip, did_you_mean};
use crate::spec::{AlertCondition, AlertRule, Endpoint, FailureScope, Receiver, ReceiverKind, Severity, SmtpTls};

const RECEIVER_KINDS: &[&str] = &["webhook", "slack", "email"];
const WEBHOOK_KEYS: &[&str] = &["kind", "url", "url_env", "secret_env", "timeout_s"];
const SLACK_KEYS: &[&str] = &["kind", "url", "url_env", "timeout_s"];
const EMAIL_KEYS: &[&str] = &["kind", "smtp", "tls", "from", "to", "username_env", "password_env", "timeout_s"];
/// How long one delivery may take unless `timeout_s` says otherwise.
const DEFAULT_TIMEOUT_S: u32 = 10;
const MAX_TIMEOUT_S: u32 = 300;

const WHENS: &[&str] = &[
    "failure_rate",
    "consecutive_failures",
    "freshness_lag",
    "backlog_eta",
    "retry_budget_exhausted",
    "source_waiting",
    "stale_partitions",
    "approval_waiting",
];
/// The settings every rule may have, whatever it watches.
const COMMON_KEYS: &[&str] = &["when", "for", "receivers", "severity"];
/// The longest `for` or duration limit: a year.
const MAX_DURATION_S: u64 = 366 * 24 * 3600;

/// What the rest of the spec declares, for the names alerts give.
pub(crate) struct Names<'a> {
    pub(crate) tasks: Vec<&'a str>,
    pub(crate) pools: Vec<&'a str>,
    /// Each dataset, and whether it is `[external]`.
    pub(crate) datasets: BTreeMap<&'a str, bool>,
}

/// Whether `name` is a valid alert or receiver name: like a dataset's, with `-` allowed too (a
/// receiver is often named after a team, as `consumers` are: `ml-training`).
fn is_valid_label(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn check_label(ctx: &mut Ctx<'_>, kind: &str, name: &str, span: toml_span::Span, path: &Path) -> bool {
    if is_valid_label(name) {
        return true;
    }
    let message = format!(
        "invalid {kind} name \"{}\": names start with a lowercase letter and hold only lowercase \
         letters, digits, \"_\" and \"-\", at most 63 characters",
        clip(name)
    );
    ctx.report(span, path, message, None);
    false
}

/// `[receivers]`; `None` marks a receiver already reported as invalid, so alerts naming it are
/// not reported a second time.
pub(crate) fn receivers(ctx: &mut Ctx<'_>, root: &Obj<'_, '_>) -> BTreeMap<String, Option<Receiver>> {
    let mut out = BTreeMap::new();
    let Some(obj) = root.get(ctx, "receivers").and_then(|f| f.obj(ctx)) else { return out };
    for (name, key_span, value) in obj.entries() {
        let path = Path::item("receivers", name);
        ctx.record(&path, key_span);
        let named = check_label(ctx, "receiver", name, key_span, &path);
        let receiver = Obj::open(ctx, path, value).and_then(|r| receiver(ctx, name, &r));
        out.insert(name.to_owned(), receiver.filter(|_| named));
    }
    out
}

fn receiver(ctx: &mut Ctx<'_>, name: &str, obj: &Obj<'_, '_>) -> Option<Receiver> {
    let kind_field = obj.require(ctx, "kind", "kind = \"webhook\" (or \"slack\", \"email\")")?;
    let kind = kind_field.str(ctx)?;
    let keys = match kind {
        "webhook" => WEBHOOK_KEYS,
        "slack" => SLACK_KEYS,
        "email" => EMAIL_KEYS,
        other => {
            let help = did_you_mean(other, RECEIVER_KINDS.iter().copied())
                .or_else(|| Some(format!("one of {}", RECEIVER_KINDS.join(", "))));
            kind_field.invalid(ctx, format!("\"{}\"", clip(other)), "is not a kind of receiver", help);
            return None;
        }
    };
    obj.allow_only(ctx, keys);
    let timeout_s = obj.u32_or(ctx, "timeout_s", DEFAULT_TIMEOUT_S, 1, MAX_TIMEOUT_S);
    let kind = match kind {
        "webhook" => {
            let url = endpoint(ctx, obj);
            let secret_env = optional_env(ctx, obj, "secret_env");
            ReceiverKind::Webhook { url: url?, secret_env: secret_env? }
        }
        "slack" => ReceiverKind::Slack { url: endpoint(ctx, obj)? },
        _ => email(ctx, obj)?,
    };
    Some(Receiver { name: name.to_owned(), kind, timeout_s: timeout_s? })
}

/// `url` or `url_env`, exactly one.
fn endpoint(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Option<Endpoint> {
    match (obj.get(ctx, "url"), obj.has("url_env")) {
        (Some(f), false) => {
            let url = f.non_empty_string(ctx)?;
            let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
            if rest.is_none_or(|r| r.trim_start_matches('/').is_empty()) {
                let shown = if url.contains('@') { "(hidden: it holds a login)".to_owned() } else { clip(&url) };
                f.invalid(ctx, format!("\"{shown}\""), "must be an http:// or https:// URL", None);
                return None;
            }
            Some(Endpoint::Url(url))
        }
        (None, true) => optional_env(ctx, obj, "url_env")?.map(Endpoint::Env),
        (Some(f), true) => {
            let help = Some("url_env names the variable holding the URL: keep one of the two".to_owned());
            f.invalid(ctx, "(a URL)", "is set beside url_env", help);
            None
        }
        (None, false) => {
            let message = format!("missing required setting {}", obj.path.join("url").short());
            let help = Some("add url = \"https://...\", or url_env = \"VAR\" when the URL holds a secret".to_owned());
            ctx.report(obj.span, &obj.path.join("url"), message, help);
            None
        }
    }
}

/// An optional setting naming an environment variable (never the secret itself).
fn optional_env(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, key: &str) -> Option<Option<String>> {
    let Some(f) = obj.get(ctx, key) else { return Some(None) };
    let name = f.non_empty_string(ctx)?;
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        let help = Some(format!("the variable's name, such as {key} = \"TIDEGATE_HOOK\"; never its value"));
        f.invalid(ctx, format!("\"{}\"", clip(&name)), "must be an environment variable's name", help);
        return None;
    }
    Some(Some(name))
}

fn email(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Option<ReceiverKind> {
    let smtp = obj.require(ctx, "smtp", "smtp = \"mail.example.com:587\"").and_then(|f| {
        let text = f.non_empty_string(ctx)?;
        let ok = text.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            f.invalid(
                ctx,
                format!("\"{}\"", clip(&text)),
                "must be host:port",
                Some("smtp = \"mail.example.com:587\"".into()),
            );
            return None;
        }
        Some(text)
    });
    let tls = match obj.get(ctx, "tls") {
        None => Some(SmtpTls::Starttls),
        Some(f) => match f.str(ctx) {
            Some("none") => Some(SmtpTls::None),
            Some("starttls") => Some(SmtpTls::Starttls),
            Some("tls") => Some(SmtpTls::Tls),
            Some(other) => {
                f.invalid(ctx, format!("\"{}\"", clip(other)), "must be \"none\", \"starttls\" or \"tls\"", None);
                None
            }
            None => None,
        },
    };
    let address = |ctx: &mut Ctx<'_>, f: &Field<'_, '_>, text: &str| {
        let ok = text.split_once('@').is_some_and(|(user, host)| !user.is_empty() && !host.is_empty());
        if !ok {
            f.invalid(ctx, format!("\"{}\"", clip(text)), "must be a mail address", None);
        }
        ok
    };
    let from = obj.require(ctx, "from", "from = \"tidegate@example.com\"").and_then(|f| {
        let text = f.non_empty_string(ctx)?;
        address(ctx, &f, &text).then_some(text)
    });
    let to = obj.require(ctx, "to", "to = [\"oncall@example.com\"]").and_then(|f| {
        let items = f.strings(ctx)?;
        if items.is_empty() {
            f.invalid(ctx, "[]", "must name at least one address", None);
            return None;
        }
        let ok = items.iter().all(|t| {
            let ok = t.value.split_once('@').is_some_and(|(u, h)| !u.is_empty() && !h.is_empty());
            if !ok {
                let message =
                    format!("invalid value \"{}\" for {}: must be a mail address", clip(&t.value), f.path.short());
                ctx.report(t.span, &t.path, message, None);
            }
            ok
        });
        ok.then(|| items.into_iter().map(|t| t.value).collect::<Vec<_>>())
    });
    let username = optional_env(ctx, obj, "username_env");
    let password = optional_env(ctx, obj, "password_env");
    let login_env = match (username?, password?) {
        (Some(u), Some(p)) => Some((u, p)),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            let message = format!("{} needs username_env and password_env together", obj.path.short());
            ctx.report(obj.span, &obj.path.join("password_env"), message, None);
            return None;
        }
    };
    Some(ReceiverKind::Email { smtp: smtp?, tls: tls?, from: from?, to: to?, login_env })
}

/// `[alerts]`, each rule checked against the names the rest of the spec declares.
pub(crate) fn alerts(
    ctx: &mut Ctx<'_>,
    root: &Obj<'_, '_>,
    names: &Names<'_>,
    receivers: &BTreeMap<String, Option<Receiver>>,
) -> BTreeMap<String, AlertRule> {
    let mut out = BTreeMap::new();
    let Some(obj) = root.get(ctx, "alerts").and_then(|f| f.obj(ctx)) else { return out };
    for (name, key_span, value) in obj.entries() {
        let path = Path::item("alerts", name);
        ctx.record(&path, key_span);
        let named = check_label(ctx, "alert", name, key_span, &path);
        let rule = Obj::open(ctx, path, value).and_then(|r| rule(ctx, name, &r, names, receivers));
        if let Some(rule) = rule.filter(|_| named) {
            out.insert(name.to_owned(), rule);
        }
    }
    out
}

fn rule(
    ctx: &mut Ctx<'_>,
    name: &str,
    obj: &Obj<'_, '_>,
    names: &Names<'_>,
    receivers: &BTreeMap<String, Option<Receiver>>,
) -> Option<AlertRule> {
    let when_field = obj.require(ctx, "when", "when = \"consecutive_failures\"")?;
    let when = when_field.str(ctx)?;
    let Some(when) = WHENS.iter().find(|w| **w == when).copied() else {
        let help = did_you_mean(when, WHENS.iter().copied()).or_else(|| Some(format!("one of {}", WHENS.join(", "))));
        when_field.invalid(ctx, format!("\"{}\"", clip(when)), "is not a condition alerts watch", help);
        return None;
    };
    let own: &[&str] = match when {
        "failure_rate" => &["task", "pool", "above", "window", "min_attempts"],
        "consecutive_failures" => &["task", "at_least"],
        "freshness_lag" | "source_waiting" => &["dataset", "above"],
        "stale_partitions" => &["dataset", "above"],
        "retry_budget_exhausted" => &["pool"],
        _ => &["above"],
    };
    let known: Vec<&str> = COMMON_KEYS.iter().chain(own).copied().collect();
    obj.allow_only(ctx, &known);
    let for_s = match obj.get(ctx, "for") {
        None => Some(0),
        Some(f) => duration(ctx, &f),
    };
    let severity = match obj.get(ctx, "severity") {
        None => Some(Severity::Page),
        Some(f) => match f.str(ctx) {
            Some("page") => Some(Severity::Page),
            Some("ticket") => Some(Severity::Ticket),
            Some(other) => {
                f.invalid(ctx, format!("\"{}\"", clip(other)), "must be \"page\" or \"ticket\"", None);
                None
            }
            None => None,
        },
    };
    let rule_receivers = obj.get(ctx, "receivers").map_or(Some(Vec::new()), |f| {
        let items = f.unique_strings(ctx)?;
        let known = receivers.keys().map(String::as_str);
        let mut ok = true;
        for t in &items {
            if !receivers.contains_key(&t.value) {
                let help = did_you_mean(&t.value, known.clone())
                    .unwrap_or_else(|| "declare it under [receivers], or remove it".to_owned());
                let message = format!("no receiver \"{}\" is declared", clip(&t.value));
                ctx.report(t.span, &t.path, message, Some(help));
                ok = false;
            }
        }
        ok.then(|| items.into_iter().map(|t| t.value).collect())
    });
    let condition = condition(ctx, obj, when, names);
    Some(AlertRule {
        name: name.to_owned(),
        condition: condition?,
        for_s: for_s?,
        receivers: rule_receivers?,
        severity: severity?,
    })
}

fn condition(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, when: &str, names: &Names<'_>) -> Option<AlertCondition> {
    let above_duration =
        |ctx: &mut Ctx<'_>| obj.require(ctx, "above", "above = \"2h\"").and_then(|f| duration(ctx, &f));
    Some(match when {
        "failure_rate" => {
            let task = named(ctx, obj, "task", &names.tasks, "task");
            let pool = named(ctx, obj, "pool", &names.pools, "pool");
            let above = obj.require(ctx, "above", "above = 0.5").and_then(|f| {
                let r = f.number(ctx)?;
                let ok = (0.0..1.0).contains(&r);
                if !ok {
                    f.invalid(ctx, r, "must be a share of attempts, at least 0 and below 1", None);
                }
                ok.then_some(r)
            });
            let window_s = match obj.get(ctx, "window") {
                None => Some(3600),
                Some(f) => duration(ctx, &f).filter(|w| {
                    let ok = *w > 0;
                    if !ok {
                        f.invalid(ctx, "\"0s\"", "must be longer than nothing", None);
                    }
                    ok
                }),
            };
            let min_attempts = obj.u32_or(ctx, "min_attempts", 3, 1, 1_000_000);
            let scope = match (task?, pool?) {
                (Some(_), Some(_)) => {
                    let message =
                        format!("{} sets task and pool: watch one, or neither for every task", obj.path.short());
                    ctx.report(obj.span, &obj.path.join("pool"), message, None);
                    return None;
                }
                (Some(t), None) => FailureScope::Task(t),
                (None, Some(p)) => FailureScope::Pool(p),
                (None, None) => FailureScope::EveryTask,
            };
            AlertCondition::FailureRate { scope, above: above?, window_s: window_s?, min_attempts: min_attempts? }
        }
        "consecutive_failures" => {
            let task = named(ctx, obj, "task", &names.tasks, "task");
            let at_least = obj.u32_or(ctx, "at_least", 3, 1, 1_000);
            AlertCondition::ConsecutiveFailures { task: task?, at_least: at_least? }
        }
        "freshness_lag" => {
            let dataset = dataset(ctx, obj, names, Some(false));
            AlertCondition::FreshnessLag { dataset: dataset?, above_s: above_duration(ctx)? }
        }
        "source_waiting" => {
            let dataset = dataset(ctx, obj, names, Some(true));
            AlertCondition::SourceWaiting { dataset: dataset?, above_s: above_duration(ctx)? }
        }
        "stale_partitions" => {
            let dataset = dataset(ctx, obj, names, Some(false));
            let above = match obj.get(ctx, "above") {
                None => Some(0),
                Some(f) => f.int_in(ctx, 0, i64::from(u32::MAX)).and_then(|n| u64::try_from(n).ok()),
            };
            AlertCondition::StalePartitions { dataset: dataset?, above: above? }
        }
        "retry_budget_exhausted" => {
            AlertCondition::RetryBudgetExhausted { pool: named(ctx, obj, "pool", &names.pools, "pool")? }
        }
        "backlog_eta" => AlertCondition::BacklogEta { above_s: above_duration(ctx)? },
        _ => AlertCondition::ApprovalWaiting { above_s: above_duration(ctx)? },
    })
}

/// An optional setting naming one of `known` (a task, a pool). `None` when invalid.
fn named(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, key: &str, known: &[&str], kind: &str) -> Option<Option<String>> {
    let Some(f) = obj.get(ctx, key) else { return Some(None) };
    let name = f.non_empty_string(ctx)?;
    if !known.contains(&name.as_str()) {
        let help = did_you_mean(&name, known.iter().copied());
        f.invalid(ctx, format!("\"{}\"", clip(&name)), &format!("no {kind} of that name is declared"), help);
        return None;
    }
    Some(Some(name))
}

/// An optional `dataset`, which must be declared, and `[external]` when `external` says so.
fn dataset(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, names: &Names<'_>, external: Option<bool>) -> Option<Option<String>> {
    let Some(f) = obj.get(ctx, "dataset") else { return Some(None) };
    let name = f.non_empty_string(ctx)?;
    match names.datasets.get(name.as_str()) {
        None => {
            let help = did_you_mean(&name, names.datasets.keys().copied());
            f.invalid(ctx, format!("\"{}\"", clip(&name)), "no dataset of that name is declared", help);
            None
        }
        Some(is_external) if external.is_some_and(|want| want != *is_external) => {
            let reason = if *is_external {
                "is an [external] dataset, which Tidegate does not write"
            } else {
                "is not an [external] dataset: only sources are waited for"
            };
            f.invalid(ctx, format!("\"{}\"", clip(&name)), reason, None);
            None
        }
        Some(_) => Some(Some(name)),
    }
}

/// A duration such as `"15m"`, `"2h"`, `"1h 30m"` or `"0s"`.
fn duration(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<u64> {
    let text = f.str(ctx)?;
    match humantime::parse_duration(text) {
        Ok(d) if d.as_secs() <= MAX_DURATION_S => Some(d.as_secs()),
        Ok(_) => {
            f.invalid(ctx, format!("\"{}\"", clip(text)), "must be at most a year", None);
            None
        }
        Err(_) => {
            let help = Some("a duration such as \"90s\", \"15m\", \"2h\" or \"1d\"".to_owned());
            f.invalid(ctx, format!("\"{}\"", clip(text)), "is not a duration", help);
            None
        }
    }
}

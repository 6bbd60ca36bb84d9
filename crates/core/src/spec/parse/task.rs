//! `[tasks.NAME]`: what a task runs, what it reads and writes, and its schedule, retry and limits.
//! Settings that only make sense together (catch-up, retry, exit codes) are checked here; checks
//! that need other tables (datasets, pools, the project) live in `graph`.

use std::collections::BTreeMap;

use toml_span::Span;

use super::reader::{Ctx, Field, Obj, Path, Text, check_name, clip};
use super::values::{self, CRON_HELP, MAPPING_HELP};
use crate::spec::{Catchup, DEFAULT_POOL, ExitCodes, Input, Loc, Mapping, RetryPolicy, Task, TaskRun};

const TASK_KEYS: &[&str] = &[
    "command",
    "sql",
    "files",
    "inputs",
    "outputs",
    "schedule",
    "catchup",
    "retry",
    "exit_codes",
    "timeout_s",
    "pool",
    "secrets",
    "params",
    "log_max_bytes",
];
const INPUT_KEYS: &[&str] = &["dataset", "mapping"];
const CATCHUP_KEYS: &[&str] = &["enabled", "max_active_runs"];
const RETRY_KEYS: &[&str] = &["attempts", "backoff_base_ms", "backoff_max_ms"];
const EXIT_CODE_KEYS: &[&str] = &["transient", "deterministic"];

/// The most attempts a retry policy may allow, the first included.
const MAX_ATTEMPTS: u32 = 100;
/// The longest backoff delay: one day.
const MAX_BACKOFF_MS: u32 = 86_400_000;
/// The longest a task may run: one week.
const MAX_TIMEOUT_S: u32 = 7 * 86_400;
const DEFAULT_TIMEOUT_S: u32 = 3_600;
/// The most runs catch-up may keep active at once for one task.
const MAX_ACTIVE_RUNS: u32 = 1_000;

/// A task as read, with the positions the cross-checks in `graph` point at.
pub(crate) struct TaskDraft {
    pub(crate) task: Task,
    pub(crate) path: Path,
    /// One per input, in order: where the entry and its mapping were written.
    pub(crate) input_sites: Vec<(Path, Span)>,
    pub(crate) outputs: Vec<Text>,
    /// False when `outputs` was missing or invalid, so the writers of some datasets are unknown.
    pub(crate) outputs_ok: bool,
    /// `None` when `timeout_s` was invalid (already reported).
    pub(crate) timeout_s: Option<u32>,
    /// `None` when the task uses the default pool.
    pub(crate) pool: Option<Text>,
    /// `None` when the task sets no (valid) log cap: the project's applies.
    pub(crate) log_max_bytes: Option<u64>,
    /// Where `schedule = "on_arrival"` was written, for the check that the task reads a source.
    pub(crate) on_arrival_site: Option<(Path, Span)>,
}

pub(crate) fn tasks(ctx: &mut Ctx<'_>, root: &Obj<'_, '_>) -> BTreeMap<String, TaskDraft> {
    let mut out = BTreeMap::new();
    let Some(obj) = root.get(ctx, "tasks").and_then(|f| f.obj(ctx)) else { return out };
    for (name, key_span, value) in obj.entries() {
        let path = Path::item("tasks", name);
        ctx.record(&path, key_span);
        check_name(ctx, "task", name, key_span, &path);
        let loc = ctx.loc(key_span);
        if let Some(t) = Obj::open(ctx, path, value) {
            out.insert(name.to_owned(), task(ctx, &t, name, loc));
        }
    }
    out
}

fn task(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, name: &str, loc: Loc) -> TaskDraft {
    obj.allow_only(ctx, TASK_KEYS);
    let run = run(ctx, obj, name);
    let (inputs, input_sites) = inputs(ctx, obj);
    let errors_before_outputs = ctx.error_count();
    let outputs = obj
        .require(ctx, "outputs", "outputs = [\"dataset_name\"]: every task writes at least one dataset")
        .and_then(|f| f.unique_strings(ctx))
        .unwrap_or_default();
    let outputs_ok = ctx.error_count() == errors_before_outputs;
    let schedule_field = obj.get(ctx, "schedule");
    let on_arrival_site =
        schedule_field.as_ref().filter(|f| f.value.as_str() == Some(ON_ARRIVAL)).map(|f| (f.path.clone(), f.span()));
    let schedule = schedule_field.filter(|_| on_arrival_site.is_none()).and_then(|f| schedule(ctx, &f));
    let catchup = catchup(ctx, obj, schedule.is_some(), on_arrival_site.is_some());
    let retry = retry(ctx, obj);
    let exit_codes = exit_codes(ctx, obj);
    let timeout_s = obj.u32_or(ctx, "timeout_s", DEFAULT_TIMEOUT_S, 1, MAX_TIMEOUT_S);
    let pool = obj.get(ctx, "pool").and_then(|f| f.text(ctx));
    let secrets = secrets(ctx, obj);
    let params = params(ctx, obj);
    let log_max_bytes = super::project::log_max_bytes(ctx, obj);
    let task = Task {
        name: name.to_owned(),
        loc,
        run,
        inputs,
        outputs: outputs.iter().map(|t| t.value.clone()).collect(),
        schedule,
        on_arrival: on_arrival_site.is_some(),
        catchup,
        retry,
        exit_codes,
        timeout_s: timeout_s.unwrap_or(DEFAULT_TIMEOUT_S),
        pool: pool.as_ref().map_or_else(|| DEFAULT_POOL.to_owned(), |p| p.value.clone()),
        secrets,
        params,
        // The project's cap replaces the default once the project is known (`parse`).
        log_max_bytes: log_max_bytes.unwrap_or(crate::spec::DEFAULT_LOG_MAX_BYTES),
    };
    TaskDraft {
        task,
        path: obj.path.clone(),
        input_sites,
        outputs,
        outputs_ok,
        timeout_s,
        pool,
        log_max_bytes,
        on_arrival_site,
    }
}

/// Exactly one of `command` and `sql`; `files` only with `command`.
fn run(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, name: &str) -> TaskRun {
    let command = obj.get(ctx, "command");
    let sql = obj.get(ctx, "sql");
    let files = obj.get(ctx, "files");
    match (command, sql) {
        (Some(c), Some(s)) => {
            let message =
                format!("a task runs either command or sql, not both; command is set at {}", ctx.at(ctx.loc(c.span())));
            ctx.report(s.span(), &s.path, message, Some("remove one of them".to_owned()));
        }
        (None, None) => {
            let message = format!("task \"{}\" has nothing to run: it needs command or sql", clip(name));
            let help = "add command = [\"python3\", \"tasks/job.py\"] or sql = \"SELECT ...\"";
            ctx.report(obj.span, &obj.path, message, Some(help.to_owned()));
        }
        (Some(c), None) => {
            let argv = argv(ctx, &c).unwrap_or_default();
            let files = files.and_then(|f| code_files(ctx, &f)).unwrap_or_default();
            return TaskRun::Command { argv, files };
        }
        (None, Some(s)) => {
            if let Some(f) = &files {
                let message = format!(
                    "files only applies to command tasks (they are hashed into the program's code version), \
                     but this task runs sql at {}",
                    ctx.at(ctx.loc(s.span()))
                );
                ctx.report(f.span(), &f.path, message, Some("remove files".to_owned()));
            }
            let help = "Tidegate stages the rows the query returns, as in sql = \"SELECT ... FROM <input>\"";
            let query = s.query(ctx, help).unwrap_or_default();
            return TaskRun::Sql { query };
        }
    }
    TaskRun::Command { argv: Vec::new(), files: Vec::new() }
}

/// `command` is argv: tidegate starts the program directly, so quoting and injection never arise.
pub(super) fn argv(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Vec<String>> {
    if let Some(shell) = f.value.as_str() {
        let words: Vec<String> = shell.split_whitespace().map(|w| format!("\"{}\"", clip(w))).collect();
        let example = if words.is_empty() { "\"python3\", \"x.py\"".to_owned() } else { words.join(", ") };
        let message = "expected an argv array, found a string: commands are argv, never a shell string".to_owned();
        let help = format!("write command = [{example}]");
        ctx.report(f.span(), &f.path, message, Some(help));
        return None;
    }
    let argv = f.strings(ctx)?;
    if argv.is_empty() {
        f.invalid(ctx, "[]", "must name the program to run, as in [\"python3\", \"x.py\"]", None);
        return None;
    }
    Some(argv.into_iter().map(|t| t.value).collect())
}

/// `files`: relative paths inside the workspace, hashed into the code version.
fn code_files(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Vec<String>> {
    let files = f.strings(ctx)?;
    let mut ok = true;
    for file in &files {
        let p = file.value.as_str();
        let escapes =
            p.starts_with('/') || p.starts_with('\\') || p.contains(':') || p.split(['/', '\\']).any(|s| s == "..");
        if escapes {
            let message = format!(
                "invalid value \"{}\" for {}: files are paths relative to the workspace folder, without \"..\"",
                clip(p),
                file.path.short()
            );
            ctx.report(file.span, &file.path, message, None);
            ok = false;
        }
    }
    ok.then(|| files.into_iter().map(|t| t.value).collect())
}

/// `inputs = ["a", { dataset = "b", mapping = "window(-1..0)" }]`.
fn inputs(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> (Vec<Input>, Vec<(Path, Span)>) {
    let mut inputs: Vec<Input> = Vec::new();
    let mut sites: Vec<(Path, Span)> = Vec::new();
    let Some(f) = obj.get(ctx, "inputs") else { return (inputs, sites) };
    let Some(items) = f.array(ctx, "an array of dataset names or { dataset, mapping } tables") else {
        return (inputs, sites);
    };
    for item in &items {
        let Some(input) = input(ctx, item) else { continue };
        if let Some(j) = inputs.iter().position(|i| i.dataset == input.dataset) {
            let message =
                format!("dataset \"{}\" is listed twice in inputs (first at {})", input.dataset, ctx.at(inputs[j].loc));
            ctx.report(item.span(), &item.path, message, None);
            continue;
        }
        sites.push((item.path.clone(), item.span()));
        inputs.push(input);
    }
    (inputs, sites)
}

fn input(ctx: &mut Ctx<'_>, item: &Field<'_, '_>) -> Option<Input> {
    let loc = ctx.loc(item.span());
    if item.value.as_str().is_some() {
        let dataset = item.non_empty_string(ctx)?;
        return Some(Input { dataset, mapping: Mapping::Same, loc });
    }
    if item.value.as_table().is_none() {
        item.wrong_type(ctx, "a dataset name or a { dataset, mapping } table");
        return None;
    }
    let obj = item.obj(ctx)?;
    obj.allow_only(ctx, INPUT_KEYS);
    let dataset = obj.require(ctx, "dataset", "dataset = \"events\"").and_then(|f| f.non_empty_string(ctx));
    let mapping = match obj.get(ctx, "mapping") {
        None => Some(Mapping::Same),
        Some(f) => mapping(ctx, &f),
    };
    Some(Input { dataset: dataset?, mapping: mapping?, loc })
}

fn mapping(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<Mapping> {
    let s = f.str(ctx)?;
    values::mapping(s)
        .map_err(|why| f.invalid(ctx, format!("\"{}\"", clip(s)), &why, Some(MAPPING_HELP.to_owned())))
        .ok()
}

fn schedule(ctx: &mut Ctx<'_>, f: &Field<'_, '_>) -> Option<crate::spec::Schedule> {
    let s = f.str(ctx)?;
    values::schedule(s).map_err(|why| f.invalid(ctx, format!("\"{}\"", clip(s)), &why, Some(CRON_HELP.to_owned()))).ok()
}

/// `schedule = "on_arrival"`: the sensor schedule.
const ON_ARRIVAL: &str = "on_arrival";

/// Catch-up is off unless asked for, and when on it must be bounded.
fn catchup(ctx: &mut Ctx<'_>, task: &Obj<'_, '_>, scheduled: bool, on_arrival: bool) -> Catchup {
    let Some(obj) = task.get(ctx, "catchup").and_then(|f| f.obj(ctx)) else { return Catchup::default() };
    obj.allow_only(ctx, CATCHUP_KEYS);
    let enabled = obj.bool_or(ctx, "enabled", false);
    let max = obj.get(ctx, "max_active_runs");
    let max_active_runs =
        max.as_ref().and_then(|f| f.int_in(ctx, 1, i64::from(MAX_ACTIVE_RUNS))).and_then(|n| u32::try_from(n).ok());
    let enabled_field = obj.get(ctx, "enabled");
    match (enabled, &max, &enabled_field) {
        (Some(true), None, Some(e)) => {
            let message = "catchup.enabled = true needs catchup.max_active_runs: catch-up is bounded so that \
                           after downtime it cannot start every missed interval at once"
                .to_owned();
            ctx.report(e.span(), &e.path, message, Some("add max_active_runs = 4 to catchup".to_owned()));
        }
        (Some(true), _, Some(e)) if on_arrival => {
            let message = "catchup applies to a clock's missed intervals; schedule = \"on_arrival\" starts every \
                           partition whose sources arrived, late ones included"
                .to_owned();
            ctx.report(e.span(), &e.path, message, Some("remove catchup".to_owned()));
        }
        (Some(true), _, Some(e)) if !scheduled => {
            let message =
                "catchup.enabled = true, but the task has no schedule, so no interval can be missed".to_owned();
            let help = "add a schedule such as \"@daily\", or turn catch-up off".to_owned();
            ctx.report(e.span(), &e.path, message, Some(help));
        }
        (Some(false), Some(m), _) => {
            let enabled_is = ctx.mention(&obj.path.join("enabled").full(), false);
            let message = format!("catchup.max_active_runs only applies when catch-up is on, but {enabled_is}");
            let help = "set enabled = true, or remove max_active_runs".to_owned();
            ctx.report(m.span(), &m.path, message, Some(help));
        }
        _ => {}
    }
    Catchup { enabled: enabled.unwrap_or_default(), max_active_runs }
}

fn retry(ctx: &mut Ctx<'_>, task: &Obj<'_, '_>) -> RetryPolicy {
    let defaults = RetryPolicy::default();
    let Some(obj) = task.get(ctx, "retry").and_then(|f| f.obj(ctx)) else { return defaults };
    obj.allow_only(ctx, RETRY_KEYS);
    let attempts = obj.u32_or(ctx, "attempts", defaults.attempts, 1, MAX_ATTEMPTS);
    let default_base = u32::try_from(defaults.backoff_base_ms).unwrap_or(MAX_BACKOFF_MS);
    let default_max = u32::try_from(defaults.backoff_max_ms).unwrap_or(MAX_BACKOFF_MS);
    let base = obj.u32_or(ctx, "backoff_base_ms", default_base, 0, MAX_BACKOFF_MS);
    let max = obj.u32_or(ctx, "backoff_max_ms", default_max, 0, MAX_BACKOFF_MS);
    if let (Some(base), Some(max)) = (base, max)
        && base > max
    {
        let max_is = ctx.mention(&obj.path.join("backoff_max_ms").full(), max);
        let base_path = obj.path.join("backoff_base_ms");
        let message = format!(
            "invalid value {base} for retry.backoff_base_ms: the first delay cannot exceed the longest one, {max_is}"
        );
        let loc = ctx.site(&base_path.full()).unwrap_or_else(|| ctx.loc(obj.span));
        ctx.report_at(loc, &base_path.full(), message, None);
    }
    RetryPolicy {
        attempts: attempts.unwrap_or(defaults.attempts),
        backoff_base_ms: base.map_or(defaults.backoff_base_ms, u64::from),
        backoff_max_ms: max.map_or(defaults.backoff_max_ms, u64::from),
    }
}

/// Which exit codes are retried; a code in both lists would make the class depend on list order.
fn exit_codes(ctx: &mut Ctx<'_>, task: &Obj<'_, '_>) -> ExitCodes {
    let defaults = ExitCodes::default();
    let Some(obj) = task.get(ctx, "exit_codes").and_then(|f| f.obj(ctx)) else { return defaults };
    obj.allow_only(ctx, EXIT_CODE_KEYS);
    let transient = codes(ctx, &obj, "transient").unwrap_or(None);
    let deterministic = codes(ctx, &obj, "deterministic").unwrap_or(None);
    let t_list: Vec<(i32, Option<Span>)> = match &transient {
        Some(list) => list.iter().map(|(c, s)| (*c, Some(*s))).collect(),
        None => defaults.transient.iter().map(|c| (*c, None)).collect(),
    };
    let d_list: Vec<(i32, Option<Span>)> = match &deterministic {
        Some(list) => list.iter().map(|(c, s)| (*c, Some(*s))).collect(),
        None => defaults.deterministic.iter().map(|c| (*c, None)).collect(),
    };
    for (code, t_span) in &t_list {
        let Some((_, d_span)) = d_list.iter().find(|(c, _)| c == code) else { continue };
        let (t_path, d_path) = (obj.path.join("transient"), obj.path.join("deterministic"));
        let other = |span: &Option<Span>, path: &Path, ctx: &Ctx<'_>| match span {
            Some(s) => format!("{} at {}", path.short(), ctx.at(ctx.loc(*s))),
            None => {
                let default = if path == &d_path { &defaults.deterministic } else { &defaults.transient };
                format!("{}, which defaults to {default:?}", path.short())
            }
        };
        // Point at whichever list the user wrote; name the other.
        let (span, path, named) = match (t_span, d_span) {
            (Some(s), _) => (*s, &t_path, other(d_span, &d_path, ctx)),
            (None, Some(s)) => (*s, &d_path, other(t_span, &t_path, ctx)),
            (None, None) => continue,
        };
        let message = format!("exit code {code} cannot be both transient and deterministic; it is also in {named}");
        ctx.report(span, path, message, Some("list each exit code in one of the two lists".to_owned()));
    }
    ExitCodes {
        transient: transient.map_or(defaults.transient, |l| l.into_iter().map(|(c, _)| c).collect()),
        deterministic: deterministic.map_or(defaults.deterministic, |l| l.into_iter().map(|(c, _)| c).collect()),
    }
}

/// `Some(None)` when absent, `None` when invalid.
fn codes(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>, key: &str) -> Option<Option<Vec<(i32, Span)>>> {
    let Some(f) = obj.get(ctx, key) else { return Some(None) };
    let items = f.array(ctx, "an array of exit codes")?;
    let codes: Vec<Option<(i32, Span)>> = items
        .iter()
        .map(|i| i.int_in(ctx, 1, 255).and_then(|c| i32::try_from(c).ok()).map(|c| (c, i.span())))
        .collect();
    codes.into_iter().collect::<Option<Vec<_>>>().map(Some)
}

/// `secrets`: environment variable names, passed to the task and redacted from its logs. Their
/// values are read when an attempt starts (`engine::secrets`), not here.
fn secrets(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> Vec<String> {
    let Some(list) = obj.strings_or_empty(ctx, "secrets") else { return Vec::new() };
    for s in &list {
        let mut chars = s.value.chars();
        let valid = matches!(chars.next(), Some(c) if c.is_ascii_uppercase() || c == '_')
            && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            let message = format!(
                "invalid value \"{}\" for {}: secrets are environment variable names such as \"API_TOKEN\" \
                 (capital letters, digits and \"_\", not starting with a digit)",
                clip(&s.value),
                s.path.short()
            );
            ctx.report(s.span, &s.path, message, None);
        }
    }
    list.into_iter().map(|t| t.value).collect()
}

/// `params`: string parameters; numbers must be quoted so the idempotency key has one spelling.
fn params(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(table) = obj.get(ctx, "params").and_then(|f| f.obj(ctx)) else { return out };
    for (key, _, value) in table.entries() {
        let field = Field { path: table.path.join(key), value };
        if let Some(s) = field.str(ctx) {
            out.insert(key.to_owned(), s.to_owned());
        }
    }
    out
}

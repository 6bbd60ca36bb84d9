//! B2 and B4: `tidegate run` as a child process, over real `/bin/true` tasks, so
//! everything a user waits for is timed (process start, spec, store, planning, submission, the
//! engine, staging, one Delta commit per step, the journal).
//!
//! - B2: a chain of tasks, each reading the previous one's output, over one partition; the
//!   workspace is warmed up by one untimed run (its tables created), then each timed run is a new
//!   partition. Baseline: as many sequential spawns of `/bin/true`.
//! - B4: one task over many daily partitions (independent steps) in a fresh workspace per run.
//!   Baseline: `xargs -P2` running the same number of `/bin/true`.
//!
//! Where the time goes is read back from the journal: each step's event timestamps (millisecond
//! resolution) split its life into phases.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde_json::{Value, json};
use tidegate_store::{JournalEntry, JournalQuery};

use super::{Outcome, ms, per_s, spread, workspace};
use crate::{Samples, progress, ratio, round};

/// B2's aim: at most this many milliseconds per step, end to end.
const B2_AIM_MS_PER_STEP: f64 = 15.0;
/// B4's aim: at most this multiple of `xargs -P2`'s time.
const B4_AIM_RATIO: f64 = 1.1;
/// The command every task runs.
const TRUE: &str = "/bin/true";

fn dataset(name: &str, start: &str) -> String {
    format!(
        "[datasets.{name}]\npartitioning = {{ grain = \"day\", start = \"{start}\" }}\nwrite = {{ mode = \"replace\" }}\n\
         columns = [{{ name = \"x\", type = \"int64\" }}]\n\n"
    )
}

/// B2's spec: tasks `c00`, `c01`, ... each reading the previous one's dataset.
fn chain_spec(n: usize) -> String {
    let mut s = String::from("[project]\nname = \"bench_b2\"\n\n");
    for i in 0..n {
        s.push_str(&dataset(&format!("d{i:03}"), B2_START));
        let inputs = if i == 0 { String::new() } else { format!("inputs = [\"d{:03}\"]\n", i - 1) };
        let _ = write!(s, "[tasks.c{i:03}]\ncommand = [\"{TRUE}\"]\n{inputs}outputs = [\"d{i:03}\"]\n\n");
    }
    s
}

/// B4's spec: one task over daily partitions.
fn independent_spec(workers: usize) -> String {
    let mut s = format!("[project]\nname = \"bench_b4\"\n\n[pools.default]\nslots = {workers}\n\n");
    s.push_str(&dataset("out", B4_START));
    let _ = write!(s, "[tasks.t]\ncommand = [\"{TRUE}\"]\noutputs = [\"out\"]\n");
    s
}

/// B2's datasets start here; each run is one day after it.
const B2_START: &str = "2024-01-01";
/// B4's dataset starts here; the run covers as many days as there are steps.
const B4_START: &str = "1990-01-01";

/// The key of the `i`-th day after `start`.
pub(super) fn day(start: &str, i: usize) -> Result<String> {
    let first = NaiveDate::parse_from_str(start, "%Y-%m-%d").context("a valid date")?;
    Ok((first + Duration::days(i64::try_from(i)?)).format("%Y-%m-%d").to_string())
}

/// One `tidegate run ... --json` in `ws` with the binary `exe`: its wall time and its JSON report.
pub(super) fn tidegate_run(exe: &Path, ws: &Path, args: &[&str]) -> Result<(f64, Value)> {
    let started = Instant::now();
    let output = Command::new(exe)
        .arg("-C")
        .arg(ws)
        .arg("run")
        .args(args)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", exe.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!("tidegate run {args:?} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    let report: Value = serde_json::from_slice(&output.stdout).context("reading the JSON of tidegate run")?;
    Ok((seconds, report))
}

/// Checks a `tidegate run --json` report: `n` steps published, none failed.
pub(super) fn check_published(report: &Value, n: usize) -> Result<String> {
    let published = report["summary"]["published"].as_u64().unwrap_or(0);
    let failed = report["summary"]["failed"].as_u64().unwrap_or(0);
    ensure!(published == n as u64 && failed == 0, "expected {n} steps published, the run reported {report}");
    report["run_id"].as_str().map(str::to_owned).context("the run report has no run_id")
}

/// Seconds for `n` sequential spawns of `/bin/true`.
fn sequential_true(n: usize) -> Result<f64> {
    let started = Instant::now();
    for _ in 0..n {
        let status = Command::new(TRUE).status().with_context(|| format!("spawning {TRUE}"))?;
        ensure!(status.success(), "{TRUE} failed: {status}");
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Seconds for `xargs -P2` to run `/bin/true` `n` times (one per input line).
fn xargs_true(n: usize) -> Result<f64> {
    let mut lines = String::with_capacity(n * 6);
    for i in 0..n {
        let _ = writeln!(lines, "{i}");
    }
    let started = Instant::now();
    let mut child = Command::new("xargs")
        .args(["-P2", "-I{}", TRUE])
        .stdin(Stdio::piped())
        .spawn()
        .context("starting xargs (the B4 baseline)")?;
    child.stdin.take().context("xargs's stdin")?.write_all(lines.as_bytes())?;
    let status = child.wait()?;
    let seconds = started.elapsed().as_secs_f64();
    ensure!(status.success(), "xargs failed: {status}");
    Ok(seconds)
}

/// Per-step phases read from the journal, in seconds, summed over steps.
#[derive(Debug, Default, Clone)]
struct Phases {
    n_steps: usize,
    /// Steps with an upstream step (chains only): `promote` is over these.
    n_promoted: usize,
    /// From the upstream step's `published` to this step's `deps_met` (chains only).
    promote: f64,
    /// `deps_met` to `claimed`: waiting for a slot and the claim.
    claim: f64,
    /// `claimed` to `staged`: spawn, wait, stage the output, run the checks, record the version.
    attempt: f64,
    /// `staged` to `checks_passed`: the validation events.
    validate: f64,
    /// `checks_passed` to `published`: the Delta commit and the release record.
    publish: f64,
    /// The loop's time spent publishing: publications happen one at a time, so each one is
    /// charged from its `checks_passed` or the previous `published`, whichever is later.
    publish_busy: f64,
    /// First `deps_met` to last `published` of the run.
    span: f64,
}

impl Phases {
    fn add(&mut self, other: &Phases) {
        self.n_steps += other.n_steps;
        self.n_promoted += other.n_promoted;
        self.promote += other.promote;
        self.claim += other.claim;
        self.attempt += other.attempt;
        self.validate += other.validate;
        self.publish += other.publish;
        self.publish_busy += other.publish_busy;
        self.span += other.span;
    }

    /// Mean milliseconds per step of each phase (`promote` per step that has an upstream).
    fn json(&self) -> Value {
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let per = |s: f64| ms(s / self.n_steps.max(1) as f64);
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let promote = ms(self.promote / self.n_promoted.max(1) as f64);
        json!({
            "steps": self.n_steps,
            "promote_ms": promote,
            "claim_ms": per(self.claim),
            "attempt_ms": per(self.attempt),
            "validate_ms": per(self.validate),
            "publish_ms": per(self.publish),
        })
    }

    fn line(&self) -> String {
        let v = self.json();
        let promote = if self.n_promoted > 0 {
            format!("upstream published -> ready {} ms, ", v["promote_ms"])
        } else {
            String::new()
        };
        format!(
            "mean per step: {promote}ready -> claimed {} ms, claimed -> staged {} ms, \
             staged -> checks passed {} ms, checks passed -> published {} ms (queueing included)",
            v["claim_ms"], v["attempt_ms"], v["validate_ms"], v["publish_ms"]
        )
    }
}

/// Reads a run's phases from the journal of the workspace's store. `chain` orders the steps by
/// `deps_met` and charges each one's wait for its upstream's publication to `promote`.
fn phases(ws: &Path, run_id: &str, chain: bool) -> Result<Phases> {
    let ws = tidegate_app::workspace::load(Some(ws))?;
    let store = ws.open_store()?;
    let entries = store.journal(&JournalQuery { run_id: Some(run_id.to_owned()), ..JournalQuery::default() })?;
    let mut by_step: HashMap<&str, HashMap<&str, DateTime<Utc>>> = HashMap::new();
    for JournalEntry { step_id, kind, at, .. } in &entries {
        if let Some(step) = step_id {
            by_step.entry(step.as_str()).or_default().entry(kind.as_str()).or_insert(*at);
        }
    }
    let secs = |a: DateTime<Utc>, b: DateTime<Utc>| (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6;
    let mut steps: Vec<[DateTime<Utc>; 5]> = Vec::new();
    for (step, kinds) in &by_step {
        let at = |k: &str| kinds.get(k).copied().with_context(|| format!("step {step} has no {k} entry"));
        steps.push([at("deps_met")?, at("claimed")?, at("staged")?, at("checks_passed")?, at("published")?]);
    }
    steps.sort_by_key(|s| s[0]);
    let mut p = Phases { n_steps: steps.len(), ..Phases::default() };
    for (i, s) in steps.iter().enumerate() {
        if chain && i > 0 {
            p.promote += secs(steps[i - 1][4], s[0]);
            p.n_promoted += 1;
        }
        p.claim += secs(s[0], s[1]);
        p.attempt += secs(s[1], s[2]);
        p.validate += secs(s[2], s[3]);
        p.publish += secs(s[3], s[4]);
    }
    let mut by_publication: Vec<&[DateTime<Utc>; 5]> = steps.iter().collect();
    by_publication.sort_by_key(|s| s[4]);
    let mut previous: Option<DateTime<Utc>> = None;
    for s in by_publication {
        let from = previous.map_or(s[3], |p| p.max(s[3]));
        p.publish_busy += secs(from, s[4]);
        previous = Some(s[4]);
    }
    if let (Some(first), Some(last)) = (steps.first(), steps.iter().map(|s| s[4]).max()) {
        p.span = secs(first[0], last);
    }
    Ok(p)
}

pub fn b2(exe: &Path, dir: &Path, n: usize, repeats: usize) -> Result<Outcome> {
    workspace(dir, &chain_spec(n))?;
    let last = format!("c{:03}", n - 1);
    progress("B2 warm-up run (untimed: creates the tables)");
    let (cold, report) = tidegate_run(exe, dir, &[&last, "--partition", &day(B2_START, 0)?])?;
    check_published(&report, n)?;
    let (mut wall, mut engine, mut baseline) = (Samples::default(), Samples::default(), Samples::default());
    let mut phase_sum = Phases::default();
    for r in 0..repeats {
        progress(&format!("B2 run {}", r + 1));
        let (seconds, report) = tidegate_run(exe, dir, &[&last, "--partition", &day(B2_START, 1 + r)?])?;
        let run_id = check_published(&report, n)?;
        wall.0.push(seconds);
        engine.0.push(report["elapsed_s"].as_f64().unwrap_or(f64::NAN));
        phase_sum.add(&phases(dir, &run_id, true)?);
        baseline.0.push(sequential_true(n)?);
    }
    #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
    let per_step = |s: &Samples| s.median() / n as f64;
    let ms_per_step = ms(per_step(&wall));
    let aim_met = ms_per_step <= B2_AIM_MS_PER_STEP;
    #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
    let outside_ms = ms((wall.0.iter().sum::<f64>() - phase_sum.span) / repeats as f64);
    let json = json!({
        "chain": n,
        "repeats": repeats,
        "tidegate_run_wall": wall.json(),
        "tidegate_run_elapsed": engine.json(),
        "ms_per_step": ms_per_step,
        "engine_ms_per_step": ms(per_step(&engine)),
        "cold_first_run_s": round(cold),
        "baseline_sequential_true": baseline.json(),
        "baseline_ms_per_spawn": ms(per_step(&baseline)),
        "ratio_to_baseline": round(ratio(wall.median(), baseline.median())),
        "phases": phase_sum.json(),
        "outside_the_steps_ms_per_run": outside_ms,
        "aim_ms_per_step": B2_AIM_MS_PER_STEP,
        "aim_met": aim_met,
    });
    let mut o = String::new();
    let _ = writeln!(o, "B2. a chain of {n} /bin/true tasks over one partition, `tidegate run` end to end");
    let _ = writeln!(
        o,
        "   {:<52} {:>28} {:>10.1} ms/step",
        "tidegate run (wall, child process)",
        spread(&wall),
        ms_per_step
    );
    let _ = writeln!(
        o,
        "   {:<52} {:>28} {:>10.1} ms/step",
        "  of which after submission (its elapsed_s)",
        spread(&engine),
        ms(per_step(&engine))
    );
    let _ = writeln!(
        o,
        "   {:<52} {:>28} {:>10.1} ms/spawn",
        format!("baseline: {n} sequential spawns of {TRUE}"),
        spread(&baseline),
        ms(per_step(&baseline))
    );
    let _ = writeln!(o, "   {}", phase_sum.line());
    let _ = writeln!(
        o,
        "   outside the steps (process start, spec, store, plan, submit, lake open, exit): {outside_ms} ms per run"
    );
    let _ = writeln!(o, "   untimed warm-up run (creates {n} tables): {cold:.3} s");
    let _ = writeln!(
        o,
        "   ratio to baseline {:.1}x; aim at most {B2_AIM_MS_PER_STEP} ms per step: {} ({ms_per_step} ms)",
        ratio(wall.median(), baseline.median()),
        if aim_met { "met" } else { "NOT met" }
    );
    Ok(Outcome { json, human: o })
}

pub fn b4(exe: &Path, dir: &Path, n: usize, workers: usize, repeats: usize) -> Result<Outcome> {
    let (mut wall, mut engine, mut baseline) = (Samples::default(), Samples::default(), Samples::default());
    let mut phase_sum = Phases::default();
    for r in 0..repeats {
        let ws = dir.join(format!("run-{r}"));
        workspace(&ws, &independent_spec(workers))?;
        progress(&format!("B4 run {}: tidegate run over {n} partitions", r + 1));
        let (seconds, report) = tidegate_run(
            exe,
            &ws,
            &["t", "--from", &day(B4_START, 0)?, "--to", &day(B4_START, n - 1)?, "--workers", &workers.to_string()],
        )?;
        let run_id = check_published(&report, n)?;
        wall.0.push(seconds);
        engine.0.push(report["elapsed_s"].as_f64().unwrap_or(f64::NAN));
        phase_sum.add(&phases(&ws, &run_id, false)?);
        let _ = std::fs::remove_dir_all(&ws);
        progress(&format!("B4 run {}: xargs -P2", r + 1));
        baseline.0.push(xargs_true(n)?);
    }
    let r = ratio(wall.median(), baseline.median());
    let aim_met = r <= B4_AIM_RATIO;
    #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
    let publish_share = phase_sum.publish_busy / wall.0.iter().sum::<f64>();
    let mut phases_json = phase_sum.json();
    phases_json["publish_busy_share_of_wall"] = json!(round(publish_share));
    let json = json!({
        "steps": n,
        "workers": workers,
        "repeats": repeats,
        "tidegate_run_wall": wall.json(),
        "tidegate_run_elapsed": engine.json(),
        "tidegate_steps_per_s": round(per_s(n, wall.median())),
        "baseline_xargs_p2": baseline.json(),
        "baseline_steps_per_s": round(per_s(n, baseline.median())),
        "ratio_to_baseline": round(r),
        "phases": phases_json,
        "aim_ratio": B4_AIM_RATIO,
        "aim_met": aim_met,
    });
    let mut o = String::new();
    let _ = writeln!(
        o,
        "B4. {n} independent /bin/true steps (one task, {n} daily partitions), `tidegate run --workers {workers}`"
    );
    let _ = writeln!(
        o,
        "   {:<52} {:>28} {:>10.1} steps/s",
        "tidegate run (wall, child process)",
        spread(&wall),
        per_s(n, wall.median())
    );
    let _ = writeln!(o, "   {:<52} {:>28}", "  of which after submission (its elapsed_s)", spread(&engine));
    let _ = writeln!(
        o,
        "   {:<52} {:>28} {:>10.1} steps/s",
        format!("baseline: xargs -P2 {TRUE}, {n} times"),
        spread(&baseline),
        per_s(n, baseline.median())
    );
    let _ = writeln!(o, "   {}", phase_sum.line());
    let _ = writeln!(
        o,
        "   a publication in progress (one at a time, beside the loop: Delta commits + release records): {:.0}% of the wall time",
        publish_share * 100.0
    );
    let _ = writeln!(
        o,
        "   ratio to xargs -P2 {r:.2}x; aim within {:.0}%: {}",
        (B4_AIM_RATIO - 1.0) * 100.0,
        if aim_met { "met" } else { "NOT met" }
    );
    Ok(Outcome { json, human: o })
}

//! B5: planning daily partitions of a generated, layered DAG of command tasks: time and peak memory.
//!
//! The DAG: tasks in layers of [`WIDTH`]; a task of layer L reads two datasets of layer L-1 (the
//! one at its position and the next one), through `same` mappings, except that layer 1 reads its
//! first input through `window(-1..0)`, so the layer-0 tasks are planned one partition earlier
//! too. A `sink` task reads every dataset nothing else reads, so planning the sink plans every
//! task. Only `tidegate_core::plan::plan` is timed (the spec is parsed once, timed separately).
//! Peak memory is the process's `VmHWM` after a reset of it just before planning.

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use chrono::{Duration, NaiveDate};
use serde_json::json;
use tidegate_core::plan::{self, Request, Selection};

use super::{Outcome, spread};
use crate::{Samples, mib, peak_rss_kib, progress, reset_peak_rss, round, rss_kib};

/// Tasks per layer, at most (small DAGs get narrower layers, so that they are layered too).
const WIDTH: usize = 100;

/// The layer width for `n` tasks besides the sink.
fn width(n: usize) -> usize {
    WIDTH.min((n / 4).max(2)).min(n)
}
/// The datasets' first day; planning starts later so that windows stay inside.
const DATA_START: &str = "2020-01-01";
const PLAN_START: &str = "2024-01-01";
const SINK: &str = "sink";

/// The spec of an `n_tasks`-task DAG (the sink included).
fn dag_spec(n_tasks: usize) -> String {
    let n = n_tasks - 1;
    let width = width(n);
    let mut s = String::from("[project]\nname = \"bench_b5\"\n\n");
    let mut read = vec![false; n];
    let mut tasks = String::new();
    for j in 0..n {
        let (layer, pos) = (j / width, j % width);
        let _ = write!(
            s,
            "[datasets.d{j:05}]\npartitioning = {{ grain = \"day\", start = \"{DATA_START}\" }}\n\
             write = {{ mode = \"replace\" }}\n\n"
        );
        let mut inputs = Vec::new();
        if layer > 0 {
            let prev = (layer - 1) * width;
            let (a, b) = (prev + pos, prev + (pos + 1) % width);
            read[a] = true;
            read[b] = true;
            let first = if layer == 1 {
                format!("{{ dataset = \"d{a:05}\", mapping = \"window(-1..0)\" }}")
            } else {
                format!("\"d{a:05}\"")
            };
            inputs.push(first);
            if b != a {
                inputs.push(format!("\"d{b:05}\""));
            }
        }
        let _ = write!(
            tasks,
            "[tasks.t{j:05}]\ncommand = [\"/bin/true\"]\ninputs = [{}]\noutputs = [\"d{j:05}\"]\n\n",
            inputs.join(", ")
        );
    }
    let sink_inputs: Vec<String> = (0..n).filter(|j| !read[*j]).map(|j| format!("\"d{j:05}\"")).collect();
    let _ = write!(
        s,
        "[datasets.{SINK}_out]\npartitioning = {{ grain = \"day\", start = \"{DATA_START}\" }}\n\
         write = {{ mode = \"replace\" }}\n\n"
    );
    s.push_str(&tasks);
    let _ = write!(
        s,
        "[tasks.{SINK}]\ncommand = [\"/bin/true\"]\ninputs = [{}]\noutputs = [\"{SINK}_out\"]\n",
        sink_inputs.join(", ")
    );
    s
}

pub fn b5(n_tasks: usize, n_partitions: usize, repeats: usize) -> Result<Outcome> {
    let text = dag_spec(n_tasks);
    let started = Instant::now();
    let spec = tidegate_core::spec::parse("bench-b5.toml", &text).map_err(|d| anyhow::anyhow!("{d}"))?;
    let parse_s = started.elapsed().as_secs_f64();
    ensure!(spec.tasks.len() == n_tasks, "the generated spec has {} tasks, expected {n_tasks}", spec.tasks.len());
    let first = NaiveDate::parse_from_str(PLAN_START, "%Y-%m-%d").context("a valid date")?;
    let last = first + Duration::days(i64::try_from(n_partitions)? - 1);
    let request = Request {
        spec: &spec,
        target: SINK,
        selection: Selection::Range { from: PLAN_START.to_owned(), to: last.format("%Y-%m-%d").to_string() },
        include_upstream: true,
        include_downstream: false,
    };
    let mut samples = Samples::default();
    let (mut n_steps, mut n_levels, mut n_edges) = (0, 0, 0);
    let (mut peak, mut before) = (None::<u64>, None::<u64>);
    for r in 0..repeats {
        progress(&format!("B5 run {}", r + 1));
        let tracked = reset_peak_rss();
        let rss_before = rss_kib();
        let started = Instant::now();
        let planned = plan::plan(&request)?;
        samples.0.push(started.elapsed().as_secs_f64());
        if tracked && let Some(p) = peak_rss_kib() {
            peak = Some(peak.map_or(p, |q| q.max(p)));
            // The first run's: later ones start with what the allocator kept from the one before.
            before = before.or(rss_before);
        }
        n_steps = planned.steps.len();
        n_levels = planned.level_widths().len();
        n_edges = planned.steps.iter().map(|s| s.upstream.len()).sum::<usize>();
    }
    let json = json!({
        "tasks": n_tasks,
        "width": width(n_tasks - 1),
        "partitions": n_partitions,
        "steps_planned": n_steps,
        "dependencies": n_edges,
        "levels": n_levels,
        "repeats": repeats,
        "parse_spec_s": round(parse_s),
        "spec_bytes": text.len(),
        "plan": samples.json(),
        "peak_rss_kib": peak,
        "rss_before_planning_kib": before,
        "planning_rss_increase_kib": peak.zip(before).map(|(p, b)| p.saturating_sub(b)),
    });
    let mut o = String::new();
    let _ = writeln!(
        o,
        "B5. planning {n_partitions} daily partitions of a {n_tasks}-task layered DAG (tidegate_core::plan::plan)"
    );
    let _ = writeln!(
        o,
        "   {:<52} {:>28}",
        format!("plan: {n_steps} steps, {n_edges} dependencies, {n_levels} levels"),
        spread(&samples)
    );
    let _ = writeln!(
        o,
        "   {:<52} {:>28}",
        format!("context: parsing the {} kB spec, once", text.len() / 1000),
        format!("{parse_s:.3} s")
    );
    let _ = writeln!(
        o,
        "   peak RSS while planning {} (the process held {} before the first run; no aim set)",
        mib(peak),
        mib(before)
    );
    Ok(Outcome { json, human: o })
}

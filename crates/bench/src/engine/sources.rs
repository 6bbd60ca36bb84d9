//! B6: the cost of source readiness. B4's independent `/bin/true` steps, each reading its day
//! of an external source whose folders all hold a file, run by `tidegate run` with
//! `ready = "location"` (every step's partition looked at before it starts) against the same
//! workspace with `ready = "none"` (nothing looked at), alternately in one invocation.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde_json::json;

use super::commands::{check_published, day, tidegate_run};
use super::{Outcome, per_s, spread, workspace};
use crate::{Samples, progress, ratio, round};

const START: &str = "2000-01-01";

fn spec(workers: usize, ready: &str, source: &Path) -> String {
    format!(
        "[project]\nname = \"bench_b6\"\n\n[pools.default]\nslots = {workers}\n\n\
         [external.src]\npartitioning = {{ grain = \"day\", start = \"{START}\" }}\n\
         location = \"{}/{{date}}\"\nready = \"{ready}\"\nready_poll_s = 1\n\n\
         [datasets.out]\npartitioning = {{ grain = \"day\", start = \"{START}\" }}\nwrite = {{ mode = \"replace\" }}\n\
         columns = [{{ name = \"x\", type = \"int64\" }}]\n\n\
         [tasks.t]\ncommand = [\"/bin/true\"]\ninputs = [{{ dataset = \"src\", mapping = \"same\" }}]\noutputs = [\"out\"]\n",
        source.display()
    )
}

pub fn b6(exe: &Path, dir: &Path, n: usize, workers: usize, repeats: usize) -> Result<Outcome> {
    let source = dir.join("source");
    for i in 0..n {
        let folder = source.join(day(START, i)?);
        std::fs::create_dir_all(&folder)?;
        std::fs::write(folder.join("part-0.csv"), "x\n1\n")?;
    }
    let to = day(START, n - 1)?;
    let args = ["t", "--from", START, "--to", &to, "--workers", &workers.to_string()];
    let (mut checked, mut unchecked) = (Samples::default(), Samples::default());
    for r in 0..repeats {
        for (ready, samples) in [("location", &mut checked), ("none", &mut unchecked)] {
            let ws = dir.join(format!("run-{r}-{ready}"));
            workspace(&ws, &spec(workers, ready, &source))?;
            progress(&format!("B6 run {}: ready = {ready}, {n} steps", r + 1));
            let (seconds, report) = tidegate_run(exe, &ws, &args)?;
            check_published(&report, n)?;
            samples.0.push(seconds);
            let _ = std::fs::remove_dir_all(&ws);
        }
    }
    let r = ratio(checked.median(), unchecked.median());
    #[allow(clippy::cast_precision_loss, reason = "a count far below 2^52, exact as f64")]
    let per_step_ms = (checked.median() - unchecked.median()) / n as f64 * 1000.0;
    let json = json!({
        "steps": n,
        "workers": workers,
        "repeats": repeats,
        "ready_location_wall": checked.json(),
        "ready_none_wall": unchecked.json(),
        "ratio": round(r),
        "cost_per_step_ms": round(per_step_ms),
    });
    let mut o = String::new();
    let _ = writeln!(o, "B6. {n} independent /bin/true steps reading a source folder each, `--workers {workers}`");
    let _ = writeln!(
        o,
        "   {:<52} {:>28} {:>10.1} steps/s",
        "ready = \"location\" (each partition looked at)",
        spread(&checked),
        per_s(n, checked.median())
    );
    let _ = writeln!(
        o,
        "   {:<52} {:>28} {:>10.1} steps/s",
        "baseline: ready = \"none\"",
        spread(&unchecked),
        per_s(n, unchecked.median())
    );
    let _ = writeln!(o, "   ratio {:.3}; readiness costs {per_step_ms:.2} ms per step (median difference / steps)", r);
    Ok(Outcome { json, human: o })
}

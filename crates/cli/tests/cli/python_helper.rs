//! The `tidegate` Python package (`python/tidegate`), installed as a task author installs it
//! (`pip install -e`, into a venv made once per test binary) and used by real command tasks that
//! `tidegate run` starts: inputs are read at the version pinned for the step even when a newer one
//! was published after pinning (issue 32, item 6), lineage records the version handed to the task,
//! and a checkpoint can only cover rows durably written (item 7). Its unit tests run from here too.
//! Needs Python 3 with `deltalake`, `pyarrow`, `polars`, `pandas` and `setuptools` (`.ci/run`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::{backend, common};

/// The package's folder in the repository.
fn package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/tidegate")
}

/// The venv's Python with the package installed editable; `None` (after saying so, or failing
/// under CI) when this machine's Python lacks what the package needs.
fn python(test: &str) -> Option<PathBuf> {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match VENV.get_or_init(make_venv) {
        Ok(python) => Some(python.clone()),
        Err(missing) => {
            tidegate_testkit::service_missing(test, missing);
            None
        }
    }
}

/// A venv over the system's packages (deltalake, pyarrow, setuptools: no download), without its
/// own pip or setuptools, so the system's build the package; one per test binary, kept in the
/// target folder between runs.
fn make_venv() -> Result<PathBuf, String> {
    let ready = Command::new("python3").args(["-c", "import deltalake, pyarrow, polars, pandas, setuptools"]).output();
    if !ready.is_ok_and(|o| o.status.success()) {
        return Err("python3 with deltalake, pyarrow, polars, pandas and setuptools".to_owned());
    }
    let name = if backend::is_shared() { "python-helper-shared" } else { "python-helper" };
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin/python");
    if !python.exists() {
        let made = Command::new("python3")
            .args(["-m", "venv", "--system-site-packages", "--without-pip"])
            .arg(&venv)
            .output()
            .expect("python3 runs");
        assert!(made.status.success(), "making a venv: {}", String::from_utf8_lossy(&made.stderr));
    }
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"])
        .args(["--no-build-isolation", "--no-index", "-e"])
        .arg(package())
        .output()
        .expect("the venv's python runs");
    assert!(
        installed.status.success(),
        "pip install -e python/tidegate: {}",
        String::from_utf8_lossy(&installed.stderr)
    );
    Ok(python)
}

/// Runs `tidegate ARGS --json` in `dir`; its exit code and output.
fn run(dir: &Path, args: &[&str]) -> (i32, Value) {
    let mut all = args.to_vec();
    all.push("--json");
    common::json(dir, &all)
}

/// `secrets` for a task that reads the lake itself: on S3 its credentials (the region, endpoint
/// and scheme come with the lake); nothing on a folder lake.
fn lake_secrets() -> &'static str {
    if backend::is_shared() { r#"secrets = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]"# } else { "" }
}

#[test]
fn the_python_package_passes_its_unit_tests() {
    let Some(python) = python("the_python_package_passes_its_unit_tests") else { return };
    let out = Command::new(python)
        .args(["-m", "unittest", "discover", "-s", "tests"])
        .current_dir(package())
        .output()
        .expect("the venv's python runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}");
    let ran = report.lines().find_map(|l| l.strip_prefix("Ran ")).unwrap_or_default();
    let n: u32 = ran.split(' ').next().unwrap_or_default().parse().unwrap_or(0);
    assert!(n >= 16 && report.trim_end().ends_with("OK"), "{report}");
}

// ---- Item 6: the pinned version, and lineage that says it ------------------------------------

/// `extract` writes three rows per day; its day-2 step waits until `enrich`'s day-1 attempt has
/// started (pinned to the version holding day 1 only), so day 2 is published while `enrich` runs.
/// `enrich` (written raw or with the package) waits for that newer version, then reads `raw` and
/// writes how many rows it read, from which version, and the version it was handed.
fn pins_workspace(python: &Path, enrich: &str) -> TestWorkspace {
    let ws = TestWorkspace::new("");
    ws.write(
        "extract.py",
        r#"
import os, sys, time
day = os.environ["TIDEGATE_PARTITION"]
deadline = time.time() + 60
while day == "2024-01-02" and not os.path.exists("enrich-started"):
    if time.time() > deadline:
        sys.exit("enrich never started")
    time.sleep(0.05)
with open(os.path.join(os.environ["TIDEGATE_OUTPUT_DIR"], "raw.csv"), "w") as f:
    f.write("id,day\n" + "".join(f"{i},{day}\n" for i in range(3)))
"#,
    );
    ws.write("enrich.py", enrich);
    let python = python.display();
    ws.set_spec(format!(
        r#"
[project]
name = "pins"

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}, {{ name = "day", type = "string" }}]

[datasets.enriched]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "n", type = "int64" }}, {{ name = "read_version", type = "int64" }}, {{ name = "pinned", type = "int64" }}]

[tasks.extract]
command = ["{python}", "extract.py"]
outputs = ["raw"]

[tasks.enrich]
command = ["{python}", "enrich.py"]
inputs = ["raw"]
outputs = ["enriched"]
{secrets}
"#,
        secrets = lake_secrets()
    ));
    ws
}

/// What both `enrich` scripts share: on day 1, say it started and wait for a version of `raw`
/// newer than the one pinned.
const WAIT_FOR_A_NEWER_VERSION: &str = r#"
import os, sys, time
from deltalake import DeltaTable, QueryBuilder
uri = os.environ["TIDEGATE_INPUT_RAW_URI"]
pinned = int(os.environ["TIDEGATE_INPUT_RAW_VERSION"])
if os.environ["TIDEGATE_PARTITION"] == "2024-01-01":
    open("enrich-started", "w").close()
    deadline = time.time() + 60
    while DeltaTable(uri).version() <= pinned:
        if time.time() > deadline:
            sys.exit("no newer version of raw was published")
        time.sleep(0.05)
"#;

/// The documented hazard, shown: a raw task that reads the table's latest version instead of
/// `TIDEGATE_INPUT_RAW_VERSION`.
const ENRICH_READING_THE_LATEST: &str = r#"
import pyarrow as pa
latest = DeltaTable(uri)
counted = QueryBuilder().register("raw", latest).execute("SELECT count(*) AS n FROM raw")
n = pa.RecordBatchReader.from_stream(counted).read_all().column(0)[0].as_py()
with open(os.path.join(os.environ["TIDEGATE_OUTPUT_DIR"], "e.csv"), "w") as f:
    f.write(f"n,read_version,pinned\n{n},{latest.version()},{pinned}\n")
"#;

/// The same task with the package: the easy way reads the pinned version.
const ENRICH_WITH_THE_PACKAGE: &str = r#"
import pyarrow as pa
import tidegate as tg
raw = tg.input("raw")
rows = raw.arrow()
tg.output(pa.table({"n": [rows.num_rows], "read_version": [raw.delta().version()], "pinned": [raw.version]}))
"#;

/// Day 1's `(n, read_version, pinned)` row of `enriched`.
fn enriched_day_1(dir: &Path) -> (i64, i64, i64) {
    let sql = "SELECT n, read_version, pinned FROM enriched WHERE tg_partition = DATE '2024-01-01'";
    let (code, rows) = run(dir, &["sql", sql]);
    assert_eq!(code, 0, "{rows}");
    let row = &rows[0];
    let int = |c: &str| row[c].as_i64().unwrap_or_else(|| panic!("{c} in {row}"));
    (int("n"), int("read_version"), int("pinned"))
}

/// The version of `raw` that lineage says `enrich`'s day-1 attempt read.
fn lineage_of_enrich_day_1(dir: &Path) -> Vec<(String, Option<String>)> {
    let text = std::fs::read_to_string(dir.join(".tidegate/openlineage.jsonl")).expect("lineage events");
    let events: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let complete = events
        .iter()
        .find(|e| {
            e["eventType"] == "COMPLETE"
                && e["job"]["name"] == "enrich"
                && e["run"]["facets"]["tidegate"]["partition"] == "2024-01-01"
        })
        .expect("enrich's day-1 attempt completed");
    let inputs = complete["inputs"].as_array().expect("inputs");
    inputs
        .iter()
        .map(|d| {
            let name = d["facets"]["symlinks"]["identifiers"][0]["name"].as_str().unwrap_or_default().to_owned();
            (name, d["facets"]["version"]["datasetVersion"].as_str().map(str::to_owned))
        })
        .collect()
}

fn run_both_days(dir: &Path) {
    let (code, report) = run(dir, &["run", "enrich", "--from", "2024-01-01", "--to", "2024-01-02", "--workers", "3"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["published"], 4, "{report}");
}

/// Issue 32, item 6, as reported (what docs/command-tasks.md warns about; Tidegate cannot see
/// inside a raw task): the task read version 2, holding both days, while lineage, like the
/// environment, says version 1.
#[test]
fn a_raw_task_reading_the_latest_version_publishes_newer_data_than_lineage_records() {
    let Some(python) = python("a_raw_task_reading_the_latest_version_publishes_newer_data_than_lineage_records") else {
        return;
    };
    let ws = pins_workspace(&python, &format!("{WAIT_FOR_A_NEWER_VERSION}{ENRICH_READING_THE_LATEST}"));
    run_both_days(ws.path());
    let (n, read_version, pinned) = enriched_day_1(ws.path());
    assert_eq!(read_version, pinned + 1, "the raw task read past its pin");
    assert_eq!(n, 6, "day 2's rows are in day 1's result");
    assert_eq!(lineage_of_enrich_day_1(ws.path()), [("raw".to_owned(), Some(pinned.to_string()))]);
}

/// Issue 32, item 6, with the package: the same task reads the version pinned for it (day 1's
/// three rows) although version 2 was published before it read, and lineage records exactly the
/// version the environment handed it.
#[test]
fn a_task_written_with_the_package_reads_its_pinned_version_after_a_newer_one_is_published() {
    let Some(python) =
        python("a_task_written_with_the_package_reads_its_pinned_version_after_a_newer_one_is_published")
    else {
        return;
    };
    let ws = pins_workspace(&python, &format!("{WAIT_FOR_A_NEWER_VERSION}{ENRICH_WITH_THE_PACKAGE}"));
    run_both_days(ws.path());
    let (n, read_version, pinned) = enriched_day_1(ws.path());
    assert_eq!((n, read_version), (3, pinned), "day 1's rows only, from the pinned version");
    assert!(common::latest_version(&common::table(ws.path(), "raw")) > u64::try_from(pinned).expect("a version"));
    assert_eq!(lineage_of_enrich_day_1(ws.path()), [("raw".to_owned(), Some(pinned.to_string()))]);
}

// ---- Item 7: a checkpoint covers only rows durably written -----------------------------------

fn hourly_workspace(python: &Path, task: &str) -> TestWorkspace {
    let ws = TestWorkspace::new("");
    ws.write("task.py", task);
    ws.set_spec(format!(
        r#"
[project]
name = "checkpoint_helper"

[datasets.hourly]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "hour", type = "int64" }}, {{ name = "value", type = "int64" }}]

[tasks.load]
command = ["{}", "task.py"]
outputs = ["hourly"]
retry = {{ attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }}
"#,
        python.display()
    ));
    ws
}

/// Item 7's task written with the package: 30 offsets in batches of 10, streamed into one file
/// per batch. Attempt 1's source dies 7 rows into the third batch (exit 75): the file was still
/// hidden and no checkpoint covered it.
const BATCHES_WITH_THE_PACKAGE: &str = r#"
import os
import pyarrow as pa
import tidegate as tg
attempt, resume = tg.attempt(), tg.resume_from()
with open(f"resumed-{attempt}", "w") as f:
    f.write(resume or "none")
first = int(resume.split("=")[1]) + 1 if resume else 0

def batch(start):
    for offset in range(start, start + 10):
        if attempt == 1 and start == 20 and offset == 27:
            os._exit(75)
        yield pa.record_batch({"hour": pa.array([offset], pa.int64()), "value": pa.array([offset * 10], pa.int64())})

for start in range(first, 30, 10):
    tg.output(batch(start))
    tg.checkpoint(f"offset={start + 9}", rows=10)
"#;

/// Issue 32, item 7, with the package: the attempt that died mid-batch left no visible file and
/// no checkpoint past offset 19; the retry resumed there and all 30 rows were published.
#[test]
fn a_task_written_with_the_package_that_dies_mid_batch_publishes_all_30_rows() {
    let Some(python) = python("a_task_written_with_the_package_that_dies_mid_batch_publishes_all_30_rows") else {
        return;
    };
    let ws = hourly_workspace(&python, BATCHES_WITH_THE_PACKAGE);
    let (code, report) = run(ws.path(), &["run", "load", "--partition", "2024-01-01"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!((report["summary"]["published"].as_u64(), report["summary"]["retried"].as_u64()), (Some(1), Some(1)));
    assert_eq!(std::fs::read_to_string(ws.path().join("resumed-2")).expect("attempt 2 ran"), "offset=19");
    let (code, rows) = run(ws.path(), &["sql", "SELECT hour, value FROM hourly ORDER BY hour"]);
    assert_eq!(code, 0, "{rows}");
    let got: Vec<(i64, i64)> = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["hour"].as_i64().expect("hour"), r["value"].as_i64().expect("value")))
        .collect();
    assert_eq!(got, (0..30).map(|h| (h, h * 10)).collect::<Vec<_>>(), "30 of 30");
}

/// Issue 32, item 7: the lie cannot even be told with the package. A task that checkpoints the
/// third batch after writing 7 of its 10 rows is refused by `checkpoint()` before any line is
/// written; the step fails naming both counts, and nothing is published.
#[test]
fn the_package_refuses_a_checkpoint_before_its_rows_are_written() {
    let Some(python) = python("the_package_refuses_a_checkpoint_before_its_rows_are_written") else { return };
    let early = BATCHES_WITH_THE_PACKAGE.replace(
        "            os._exit(75)\n",
        "            return  # the batch ends early, and is checkpointed as if whole\n",
    );
    let ws = hourly_workspace(&python, &early);
    let (code, report) = run(ws.path(), &["run", "load", "--partition", "2024-01-01"]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["summary"]["published"], 0, "{report}");
    let reason = report["failures"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("CheckpointRefused") && reason.contains("declares 10 rows but its files hold 7"),
        "{report}"
    );
    let granules = common::state(ws.path()).texts("SELECT granule FROM checkpoints ORDER BY granule", &[]);
    assert_eq!(granules, ["offset=19", "offset=9"], "the two whole batches only");
}

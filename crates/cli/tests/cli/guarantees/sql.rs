//! Every SQL surface is read-only and a task writes only through staging: `tidegate sql` refuses
//! statements that write a table or touch a file, a spec whose custom check or SQL task is not a
//! query fails validation, an output file Tidegate cannot read fails its step instead of
//! publishing an empty partition, and `tidegate read` names what it cannot find or read.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{latest_version, ok, table, tidegate};

const SPEC: &str = r#"
[project]
name = "guarded"

[datasets.daily_stats]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64", nullable = false }, { name = "n", type = "int64" }]

[tasks.make]
command = ["sh", "-c", "printf 'id,n\n1,10\n2,20\n' > \"$TIDEGATE_OUTPUT_DIR/rows.csv\""]
outputs = ["daily_stats"]
"#;

/// The command of `make` in [`SPEC`], as written in the file.
const MAKE_COMMAND: &str = r#"printf 'id,n\n1,10\n2,20\n' > \"$TIDEGATE_OUTPUT_DIR/rows.csv\""#;

/// A workspace with [`SPEC`] whose `daily_stats` has two rows published for 2024-01-01.
fn published() -> TestWorkspace {
    let dir = TestWorkspace::new(SPEC);
    ok(dir.path(), &["run", "make", "--partition", "2024-01-01", "--json"]);
    dir
}

/// Runs `tidegate ARGS`, which must fail, and returns what it printed on stderr.
fn fails(dir: &Path, args: &[&str]) -> String {
    let out = tidegate(dir).args(args).output().expect("runs");
    assert!(
        !out.status.success(),
        "tidegate {args:?} should fail; it printed {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).expect("utf-8")
}

/// The published rows of `daily_stats`, through `tidegate read`.
fn published_rows(dir: &Path) -> Vec<Value> {
    let text = ok(dir, &["read", "daily_stats", "--json"]);
    serde_json::from_str::<Value>(&text).expect("json").as_array().expect("rows").clone()
}

#[test]
fn sql_refuses_statements_that_write_tables_or_touch_files() {
    let dir = published();
    let t = table(dir.path(), "daily_stats");
    let version = latest_version(&t);
    let secret = dir.path().join("secret.csv");
    std::fs::write(&secret, "user,password\nroot,hunter2\n").expect("secret");
    let leak = dir.path().join("leak.csv");
    let attacks = [
        "INSERT INTO daily_stats SELECT * FROM daily_stats".to_owned(),
        "INSERT OVERWRITE daily_stats SELECT * FROM daily_stats WHERE false".to_owned(),
        format!("COPY (SELECT * FROM daily_stats) TO '{}'", leak.display()),
        format!("CREATE EXTERNAL TABLE secrets STORED AS CSV LOCATION '{}'", secret.display()),
    ];
    for attack in &attacks {
        let stderr = fails(dir.path(), &["sql", attack]);
        assert!(stderr.contains("read-only"), "{attack}: {stderr}");
        assert_eq!(latest_version(&t), version, "{attack} committed a new version");
        assert!(!leak.exists(), "{attack} wrote {}", leak.display());
    }
    // Nor can a query name a file as a table.
    let stderr = fails(dir.path(), &["sql", &format!("SELECT * FROM '{}'", secret.display())]);
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert_eq!(published_rows(dir.path()).len(), 2, "the published rows are unchanged");
    // Reading stays what `sql` is for.
    let counted =
        ok(dir.path(), &["sql", "WITH s AS (SELECT * FROM daily_stats) SELECT count(*) AS n FROM s", "--csv"]);
    assert_eq!(counted, "n\n2\n");
}

#[test]
fn a_query_over_the_memory_limit_fails_naming_the_limit() {
    let dir = published();
    // Sorting two million rows needs far more than 1 MiB, and user queries do not spill to disk.
    let query = "SELECT value FROM generate_series(1, 2000000) ORDER BY value DESC";
    let stderr = fails(dir.path(), &["sql", "--memory-limit-mb", "1", query]);
    assert!(stderr.contains("memory limit of 1 MiB") && stderr.contains("--memory-limit-mb"), "{stderr}");
    let small = ok(dir.path(), &["sql", "--memory-limit-mb", "64", "SELECT count(*) AS n FROM daily_stats", "--csv"]);
    assert_eq!(small, "n\n2\n");
}

/// The 1-based line and column at which `needle` starts in `text`.
fn line_col(text: &str, needle: &str) -> (usize, usize) {
    let at = text.find(needle).expect("needle in text");
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = at - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

#[test]
fn validate_refuses_a_check_or_a_sql_task_that_is_not_a_query() {
    let spec = format!(
        r#"{SPEC}
[[datasets.daily_stats.checks]]
type = "sql"
query = "INSERT INTO staged SELECT * FROM staged"

[datasets.copied]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.copy]
sql = "COPY (SELECT * FROM daily_stats) TO '/tmp/leak.csv'"
inputs = ["daily_stats"]
outputs = ["copied"]
"#
    );
    let dir = TestWorkspace::new(&spec);
    let out = tidegate(dir.path()).arg("validate").output().expect("runs");
    assert!(!out.status.success(), "validate accepted a check and a task that write");
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let (line, col) = line_col(&spec, "INSERT INTO staged");
    let check = format!("tidegate.toml:{line}:{col}: datasets.daily_stats.checks[0].query: ");
    assert!(printed.contains(&check), "expected {check:?} in:\n{printed}");
    let (line, col) = line_col(&spec, "COPY (SELECT");
    let task = format!("tidegate.toml:{line}:{col}: tasks.copy.sql: ");
    assert!(printed.contains(&task), "expected {task:?} in:\n{printed}");
}

/// The reasons recorded for every attempt of the workspace.
fn attempt_reasons(dir: &Path) -> Vec<String> {
    crate::common::state(dir).texts("SELECT reason FROM attempts WHERE reason IS NOT NULL", &[])
}

#[test]
fn an_output_that_is_a_symlink_fails_the_step_and_keeps_the_published_rows() {
    let dir = published();
    let t = table(dir.path(), "daily_stats");
    let (version, before) = (latest_version(&t), published_rows(dir.path()));
    let real = dir.path().join("real.csv");
    std::fs::write(&real, "id,n\n7,70\n").expect("csv");
    let linking = format!(r#"ln -s '{}' \"$TIDEGATE_OUTPUT_DIR/rows.csv\""#, real.display());
    let spec = SPEC.replace(MAKE_COMMAND, &linking);
    assert_ne!(spec, SPEC);
    dir.set_spec(spec);

    // The next day: the linking command is other code, which may not replace the published day
    // without review (decision 0020), but may write a new one.
    let out = tidegate(dir.path()).args(["run", "make", "--partition", "2024-01-02", "--json"]).output().expect("runs");
    assert!(!out.status.success(), "the run succeeded: {}", String::from_utf8_lossy(&out.stdout));
    let reasons = attempt_reasons(dir.path());
    assert!(
        reasons.iter().any(|r| r.contains("rows.csv") && r.contains("symbolic link")),
        "no attempt names the symlink: {reasons:?}"
    );
    assert_eq!(latest_version(&t), version, "nothing was published");
    assert_eq!(published_rows(dir.path()), before);
}

#[test]
fn read_of_an_unknown_dataset_suggests_the_closest_name() {
    let dir = TestWorkspace::new(SPEC);
    let stderr = fails(dir.path(), &["read", "daily_stat"]);
    assert!(stderr.contains(r#"did you mean "daily_stats"?"#), "{stderr}");
}

#[test]
fn read_of_a_corrupt_commit_names_the_table_and_the_commit_file() {
    let dir = published();
    let t = table(dir.path(), "daily_stats");
    let file = format!("{:020}.json", latest_version(&t));
    std::fs::write(t.join("_delta_log").join(&file), "this is not a Delta commit {").expect("corrupt");
    for args in [&["read", "daily_stats"][..], &["sql", "SELECT 1"][..]] {
        let stderr = fails(dir.path(), args);
        assert!(stderr.contains("daily_stats") && stderr.contains(&file), "{args:?}: {stderr}");
        let lower = stderr.to_lowercase();
        assert!(!lower.contains("this is a bug") && !lower.contains("backtrace"), "{args:?}: {stderr}");
    }
}

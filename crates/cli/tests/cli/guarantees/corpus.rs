//! Bad-input corpora (issue 19): command lines, task outputs and SQL. Each case is one bad input
//! and what its user must read back: the exit status and the names of what is at fault (the flag,
//! value, file, column, dataset or query). Every answer must also be an error message, never a
//! panic, a backtrace or an "internal error". Each test runs its whole table and lists every case
//! that falls short, so one run shows all of them. The spec corpus is `crates/core/tests/bad_specs/`.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, latest_version, table, tidegate};

/// Text that never belongs in an answer to bad input, in any case: a panic, a backtrace, a bug
/// report (ours or a library's).
const NEVER: &[&str] = &[
    "panicked",
    "rust_backtrace",
    "stack backtrace",
    "called `option::unwrap()`",
    "called `result::unwrap()`",
    "internal error",
    "this is a bug",
    "caused by a bug",
    "please file",
    // A library's debug form of its error, not a sentence.
    "parsererror(",
];

/// Why an answer is not the clear one expected (`None` when it is): its exit status must be
/// `code` (a panic exits with 101), it must show none of [`NEVER`] nor a backtrace frame, and it
/// must say every one of `says`.
fn unclear(status: Option<i32>, text: &str, code: i32, says: &[&str]) -> Option<String> {
    // Shown with `-- --nocapture`: the whole corpus of answers, for a reviewer to read.
    println!("  [{status:?}] {}\n", text.trim().replace('\n', "\n      "));
    let mut problems = Vec::new();
    if status != Some(code) {
        problems.push(format!("exit status {status:?}, expected {code}"));
    }
    let lower = text.to_lowercase();
    problems.extend(NEVER.iter().filter(|n| lower.contains(*n)).map(|n| format!("shows {n:?}")));
    if text.lines().any(is_backtrace_frame) {
        problems.push("shows a backtrace".to_owned());
    }
    if let Some(twice) = said_twice(text) {
        problems.push(format!("says {twice:?} twice"));
    }
    problems.extend(says.iter().filter(|s| !text.contains(*s)).map(|s| format!("does not say {s:?}")));
    (!problems.is_empty())
        .then(|| format!("{}\n    got: {}", problems.join("; "), text.trim().replace('\n', "\n         ")))
}

/// A clause (text between `: ` separators or line breaks) long enough to mean something that the
/// answer repeats: an error printed once as its message and again as its cause.
fn said_twice(text: &str) -> Option<&str> {
    let clauses: Vec<&str> = text.split([':', '\n']).map(str::trim).filter(|c| c.len() >= 20).collect();
    clauses.iter().enumerate().find(|(i, c)| clauses[..*i].contains(c)).map(|(_, c)| *c)
}

/// `  12: std::rt::lang_start` or `at /rustc/...`: a line of a printed backtrace.
fn is_backtrace_frame(line: &str) -> bool {
    let line = line.trim_start();
    let digits = line.chars().take_while(char::is_ascii_digit).count();
    (digits > 0 && line[digits..].starts_with(": ") && line.contains("::")) || line.starts_with("at /rustc/")
}

/// Everything a command printed, stdout then stderr.
fn printed(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Runs `tidegate ARGS` in `dir` as a user would (no backtrace asked for), with the secret the
/// example's `clean_events` task declares, which its runs need.
fn run(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = tidegate(dir);
    cmd.args(args).env_remove("RUST_BACKTRACE").env("EVENTS_API_TOKEN", "corpus-token");
    cmd.output().expect("tidegate runs")
}

/// Fails listing every unclear case of a corpus, or passes when there is none.
fn assert_all_clear(corpus: &str, n_cases: usize, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} of {n_cases} {corpus} cases are not answered clearly:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Runs `tidegate ARGS` and fails the test (this is set-up, not a case) unless it succeeds.
fn setup(dir: &Path, args: &[&str]) {
    let out = run(dir, args);
    assert!(out.status.success(), "set-up `tidegate {args:?}` failed:\n{}", printed(&out));
}

// ---- 1. Command lines -------------------------------------------------------------------------

/// One command line: its arguments (split at spaces), the exit status (2 for what the argument
/// parser rejects, 1 for what the command rejects), and what the message must name.
type CliCase = (&'static str, i32, &'static [&'static str]);

/// Command lines against the example workspace of `tidegate init`, after one published day.
const CLI_EXAMPLE: &[CliCase] = &[
    // Unknown subcommands and flags: named, with the nearest known one where clap has it.
    ("frobnicate", 2, &["frobnicate"]),
    ("backfill frobnicate", 2, &["frobnicate"]),
    ("validate --strict", 2, &["--strict"]),
    ("run daily_stats --frm 2024-01-01 --to 2024-01-02", 2, &["--frm", "--from"]),
    ("plan daily_stats --partition 2024-01-01 --upstream", 2, &["--upstream"]),
    ("init --json", 2, &["--json"]),
    ("serve --json", 2, &["--json"]),
    ("rollback daily_stats --to-version 0 --dry-run", 2, &["--dry-run"]),
    // Missing arguments and values.
    ("plan", 2, &["TARGET"]),
    ("sql", 2, &["QUERY"]),
    ("read", 2, &["DATASET"]),
    ("plan daily_stats --from", 2, &["--from"]),
    ("plan daily_stats --from 2024-01-01", 2, &["--to"]),
    ("plan daily_stats", 1, &["--from A --to B", "--partition", "--all"]),
    ("backfill plan daily_stats --from 2024-01-01 --to 2024-01-02 --reprocess all", 2, &["--reason"]),
    ("backfill approve", 2, &["ID"]),
    // Contradicting flags: both named.
    ("plan daily_stats --partition 2024-01-01 --json --graph dot", 2, &["--json", "--graph"]),
    ("plan daily_stats --from 2024-01-01 --to 2024-01-02 --partition 2024-01-01", 2, &["--from", "--partition"]),
    ("read daily_stats --version 1 --release r", 2, &["--version", "--release"]),
    ("read daily_stats --json --csv", 2, &["--json", "--csv"]),
    ("sql query --json --csv", 2, &["--json", "--csv"]),
    ("rollback daily_stats --to-version 0 --to-release r", 2, &["--to-version", "--to-release"]),
    ("vacuum --retain-releases 2 --older-than 7d", 2, &["--retain-releases", "--older-than"]),
    // Bad partitions and ranges: the flag and the value.
    ("plan daily_stats --partition 2024-13-01", 1, &["--partition 2024-13-01", "YYYY-MM-DD"]),
    ("plan daily_stats --partition 2024-02-30", 1, &["2024-02-30"]),
    ("plan daily_stats --partition yesterday", 1, &["yesterday"]),
    ("plan daily_stats --from 2024-01-07 --to 2024-01-01", 1, &["--from 2024-01-07 is after --to 2024-01-01"]),
    ("plan daily_stats --from tomorrow --to 2024-01-01", 1, &["--from tomorrow"]),
    ("plan daily_stats --partition 2023-12-31", 1, &["2023-12-31", "2024-01-01"]),
    ("plan daily_stats --from 2024-01-01 --to 2999-01-01", 1, &["limit"]),
    ("plan daily_stats --all", 1, &["--all", "daily_stats", "static"]),
    ("submit daily_stats --partition 2024-13-01", 1, &["--partition 2024-13-01"]),
    ("run daily_stats --from 2024-01-03 --to 2024-01-01", 1, &["--from 2024-01-03 is after --to 2024-01-01"]),
    (
        "backfill plan daily_stats --from 2024-01-03 --to 2024-01-01 --reprocess all --reason r",
        1,
        &["--from 2024-01-03 is after --to 2024-01-01"],
    ),
    // Unknown targets and datasets, with the nearest name.
    ("plan daily_stat --partition 2024-01-01", 1, &["\"daily_stat\"", "did you mean \"daily_stats\""]),
    ("run dialy_stats --partition 2024-01-01", 1, &["\"dialy_stats\"", "did you mean \"daily_stats\""]),
    ("plan raw_events --partition 2024-01-01", 1, &["raw_events", "external"]),
    (
        "backfill plan daily_stat --from 2024-01-01 --to 2024-01-02 --reprocess all --reason r",
        1,
        &["\"daily_stat\"", "did you mean \"daily_stats\""],
    ),
    ("read nosuch", 1, &["\"nosuch\""]),
    ("rollback nosuch --to-version 0", 1, &["nosuch"]),
    ("vacuum nosuch", 1, &["nosuch"]),
    ("history nosuch:2024-01-01", 1, &["\"nosuch\""]),
    ("history nosuch@2024-01-01", 1, &["no task named \"nosuch\""]),
    ("history daily_stat@2024-01-01", 1, &["\"daily_stat\"", "did you mean \"daily_stats\""]),
    ("history daily_stat:2024-01-01", 1, &["\"daily_stat\"", "did you mean \"daily_stats\""]),
    // Numbers that are not numbers, or out of their range.
    ("run daily_stats --partition 2024-01-01 --workers 0", 2, &["--workers", "'0'"]),
    ("run daily_stats --partition 2024-01-01 --workers many", 2, &["--workers", "'many'"]),
    ("run daily_stats --partition 2024-01-01 --workers 5000", 2, &["--workers", "'5000'"]),
    ("status --limit -1", 2, &["--limit", "'-1'"]),
    ("run daily_stats --partition 2024-01-01 --workers -3", 2, &["--workers", "'-3'"]),
    ("tick --workers 0", 2, &["--workers", "'0'"]),
    ("tick --workers -1", 2, &["--workers", "'-1'"]),
    ("worker --slots -2", 2, &["--slots", "'-2'"]),
    ("vacuum --retain-releases -1", 2, &["--retain-releases", "'-1'"]),
    ("serve --tick-every-s -60", 2, &["--tick-every-s", "'-60'"]),
    ("rollback daily_stats --to-version 0 --lock-wait -5", 2, &["--lock-wait", "'-5'"]),
    ("status --limit lots", 2, &["--limit", "'lots'"]),
    ("read daily_stats --limit -1", 2, &["--limit", "'-1'", "0.."]),
    ("read daily_stats --version -1", 2, &["--version", "'-1'", "0.."]),
    ("history --limit -1", 2, &["--limit", "'-1'", "0.."]),
    ("rollback daily_stats --to-version -1", 2, &["--to-version", "'-1'", "0.."]),
    ("backfill list --limit -1", 2, &["--limit", "'-1'", "0.."]),
    ("backfill start bf-nope --workers 0", 2, &["--workers", "'0'", "1..=4096"]),
    ("backfill start bf-nope --workers -2", 2, &["--workers", "'-2'", "1..=4096"]),
    (
        "backfill plan daily_stats --from 2024-01-01 --to 2024-01-02 --reprocess all --reason r --max-active-runs -1",
        2,
        &["--max-active-runs", "'-1'", "0.."],
    ),
    (
        "backfill plan daily_stats --from 2024-01-01 --to 2024-01-02 --reprocess all --reason r --rate -1",
        1,
        &["--rate", "-1"],
    ),
    ("history --limit 1e3", 2, &["--limit", "'1e3'"]),
    ("read daily_stats --version latest", 2, &["--version", "'latest'"]),
    ("backfill list --limit ten", 2, &["--limit", "'ten'"]),
    ("vacuum --retain-releases 0", 2, &["--retain-releases", "'0'"]),
    ("serve --tick-every-s 0", 2, &["--tick-every-s", "'0'"]),
    ("serve --workers 9999", 2, &["--workers", "'9999'"]),
    ("worker --slots 0", 2, &["--slots", "'0'"]),
    ("rollback daily_stats --to-version 0 --lock-wait soon", 2, &["--lock-wait", "'soon'"]),
    (
        "backfill plan daily_stats --from 2024-01-01 --to 2024-01-02 --reprocess all --reason r --max-active-runs 0",
        1,
        &["--max-active-runs"],
    ),
    ("backfill plan daily_stats --from 2024-01-01 --to 2024-01-02 --reprocess all --reason r --rate 0", 1, &["--rate"]),
    (
        "backfill plan daily_stats --from 2024-01-01 --to 2024-01-02 --reprocess sometimes --reason r",
        2,
        &["--reprocess", "sometimes", "missing"],
    ),
    ("plan daily_stats --partition 2024-01-01 --graph svg", 2, &["--graph", "svg", "dot"]),
    // Durations and instants.
    ("reconcile --keep-logs forever", 2, &["--keep-logs", "'forever'"]),
    ("vacuum --older-than 3x", 2, &["--older-than", "'3x'"]),
    ("tick --now noon", 1, &["noon"]),
    ("status --now 2024-99-99", 1, &["2024-99-99"]),
    // Unknown ids: named, with where to find the known ones.
    ("history no-such-run", 1, &["\"no-such-run\""]),
    ("backfill start bf-nope", 1, &["\"bf-nope\"", "backfill list"]),
    ("backfill status bf-nope", 1, &["\"bf-nope\""]),
    ("backfill pause bf-nope", 1, &["\"bf-nope\"", "backfill list"]),
    ("backfill resume bf-nope", 1, &["\"bf-nope\""]),
    ("backfill cancel bf-nope", 1, &["\"bf-nope\"", "backfill list"]),
    ("backfill compare bf-nope", 1, &["\"bf-nope\""]),
    ("backfill approve bf-nope --comparison 0123456789ab --as reviewer", 1, &["\"bf-nope\""]),
    ("backfill approve bf-nope", 2, &["--comparison"]),
    ("backfill publish bf-nope", 1, &["\"bf-nope\""]),
    ("backfill rollback bf-nope", 1, &["\"bf-nope\""]),
    ("read daily_stats --release rel-nope", 1, &["\"rel-nope\""]),
    ("rollback daily_stats --to-release rel-nope", 1, &["rel-nope"]),
    // Versions that do not exist.
    ("read daily_stats --version 999", 1, &["\"daily_stats\"", "999"]),
    ("rollback daily_stats --to-version 999", 1, &["\"daily_stats\"", "version 999", "current version"]),
    // Partitions that the dataset's partitioning cannot have: refused before anything is read or written.
    ("read events --partition 2024-13-01", 1, &["--partition 2024-13-01", "YYYY-MM-DD"]),
    ("read events --partition banana", 1, &["--partition banana"]),
    (
        "rollback events --partition banana --to-version 0",
        1,
        &["--partition banana", "YYYY-MM-DD", "nothing was restored"],
    ),
    // The workspace folder.
    ("-C /nonexistent validate", 1, &["/nonexistent", "tidegate.toml"]),
    ("-C /proc status", 1, &["/proc", "tidegate.toml"]),
    ("init .", 1, &["tidegate.toml", "already exist", "nothing was written"]),
    ("init /dev/null/ws", 1, &["/dev/null"]),
];

/// A statically partitioned workspace, for the partition keys of static partitions.
const STATIC_SPEC: &str = r#"
[project]
name = "regions"

[datasets.sales]
partitioning = { keys = ["eu", "us"] }
write = { mode = "replace" }

[tasks.sales]
command = ["sh", "-c", "printf 'n\n1\n' > \"$TIDEGATE_OUTPUT_DIR/sales.csv\""]
outputs = ["sales"]
"#;

const CLI_STATIC: &[CliCase] = &[
    ("plan sales --partition mars", 1, &["--partition mars", "\"mars\"", "eu, us"]),
    ("run sales --partition EU", 1, &["\"EU\"", "eu, us"]),
    ("plan sales --from eu --to us", 1, &["\"sales\"", "--partition", "--all"]),
    ("plan sales --all --partition eu", 2, &["--all", "--partition"]),
];

/// `tidegate validate` where `tidegate.toml` is no spec at all: its bytes, and what to name.
const BROKEN_SPEC_FILES: &[(&[u8], &[&str])] = &[
    (b"", &["tidegate.toml:1:1", "missing [project]"]),
    (b"\xff\xfe[project]\n", &["tidegate.toml", "valid UTF-8"]),
    (b"[project\n", &["tidegate.toml:1:9", "right bracket"]),
    (b"[project]\nname = \"x\"\nname = \"y\"\n", &["tidegate.toml:3:1", "\"name\" is set twice"]),
    (b"\0\0\0", &["tidegate.toml:1:1", "invalid TOML"]),
];

/// `tidegate status` in a workspace whose `[project]` names a store or lake that cannot be used:
/// the line, and what to name.
const BAD_PLACES: &[(&str, &[&str])] = &[
    ("state = \"mysql://x/y\"", &["mysql://x/y", "unknown scheme"]),
    ("state = \"postgres://postgres@127.0.0.1:1/test\"", &["127.0.0.1:1", "unreachable"]),
    ("lake = \"ftp://example/lake\"", &["ftp://example/lake", "unknown scheme"]),
];

/// Answers in workspaces whose spec file is broken or not a file, or names unusable places.
fn broken_workspaces() -> Vec<(String, Output, &'static [&'static str])> {
    let mut answers = Vec::new();
    for (bytes, says) in BROKEN_SPEC_FILES {
        let dir = TestWorkspace::new(bytes);
        answers.push((
            format!("validate with tidegate.toml = {:?}", String::from_utf8_lossy(bytes)),
            run(dir.path(), &["validate"]),
            *says,
        ));
    }
    for (line, says) in BAD_PLACES {
        let dir = TestWorkspace::new(format!("[project]\nname = \"places\"\n{line}\n{EXTRACT_SUMMARIZE}"));
        answers.push((format!("status with {line}"), run(dir.path(), &["status"]), *says));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("tidegate.toml")).expect("a folder named tidegate.toml");
    answers.push((
        "validate with a folder tidegate.toml".to_owned(),
        run(dir.path(), &["validate"]),
        &["tidegate.toml is not a file"],
    ));
    let dir = tempfile::tempdir().expect("temp dir");
    std::os::unix::fs::symlink(dir.path().join("gone.toml"), dir.path().join("tidegate.toml")).expect("symlink");
    answers.push((
        "validate with a dangling tidegate.toml link".to_owned(),
        run(dir.path(), &["validate"]),
        &["tidegate.toml is not a file"],
    ));
    answers
}

#[test]
fn bad_command_lines_are_answered_clearly() {
    let example = tempfile::tempdir().expect("temp dir");
    setup(example.path(), &["init", "."]);
    setup(example.path(), &["run", "daily_stats", "--partition", "2024-01-01"]);
    let regions = TestWorkspace::new(STATIC_SPEC);
    let nowhere = tempfile::tempdir().expect("temp dir");
    let no_workspace: &[CliCase] = &[
        ("status", 1, &["no tidegate.toml", "tidegate init"]),
        ("run daily_stats --partition 2024-01-01", 1, &["no tidegate.toml", "-C DIR"]),
    ];
    let mut failures = Vec::new();
    let mut n_cases = 0;
    for (dir, cases) in [(example.path(), CLI_EXAMPLE), (regions.path(), CLI_STATIC), (nowhere.path(), no_workspace)] {
        for (line, code, says) in cases {
            n_cases += 1;
            println!("tidegate {line}");
            let out = run(dir, &line.split_whitespace().collect::<Vec<_>>());
            if let Some(why) = unclear(out.status.code(), &printed(&out), *code, says) {
                failures.push(format!("tidegate {line}: {why}"));
            }
        }
    }
    for (what, out, says) in broken_workspaces() {
        n_cases += 1;
        println!("tidegate {what}");
        if let Some(why) = unclear(out.status.code(), &printed(&out), 1, says) {
            failures.push(format!("tidegate {what}: {why}"));
        }
    }
    assert_all_clear("command-line", n_cases, &failures);
}

// ---- 2. Task outputs --------------------------------------------------------------------------

/// A command task whose output each case writes with its own `case.sh` (run with `$OUT` set to
/// the output folder), retried up to 3 times were its failure transient; and `shapes`, another
/// dataset whose published Parquet files have the wrong columns for `rows`.
const OUTPUTS_SPEC: &str = r#"
[project]
name = "outputs"

[datasets.rows]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [
  { name = "id", type = "int64", nullable = false },
  { name = "name", type = "string" },
  { name = "amount", type = "float64" },
  { name = "day", type = "date" },
  { name = "ok", type = "bool" },
]

[tasks.produce]
command = ["sh", "-c", "OUT=\"$TIDEGATE_OUTPUT_DIR\" . ./case.sh"]
outputs = ["rows"]
retry = { attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }

[datasets.shapes]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "code", type = "string", nullable = false }, { name = "weight", type = "float64" }]

[tasks.shapes]
command = ["sh", "-c", "printf 'code,weight\nsq,1.5\n' > \"$TIDEGATE_OUTPUT_DIR/shapes.csv\""]
outputs = ["shapes"]
"#;

/// The script (a `case.sh` body) and what the step's error must name.
type OutputCase = (&'static str, &'static [&'static str]);

/// A published Parquet file of `shapes`, copied as the task's output.
const SHAPES_PARQUET: &str = "cp \"$(find .tidegate/lake/shapes -name '*.parquet' | head -n 1)\"";

const OUTPUTS: &[OutputCase] = &[
    // CSV rows that do not fit the declared columns.
    ("printf 'id,name,amount\\n1,a,2.5\\n2,b\\n' > \"$OUT/out.csv\"", &["out.csv", "line 3"]),
    ("printf 'id,name\\n1,a,extra\\n' > \"$OUT/out.csv\"", &["out.csv", "line 2"]),
    ("printf 'id,name\\nabc,a\\n' > \"$OUT/out.csv\"", &["out.csv", "line 2", "\"id\"", "abc"]),
    ("printf 'id,name\\n1.5,a\\n' > \"$OUT/out.csv\"", &["out.csv", "\"id\"", "1.5"]),
    ("printf 'id\\n99999999999999999999\\n' > \"$OUT/out.csv\"", &["out.csv", "\"id\"", "99999999999999999999"]),
    ("printf 'id,amount\\n1,lots\\n' > \"$OUT/out.csv\"", &["out.csv", "\"amount\"", "lots"]),
    ("printf 'id,day\\n1,2024-99-01\\n' > \"$OUT/out.csv\"", &["out.csv", "\"day\"", "2024-99-01"]),
    ("printf 'id,ok\\n1,true\\n2,maybe\\n' > \"$OUT/out.csv\"", &["out.csv", "line 3", "\"ok\"", "maybe"]),
    ("printf 'id,name\\n,a\\n' > \"$OUT/out.csv\"", &["out.csv", "\"id\"", "null"]),
    ("printf 'name\\na\\n' > \"$OUT/out.csv\"", &["out.csv", "\"id\"", "missing"]),
    ("printf 'id,colour\\n1,red\\n' > \"$OUT/out.csv\"", &["out.csv", "\"colour\"", "not in the dataset schema"]),
    ("printf 'id;name\\n1;a\\n' > \"$OUT/out.csv\"", &["out.csv", "id;name"]),
    ("printf 'id,id\\n1,2\\n' > \"$OUT/out.csv\"", &["out.csv", "\"id\"", "twice"]),
    ("printf 'id,nope\\n' > \"$OUT/out.csv\"", &["out.csv", "\"nope\"", "not in the dataset schema"]),
    ("printf 'id,name\\n1,\"unterminated\\n' > \"$OUT/out.csv\"", &["out.csv", "line 2", "quote"]),
    // Documented in docs/command-tasks.md: a CSV file has at least its header row.
    (": > \"$OUT/out.csv\"", &["out.csv", "empty", "header"]),
    // Bytes that are not text.
    ("printf 'id,name\\n1,\\377\\376\\n' > \"$OUT/out.csv\"", &["out.csv", "UTF-8"]),
    ("printf 'id\\n1\\0002\\n' > \"$OUT/out.csv\"", &["out.csv", "\"id\""]),
    ("head -c 64 /dev/zero > \"$OUT/out.csv\"", &["out.csv", "not in the dataset schema"]),
    // JSON lines.
    ("printf '{\"id\": 1\\n' > \"$OUT/out.jsonl\"", &["out.jsonl"]),
    ("printf '{\"id\": \"abc\"}\\n' > \"$OUT/out.jsonl\"", &["out.jsonl", "\"id\"", "abc"]),
    ("printf '[1, 2, 3]\\n' > \"$OUT/out.jsonl\"", &["out.jsonl"]),
    ("printf '[{\"id\": 1},\\n {\"id\": 2}]\\n' > \"$OUT/out.json\"", &["out.json"]),
    ("printf '{\"id\": null}\\n' > \"$OUT/out.jsonl\"", &["out.jsonl", "\"id\"", "null"]),
    ("printf '{\"id\": 1, \"name\": {\"first\": \"a\"}}\\n' > \"$OUT/out.jsonl\"", &["out.jsonl", "\"name\""]),
    ("printf '{\"id\": 1, \"extra\": true}\\n' > \"$OUT/out.ndjson\"", &["out.ndjson", "\"extra\""]),
    // Parquet.
    ("printf 'not parquet at all' > \"$OUT/out.parquet\"", &["out.parquet", "Parquet"]),
    ("printf 'id\\n1\\n' > \"$OUT/out.pq\"", &["out.pq", "Parquet"]),
    ("SHAPES \"$OUT/wrong.parquet\"", &["wrong.parquet", "\"code\""]),
    // A hidden file is ignored: only its first 200 bytes, cut.parquet, are the output.
    ("SHAPES \"$OUT/.whole\" && head -c 200 \"$OUT/.whole\" > \"$OUT/cut.parquet\"", &["cut.parquet"]),
    // Files that are not outputs.
    ("printf 'id\\n1\\n' > \"$OUT/out.txt\"", &["out.txt", "extension"]),
    ("printf 'id\\n1\\n' > \"$OUT/out\"", &["out", "extension"]),
    ("printf 'id\\n1\\n' > \"$OUT/a.csv\"; printf 'id\\nx\\n' > \"$OUT/b.csv\"", &["b.csv", "\"id\""]),
    // Rows for another partition.
    (
        "printf 'id,tg_partition\\n1,2023-05-05\\n' > \"$OUT/out.csv\"",
        &["out.csv", "line 2", "tg_partition \"2023-05-05\"", "this step writes only"],
    ),
    (
        "printf 'id,tg_partition\\n1,\\n' > \"$OUT/out.csv\"",
        &["out.csv", "tg_partition \"null\"", "this step writes only"],
    ),
];

/// The step's failure reasons (`attempt_failed` and `checks_failed` entries) for run `run_id`,
/// from the journal.
fn failure_reasons(dir: &Path, run_id: &str) -> Vec<String> {
    let out = run(dir, &["history", run_id, "--json"]);
    let history: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    history["happened"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "attempt_failed" || e["kind"] == "checks_failed")
        // A failed check's reason names the failing checks and their details, as `history` shows.
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Runs `target` for `partition` expecting a deterministic failure that publishes nothing, and
/// says what fell short: the run's exit status and report, the number of attempts, the table of
/// `dataset` (unchanged), and whether the journaled reason names all of `says`.
fn expect_failed_step(dir: &Path, target: &str, partition: &str, dataset: &str, says: &[&str]) -> Option<String> {
    let before = latest_version(&table(dir, dataset));
    let out = run(dir, &["run", target, "--partition", partition, "--only", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let mut problems = Vec::new();
    if report["summary"]["failed"] != 1 {
        problems.push(format!("the run did not fail one step: {}", printed(&out).trim()));
    }
    if report["summary"]["retried"] != 0 {
        problems.push(format!("retried {} times: the failure was not deterministic", report["summary"]["retried"]));
    }
    if latest_version(&table(dir, dataset)) != before {
        problems.push(format!("{dataset} moved from version {before}: something was published"));
    }
    let reasons = failure_reasons(dir, report["run_id"].as_str().unwrap_or_default());
    let reason = reasons.join(" | ");
    if let Some(why) = unclear(out.status.code(), &reason, 1, says) {
        problems.push(why);
    }
    if reasons.len() > 1 {
        problems.push(format!("{} attempts", reasons.len()));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

#[test]
fn malformed_task_outputs_fail_their_step_once_and_publish_nothing() {
    let dir = TestWorkspace::new(OUTPUTS_SPEC);
    let case_file = dir.path().join("case.sh");
    std::fs::write(&case_file, "printf 'id,name\\n1,a\\n' > \"$OUT/out.csv\"\n").expect("write case.sh");
    setup(dir.path(), &["run", "produce", "--partition", "2024-01-01"]);
    setup(dir.path(), &["run", "shapes", "--partition", "2024-01-01"]);
    let first = chrono::NaiveDate::from_ymd_opt(2024, 1, 2).expect("a date");
    let mut failures = Vec::new();
    for (i, (script, says)) in OUTPUTS.iter().enumerate() {
        let body = script.replace("SHAPES", SHAPES_PARQUET);
        std::fs::write(&case_file, format!("{body}\n")).expect("write case.sh");
        let partition = (first + chrono::Days::new(i as u64)).to_string();
        println!("{script}");
        if let Some(why) = expect_failed_step(dir.path(), "produce", &partition, "rows", says) {
            failures.push(format!("{script}\n    {why}"));
        }
    }
    assert_all_clear("task-output", OUTPUTS.len(), &failures);
}

/// Not a bad input (documented in docs/command-tasks.md): a task with nothing to publish for a
/// partition leaves no file, and the partition is published empty, replacing what it held.
#[test]
fn a_task_that_leaves_no_file_publishes_an_empty_partition() {
    let dir = TestWorkspace::new(OUTPUTS_SPEC);
    std::fs::write(dir.path().join("case.sh"), "printf 'id\\n1\\n' > \"$OUT/out.csv\"\n").expect("write case.sh");
    setup(dir.path(), &["run", "produce", "--partition", "2024-01-01"]);
    let before = latest_version(&table(dir.path(), "rows"));
    std::fs::write(dir.path().join("case.sh"), ": nothing to write\n").expect("write case.sh");
    setup(dir.path(), &["run", "produce", "--partition", "2024-01-01"]);
    assert_eq!(latest_version(&table(dir.path(), "rows")), before + 1, "one commit");
    let out = run(dir.path(), &["read", "rows", "--partition", "2024-01-01", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]", "{}", printed(&out));
}

// ---- 3. SQL -----------------------------------------------------------------------------------

/// `tidegate sql` queries over the published `raw` (id int64, day string) and `summary`, and what
/// the message must name.
const SQL_QUERIES: &[(&str, &[&str])] = &[
    ("SELEC * FROM raw", &["SELEC"]),
    ("SELECT * FROM", &["found: EOF"]),
    ("SELECT * FROM raw WHERE", &["found: EOF"]),
    ("SELECT (id FROM raw", &["Expected: )", "Column: 12"]),
    ("", &["No SQL statements"]),
    ("SELECT 1; SELECT 2", &["single"]),
    ("SELECT * FROM raww", &["no table \"raww\"", "did you mean \"raw\""]),
    ("SELECT SUM(day) FROM raw", &["sum", "query"]),
    ("SELECT * FROM nosuch.raw", &["nosuch"]),
    ("SELECT idd FROM raw", &["idd", "id"]),
    ("SELECT raw.nope FROM raw", &["nope"]),
    ("SELECT id FROM raw a JOIN raw b ON a.id = b.id", &["Ambiguous", "field id"]),
    ("SELECT day, COUNT(*) FROM raw", &["day", "GROUP BY"]),
    ("SELECT SUM(COUNT(*)) FROM raw", &["cannot be nested"]),
    ("SELECT * FROM raw WHERE COUNT(*) > 1", &["WHERE", "HAVING"]),
    ("SELECT frobnicate(id) FROM raw", &["frobnicate"]),
    ("SELECT substr() FROM raw", &["substr"]),
    ("SELECT id + 'abc' FROM raw", &["Int64 + Utf8"]),
    ("SELECT CAST(day AS INT) FROM raw", &["2024-01-01"]),
    ("SELECT id / 0 FROM raw", &["Divide by zero"]),
    ("SELECT id % 0 FROM raw", &["zero"]),
    ("SELECT * FROM raw WHERE id = 'one'", &["one"]),
    ("SELECT * FROM raw ORDER BY 7", &["7"]),
    ("SELECT * FROM raw UNION SELECT id FROM raw", &["UNION"]),
];

/// The pipeline the SQL corpus reads, with one more dataset a SQL task or a checked command task
/// writes; `{extra}` is replaced by each case's task or check.
fn sql_spec(extra: &str) -> String {
    format!("[project]\nname = \"sql_corpus\"\n{EXTRACT_SUMMARIZE}\n{extra}")
}

/// A SQL task writing `derived`, with the declared columns a query must produce. Each case is
/// another version of the task's code over the same published partition, so the dataset's
/// history is free to rewrite (decision 0020): the step runs and meets the query's problem.
fn sql_task(query: &str) -> String {
    format!(
        r#"
[datasets.derived]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
rewrites = "free"
columns = [{{ name = "day", type = "string", nullable = false }}, {{ name = "n", type = "int64", nullable = false }}]

[tasks.derive]
sql = {query:?}
inputs = ["raw"]
outputs = ["derived"]
retry = {{ attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }}
"#
    )
}

/// A command task writing `checked`, whose custom SQL check runs `query` over `staged`.
fn sql_check(query: &str) -> String {
    format!(
        r#"
[datasets.checked]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64", nullable = false }}, {{ name = "day", type = "string" }}]

[[datasets.checked.checks]]
name = "custom"
type = "sql"
query = {query:?}

[tasks.check_me]
command = ["sh", "-c", "printf 'id,day\n1,x\n' > \"$TIDEGATE_OUTPUT_DIR/checked.csv\""]
outputs = ["checked"]
retry = {{ attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }}
"#
    )
}

/// SQL task queries (over the input `raw`, for `derived`: day string, n int64, both not null).
const SQL_TASKS: &[(&str, &[&str])] = &[
    ("SELEC day, COUNT(*) AS n FROM raw GROUP BY day", &["SELEC"]),
    ("SELECT day, COUNT(*) AS n FROM raww GROUP BY day", &["no table \"raww\"", "did you mean \"raw\""]),
    ("SELECT day, COUNT(*) AS n FROM summary GROUP BY day", &["no table \"summary\"", "not one of the task's inputs"]),
    ("SELECT dya, COUNT(*) AS n FROM raw GROUP BY dya", &["dya"]),
    ("SELECT day, COUNT(*) AS n FROM raw", &["day", "GROUP BY"]),
    ("SELECT day, id / 0 AS n FROM raw", &["Divide by zero"]),
    ("SELECT day, COUNT(*) AS n, 1 AS extra FROM raw GROUP BY day", &["\"extra\"", "derived"]),
    ("SELECT COUNT(*) AS n FROM raw", &["\"day\"", "derived"]),
    ("SELECT day, day AS n FROM raw", &["\"n\"", "2024-01-01"]),
    ("SELECT day, CAST(NULL AS BIGINT) AS n FROM raw", &["\"n\"", "null"]),
    ("SELECT day, COUNT(*) AS n, '2023-05-05' AS tg_partition FROM raw GROUP BY day", &["tg_partition", "2023-05-05"]),
];

/// Custom SQL check queries over `staged` (id int64, day string).
const SQL_CHECKS: &[(&str, &[&str])] = &[
    ("SELEC * FROM staged", &["SELEC"]),
    ("SELECT * FROM stagd", &["stagd"]),
    ("SELECT * FROM staged WHERE idd < 0", &["idd"]),
    ("SELECT * FROM staged WHERE id / 0 > 1", &["Divide by zero"]),
    ("SELECT * FROM staged WHERE CAST(day AS INT) > 0", &["x"]),
    ("SELECT day FROM staged HAVING COUNT(*) > 1", &["day"]),
    ("SELECT * FROM staged WHERE", &["custom", "found: EOF"]),
    ("SELECT * FROM raw WHERE id < 0", &["custom", "no table \"raw\"", "staged"]),
    ("SELECT * FROM staged WHERE nosuchfn(id)", &["custom", "nosuchfn"]),
];

#[test]
fn bad_sql_is_answered_with_the_query_problem() {
    let dir = TestWorkspace::new(sql_spec(""));
    setup(dir.path(), &["run", "summarize", "--partition", "2024-01-01"]);
    let mut failures = Vec::new();
    for (query, says) in SQL_QUERIES {
        println!("tidegate sql {query:?}");
        let out = run(dir.path(), &["sql", query]);
        if let Some(why) = unclear(out.status.code(), &printed(&out), 1, says) {
            failures.push(format!("tidegate sql {query:?}: {why}"));
        }
    }
    // Publish each dataset once, so a case that published would move its table's version.
    dir.set_spec(sql_spec(&sql_task("SELECT day, COUNT(*) AS n FROM raw GROUP BY day")));
    setup(dir.path(), &["run", "derive", "--partition", "2024-01-01", "--only"]);
    dir.set_spec(sql_spec(&sql_check("SELECT * FROM staged WHERE id < 0")));
    setup(dir.path(), &["run", "check_me", "--partition", "2024-01-01", "--only"]);
    for (query, says) in SQL_TASKS {
        println!("SQL task {query:?}");
        dir.set_spec(sql_spec(&sql_task(query)));
        if let Some(why) = expect_failed_sql(dir.path(), "derive", "derived", says) {
            failures.push(format!("SQL task {query:?}: {why}"));
        }
    }
    for (query, says) in SQL_CHECKS {
        println!("SQL check {query:?}");
        dir.set_spec(sql_spec(&sql_check(query)));
        if let Some(why) = expect_failed_sql(dir.path(), "check_me", "checked", says) {
            failures.push(format!("SQL check {query:?}: {why}"));
        }
    }
    assert_all_clear("SQL", SQL_QUERIES.len() + SQL_TASKS.len() + SQL_CHECKS.len(), &failures);
}

/// A bad query in the spec may be refused when the spec loads (naming the file) or when the step
/// runs (failing it once, deterministically); either way nothing is published and the message
/// names the query's problem.
fn expect_failed_sql(dir: &Path, target: &str, dataset: &str, says: &[&str]) -> Option<String> {
    let validate = run(dir, &["validate"]);
    if validate.status.success() {
        return expect_failed_step(dir, target, "2024-01-01", dataset, says);
    }
    let before = latest_version(&table(dir, dataset));
    let out = run(dir, &["run", target, "--partition", "2024-01-01", "--only"]);
    let mut problems: Vec<String> = unclear(out.status.code(), &printed(&out), 1, says).into_iter().collect();
    problems.extend(unclear(validate.status.code(), &printed(&validate), 1, &["tidegate.toml"]));
    if latest_version(&table(dir, dataset)) != before {
        problems.push(format!("{dataset} moved from version {before}: something was published"));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// A step stopped by a check: the journal's reason for it, as `tidegate history` shows it, names
/// the blocking check that failed and why, not only how many failed.
#[test]
fn a_failed_check_is_named_in_the_journal_reason() {
    let dir = TestWorkspace::new(sql_spec(&sql_check("SELECT * FROM staged WHERE id > 0")));
    let out = run(dir.path(), &["run", "check_me", "--partition", "2024-01-01", "--only", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let run_id = report["run_id"].as_str().unwrap_or_default();
    let history: Value =
        serde_json::from_slice(&run(dir.path(), &["history", run_id, "--json"]).stdout).unwrap_or(Value::Null);
    let reasons: Vec<&str> = history["happened"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "checks_failed")
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        matches!(reasons.as_slice(), [r] if r.contains("custom") && r.contains("1 failing rows")),
        "one checks_failed entry naming the check and its detail, got {reasons:?} ({})",
        printed(&out)
    );
}

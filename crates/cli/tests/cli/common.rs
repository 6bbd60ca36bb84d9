//! Helpers shared by the CLI's integration tests: run the built binary on a workspace (a
//! `tidegate_testkit::TestWorkspace`) and read a Delta table's log directly, as an outside reader
//! would (the log readers live in `tidegate_testkit::delta`; the ones the tests use are re-exported
//! here).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub use tidegate_testkit::delta::{adds, commits_per_app_id, latest_version, release_of, staged_files};

/// The datasets and tasks of a two-step daily pipeline, to follow a `[project]` table: `extract`
/// writes two rows per day into `raw` with a command, `summarize` counts them into `summary` with SQL.
pub const EXTRACT_SUMMARIZE: &str = r#"
[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64", nullable = false }, { name = "day", type = "string" }]

[datasets.summary]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.extract]
command = ["sh", "-c", "printf 'id,day\n1,%s\n2,%s\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
"#;

/// A command running the built `tidegate` in `dir`.
pub fn tidegate(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidegate"));
    cmd.current_dir(dir).env_remove("TIDEGATE_TOKEN").env_remove("TIDEGATE_USER").env_remove("TIDEGATE_FAILPOINT");
    cmd
}

/// A command running the built `tidegate` in `dir` as a second person: the holder of `user`'s
/// approver token ([`token_of`]); `None` is the OS account running the tests (the workspace's admin).
pub fn tidegate_as(dir: &Path, user: Option<&str>) -> Command {
    let mut cmd = tidegate(dir);
    if let Some(user) = user {
        cmd.env("TIDEGATE_TOKEN", token_of(dir, user));
    }
    cmd
}

/// Runs `tidegate ARGS` and returns its stdout, failing the test if it does not succeed.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    let out = tidegate(dir).args(args).output().expect("runs");
    assert!(out.status.success(), "tidegate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs `tidegate ARGS` (which must print JSON) and returns its exit code and output.
pub fn json(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = tidegate(dir).args(args).output().expect("runs");
    let value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("tidegate {args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().expect("exited, not killed"), value)
}

/// Runs `tidegate ARGS` with a failpoint armed and asserts that the process aborted there.
pub fn abort_at(dir: &Path, failpoint: &str, args: &[&str]) -> Output {
    use std::os::unix::process::ExitStatusExt as _;
    let out = tidegate(dir).env("TIDEGATE_FAILPOINT", failpoint).args(args).output().expect("runs");
    assert_eq!(
        out.status.signal(),
        Some(SIGABRT),
        "{failpoint} should abort `tidegate {args:?}`; it exited with {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The signal `std::process::abort` raises.
const SIGABRT: i32 = 6;

/// The Delta table of `dataset` in the workspace's default lake.
pub fn table(dir: &Path, dataset: &str) -> PathBuf {
    dir.join(".tidegate/lake").join(dataset)
}

/// Sets `path`'s modification time an hour back: a file (or folder) some long-dead attempt left.
pub fn make_old(path: &Path) {
    // Opened read-only, so folders can be aged too (futimens needs ownership, not write access).
    let file = std::fs::File::open(path).expect("open to age");
    file.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3_600)).expect("set mtime");
}

/// `user`'s approver token for the workspace in `dir`, minted on first use.
pub fn token_of(dir: &Path, user: &str) -> String {
    let kept = dir.join(format!(".tidegate/test-token-{user}"));
    if let Ok(token) = std::fs::read_to_string(&kept) {
        return token;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .current_dir(dir)
        .env_remove("TIDEGATE_TOKEN")
        .args(["token", "create", "--name", user, "--role", "approver", "--json"])
        .output()
        .expect("tidegate runs");
    assert!(out.status.success(), "minting {user}'s token: {}", String::from_utf8_lossy(&out.stderr));
    let minted: Value = serde_json::from_slice(&out.stdout).expect("token JSON");
    let token = minted["token"].as_str().expect("token").to_owned();
    std::fs::write(&kept, &token).expect("keep the token");
    token
}

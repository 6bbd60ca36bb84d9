//! Helpers shared by the CLI's integration tests: run the built binary on a workspace (a
//! `tidegate_testkit::TestWorkspace`) and read a Delta table's log directly, as an outside reader
//! would (the log readers live in `tidegate_testkit::delta`; the ones the tests use are re-exported
//! here).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub(crate) use crate::backend;
pub use crate::backend::StateDb;

use tidegate_testkit::delta;

/// The newest version of the Delta table at `table` ([`table`]'s folder), read as it is now.
pub fn latest_version(table: &Path) -> u64 {
    delta::latest_version(&backend::fresh(table))
}

/// The `add` actions of `table`'s commit `version`, read as the table is now.
pub fn adds(table: &Path, version: u64) -> Vec<Value> {
    delta::adds(&backend::fresh(table), version)
}

/// The release id in `table`'s commit `version`, read as the table is now.
pub fn release_of(table: &Path, version: u64) -> String {
    delta::release_of(&backend::fresh(table), version)
}

/// How many commits of `table` carry each Tidegate step identity (`txn` appId), read as it is now.
pub fn commits_per_app_id(table: &Path) -> std::collections::BTreeMap<String, usize> {
    delta::commits_per_app_id(&backend::fresh(table))
}

/// The files under `table`'s staging area, read as the table is now.
pub fn staged_files(table: &Path) -> Vec<String> {
    delta::staged_files(&backend::fresh(table))
}

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

/// A command running the built `tidegate` in `dir`, on the workspace's state and lake
/// ([`crate::backend`]: the defaults, or PostgreSQL and S3 in the shared binary).
pub fn tidegate(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidegate"));
    cmd.current_dir(dir).env_remove("TIDEGATE_TOKEN").env_remove("TIDEGATE_USER").env_remove("TIDEGATE_FAILPOINT");
    cmd.envs(backend::env(dir));
    cmd
}

/// The processes whose command line holds `marker` (a number no other process uses), as
/// `pid: command line`. A killed process left as a zombie has none, and is not listed.
pub fn alive_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(marker) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// The workspace's state database, read and written past Tidegate.
pub fn state(dir: &Path) -> StateDb {
    backend::state(dir)
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

/// The Delta table of `dataset` in the workspace's lake, as a local folder (on S3, a fresh copy).
pub fn table(dir: &Path, dataset: &str) -> PathBuf {
    backend::table(dir, dataset)
}

/// The workspace's lake as a Python reader opens it: its folder, or its `s3://` URL.
pub fn lake(dir: &Path) -> String {
    backend::lake(dir)
}

/// Python that opens a lake given as a folder or an `s3://` URL (on the test S3 server the
/// `AWS_*` variables name): `Lake(root)` with `.table(name, version)`, `.exists(rel)` and
/// `.read_text(rel)`. Prepended to the tests' Python readers.
pub const PYTHON_LAKE: &str = r#"
import os
import pyarrow.fs as pafs
from deltalake import DeltaTable

class Lake:
    def __init__(self, root):
        self.root = root.rstrip("/")
        if root.startswith("s3://"):
            env = os.environ
            self.options = {k: env[k] for k in ["AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]}
            self.options["AWS_ALLOW_HTTP"] = "true"
            self.fs = pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], access_key=env["AWS_ACCESS_KEY_ID"],
                                        secret_key=env["AWS_SECRET_ACCESS_KEY"], region=env["AWS_REGION"])
            self.base = self.root[len("s3://"):]
        else:
            self.options, self.fs, self.base = None, pafs.LocalFileSystem(), self.root

    def table(self, name, version=None):
        return DeltaTable(f"{self.root}/{name}", version=version, storage_options=self.options)

    def exists(self, rel):
        return self.fs.get_file_info(f"{self.base}/{rel}").type != pafs.FileType.NotFound

    def read_text(self, rel):
        # One GET, as a consumer reads the pointer: pyarrow's S3 file asks the size first and then
        # reads that many bytes, so a pointer replaced in between reads as the new one cut short.
        if self.options is not None:
            import boto3
            bucket, _, prefix = self.base.partition("/")
            s3 = boto3.client("s3", endpoint_url=self.options["AWS_ENDPOINT_URL"], region_name=self.options["AWS_REGION"],
                              aws_access_key_id=self.options["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=self.options["AWS_SECRET_ACCESS_KEY"])
            return s3.get_object(Bucket=bucket, Key=f"{prefix}/{rel}".lstrip("/"))["Body"].read().decode()
        with self.fs.open_input_stream(f"{self.base}/{rel}") as f:
            return f.read().decode()
"#;

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
    let out = tidegate(dir)
        .args(["token", "create", "--name", user, "--role", "approver", "--json"])
        .output()
        .expect("tidegate runs");
    assert!(out.status.success(), "minting {user}'s token: {}", String::from_utf8_lossy(&out.stderr));
    let minted: Value = serde_json::from_slice(&out.stdout).expect("token JSON");
    let token = minted["token"].as_str().expect("token").to_owned();
    // On PostgreSQL and S3 the workspace has no `.tidegate/` of its own.
    std::fs::create_dir_all(dir.join(".tidegate")).expect("a folder to keep the token in");
    std::fs::write(&kept, &token).expect("keep the token");
    token
}

/// The hash of backfill `id`'s recorded comparison, as `backfill status --json` shows it to the
/// approver who names it (`backfill approve ID --comparison HASH`).
pub fn comparison_of(dir: &Path, id: &str) -> String {
    let out = tidegate(dir).args(["backfill", "status", id, "--json"]).output().expect("runs");
    let status: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("backfill status printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    status["comparison_hash"].as_str().unwrap_or_else(|| panic!("backfill {id} has no comparison: {status}")).to_owned()
}

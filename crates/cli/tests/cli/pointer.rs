//! Release-consistent reads (issue 21, item 4): a run that publishes two datasets commits them one
//! after the other, and a consumer reading the newest versions can see new features beside old
//! labels. The release pointer moves only once the run has succeeded; a reader no one here wrote
//! (Python `deltalake`) that reads every table at the versions the pointer names never sees a
//! mixture.

use std::process::{Command, Stdio};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{json, ok};

/// `featurize` writes one row holding the generation in `gen.txt`; `label` copies it with SQL.
/// Every run publishes `features`, then `labels`, in two commits.
const SPEC: &str = r#"
[project]
name = "pointer_test"

[datasets.features]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "gen", type = "int64" }]

[datasets.labels]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.featurize]
command = ["sh", "-c", "printf 'gen\n%s\n' \"$(cat gen.txt)\" > \"$TIDEGATE_OUTPUT_DIR/features.csv\""]
outputs = ["features"]

[tasks.label]
sql = "SELECT gen FROM features"
inputs = ["features"]
outputs = ["labels"]
"#;

const RELEASES: u32 = 100;

/// Reads both tables through the pointer until `stop` exists; prints the reads made, the
/// mixtures seen through the pointer, and (for contrast, not asserted) the mixtures seen by
/// reading each table's newest version.
const READER: &str = r#"
import json, os, sys, time

lake, stop = Lake(sys.argv[1]), sys.argv[2]
pointer_path = "_tidegate/releases/current.json"
reads, mixed, mixed_latest, errors = 0, [], 0, []
parent = os.getppid()

def gens(name, version=None):
    t = lake.table(name, version=version).to_pyarrow_table()
    return sorted(t.column("gen").to_pylist())

while not os.path.exists(stop) and len(mixed) < 20 and len(errors) < 20 and os.getppid() == parent:
    try:
        if lake.exists(pointer_path):
            pointer = json.loads(lake.read_text(pointer_path))
            tables = pointer["tables"]
            features, labels = gens("features", tables["features"]), gens("labels", tables["labels"])
            reads += 1
            if features != labels:
                mixed.append("pointer %d: features %s, labels %s" % (pointer["seq"], features, labels))
            if gens("features") != gens("labels"):
                mixed_latest += 1
    except Exception as e:
        errors.append(repr(e))
    time.sleep(0.01)
print(json.dumps({"reads": reads, "mixed": mixed, "mixed_latest": mixed_latest, "errors": errors}))
sys.stdout.flush()
os._exit(0)
"#;

#[test]
fn a_reader_through_the_pointer_never_sees_two_releases_mixed() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    let lake = crate::common::lake(ws);
    let stop = ws.join("reader.stop");
    let has_python =
        Command::new("python3").args(["-c", "import deltalake"]).output().is_ok_and(|o| o.status.success());
    let reader = if has_python {
        dir.write("reader.py", format!("{}{READER}", crate::common::PYTHON_LAKE));
        let reader = Command::new("python3")
            .arg(ws.join("reader.py"))
            .arg(&lake)
            .arg(&stop)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Python reader");
        Some(reader)
    } else {
        tidegate_testkit::service_missing("the pointer reader", "Python deltalake");
        None
    };
    // Each release is a process over PostgreSQL and S3 in the shared binary: fewer there.
    let releases = if crate::common::backend::is_shared() { 12 } else { RELEASES };
    for generation in 1..=releases {
        dir.write("gen.txt", generation.to_string());
        let (code, report) = json(ws, &["run", "label", "--partition", "2024-01-01", "--json"]);
        assert_eq!(code, 0, "release {generation}: {report}");
    }
    std::fs::write(&stop, "").expect("stop the reader");

    // The pointer names the last release whole, and `sql --release latest` reads through it.
    let (_, rows) = json(
        ws,
        &["sql", "SELECT f.gen AS f, l.gen AS l FROM features f CROSS JOIN labels l", "--release", "latest", "--json"],
    );
    assert_eq!(rows, serde_json::json!([{ "f": releases, "l": releases }]), "{rows}");
    let pointer: Value = serde_json::from_str(
        &crate::common::backend::lake_file(ws, "_tidegate/releases/current.json").expect("the pointer"),
    )
    .expect("pointer JSON");
    assert_eq!(pointer["seq"], releases, "one pointer per succeeded run: {pointer}");
    let read = ok(ws, &["read", "labels", "--release", "latest", "--json"]);
    assert!(read.contains(&format!("\"gen\":{releases}")), "{read}");

    if let Some(reader) = reader {
        let out = reader.wait_with_output().expect("the reader ends");
        let seen: Value = serde_json::from_slice(&out.stdout).expect("the reader's report");
        assert_eq!(seen["errors"], serde_json::json!([]), "{seen}");
        assert_eq!(seen["mixed"], serde_json::json!([]), "reads through the pointer saw a mixture: {seen}");
        assert!(seen["reads"].as_u64() > Some(releases.into()), "the reader read throughout: {seen}");
        println!("{seen}");
    }
}

//! Eight workers racing for one pool (issue 35): a scheduler (`serve --workers 0`) and eight
//! `tidegate worker`s with two slots each, on PostgreSQL and a lake folder they all see, run two
//! tasks that share a pool of three slots: one that succeeds and one whose every attempt fails
//! transiently. Sixteen free slots chase three.
//!
//! Each attempt's command writes when it began and ended (the machine's clock, which every
//! process here shares), and the test reads those intervals back with the worker that ran each
//! one from the store:
//!
//! - the pool's slots held: never more than three commands of the pool running at once, and
//!   three at once at some point (the pool was not starved either);
//! - each worker's slots held: never more than two at once on one worker, and the work spread
//!   over several workers;
//! - the retry budget held across workers: the failing task's retries stop at the pool's burst
//!   plus its ratio of first attempts, whichever worker ran them, and every failed step ends with
//!   a journaled retry denial;
//! - priorities held: a third task, scheduled daily and eight days behind, owes its newest day as
//!   live work and seven older ones as catch-up. The pool is paused until every step is ready, so
//!   all of them compete from the same instant; while steps of both classes waited, catch-up ran
//!   in exactly its guaranteed share (20% of three slots, rounded up: one), neither more nor
//!   starved, and live work in the rest;
//! - nothing ran or published twice: one attempt per succeeding step, one Delta commit per step
//!   identity.
//!
//! Needs `TIDEGATE_TEST_POSTGRES_URL`; without it the test says it was skipped (and fails under
//! CI). The fencing of a paused worker's late report is `fencing.rs` and `cluster.rs`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use tidegate_testkit::TestWorkspace;
use tidegate_testkit::store::PgSchema;

use crate::common::ok;
use crate::machines::{Process, wait_until};

const WORKERS: usize = 8;
const WORKER_SLOTS: usize = 2;
const POOL_SLOTS: usize = 3;
const SUCCEEDING: i64 = 12;
const FAILING: i64 = 10;
/// How many days the scheduled task is behind: the first is published by hand before the
/// scheduler starts, the newest is live work, the rest catch-up.
const BEHIND: i64 = 9;
/// Catch-up's guaranteed share of the pool: 20% of its slots, rounded up.
const CATCHUP_FLOOR: usize = 1;

fn spec(state: &str, lake: &Path, marks: &Path, behind_since: &str) -> String {
    let (lake, marks) = (lake.display(), marks.display());
    // Each command writes "<began ns> <ended ns>" to a file named after its task, partition and
    // attempt, so the intervals can be matched with the store's attempts.
    let mark = format!(r#"echo \"$s $(date +%s%N)\" > \"{marks}/$0.$TIDEGATE_PARTITION.$TIDEGATE_ATTEMPT\""#);
    format!(
        r#"
[project]
name = "pool_race"
state = "{state}"
lake = "{lake}"
lease_ttl_s = 10
heartbeat_s = 2

[pools.narrow]
slots = {POOL_SLOTS}
retry_budget_ratio = 0.1
retry_budget_burst = 1

[datasets.good]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[datasets.never]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.succeeds]
command = ["sh", "-c", "s=$(date +%s%N); sleep 0.4; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/good.csv\"; {mark}", "succeeds"]
outputs = ["good"]
pool = "narrow"

[datasets.late]
partitioning = {{ grain = "day", start = "{behind_since}" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.behind]
command = ["sh", "-c", "s=$(date +%s%N); sleep 0.4; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/late.csv\"; {mark}", "behind"]
outputs = ["late"]
pool = "narrow"
schedule = "@daily"
catchup = {{ enabled = true, max_active_runs = 20 }}

[tasks.fails]
command = ["sh", "-c", "s=$(date +%s%N); sleep 0.2; {mark}; exit 75", "fails"]
outputs = ["never"]
pool = "narrow"
retry = {{ attempts = 5, backoff_base_ms = 10, backoff_max_ms = 20 }}
"#
    )
}

/// One command's run: when it began and ended (ns since the epoch) and the worker it ran on.
#[derive(Debug, Clone)]
struct Ran {
    began: i128,
    ended: i128,
    worker: String,
    /// When the scheduler claimed the attempt (ms precision, at or before the claim).
    claimed: i128,
    /// The class of the step's run: `live` or `catchup`.
    class: String,
}

fn now_ns() -> i128 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    i128::try_from(since.as_nanos()).expect("in range")
}

/// The most intervals open at one instant.
fn most_at_once<'a>(runs: impl Iterator<Item = &'a Ran>) -> usize {
    let mut edges: Vec<(i128, i32)> = runs.flat_map(|r| [(r.began, 1), (r.ended, -1)]).collect();
    // At equal instants an end comes before a beginning: touching intervals do not overlap.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, delta) in edges {
        open += delta;
        most = most.max(open);
    }
    usize::try_from(most).expect("never negative")
}

#[test]
fn eight_workers_racing_for_one_pool_hold_its_slots_priorities_and_retry_budget() {
    let Some(schema) = PgSchema::create() else { return };
    let shared = tempfile::tempdir().expect("a folder every process sees");
    let (lake, marks, logs) = (shared.path().join("lake"), shared.path().join("marks"), shared.path().join("logs"));
    for dir in [&marks, &logs] {
        std::fs::create_dir_all(dir).expect("a folder");
    }
    let behind_since = (chrono::Utc::now().date_naive() - chrono::Days::new(BEHIND as u64)).to_string();
    let text = spec(&schema.url, &lake, &marks, &behind_since);
    let scheduler = TestWorkspace::new(&text);
    let desk = TestWorkspace::new(&text);
    // The scheduled task's first day published by hand: a tick owes the days since the newest
    // published one (never a task's whole history on its first tick).
    ok(desk.path(), &["run", "behind", "--partition", &behind_since]);
    for mark in std::fs::read_dir(&marks).expect("marks") {
        std::fs::remove_file(mark.expect("a mark").path()).expect("removing the first day's mark");
    }
    // Nothing of the pool starts until every step is ready.
    ok(desk.path(), &["pause", "pool:narrow", "--reason", "every step ready first"]);
    let mut db = schema.client();
    let count = |db: &mut postgres::Client, sql: &str| db.query_one(sql, &[]).map_or(-1, |r| r.get::<_, i64>(0));

    let spawn = |dir: &Path, name: &str, args: &[&str]| {
        let log = std::fs::File::create(logs.join(format!("{name}.log"))).expect("a log file");
        let child = crate::common::tidegate(dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn");
        Process(Some(child))
    };
    let serve = spawn(scheduler.path(), "serve", &["serve", "--workers", "0", "--tick-every-s", "30"]);
    let machines: Vec<TestWorkspace> = (0..WORKERS).map(|_| TestWorkspace::new(&text)).collect();
    let workers: Vec<(String, Process)> = machines
        .iter()
        .enumerate()
        .map(|(i, ws)| {
            let name = format!("w{i}");
            let work = ws.path().join("work");
            let slots = WORKER_SLOTS.to_string();
            let args = ["worker", "--name", &name, "--slots", &slots, "--work-dir", work.to_str().expect("utf-8")];
            let process = spawn(ws.path(), &name, &args);
            (name, process)
        })
        .collect();
    wait_until("every worker registers", Duration::from_secs(60), || {
        count(&mut db, "SELECT COUNT(*) FROM workers") == WORKERS as i64
    });

    // Two live runs, and the scheduled task's live day and catch-up days from the first tick:
    // 31 steps ready for a pool of three slots, then the pool resumes.
    let all = SUCCEEDING + FAILING + (BEHIND - 1);
    ok(desk.path(), &["submit", "succeeds", "--from", "2024-01-01", "--to", &format!("2024-01-{SUCCEEDING:02}")]);
    ok(desk.path(), &["submit", "fails", "--from", "2024-01-01", "--to", &format!("2024-01-{FAILING:02}")]);
    wait_until("every step is ready", Duration::from_secs(60), || {
        count(&mut db, "SELECT COUNT(*) FROM steps WHERE status = 'ready'") == all
    });
    let resumed_ns = now_ns();
    ok(desk.path(), &["resume", "pool:narrow", "--reason", "every step is ready"]);
    wait_until("every step ends", Duration::from_secs(120), || {
        // With the first day, published by hand.
        count(&mut db, "SELECT COUNT(*) FROM steps WHERE status IN ('published', 'failed')") == all + 1
    });

    // Each command's interval, with the worker the store says ran that attempt, and the
    // attempt's claim (ms) and class.
    let mut ran_on: HashMap<(String, String, i64), (String, i128, String)> = HashMap::new();
    for row in db
        .query(
            "SELECT s.task, s.partition_key, a.attempt, a.worker, a.started_at, r.priority \
             FROM attempts a JOIN steps s ON s.id = a.step_id JOIN runs r ON r.id = s.run_id",
            &[],
        )
        .expect("attempts")
    {
        let claimed: String = row.get(4);
        let claimed = chrono::DateTime::parse_from_rfc3339(&claimed).expect("a timestamp");
        let claimed_ns = i128::from(claimed.timestamp_nanos_opt().expect("in range"));
        ran_on.insert((row.get(0), row.get(1), row.get(2)), (row.get(3), claimed_ns, row.get(5)));
    }
    ran_on.remove(&("behind".to_owned(), behind_since.clone(), 1)).expect("the first day's attempt, by hand");
    let mut runs: BTreeMap<(String, String, i64), Ran> = BTreeMap::new();
    for entry in std::fs::read_dir(&marks).expect("marks") {
        let entry = entry.expect("a mark");
        let name = entry.file_name().to_string_lossy().into_owned();
        let [task, partition, attempt] = name.splitn(3, '.').collect::<Vec<_>>()[..] else {
            panic!("a mark named {name}")
        };
        let key = (task.to_owned(), partition.to_owned(), attempt.parse::<i64>().expect("an attempt number"));
        let text = std::fs::read_to_string(entry.path()).expect("a mark's text");
        let [began, ended] = text.split_whitespace().map(|n| n.parse::<i128>().expect("ns")).collect::<Vec<_>>()[..]
        else {
            panic!("{name}: {text}")
        };
        let (worker, claimed, class) =
            ran_on.get(&key).unwrap_or_else(|| panic!("{key:?} ran with no attempt in the store")).clone();
        assert!(began >= resumed_ns, "{key:?} began before the pool resumed");
        runs.insert(key, Ran { began, ended, worker, claimed, class });
    }
    assert_eq!(runs.len(), ran_on.len(), "every attempt's command ran once, and no command ran without an attempt");

    // The pool's three slots, across eight workers.
    let pool_most = most_at_once(runs.values());
    assert_eq!(pool_most, POOL_SLOTS, "the most commands of the pool running at once");
    // Each worker's two slots, and the work spread over the workers.
    let mut per_worker: BTreeMap<&str, Vec<&Ran>> = BTreeMap::new();
    for r in runs.values() {
        per_worker.entry(&r.worker).or_default().push(r);
    }
    for (worker, its) in &per_worker {
        let most = most_at_once(its.iter().copied());
        assert!(most <= WORKER_SLOTS, "{worker} ran {most} at once with {WORKER_SLOTS} slots");
    }
    assert!(per_worker.len() >= POOL_SLOTS, "attempts on {} workers only: {:?}", per_worker.len(), per_worker.keys());

    // Priorities: while both live and catch-up steps waited (until the last claim of either
    // class), catch-up ran in exactly its share of the pool, and live work had the rest.
    let last_claim = |class: &str| {
        runs.iter()
            .filter(|((_, _, attempt), r)| r.class == class && *attempt == 1)
            .map(|(_, r)| r.claimed)
            .max()
            .unwrap_or_else(|| panic!("no {class} attempt"))
    };
    let both_waited_until = last_claim("live").min(last_claim("catchup"));
    let during = |class: &str| -> Vec<Ran> {
        runs.values()
            .filter(|r| r.class == class && r.began < both_waited_until)
            .map(|r| Ran { ended: r.ended.min(both_waited_until), ..r.clone() })
            .collect()
    };
    let (catchup, live) = (during("catchup"), during("live"));
    assert_eq!(runs.values().filter(|r| r.class == "catchup").count() as i64, BEHIND - 2, "the catch-up days");
    assert_eq!(most_at_once(catchup.iter()), CATCHUP_FLOOR, "catch-up at once while live work waited: {catchup:?}");
    assert_eq!(most_at_once(live.iter()), POOL_SLOTS - CATCHUP_FLOOR, "live work at once beside it: {live:?}");

    // The retry budget, whichever workers ran the retries: burst 1 plus 10% of 10 first attempts.
    let firsts = runs.keys().filter(|(task, _, attempt)| task == "fails" && *attempt == 1).count();
    let retries = runs.keys().filter(|(task, _, attempt)| task == "fails" && *attempt > 1).count();
    assert_eq!(firsts, FAILING as usize);
    assert!((1..=2).contains(&retries), "{retries} retries of {firsts} failing steps");
    // Read from the table: an entry joins the chain right after the commit that changed its step
    // (decision 0024), so the steps' last change may be seen a moment before it.
    let denied = "SELECT COUNT(*) FROM journal WHERE kind = 'retry_denied'";
    wait_until("every denied retry is journaled", Duration::from_secs(10), || count(&mut db, denied) >= FAILING);
    assert_eq!(count(&mut db, denied), FAILING);

    // Nothing twice: one attempt per succeeding step and one Delta commit per step identity.
    let succeeded: Vec<_> = runs.keys().filter(|(task, _, _)| task == "succeeds").collect();
    assert_eq!(succeeded.len() as i64, SUCCEEDING, "{succeeded:?}");
    assert!(succeeded.iter().all(|(_, _, attempt)| *attempt == 1));
    let mut commits_per_app: HashMap<String, usize> = HashMap::new();
    for entry in std::fs::read_dir(lake.join("good/_delta_log")).expect("the table's log") {
        let path = entry.expect("a log file").path();
        if path.extension().is_some_and(|e| e == "json") {
            for line in std::fs::read_to_string(&path).expect("a commit").lines() {
                let action: serde_json::Value = serde_json::from_str(line).expect("an action");
                if let Some(app) = action["txn"]["appId"].as_str() {
                    *commits_per_app.entry(app.to_owned()).or_default() += 1;
                }
            }
        }
    }
    assert_eq!(commits_per_app.len() as i64, SUCCEEDING, "{commits_per_app:?}");
    assert!(commits_per_app.values().all(|n| *n == 1), "a step published twice: {commits_per_app:?}");

    for (name, process) in workers.into_iter().chain([("serve".to_owned(), serve)]) {
        let status = process.terminate();
        let log = std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default();
        assert!(status.success() && log.contains("stopped cleanly"), "{name}: {status:?}\n{log}");
    }
}

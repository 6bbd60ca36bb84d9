//! Tamper evidence that sees tampering: every Delta commit carries the journal's head, so a
//! journal truncated, rewritten with a recomputed chain, or lost with its store is caught by
//! comparing with the lake.

use std::path::Path;
use std::process::Output;

use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, ok, tidegate};

fn run(dir: &Path, args: &[&str]) -> Output {
    tidegate(dir).args(args).output().expect("tidegate runs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A workspace with three published days.
fn published() -> TestWorkspace {
    let dir = TestWorkspace::new(format!("[project]\nname = \"anchors\"\n{EXTRACT_SUMMARIZE}"));
    ok(dir.path(), &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-03"]);
    assert_eq!(run(dir.path(), &["history"]).status.code(), Some(0), "an untouched journal verifies");
    dir
}

fn db(ws: &Path) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(ws.join(".tidegate/state.db")).expect("open store");
    db.execute_batch("DROP TRIGGER journal_no_update; DROP TRIGGER journal_no_delete;").expect("drop triggers");
    db
}

fn n_entries(db: &rusqlite::Connection) -> i64 {
    db.query_row("SELECT MAX(seq) FROM journal", [], |r| r.get(0)).expect("count")
}

#[test]
fn a_journal_missing_its_last_entries_is_caught_by_the_lake() {
    let dir = published();
    let ws = dir.path();
    {
        let db = db(ws);
        // The newest publications and everything after them: the chain that remains is intact.
        let last_published: i64 = db
            .query_row("SELECT MAX(seq) FROM journal WHERE kind = 'published'", [], |r| r.get(0))
            .expect("a publication");
        let n = n_entries(&db);
        db.execute("DELETE FROM journal WHERE seq >= ?1", [last_published - 3]).expect("truncate");
        assert!(n_entries(&db) < n);
    }
    let out = run(ws, &["history"]);
    assert_eq!(out.status.code(), Some(2), "a truncated journal passed: {}", text(&out));
    assert!(text(&out).contains("were removed"), "{}", text(&out));
    let json = run(ws, &["history", "--json"]);
    assert_eq!(json.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert!(!report["anchors"].as_array().expect("anchors").is_empty(), "{report}");
    // The commands that delete files on the store's word refuse, naming the mismatch.
    let files_before = count_files(&ws.join(".tidegate/lake"));
    for args in [&["reconcile"][..], &["vacuum", "--retain-releases", "1"][..]] {
        let out = run(ws, args);
        assert!(!out.status.success(), "{args:?} ran on a journal the lake contradicts: {}", text(&out));
        assert!(text(&out).contains("deletes nothing while the journal does not match the lake"), "{}", text(&out));
    }
    assert_eq!(count_files(&ws.join(".tidegate/lake")), files_before, "nothing was deleted");
}

/// The entries after the newest commit (the run's end) are outside every table's anchor; the
/// journal's head, written to the lake when the run ended, vouches for them: removing only them
/// is caught too.
#[test]
fn a_journal_missing_only_what_followed_the_last_commit_is_caught_by_the_head_anchor() {
    let dir = published();
    let ws = dir.path();
    {
        let db = db(ws);
        let last_release: i64 = db
            .query_row("SELECT MAX(seq) FROM journal WHERE kind = 'release_published'", [], |r| r.get(0))
            .expect("a release");
        let after: Vec<String> = db
            .prepare("SELECT kind FROM journal WHERE seq > ?1 ORDER BY seq")
            .expect("prepare")
            .query_map([last_release], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("kinds");
        assert!(after.contains(&"run_status".to_owned()), "the run's end follows its last release: {after:?}");
        db.execute("DELETE FROM journal WHERE seq > ?1", [last_release]).expect("truncate");
    }
    let out = run(ws, &["history"]);
    assert_eq!(out.status.code(), Some(2), "a journal missing the run's end passed: {}", text(&out));
    assert!(text(&out).contains("_tidegate/journal/anchors.json") && text(&out).contains("removed"), "{}", text(&out));
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("folder")
        .flatten()
        .map(|e| if e.path().is_dir() { count_files(&e.path()) } else { 1 })
        .sum()
}

#[test]
fn a_rewritten_journal_with_a_recomputed_chain_is_caught_by_the_lake() {
    let dir = published();
    let ws = dir.path();
    let cut = {
        let db = db(ws);
        let cut = n_entries(&db) / 2;
        db.execute("DELETE FROM journal WHERE seq > ?1", [cut]).expect("cut");
        cut
    };
    // The forger appends new entries through the store itself: the chain is recomputed and
    // verifies, and the journal is as long as before.
    let store = tidegate_store::open(&ws.join(".tidegate/state.db").display().to_string()).expect("store");
    let head = store.journal_head().expect("head").expect("entries");
    assert_eq!(head.seq, u64::try_from(cut).expect("positive"));
    for i in 0..200 {
        let meta = tidegate_store::JournalMeta {
            via: None,
            actor: "forger".into(),
            correlation_id: "forged".into(),
            reason: format!("nothing happened {i}"),
            at: chrono::Utc::now(),
        };
        let decision = tidegate_store::Decision {
            kind: "note".into(),
            run_id: None,
            task: None,
            partition: None,
            payload: serde_json::json!({}),
        };
        store.record_decision(&decision, &meta).expect("append");
    }
    assert!(store.verify_journal().expect("verify").break_at.is_none(), "the forged chain verifies on its own");
    let out = run(ws, &["history"]);
    assert_eq!(out.status.code(), Some(2), "a rewritten journal passed: {}", text(&out));
    assert!(text(&out).contains("rewritten"), "{}", text(&out));
}

#[test]
fn an_emptied_store_beside_a_lake_of_releases_is_refused_not_recreated() {
    let dir = published();
    let ws = dir.path();
    let db = ws.join(".tidegate/state.db");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    std::fs::write(&db, b"").expect("truncate the store");
    let log_before = std::fs::read_dir(ws.join(".tidegate/lake/summary/_delta_log")).expect("log").count();
    for args in [&["status"][..], &["history"][..], &["run", "summarize", "--partition", "2024-01-04"][..]] {
        let out = run(ws, args);
        assert!(!out.status.success(), "{args:?} ran on an emptied store: {}", text(&out));
        assert!(text(&out).contains("holds no journal"), "{args:?}: {}", text(&out));
    }
    let log_after = std::fs::read_dir(ws.join(".tidegate/lake/summary/_delta_log")).expect("log").count();
    assert_eq!(log_before, log_after, "nothing was published beside the emptied store");
}

/// A lake with no table published yet still vouches for the journal its runs left (their head,
/// written when they ended): an emptied store beside it is refused too, not silently recreated.
#[test]
fn an_emptied_store_beside_a_lake_that_vouches_only_for_failed_runs_is_refused() {
    let spec = "[project]\nname = \"anchors\"\n\n[datasets.raw]\npartitioning = { grain = \"day\", start = \"2024-01-01\" }\n\
                write = { mode = \"replace\" }\n\n[tasks.extract]\ncommand = [\"sh\", \"-c\", \"echo the feed is down >&2; exit 3\"]\n\
                outputs = [\"raw\"]\nretry = { attempts = 1 }\n";
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let failed = run(ws, &["run", "extract", "--partition", "2024-01-01"]);
    assert_eq!(failed.status.code(), Some(1), "the run fails: {}", text(&failed));
    assert!(!ws.join(".tidegate/lake/raw/_delta_log").exists(), "nothing was published");
    let db = ws.join(".tidegate/state.db");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    std::fs::write(&db, b"").expect("truncate the store");
    let out = run(ws, &["status"]);
    assert!(!out.status.success(), "status ran on an emptied store: {}", text(&out));
    assert!(
        text(&out).contains("holds no journal") && text(&out).contains("_tidegate/journal/anchors.json"),
        "{}",
        text(&out)
    );
}

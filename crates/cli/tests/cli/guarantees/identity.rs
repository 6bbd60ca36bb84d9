//! Reviews that are real: the approver is established (the OS account running the command, or
//! the holder of a token an admin minted), never typed, and compared with the requester as people
//! compare names.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, comparison_of, ok, tidegate};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A workspace with a published day and a backfill of it, staged and compared, awaiting approval.
/// Returns the folder and the backfill's id.
fn staged_backfill() -> (TestWorkspace, String) {
    let dir = TestWorkspace::new(format!("[project]\nname = \"identity\"\n{EXTRACT_SUMMARIZE}"));
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--partition", "2024-01-01"]);
    let plan = ok(
        ws,
        &[
            "backfill",
            "plan",
            "summarize",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-01",
            "--reprocess",
            "all",
            "--reason",
            "recount",
            "--json",
        ],
    );
    let id = serde_json::from_str::<Value>(&plan).expect("plan JSON")["id"].as_str().expect("id").to_owned();
    ok(ws, &["backfill", "start", &id]);
    ok(ws, &["backfill", "compare", &id]);
    (dir, id)
}

/// Mints a token (as the OS account, the workspace's admin) and returns it.
fn mint(ws: &Path, name: &str, role: &str) -> (String, String) {
    let out = ok(ws, &["token", "create", "--name", name, "--role", role, "--json"]);
    let minted: Value = serde_json::from_str(&out).expect("token JSON");
    (minted["token"].as_str().expect("token").to_owned(), minted["id"].as_str().expect("id").to_owned())
}

fn approve_with(ws: &Path, id: &str, token: Option<&str>, extra: &[&str]) -> Output {
    let mut cmd = tidegate(ws);
    if let Some(token) = token {
        cmd.env("TIDEGATE_TOKEN", token);
    }
    cmd.args(["backfill", "approve", id, "--comparison", &comparison_of(ws, id)])
        .args(extra)
        .output()
        .expect("tidegate runs")
}

fn requester(ws: &Path, id: &str) -> String {
    let status: Value = serde_json::from_str(&ok(ws, &["backfill", "status", id, "--json"])).expect("status JSON");
    status["requester"].as_str().expect("requester").to_owned()
}

fn status(ws: &Path, id: &str) -> String {
    let status: Value = serde_json::from_str(&ok(ws, &["backfill", "status", id, "--json"])).expect("status JSON");
    status["status"].as_str().expect("status").to_owned()
}

#[test]
fn a_typed_name_or_variable_does_not_make_the_requester_someone_else() {
    let (dir, id) = staged_backfill();
    let ws = dir.path();
    let me = requester(ws, &id);
    assert_ne!(me, "unknown");
    // The flag that once named the approver.
    let out = approve_with(ws, &id, None, &["--as", "bob"]);
    assert!(!out.status.success(), "--as bob approved the requester's own backfill");
    assert!(stderr(&out).contains("--as"), "{}", stderr(&out));
    // The variable that once named the actor.
    let out = tidegate(ws)
        .env("TIDEGATE_USER", "bob")
        .args(["backfill", "approve", &id, "--comparison", &comparison_of(ws, &id)])
        .output()
        .expect("runs");
    assert!(!out.status.success(), "TIDEGATE_USER=bob approved the requester's own backfill");
    assert!(stderr(&out).contains("cannot also approve"), "{}", stderr(&out));
    assert_eq!(status(ws, &id), "staged");
}

/// The requester's name with every Latin letter that has a Cyrillic twin replaced by it.
fn lookalike(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a' => 'а',
            'o' => 'о',
            'e' => 'е',
            'c' => 'с',
            'p' => 'р',
            'x' => 'х',
            other => other,
        })
        .collect()
}

#[test]
fn a_token_under_another_spelling_of_the_requesters_name_cannot_approve() {
    for spelling in [str::to_uppercase as fn(&str) -> String, lookalike, |n: &str| format!(" {n} ")] {
        let (dir, id) = staged_backfill();
        let ws = dir.path();
        let me = requester(ws, &id);
        let name = spelling(&me);
        let (token, _) = mint(ws, &name, "approver");
        let out = approve_with(ws, &id, Some(&token), &[]);
        assert!(!out.status.success(), "{name:?} approved {me:?}'s backfill");
        assert!(stderr(&out).contains("cannot also approve"), "{name:?}: {}", stderr(&out));
        assert_eq!(status(ws, &id), "staged");
    }
}

#[test]
fn one_person_cannot_hold_two_spellings_of_a_name() {
    let dir = TestWorkspace::new(format!("[project]\nname = \"identity\"\n{EXTRACT_SUMMARIZE}"));
    let ws = dir.path();
    mint(ws, "bob", "approver");
    for other in ["Bob", "b\u{043E}b", "ｂｏｂ"] {
        let out = tidegate(ws).args(["token", "create", "--name", other, "--role", "approver"]).output().expect("runs");
        assert!(!out.status.success(), "{other:?} minted beside bob");
        assert!(stderr(&out).contains("reads the same as the existing identity \"bob\""), "{}", stderr(&out));
    }
}

#[test]
fn only_a_valid_approver_token_of_another_person_approves() {
    let (dir, id) = staged_backfill();
    let ws = dir.path();
    let (viewer, _) = mint(ws, "vera", "viewer");
    let out = approve_with(ws, &id, Some(&viewer), &[]);
    assert!(!out.status.success(), "a viewer approved");
    assert!(stderr(&out).contains("approver role"), "{}", stderr(&out));
    let (revoked, revoked_id) = mint(ws, "rita", "approver");
    ok(ws, &["token", "revoke", &revoked_id]);
    let out = approve_with(ws, &id, Some(&revoked), &[]);
    assert!(!out.status.success(), "a revoked token approved");
    assert!(stderr(&out).contains("revoked"), "{}", stderr(&out));
    let out = approve_with(ws, &id, Some("tgt_not-a-token"), &[]);
    assert!(!out.status.success(), "an unknown token approved");
    assert_eq!(status(ws, &id), "staged");
    let (bo, bo_id) = mint(ws, "bo", "approver");
    let out = approve_with(ws, &id, Some(&bo), &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let approved: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(approved["approval"]["by"], "bo");
    let how = approved["approval"]["authenticated_as"].as_str().expect("how");
    assert!(how.contains(&bo_id), "the approval says how bo was established: {how}");
    // The journal names the approver and how they were established; it never holds the token.
    let history = ok(ws, &["history", "--json"]);
    assert!(history.contains(&bo_id), "approval journaled with the token id");
    assert!(!history.contains(&bo), "a token reached the journal");
}

#[test]
fn without_user_variables_the_requester_is_the_os_account_not_unknown() {
    let dir = TestWorkspace::new(format!("[project]\nname = \"identity\"\n{EXTRACT_SUMMARIZE}"));
    let ws = dir.path();
    let out = tidegate(ws)
        .env_remove("TIDEGATE_USER")
        .env_remove("USER")
        .env_remove("USERNAME")
        .env_remove("LOGNAME")
        .args(["submit", "extract", "--partition", "2024-01-01", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let submitted: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let who = submitted["run"]["request"]["requester"].as_str().expect("requester");
    assert!(!who.is_empty() && who != "unknown", "requester {who:?}");
}

//! Every command is refused to a token whose role is below what its operation needs, and allowed
//! at that role: the application layer checks each operation's access itself
//! (`tidegate_app::actor::Access`), so no front end can forget a role.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, ok, tidegate};

/// Mints a token (as the OS account, the workspace's admin) for `role`.
fn token(ws: &Path, role: &str) -> String {
    let out = ok(ws, &["token", "create", "--name", &format!("{role}-person"), "--role", role, "--json"]);
    serde_json::from_str::<Value>(&out).expect("token JSON")["token"].as_str().expect("token").to_owned()
}

/// Runs `tidegate ARGS` with `token`; returns whether it succeeded and its stderr.
fn with_token(ws: &Path, token: &str, args: &[&str]) -> (bool, String) {
    let out = tidegate(ws).env("TIDEGATE_TOKEN", token).args(args).output().expect("tidegate runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn each_command_needs_exactly_its_operations_role() {
    let dir = TestWorkspace::new(format!("[project]\nname = \"roles\"\n{EXTRACT_SUMMARIZE}"));
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--partition", "2024-01-01"]);
    let viewer = token(ws, "viewer");
    let operator = token(ws, "operator");
    let approver = token(ws, "approver");

    // (command, the least role allowed to run it, what the refusal says is asked)
    let day = ["--partition", "2024-01-02"];
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (vec!["status"], "viewer", "read"),
        (vec!["history", "--limit", "3"], "viewer", "read"),
        (vec!["read", "summary"], "viewer", "read"),
        (vec!["sql", "SELECT COUNT(*) FROM summary"], "viewer", "read"),
        (vec!["backfill", "list"], "viewer", "read backfills"),
        ([&["run", "extract"][..], &day].concat(), "operator", "run work"),
        ([&["submit", "extract"][..], &day].concat(), "operator", "run work"),
        (vec!["tick", "--dry-run"], "operator", "run work"),
        (vec!["vacuum", "--dry-run"], "operator", "change published tables"),
        (vec!["reconcile"], "operator", "change published tables"),
        (
            vec![
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
                "roles",
            ],
            "operator",
            "change a backfill",
        ),
        (vec!["token", "list"], "admin", "manage tokens"),
    ];
    let below = |role: &str| -> Vec<(&str, &String)> {
        let ranked = [("viewer", &viewer), ("operator", &operator), ("approver", &approver)];
        let rank = ["viewer", "operator", "approver", "admin"].iter().position(|r| *r == role).expect("a role");
        ranked.into_iter().take(rank).collect()
    };
    for (args, least, what) in &cases {
        for (role, token) in below(least) {
            let (allowed, stderr) = with_token(ws, token, args);
            assert!(!allowed, "a {role} token ran `tidegate {}`", args.join(" "));
            assert!(
                stderr.contains(&format!("may not {what}: that needs the {least} role")),
                "`tidegate {}` as {role}: {stderr}",
                args.join(" ")
            );
        }
        let at_least = match *least {
            "viewer" => Some(&viewer),
            "operator" => Some(&operator),
            _ => None, // admin: the OS account, which runs `ok` above
        };
        if let Some(token) = at_least {
            let (allowed, stderr) = with_token(ws, token, args);
            assert!(allowed, "a {least} token was refused `tidegate {}`: {stderr}", args.join(" "));
        }
    }
    let (allowed, stderr) = with_token(ws, &approver, &["token", "revoke", "tk-none"]);
    assert!(!allowed && stderr.contains("may not manage tokens"), "an approver revoked a token: {stderr}");
}

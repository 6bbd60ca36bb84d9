//! Schemathesis (PyPI `schemathesis`, installed by `.ci/run` in its own venv) against a live
//! server: a bounded number of generated requests per operation, failing on any 5xx, any status
//! or content type the document does not declare, any response that violates its schema, and any
//! route that ignores its authentication.

use std::path::PathBuf;
use std::process::Command;

use tidegate_core::actor::Role;

use crate::common::{Server, published_workspace};

/// Where `.ci/run` installs it; `TIDEGATE_SCHEMATHESIS` names another.
const DEFAULT_BIN: &str = "/tmp/tidegate-schemathesis/bin/schemathesis";

fn schemathesis() -> Option<PathBuf> {
    let path = std::env::var_os("TIDEGATE_SCHEMATHESIS").map_or_else(|| PathBuf::from(DEFAULT_BIN), PathBuf::from);
    path.is_file().then_some(path)
}

#[test]
fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let Some(bin) = schemathesis() else {
        tidegate_testkit::service_missing(
            "schemathesis_finds_no_server_error_and_no_schema_violation",
            "schemathesis (schemathesis==4.32.5 and hypothesis==6.165.0 in the venv /tmp/tidegate-schemathesis, as .ci/run installs them)",
        );
        return;
    };
    let dir = published_workspace();
    // `ignored_auth` sends a bad token after each success, from this one address: with the
    // failed-authentication limit (security.rs tests it) the fuzzing would meet only 429s.
    let options = tidegate_server::Options { auth_failures: u32::MAX, ..Default::default() };
    let server = Server::start_with(&dir, options);
    let admin = server.token("fuzzer", Role::Admin);
    let base = format!("http://{}", server.addr);
    let report = tempfile::tempdir().expect("a report folder");
    let out = Command::new(bin)
        .args(["run", &format!("{base}/api/openapi.json"), "--url", &base])
        .args(["--header", &format!("Authorization: Bearer {admin}")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,ignored_auth",
        ])
        .args(["--max-examples", "8", "--seed", "22", "--workers", "1", "--phases", "examples,coverage,fuzzing"])
        .args(["--report-dir"])
        .arg(report.path())
        .env("NO_COLOR", "1")
        // Schemathesis keeps a cache in its working folder: the temp folder, not the source tree.
        .current_dir(report.path())
        .output()
        .expect("schemathesis runs");
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    // It ran: every operation was selected and cases were generated for them.
    let document = serde_json::to_value(tidegate_server::document()).expect("the document serialises");
    let paths = document["paths"].as_object().expect("paths");
    let n_operations: usize = paths.values().filter_map(|item| item.as_object()).map(|item| item.len()).sum();
    assert!(text.contains(&format!("{n_operations} selected / {n_operations} total")), "{text}");
    let generated: usize = text
        .split_once(" generated, ")
        .and_then(|(before, _)| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(generated >= 10 * n_operations, "only {generated} cases for {n_operations} operations:\n{text}");
}

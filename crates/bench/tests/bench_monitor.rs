//! `tidegate-bench monitor` at a tiny size, as a real process: it runs to the end and its JSON
//! report carries the fields BENCHMARKS.md is written from. Timings are only checked to be
//! positive numbers, never compared with anything.

use std::process::Command;

use serde_json::Value;

#[test]
fn monitor_reports_each_scrape_and_its_baseline() {
    let out = Command::new(env!("CARGO_BIN_EXE_tidegate-bench"))
        .args(["monitor", "--json", "--steps", "2000", "--repeats", "2"])
        .output()
        .expect("the tidegate-bench binary runs");
    assert!(out.status.success(), "bench monitor failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("valid JSON on stdout");
    assert_eq!(report["n_steps"], 2000);
    assert_eq!(report["store"], "sqlite");
    assert!(report["n_journal_entries"].as_u64().is_some_and(|n| n > 4000), "{report}");
    assert!(report["first_scrape_s"].as_f64().is_some_and(|s| s > 0.0), "{report}");
    for measured in ["scrape_nothing_new", "scrape_after_1000_steps_planned_and_skipped", "baseline_status_debt"] {
        let samples = report[measured]["samples_s"].as_array().expect("samples");
        assert_eq!(samples.len(), 2, "{measured}: {report}");
        assert!(report[measured]["median_s"].as_f64().is_some_and(|s| s > 0.0), "{measured}: {report}");
    }
}

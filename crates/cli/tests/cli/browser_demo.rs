//! The README's first two commands in a browser: `tidegate demo`, then `tidegate serve --http` in
//! its folder, and the token the demo printed signs in: the grid shows every dataset of the demo,
//! its stale cells exactly where `tidegate stale` says, and the demo's backfill rolled back. On
//! the defaults only, as `usage.rs` runs the demo (it builds its own workspace).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::browser::{Findings, Served};
use crate::common::tidegate;
use crate::webdriver::Browser;

#[test]
fn the_token_the_demo_prints_signs_in_and_the_grid_shows_the_demo() {
    const TEST: &str = "the_token_the_demo_prints_signs_in_and_the_grid_shows_the_demo";
    let Some(mut browser) = Browser::start(TEST, "demo") else { return };
    let parent = tempfile::tempdir().expect("a temp folder");
    let out = tidegate(parent.path()).args(["demo", "--dir", "demo", "--days", "14"]).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the demo: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let token = stdout
        .lines()
        .skip_while(|l| !l.contains("sign in with your token"))
        .nth(1)
        .map(str::trim)
        .filter(|t| t.starts_with("tgt_"))
        .unwrap_or_else(|| panic!("the demo prints a token to sign in with:\n{stdout}"))
        .to_owned();
    let ws = parent.path().join("demo");
    let served = Served::start(&ws);
    let mut findings = Findings::default();

    browser.goto(&format!("{}/", served.base));
    let input = browser.find("form#sign-in input#token");
    browser.type_into(&input, &token);
    browser.click_css("button#sign-in-submit");
    browser.wait_screen("grid");
    findings.check(&mut browser, "demo-grid");

    let rows = browser
        .exec("return [...document.querySelectorAll('table#grid tr[data-dataset]')].map(r => r.dataset.dataset);", &[]);
    let rows: BTreeSet<&str> = rows.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let daily = BTreeSet::from(["campaign_days", "clicks", "sessions", "user_features"]);
    assert_eq!(rows, daily, "a row per daily dataset of the demo (one partitioning per grid)");

    // Stale cells where `tidegate stale` says, and only there (of the partitions the grid shows).
    let out = tidegate(&ws).args(["stale", "--json"]).output().expect("runs");
    let stale: Value = serde_json::from_slice(&out.stdout).expect("stale --json");
    let said: BTreeSet<(String, String)> = stale
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["dataset"].as_str().unwrap_or_default().to_owned(),
                s["partition"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let cells = browser.exec(
        "return [...document.querySelectorAll('table#grid td[data-state]')].map(c => \
           [c.closest('tr').dataset.dataset, c.dataset.partition, c.dataset.state]);",
        &[],
    );
    let cells: Vec<(String, String, String)> = cells
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let text = |i: usize| c[i].as_str().unwrap_or_default().to_owned();
            (text(0), text(1), text(2))
        })
        .collect();
    let shown: BTreeSet<(String, String)> = cells.iter().map(|(d, p, _)| (d.clone(), p.clone())).collect();
    let grid_stale: BTreeSet<(String, String)> =
        cells.iter().filter(|(_, _, s)| s == "stale").map(|(d, p, _)| (d.clone(), p.clone())).collect();
    // January 2024 is the demo's; serve may be running yesterday's interval meanwhile.
    let demo = |(_, p): &&(String, String)| p.starts_with("2024-");
    let said_shown: BTreeSet<(String, String)> = said.intersection(&shown).filter(demo).cloned().collect();
    let grid_stale: BTreeSet<(String, String)> = grid_stale.iter().filter(demo).cloned().collect();
    assert!(!said_shown.is_empty(), "the demo leaves stale partitions in view: {said:?}");
    assert_eq!(grid_stale, said_shown, "the grid's stale cells are `tidegate stale`'s");
    let published =
        cells.iter().filter(|(d, p, s)| d == "clicks" && p.starts_with("2024-") && s == "published").count();
    assert_eq!(published, 14, "clicks has the demo's 14 days published: {cells:?}");

    // The weekly training snapshot has a grid of its own.
    let axes =
        browser.exec("return [...document.querySelectorAll('select#filter-axis option')].map(o => o.value);", &[]);
    let week =
        axes.as_array().into_iter().flatten().filter_map(Value::as_str).find(|a| a.contains("week")).map(str::to_owned);
    let week = week.unwrap_or_else(|| panic!("a weekly partitioning to choose: {axes}"));
    browser.click_css("select#filter-axis");
    browser.click_css(&format!("select#filter-axis option[value=\"{week}\"]"));
    browser.find("table#grid tr[data-dataset=\"training_snapshot\"]");
    browser.wait_screen("grid");
    findings.check(&mut browser, "demo-grid-weekly");

    browser.click_css("nav#nav a[data-nav=\"backfills\"]");
    browser.wait_screen("backfills");
    findings.check(&mut browser, "demo-backfills");
    let listed = browser.text_of("table#backfills").unwrap_or_default().to_lowercase().replace('_', " ");
    assert!(listed.contains("rolled back"), "the demo's backfill, rolled back: {listed}");
    findings.assert_none("demo", &served);
}

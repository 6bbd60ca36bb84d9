//! SQL over HTTP within the server's limits (issue 31, items 10 and 13a): a viewer's query cannot
//! take the memory or the time of the process that schedules. A result past the row or byte
//! limit, a query past the memory or time limit, and one that once made DataFusion panic are
//! each a 422 naming the limit and the `tidegate serve` flag that raises it; only so many queries
//! run at once (429 beyond).

use std::time::Duration;

use serde_json::{Value, json};
use tidegate_core::actor::Role;

use crate::common::{Response, Server, published_workspace};

fn sql(server: &Server, token: &str, query: &str) -> Response {
    server.call("POST", "/api/sql", Some(token), Some(&json!({ "query": query })))
}

/// The problem's `detail`, from a 422.
fn refused(r: &Response) -> String {
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    r.json()["detail"].as_str().expect("a detail").to_owned()
}

#[test]
fn a_query_over_the_servers_limits_is_refused_naming_the_limit_and_its_flag() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);

    let within = sql(&server, &viewer, "SELECT count(*) AS n FROM generate_series(1, 100000)");
    assert_eq!(within.status, 200, "{}", within.body);
    assert_eq!(within.json()["rows"], json!([{ "n": 100000 }]));

    // 800 MB of text in 800,000 rows: over 10,000 rows long before memory.
    let detail = refused(&sql(&server, &viewer, "SELECT repeat('x', 1000) AS s FROM generate_series(1, 800000)"));
    assert!(detail.contains("limit of 10000 rows per result") && detail.contains("--sql-max-rows"), "{detail}");
    // 50 MB in 5,000 rows: over the 32 MiB a result may hold.
    let detail = refused(&sql(&server, &viewer, "SELECT repeat('x', 10000) AS s FROM generate_series(1, 5000)"));
    assert!(detail.contains("limit of 32 MiB per result") && detail.contains("--sql-max-result-mb"), "{detail}");
    // The query that made DataFusion panic: 3 GB built by one function in one batch.
    let panicked = "SELECT max(length(r)) AS n FROM (SELECT repeat('x', 100000000) AS r FROM generate_series(1, 30))";
    let detail = refused(&sql(&server, &viewer, panicked));
    assert!(detail.contains("memory limit of 256 MiB") && detail.contains("repeat"), "{detail}");
    assert!(detail.contains("--sql-memory-limit-mb") && !detail.contains("panicked"), "{detail}");
}

#[test]
fn only_so_many_queries_run_at_once_and_a_slow_one_stops_at_the_time_limit() {
    let dir = published_workspace();
    let limits = tidegate_lake::QueryLimits { time_s: 2, ..tidegate_server::HTTP_QUERY_LIMITS };
    let options = tidegate_server::Options { sql_limits: limits, sql_queries_at_once: 1, ..Default::default() };
    let server = std::sync::Arc::new(Server::start_with(&dir, options));
    let viewer = server.token("vi", Role::Viewer);

    // A count over a cartesian product of a trillion rows: bounded memory, unbounded time.
    let slow = "SELECT count(*) FROM generate_series(1, 1000000) a CROSS JOIN generate_series(1, 1000000) b";
    let running = {
        let (server, viewer) = (server.clone(), viewer.clone());
        std::thread::spawn(move || sql(&server, &viewer, slow))
    };
    std::thread::sleep(Duration::from_millis(500));
    let busy = sql(&server, &viewer, "SELECT 1 AS one");
    assert_eq!(busy.status, 429, "{}", busy.body);
    let detail: Value = busy.json()["detail"].clone();
    assert!(detail.as_str().is_some_and(|d| d.contains("the most it runs at once")), "{detail}");

    let detail = refused(&running.join().expect("the slow query's thread"));
    assert!(detail.contains("time limit of 2 s") && detail.contains("--sql-time-limit-s"), "{detail}");
    let after = sql(&server, &viewer, "SELECT 1 AS one");
    assert_eq!(after.status, 200, "the slot is free again: {}", after.body);
}

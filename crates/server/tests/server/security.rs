//! The basics: no token secret in any response, bodies bounded, no CORS, and a read-only replica
//! that serves reads and refuses changes.

use serde_json::json;
use tidegate_core::actor::Role;

use crate::common::{Server, published_workspace, request};

#[test]
fn no_response_carries_a_token_and_bodies_are_bounded_without_cors() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let admin = server.token("ad", Role::Admin);
    let other = server.token("vi", Role::Viewer);
    let listed = server.call("GET", "/api/tokens", Some(&admin), None);
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.json().as_array().map(Vec::len), Some(2));
    for secret in [&admin, &other] {
        assert!(!listed.body.contains(secret.as_str()), "a token secret in the listing");
    }
    let forbidden = server.call("GET", "/api/tokens", Some(&other), None);
    assert!(!forbidden.body.contains(other.as_str()) && !forbidden.body.contains(admin.as_str()));

    let huge = json!({ "query": "x".repeat(tidegate_server::BODY_BYTES_MAX + 1) });
    let r = server.call("POST", "/api/sql", Some(&other), Some(&huge));
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    let preflight = request(server.addr, "OPTIONS", "/api/status", None, None);
    assert!(preflight.header("access-control-allow-origin").is_none(), "{preflight:?}");
    assert_eq!(preflight.status, 405, "{}", preflight.body);
}

#[test]
fn a_read_only_replica_serves_reads_and_refuses_changes() {
    let dir = published_workspace();
    let options = tidegate_server::Options { writable: false, ..tidegate_server::Options::default() };
    let server = Server::start_with(&dir, options);
    let admin = server.token("ad", Role::Admin);
    let status = server.call("GET", "/api/status", Some(&admin), None);
    assert_eq!(status.status, 200, "{}", status.body);
    assert_eq!(status.json()["runs"].as_array().map(Vec::len), Some(1));
    let body = json!({ "target": "summarize", "from": "2024-01-01", "to": "2024-01-01" });
    let refused = server.call("POST", "/api/runs", Some(&admin), Some(&body));
    assert_eq!((refused.status, refused.json()["code"].clone()), (405, json!("read_only")), "{}", refused.body);
    assert_eq!(server.call("POST", "/api/runs", None, Some(&body)).status, 401);
    let runs = server.call("GET", "/api/runs", Some(&admin), None).json();
    assert_eq!(runs["items"].as_array().map(Vec::len), Some(1), "nothing was submitted");
}

#[test]
fn an_address_that_keeps_presenting_bad_tokens_is_refused_for_the_rest_of_the_window() {
    let dir = published_workspace();
    let window = std::time::Duration::from_secs(2);
    let options = tidegate_server::Options { auth_failures: 3, auth_failure_window: window, ..Default::default() };
    let server = Server::start_with(&dir, options);
    let good = server.token("vi", Role::Viewer);
    // No token at all guesses nothing and is not counted.
    for _ in 0..5 {
        assert_eq!(server.call("GET", "/api/status", None, None).status, 401);
    }
    assert_eq!(server.call("GET", "/api/status", Some(&good), None).status, 200);
    for guess in 0..3 {
        let r = server.call("GET", "/api/status", Some(&format!("tgt_guess{guess}")), None);
        assert_eq!(r.status, 401, "{}", r.body);
    }
    // The fourth request is refused whatever it carries, with when to come back.
    for token in ["tgt_guess3", good.as_str()] {
        let r = server.call("GET", "/api/status", Some(token), None);
        assert_eq!((r.status, r.json()["code"].clone()), (429, json!("too_many_failed_authentications")), "{}", r.body);
        let wait: u64 = r.header("retry-after").and_then(|s| s.parse().ok()).expect("a Retry-After in seconds");
        assert!((1..=2).contains(&wait), "{wait}");
        assert!(!r.body.contains(good.as_str()), "no token in the answer");
    }
    std::thread::sleep(window);
    assert_eq!(server.call("GET", "/api/status", Some(&good), None).status, 200, "the window ended");
}

/// `GET /api/status` tells every viewer where the state is: a password given with the state's
/// URL, as `user:password@` or as `?password=`, is hidden (the shared binary's PostgreSQL server
/// takes any password; on the defaults the state is a SQLite file, shown as its path).
#[test]
fn the_status_route_shows_where_the_state_is_without_its_password() {
    const SECRET: &str = "hunter2-secret";
    let dir = crate::common::workspace(&crate::common::spec("SUM(v)"));
    let spec = dir.spec();
    let Some(line) = spec.lines().find(|l| l.starts_with("state = \"postgres://")) else {
        let server = Server::start(&dir);
        let viewer = server.token("vi", Role::Viewer);
        let status = server.call("GET", "/api/status", Some(&viewer), None);
        assert_eq!(status.status, 200, "{}", status.body);
        assert!(status.json()["state"].as_str().is_some_and(|s| s.ends_with(".tidegate/state.db")), "{}", status.body);
        return;
    };
    let url = line.trim_start_matches("state = \"").trim_end_matches('"');
    let sep = if url.contains('?') { '&' } else { '?' };
    let user = url.trim_start_matches("postgres://").split('@').next().expect("a user");
    for (i, with_password) in
        [format!("{url}{sep}password={SECRET}"), url.replacen(&format!("//{user}@"), &format!("//{user}:{SECRET}@"), 1)]
            .into_iter()
            .enumerate()
    {
        tidegate_testkit::TestWorkspace::set_spec(&dir, spec.replacen(url, &with_password, 1));
        let server = Server::start(&dir);
        let viewer = server.token(&format!("viewer{i}"), Role::Viewer);
        let status = server.call("GET", "/api/status", Some(&viewer), None);
        assert_eq!(status.status, 200, "{}", status.body);
        assert!(!status.body.contains(SECRET), "the status route shows the password: {}", status.body);
        let state = status.json()["state"].as_str().map(str::to_owned).expect("the state's location");
        assert!(state.contains("127.0.0.1") && state.contains("***"), "{state}");
    }
}

/// Behind the reverse proxy docs/deploy.md recommends, every request comes from the proxy's
/// address, and a lockout per address locked every client out with the guesser. With
/// `trust_proxy`, the client is the address the proxy appended to `X-Forwarded-For` (its last
/// entry): the guesser is locked out alone. Without it the header is ignored, so a guesser
/// cannot dodge the limit by writing a new address into each request.
#[test]
fn behind_a_trusted_proxy_a_guesser_is_locked_out_alone() {
    let dir = crate::common::workspace(&crate::common::spec("SUM(v)"));
    let limited = tidegate_server::Options { auth_failures: 3, ..Default::default() };
    let forwarded = |addr: &str| format!("10.1.2.3, {addr}");
    let as_client = |server: &Server, client: &str, token: &str| {
        let header = forwarded(client);
        crate::common::request_with(
            server.addr,
            "GET",
            "/api/status",
            Some(token),
            &[("X-Forwarded-For", &header)],
            None,
        )
    };

    let server = Server::start_with(&dir, tidegate_server::Options { trust_proxy: true, ..limited });
    let good = server.token("vi", Role::Viewer);
    for guess in 0..3 {
        assert_eq!(as_client(&server, "203.0.113.7", &format!("tgt_guess{guess}")).status, 401);
    }
    assert_eq!(as_client(&server, "203.0.113.7", &good).status, 429, "the guesser is locked out");
    let other = as_client(&server, "198.51.100.2", &good);
    assert_eq!(other.status, 200, "another client behind the proxy: {}", other.body);
    drop(server);

    let server = Server::start_with(&dir, limited);
    let good = server.token("vi2", Role::Viewer);
    for guess in 0..3 {
        assert_eq!(as_client(&server, &format!("203.0.113.{guess}"), &format!("tgt_guess{guess}")).status, 401);
    }
    let r = as_client(&server, "198.51.100.2", &good);
    assert_eq!(r.status, 429, "an untrusted X-Forwarded-For is ignored: {}", r.body);
}

/// 300 connections opened and left idle once stopped the API. `/healthz` is answered while they
/// sit open, and the server closes each once it has sent nothing for `header_read_timeout`.
#[test]
fn idle_connections_neither_stop_the_api_nor_stay_open() {
    use std::io::Read as _;
    let dir = crate::common::workspace(&crate::common::spec("SUM(v)"));
    let timeout = std::time::Duration::from_secs(2);
    let server =
        Server::start_with(&dir, tidegate_server::Options { header_read_timeout: timeout, ..Default::default() });
    let mut idle: Vec<std::net::TcpStream> =
        (0..300).map(|_| std::net::TcpStream::connect(server.addr).expect("an idle connection")).collect();
    let asked = std::time::Instant::now();
    let health = request(server.addr, "GET", "/healthz", None, None);
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(asked.elapsed() < timeout, "/healthz waited {:?} behind idle connections", asked.elapsed());
    for (i, stream) in idle.iter_mut().enumerate() {
        stream.set_read_timeout(Some(timeout * 5)).expect("a read timeout");
        // The server closes it (EOF, or a reset); a read that times out found it open.
        let closed = match stream.read(&mut [0; 1]) {
            Ok(_) => true,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        };
        assert!(closed, "idle connection {i} was still open after {:?}", asked.elapsed());
    }
}

//! The routes take a run or release id by a unique prefix, as the command line does: the run or
//! release it begins, a 422 listing the ids an ambiguous prefix begins, a 404 for one that begins
//! none.

use tidegate_core::actor::Role;

use crate::common::{Server, published_workspace, run_live};

/// The characters `a` and `b` begin with alike.
fn alike(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

/// The shortest prefix of `id` (4 characters at least) that begins none of `others`.
fn unique_prefix<'a>(id: &'a str, others: &[&str]) -> &'a str {
    let longest = others.iter().filter(|o| **o != id).map(|o| alike(id, o)).max().unwrap_or(0);
    &id[..longest.max(3) + 1]
}

#[test]
fn a_run_and_a_release_are_found_by_a_unique_prefix_and_an_ambiguous_one_is_a_422() {
    let dir = published_workspace();
    run_live(&dir, "2024-01-03", "2024-01-03", true);
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);
    let runs = server.call("GET", "/api/runs", Some(&viewer), None).json();
    let ids: Vec<&str> = runs["items"].as_array().expect("runs").iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids.len(), 2, "{runs}");

    for id in &ids {
        let got = server.call("GET", &format!("/api/runs/{}", unique_prefix(id, &ids)), Some(&viewer), None);
        assert_eq!((got.status, got.json()["id"].as_str()), (200, Some(*id)), "{}", got.body);
        let steps = server.call("GET", &format!("/api/runs/{}/steps", unique_prefix(id, &ids)), Some(&viewer), None);
        assert_eq!(steps.status, 200, "{}", steps.body);
    }
    let shared = &ids[0][..alike(ids[0], ids[1])];
    let ambiguous = server.call("GET", &format!("/api/runs/{shared}"), Some(&viewer), None);
    assert_eq!(ambiguous.status, 422, "{}", ambiguous.body);
    let detail = ambiguous.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains(ids[0]) && detail.contains(ids[1]), "{}", ambiguous.body);
    let none = server.call("GET", "/api/runs/ffffffff", Some(&viewer), None);
    assert_eq!(none.status, 404, "{}", none.body);
    let short = server.call("GET", "/api/runs/01", Some(&viewer), None);
    assert_eq!(short.status, 422, "{}", short.body);

    let releases = server.call("GET", "/api/releases", Some(&viewer), None).json();
    let release_ids: Vec<&str> =
        releases["items"].as_array().expect("releases").iter().filter_map(|r| r["id"].as_str()).collect();
    let release = release_ids.first().copied().unwrap_or_else(|| panic!("a release: {releases}"));
    let got =
        server.call("GET", &format!("/api/releases/{}", unique_prefix(release, &release_ids)), Some(&viewer), None);
    assert_eq!((got.status, got.json()["id"].as_str()), (200, Some(release)), "{}", got.body);
}

//! Where the state store and the lake are (`TIDEGATE_STATE`, `TIDEGATE_LAKE`, `[project]`) never
//! shows a secret: not in `status`, `status --json` or an error, whatever form the location came
//! in (a URL's `user:password@` or `?password=`, a libpq `key=value` string), and a `key=value`
//! string is never taken for a SQLite path. A lake URL that carries credentials is refused.

use std::path::Path;

use tidegate_testkit::TestWorkspace;

/// The password every test hides; never printed by a passing test.
const SECRET: &str = "hunter2-secret";

fn workspace() -> TestWorkspace {
    let dir = TestWorkspace::new(format!("[project]\nname = \"locations\"\n{}", crate::common::EXTRACT_SUMMARIZE));
    crate::common::ok(dir.path(), &["validate"]);
    dir
}

/// `tidegate ARGS` in `dir` with `var` set to `value`: exit success, stdout, stderr.
fn with_var(dir: &Path, var: &str, value: &str, args: &[&str]) -> (bool, String, String) {
    let out = crate::common::tidegate(dir).env(var, value).args(args).output().expect("runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn assert_hidden(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} shows the password: {text}");
}

/// Every file and folder under `dir` whose name holds the password.
fn files_named_with_the_secret(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(folder) = todo.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains(SECRET) {
                found.push(entry.path().display().to_string());
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(entry.path());
            }
        }
    }
    found
}

/// A PostgreSQL server nobody listens for (port 1), with the password in each form.
fn unreachable_forms() -> [String; 4] {
    [
        format!("postgres://ana:{SECRET}@127.0.0.1:1/tidegate"),
        format!("postgresql://ana@127.0.0.1:1/tidegate?sslmode=disable&password={SECRET}"),
        format!("host=127.0.0.1 port=1 user=ana password={SECRET} dbname=tidegate"),
        format!("host=127.0.0.1 port=1 user=ana password='{SECRET} with spaces' dbname=tidegate"),
    ]
}

/// A state store that cannot be reached fails the command with an error naming the location, its
/// password hidden, in every form; a libpq `key=value` string is a PostgreSQL location, never a
/// SQLite file named with the password.
#[test]
fn an_unreachable_state_store_fails_without_showing_its_password_in_any_form() {
    let dir = workspace();
    for form in unreachable_forms() {
        let (ok, stdout, stderr) = with_var(dir.path(), "TIDEGATE_STATE", &form, &["status"]);
        assert!(!ok, "status on an unreachable store succeeded ({form}): {stdout}");
        assert_hidden("the error", &format!("{stdout}{stderr}"));
        assert!(stderr.contains("127.0.0.1") && stderr.contains("***"), "the error names the location: {stderr}");
        assert_eq!(files_named_with_the_secret(dir.path()), Vec::<String>::new(), "{form} made a file");
    }
}

/// The workspace's own store (the SQLite file, or in the shared binary its PostgreSQL schema,
/// whose server takes any password) given with a password in each form: `status` and `status
/// --json` show where the state is, the password hidden.
#[test]
fn status_shows_where_the_state_is_without_its_password() {
    let dir = workspace();
    crate::common::ok(dir.path(), &["status"]);
    let Some(url) = crate::backend::env(dir.path()).into_iter().find(|(k, _)| *k == "TIDEGATE_STATE").map(|(_, v)| v)
    else {
        // The defaults: a SQLite file, shown as its path.
        let (_, status) = crate::common::json(dir.path(), &["status", "--json"]);
        let state = status["state"].as_str().expect("the state's location");
        assert!(state.ends_with(".tidegate/state.db"), "{status}");
        return;
    };
    for form in with_password(&url) {
        for args in [&["status"][..], &["status", "--json"]] {
            let (ok, stdout, stderr) = with_var(dir.path(), "TIDEGATE_STATE", &form, args);
            assert!(ok, "tidegate {args:?} with {form}: {stderr}");
            assert_hidden("status", &format!("{stdout}{stderr}"));
            assert!(stdout.contains("127.0.0.1") && stdout.contains("***"), "{args:?} shows the location: {stdout}");
        }
    }
}

/// `url` (a shared workspace's PostgreSQL URL, no password) with the password as `user:password@`,
/// as `?password=`, and as a libpq `key=value` string.
fn with_password(url: &str) -> [String; 3] {
    let config: postgres::Config = url.parse().expect("the test URL parses");
    let host = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("the test server is reached over TCP, not {other:?}"),
    };
    let user = config.get_user().expect("the test URL names a user");
    let options = config.get_options().unwrap_or_default().replace('\\', "\\\\").replace('\'', "\\'");
    let key_value = format!(
        "host={host} port={} user={user} password={SECRET} dbname={} options='{options}'",
        config.get_ports()[0],
        config.get_dbname().expect("the test URL names a database"),
    );
    let sep = if url.contains('?') { '&' } else { '?' };
    [
        url.replacen(&format!("://{user}@"), &format!("://{user}:{SECRET}@"), 1),
        format!("{url}{sep}password={SECRET}"),
        key_value,
    ]
}

/// Tidegate reads S3 credentials from the `AWS_*` variables only: a lake URL that carries some
/// (`user:secret@`, `?secret_access_key=`) is refused, naming the variable, without showing them.
#[test]
fn a_lake_url_carrying_credentials_is_refused_without_showing_them() {
    let dir = workspace();
    for lake in [
        format!("s3://AKIAEXAMPLE:{SECRET}@tidegate-test/lake"),
        format!("s3://tidegate-test/lake?aws_secret_access_key={SECRET}"),
    ] {
        let (ok, stdout, stderr) = with_var(dir.path(), "TIDEGATE_LAKE", &lake, &["status"]);
        assert!(!ok, "a lake URL with credentials was accepted ({lake}): {stdout}");
        assert_hidden("the error", &format!("{stdout}{stderr}"));
        assert!(stderr.contains("TIDEGATE_LAKE") && stderr.contains("AWS_"), "the error says what to do: {stderr}");
    }
}

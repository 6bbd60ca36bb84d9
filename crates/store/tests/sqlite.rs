//! The store suite on SQLite, on a fresh temp file per test.

mod suite;

use tidegate_testkit::store::StoreUnderTest;

all_backend_tests!(Some(StoreUnderTest::sqlite()));

/// `open` accepts a plain path and `sqlite://`, creating missing parent folders.
#[test]
fn open_accepts_paths_and_sqlite_urls() {
    let dir = tempfile::tempdir().expect("temp folder");
    let plain = dir.path().join("a/b/state.db");
    let store = tidegate_store::open(plain.to_str().expect("utf-8 path")).expect("opening a path");
    assert_eq!(store.backend(), tidegate_store::Backend::Sqlite);
    let url = format!("sqlite://{}", dir.path().join("c/state.db").display());
    tidegate_store::open(&url).expect("opening a sqlite:// URL");
    let err = tidegate_store::open("mysql://u:secret@h/db").expect_err("unknown scheme");
    assert_eq!(
        err.to_string(),
        "invalid state store location \"mysql://u:***@h/db\": unknown scheme; expected a file path, sqlite://PATH, \
         postgres://, postgresql:// or a libpq key=value string"
    );
    // A libpq key=value string is a PostgreSQL location (here one nobody listens on), never a
    // SQLite file named with its password.
    let key_value = "host=127.0.0.1 port=1 user=ana password=hunter2 dbname=tidegate";
    let err = tidegate_store::open(key_value).expect_err("nobody listens on port 1");
    assert!(matches!(err, tidegate_store::Error::Unavailable(_)), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(!std::path::Path::new(key_value).exists(), "a file named with the password");
}

/// Two processes creating one store together (two `tidegate run`s on a new workspace) once
/// failed with "database is locked": the switch to WAL on a new file answers SQLITE_BUSY at once,
/// without the busy handler. Many rounds, because the window is narrow.
#[test]
fn concurrent_opens_migrate_once() {
    for _ in 0..ROUNDS {
        let dir = tempfile::tempdir().expect("temp folder");
        let path = dir.path().join("state.db");
        suite::concurrent_opens_migrate_once(|| {
            tidegate_store::SqliteStore::open(&path).expect("opening").n_migrations_applied()
        });
    }
}

const ROUNDS: usize = 100;

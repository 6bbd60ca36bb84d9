//! The store suite on PostgreSQL, in a fresh schema per test; skipped (with a message) when
//! `TIDEGATE_TEST_POSTGRES_URL` is not set.

mod suite;

use tidegate_testkit::store::{PgSchema, StoreUnderTest};

all_backend_tests!(StoreUnderTest::postgres());

#[test]
fn concurrent_opens_migrate_once() {
    let Some(schema) = tidegate_testkit::store::PgSchema::create() else { return };
    suite::concurrent_opens_migrate_once(|| {
        tidegate_store::PgStore::connect(&schema.url).expect("connecting").n_migrations_applied()
    });
}

/// A write through `store` on another thread; whether it finished within `within`.
fn writes_within(store: std::sync::Arc<dyn tidegate_store::Store>, within: std::time::Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let decision = tidegate_store::Decision {
            kind: "note".into(),
            run_id: None,
            task: None,
            partition: None,
            payload: serde_json::json!({}),
        };
        let _ = tx.send(store.record_decision(&decision, &tidegate_testkit::store::meta(chrono::Utc::now())));
    });
    matches!(rx.recv_timeout(within), Ok(Ok(_)))
}

/// A session on `schema` that began a chainer pass as a Tidegate store does (its session settings,
/// then the chain lock, which every journaled write's pass waits for) and stopped talking: a
/// process frozen by SIGSTOP or a stalled VM.
fn frozen_writer(schema: &PgSchema, with_store_settings: bool) -> postgres::Client {
    let mut client = schema.client();
    if with_store_settings {
        client.batch_execute(tidegate_store::pg::SESSION_SETTINGS).expect("the store's session settings");
    }
    client.batch_execute("BEGIN").expect("begin");
    client.batch_execute(tidegate_store::pg::CHAIN_LOCK).expect("the chain lock");
    client
}

/// A process frozen inside a write transaction once stopped every other writer of the store for
/// as long as it stayed frozen (the `fencing` CLI test hung on PostgreSQL): PostgreSQL now ends a
/// store session left idle inside a transaction after a few seconds, which releases the lock.
#[test]
fn a_session_frozen_inside_a_write_is_cut_off_and_the_other_writers_go_on() {
    let Some(schema) = PgSchema::create() else { return };
    let store: std::sync::Arc<dyn tidegate_store::Store> =
        std::sync::Arc::new(tidegate_store::PgStore::connect(&schema.url).expect("a store on the schema"));
    let _frozen = frozen_writer(&schema, true);
    assert!(
        writes_within(store.clone(), std::time::Duration::from_secs(30)),
        "a write waited behind a frozen session for 30 s"
    );
}

/// Tidegate deployments in different schemas of one database write independently: one's chain lock,
/// even held by a session that never lets go, never stops the other's writes.
#[test]
fn a_schema_never_waits_for_another_schemas_writer() {
    let (Some(first), Some(second)) = (PgSchema::create(), PgSchema::create()) else { return };
    let _first_store = tidegate_store::PgStore::connect(&first.url).expect("a store on the first schema");
    let store: std::sync::Arc<dyn tidegate_store::Store> =
        std::sync::Arc::new(tidegate_store::PgStore::connect(&second.url).expect("a store on the second schema"));
    let _holder = frozen_writer(&first, false);
    assert!(
        writes_within(store, std::time::Duration::from_secs(5)),
        "the second schema's write waited for the first schema's lock"
    );
}

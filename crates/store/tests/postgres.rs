//! The store suite on PostgreSQL, in a fresh schema per test; skipped (with a message) when
//! `TIDEGATE_TEST_POSTGRES_URL` is not set.

mod suite;

use tidegate_testkit::store::StoreUnderTest;

all_backend_tests!(StoreUnderTest::postgres());

#[test]
fn concurrent_opens_migrate_once() {
    let Some(schema) = tidegate_testkit::store::PgSchema::create() else { return };
    suite::concurrent_opens_migrate_once(|| {
        tidegate_store::PgStore::connect(&schema.url).expect("connecting").n_migrations_applied()
    });
}

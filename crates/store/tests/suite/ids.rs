//! Ids found by their first characters: runs, backfills and releases, the matches in order, a
//! wildcard never taken for one.

use tidegate_store::{Error, IdKind, ReleaseKind};
use tidegate_testkit::store::{StoreUnderTest, meta, new_steps, release_record, run_request};

use super::{backfill_record, t0};

pub fn ids_are_found_by_their_first_characters_and_wildcards_are_refused(t: &StoreUnderTest) {
    let store = &*t.store;
    let a = store.create_run(&run_request("a"), &new_steps(1), &meta(t0())).expect("creating a run");
    let b = store.create_run(&run_request("b"), &new_steps(1), &meta(t0())).expect("creating a run");
    let prefix = |kind, p: &str| store.ids_with_prefix(kind, p, 10).expect("finding ids");
    assert_eq!(prefix(IdKind::Run, &a.id), vec![a.id.clone()]);
    let mut both = vec![a.id.clone(), b.id.clone()];
    both.sort();
    // Two UUIDv7 made a moment apart share their first characters (they begin with the time).
    let common: String = a.id.chars().zip(b.id.chars()).take_while(|(x, y)| x == y).map(|(x, _)| x).collect();
    assert_eq!(prefix(IdKind::Run, &common), both);
    assert_eq!(store.ids_with_prefix(IdKind::Run, &common, 1).expect("finding ids").len(), 1, "the limit");
    assert!(prefix(IdKind::Run, "ffff").is_empty());

    store.create_backfill(&backfill_record("bf-12ab34cd", &[("f", &["2024-01-01"])]), &meta(t0())).expect("backfill");
    store.create_backfill(&backfill_record("bf-12ff0000", &[("f", &["2024-01-02"])]), &meta(t0())).expect("backfill");
    assert_eq!(prefix(IdKind::Backfill, "bf-12a"), ["bf-12ab34cd"]);
    assert_eq!(prefix(IdKind::Backfill, "bf-12"), ["bf-12ab34cd", "bf-12ff0000"]);
    assert!(prefix(IdKind::Run, "bf-12").is_empty(), "each kind looks at its own ids");

    let release = release_record("rel-0042", ReleaseKind::Publish, &[("labels", None)], t0());
    store.record_release(&release, &[], &meta(t0())).expect("recording a release");
    assert_eq!(prefix(IdKind::Release, "rel-00"), ["rel-0042"]);

    // `%` and `_` would be LIKE wildcards; upper case is no id's (PostgreSQL compares case).
    for bad in ["%", "bf-%", "bf_12ab34cd", "BF-12", "bf-12' OR '1'='1", ""] {
        match store.ids_with_prefix(IdKind::Backfill, bad, 10) {
            Err(Error::InvalidRequest(m)) => assert!(m.contains("a-z, 0-9 and -"), "{bad:?}: {m}"),
            other => panic!("{bad:?} was taken as a prefix: {other:?}"),
        }
    }
}

//! The lake suite of `tests/lake` again, with every test's lake under an `s3://` prefix of its own
//! (`.ci/run` starts moto's S3 server and sets `TIDEGATE_TEST_S3_URL` and the `AWS_*` variables):
//! one suite, two kinds of storage. The same test files, compiled into this second binary; each
//! makes its lake with `common::lake` and reaches the lake's files through `common::Place`.
//!
//! Left out, as about a folder or already on S3: `readonly` and `unreadable` (what SQL may read
//! on this machine's disk, and files a folder can hold that an object store cannot), `readers` and
//! `interop` (Python readers handed a table's folder; `cli_shared` reads S3 tables with Python
//! `deltalake`), `logs` (log copies in a folder), and `s3`. A test inside a module that hands the
//! table's folder to delta-rs or to Python uses `common::folder_lake` on both binaries.

/// Whether every test's lake is on S3 (this binary) or in a folder (`lake`).
const SHARED: bool = true;

use suite::common;

#[path = "../lake"]
mod suite {
    pub(crate) mod common;

    mod approved;
    mod checks;
    mod compare;
    mod conversion;
    mod dedup;
    mod evolution;
    mod modes;
    mod names;
    mod publication;
    mod rollback;
    mod staging;
    mod vacuum;
}

//! What Tidegate cannot read is an error that names it: an entry of a command's output folder
//! that is not a regular file (a symlink, a FIFO, a folder) fails staging instead of being
//! skipped, and a damaged Delta commit is reported with its table and file, not as a bug.

use std::path::{Path, PathBuf};

use crate::common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::{Error, Lake};

/// A fresh output folder `name` under `dir`.
fn folder(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).expect("output folder");
    out
}

#[tokio::test]
async fn an_output_entry_that_is_not_a_regular_file_fails_staging_naming_it() {
    let (dir, lake) = lake().await;
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    let real = dir.path().join("real.csv");
    std::fs::write(&real, "id,value,name\n1,2,a\n").expect("csv");

    let link = folder(dir.path(), "link");
    std::os::unix::fs::symlink(&real, link.join("rows.csv")).expect("symlink");
    let nested = folder(dir.path(), "nested");
    std::fs::create_dir(nested.join("more")).expect("subfolder");
    std::fs::write(nested.join("more/rows.csv"), "id,value,name\n1,2,a\n").expect("csv");
    let fifo = folder(dir.path(), "fifo");
    let made = std::process::Command::new("mkfifo").arg(fifo.join("rows.csv")).status().expect("mkfifo runs");
    assert!(made.success());

    for (out, entry, why) in
        [(&link, "rows.csv", "symbolic link"), (&nested, "more", "folder"), (&fifo, "rows.csv", "FIFO")]
    {
        let err = lake.stage_files(&ds, "s", &[part("p")], out).await.expect_err(why);
        let text = err.to_string();
        let named = out.join(entry).display().to_string();
        assert!(matches!(err, Error::UnreadableFile { .. }), "{why}: {text}");
        assert!(text.contains(&named) && text.contains(why), "{why}: {text}");
    }
    // A checkpoint that names a symlink is refused the same way.
    let err = lake.stage_paths(&ds, "s", &[part("p")], &[link.join("rows.csv")]).await.expect_err("named symlink");
    assert!(err.to_string().contains("symbolic link"), "{err}");

    // Hidden entries are still the task's own business.
    let fine = folder(dir.path(), "fine");
    std::fs::write(fine.join("rows.csv"), "id,value,name\n1,2,a\n").expect("csv");
    std::os::unix::fs::symlink(&real, fine.join(".part.csv")).expect("symlink");
    std::fs::create_dir(fine.join("_scratch")).expect("scratch");
    let staged = lake.stage_files(&ds, "s", &[part("p")], &fine).await.expect("stage");
    assert_eq!(staged.n_rows, 1);
}

#[tokio::test]
async fn a_corrupt_commit_is_reported_with_its_table_and_file() {
    let (dir, lake) = lake().await;
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    let version = put(&lake, &ds, &[part("p")], rows(&[(1, Some(1), Some("a"))], None), "s1").await;
    let name = format!("{version:020}.json");
    let root = dir.path().join("lake");
    std::fs::write(root.join("events/_delta_log").join(&name), "this is not a Delta commit {").expect("corrupt");
    // A new handle, as a new process would open it.
    let fresh = Lake::open(root.to_str().expect("utf-8")).await.expect("open");
    for err in [
        fresh.read("events", None, None).await.expect_err("read"),
        fresh.sql("SELECT 1").await.expect_err("sql"),
        lake.read("events", None, None).await.expect_err("read through the cached handle"),
    ] {
        let text = err.to_string();
        assert!(text.contains("events") && text.contains(&name), "{text}");
        assert!(!text.contains("this is a bug") && !text.to_lowercase().contains("backtrace"), "{text}");
    }
}

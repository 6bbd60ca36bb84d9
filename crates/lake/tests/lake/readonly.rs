//! User SQL is read-only: `Lake::sql`, custom SQL checks and SQL tasks (`Lake::sql_over`) refuse
//! every statement that writes a table, a file or the session, or reads a file by path; and the
//! table, the staged rows and the folder around the lake are left as they were.

use std::path::Path;

use crate::common::*;
use tidegate_core::spec::model::{CheckRule, WriteMode};
use tidegate_lake::{Error, InputTable, QueryLimits};

/// Statements that write or read something outside the query, against the table `table`.
fn attacks(dir: &Path, table: &str) -> Vec<String> {
    vec![
        format!("INSERT INTO {table} SELECT * FROM {table}"),
        format!("INSERT OVERWRITE {table} SELECT * FROM {table} WHERE false"),
        format!("COPY (SELECT * FROM {table}) TO '{}'", dir.join("leak.csv").display()),
        format!("CREATE EXTERNAL TABLE secrets STORED AS CSV LOCATION '{}'", dir.join("secret.csv").display()),
        format!("CREATE TABLE copied AS SELECT * FROM {table}"),
        format!("SELECT * INTO copied FROM {table}"),
        format!("WITH t AS (SELECT * FROM {table}) SELECT * INTO copied FROM t"),
        format!("CREATE VIEW v AS SELECT * FROM {table}"),
        format!("DROP TABLE {table}"),
        format!("EXPLAIN ANALYZE INSERT INTO {table} SELECT * FROM {table}"),
        "SET datafusion.execution.batch_size = 1".to_owned(),
    ]
}

/// The files an attack could have written or must not have read.
fn prepare(dir: &Path) {
    std::fs::write(dir.join("secret.csv"), "user,password\nroot,hunter2\n").expect("secret");
}

fn assert_refused(attack: &str, err: &tidegate_lake::Error) {
    let text = err.to_string();
    assert!(text.contains("read-only"), "{attack}: {text}");
}

#[tokio::test]
async fn sql_refuses_writes_and_file_access_and_changes_nothing() {
    let (dir, lake) = lake().await;
    prepare(dir.path());
    let ds = dataset("events", WriteMode::Replace, basic_columns());
    let version = put(&lake, &ds, &[part("p")], rows(&[(1, Some(1), Some("a"))], None), "s1").await;
    let before = read_all(&lake, "events").await;
    for attack in attacks(dir.path(), "events") {
        let err = lake.sql(&attack).await.expect_err(&attack);
        assert_refused(&attack, &err);
    }
    assert_eq!(lake.table_version("events").await.expect("version"), Some(version));
    assert_eq!(read_all(&lake, "events").await, before);
    assert!(!dir.path().join("leak.csv").exists());
    // A file cannot be named as a table either.
    let secret = format!("SELECT * FROM '{}'", dir.path().join("secret.csv").display());
    let err = lake.sql(&secret).await.expect_err("a file as a table");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    // Reading stays allowed.
    for query in [
        "SELECT count(*) FROM events",
        "WITH x AS (SELECT * FROM events) SELECT * FROM x",
        "VALUES (1), (2)",
        "EXPLAIN SELECT * FROM events",
        "SELECT * FROM generate_series(1, 3)",
    ] {
        lake.sql(query).await.expect(query);
    }
}

#[tokio::test]
async fn a_custom_sql_check_that_writes_fails_and_writes_nothing() {
    let (dir, lake) = lake().await;
    prepare(dir.path());
    for attack in attacks(dir.path(), "staged") {
        let rule = CheckRule::Sql { query: attack.clone() };
        let ds = with_checks(dataset("checked", WriteMode::Replace, basic_columns()), vec![("attack", rule)]);
        let staged =
            lake.stage_batches(&ds, "chk", &[part("p")], vec![rows(&[(1, None, None)], None)]).await.expect("stage");
        let results = lake.check(&ds, &staged).await.expect("check");
        let result = results.iter().find(|r| r.name == "attack").expect("the check ran");
        assert!(result.blocks() && result.detail.contains("read-only"), "{attack}: {result:?}");
    }
    assert!(!dir.path().join("leak.csv").exists());
}

#[tokio::test]
async fn a_sql_task_query_that_writes_fails_and_writes_nothing() {
    let (dir, lake) = lake().await;
    prepare(dir.path());
    let ds = dataset("sales", WriteMode::Replace, basic_columns());
    let version = put(&lake, &ds, &[part("p")], rows(&[(1, Some(1), Some("a"))], None), "s1").await;
    let input = InputTable {
        name: "sales".to_owned(),
        dataset: "sales".to_owned(),
        version: Some(version),
        partitions: Vec::new(),
        overlay: Vec::new(),
    };
    for attack in attacks(dir.path(), "sales") {
        let err = lake.sql_over(&attack, std::slice::from_ref(&input)).await.expect_err(&attack);
        assert_refused(&attack, &err);
    }
    assert!(!dir.path().join("leak.csv").exists());
    assert_eq!(lake.table_version("sales").await.expect("version"), Some(version));
    assert_eq!(render(&lake.sql_over("SELECT id FROM sales", &[input]).await.expect("a query")), ["id=1"]);
}

#[tokio::test]
async fn a_query_over_the_memory_limit_fails_naming_the_limit() {
    let (_dir, lake) = lake().await;
    let lake = lake.with_query_limits(QueryLimits { memory_mb: 1, ..QueryLimits::default() });
    // Sorting two million rows needs far more than 1 MiB, and user queries do not spill to disk.
    let sort = "SELECT value FROM generate_series(1, 2000000) ORDER BY value DESC";
    let err = lake.sql(sort).await.expect_err("over the limit");
    assert!(matches!(err, Error::QueryLimit { .. }) && err.to_string().contains("memory limit of 1 MiB"), "{err}");
    // A custom check over the limit is a failing check that blocks publication.
    let rule = CheckRule::Sql { query: sort.to_owned() };
    let ds = with_checks(dataset("checked", WriteMode::Replace, basic_columns()), vec![("big", rule)]);
    let staged =
        lake.stage_batches(&ds, "chk", &[part("p")], vec![rows(&[(1, None, None)], None)]).await.expect("stage");
    let results = lake.check(&ds, &staged).await.expect("check");
    let result = results.iter().find(|r| r.name == "big").expect("the check ran");
    assert!(result.blocks() && result.detail.contains("memory limit of 1 MiB"), "{result:?}");
}

//! `s3://` lakes. The round trip runs against a real S3-compatible server when
//! `TIDEGATE_TEST_S3_URL` names a bucket on one (`.ci/run` starts moto's server and sets it, with
//! the `AWS_*` variables the client reads); without it that test says it was skipped. The refusal
//! of a store without conditional put runs everywhere, against a small HTTP server in this file
//! that accepts every write, as a store ignoring `If-None-Match` would.

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};

use common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::{Error, Lake};

/// A fresh prefix in the test bucket, or `None` (test skipped) when no server is configured.
fn s3_prefix(test: &str) -> Option<String> {
    let Ok(base) = std::env::var("TIDEGATE_TEST_S3_URL") else {
        eprintln!("skipped {test}: set TIDEGATE_TEST_S3_URL (and AWS_* for the client) to run it");
        return None;
    };
    Some(format!("{}/{test}-{}", base.trim_end_matches('/'), uuid::Uuid::now_v7()))
}

/// Stage, publish, replay, read with SQL, publish concurrently from two processes' worth of lake
/// handles, and roll back: the same guarantees as a folder lake, on an object store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_lake_publishes_replays_and_rolls_back_like_a_folder() {
    let Some(url) = s3_prefix("roundtrip") else { return };
    let lake = Lake::open(&url).await.expect("open the s3 lake");
    assert!(lake.root().is_none(), "an s3 lake has no folder");
    let ds = dataset("events", WriteMode::Replace, basic_columns());

    let v1 = put(&lake, &ds, &[part("a"), part("b")], rows(&[(1, Some(10), Some("x"))], Some(&["a"])), "s1").await;
    assert_eq!(read_all(&lake, "events").await, vec!["id=1|value=10|name=x|tg_partition=a"]);
    assert_eq!(lake.datasets().await.expect("list"), vec!["events".to_owned()]);

    // A replay of the same step commits nothing.
    let staged = lake
        .stage_batches(&ds, "stg-s1-again", &[part("a")], vec![rows(&[(9, None, None)], Some(&["a"]))])
        .await
        .expect("stage");
    let replay = lake.publish(&release("rel-s1", &ds, staged, "s1")).await.expect("replay");
    assert!(replay.items[0].already_published);
    assert_eq!(replay.items[0].table_version, v1);

    // Two handles (as two schedulers would have) publish different partitions at once: both land,
    // in two versions, because the store refuses the second create of a version.
    let other = Lake::open(&url).await.expect("second handle");
    let (c, d) = ([part("c")], [part("d")]);
    let (va, vb) = tokio::join!(
        put(&lake, &ds, &c, rows(&[(3, Some(30), Some("c"))], Some(&["c"])), "s3"),
        put(&other, &ds, &d, rows(&[(4, Some(40), Some("d"))], Some(&["d"])), "s4"),
    );
    assert_ne!(va, vb);
    assert_eq!(va.max(vb), v1 + 2);
    let batches = lake.sql("SELECT COUNT(*) AS n FROM events").await.expect("sql");
    assert_eq!(render(&batches), vec!["n=3"]);

    // Rollback restores the first version's files in a new commit.
    lake.rollback("events", v1, None, "rb").await.expect("rollback");
    assert_eq!(read_all(&lake, "events").await, vec!["id=1|value=10|name=x|tg_partition=a"]);
}

#[tokio::test]
async fn a_store_that_ignores_conditional_put_is_refused_with_the_reason() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_blindly(stream));
        }
    });
    // The client reads its endpoint from the environment; this test's own process cannot set it
    // (that needs `unsafe`), so it runs the check in a child: the test binary itself, filtered to
    // the helper below.
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "open_the_lake_in_the_environment", "--nocapture", "--include-ignored"])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("TIDEGATE_TEST_OPEN_LAKE", "s3://blind-bucket/lake")
        .output()
        .expect("run the helper");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("OPEN: ")).unwrap_or_else(|| panic!("no result: {stdout}"));
    assert!(
        line.starts_with(
            "OPEN: lake s3://blind-bucket/lake: the object store does not honour conditional put (If-None-Match), \
             which Delta commits need so that two writers cannot both create the same version: a second create of \
             lake/_tidegate/probe-"
        ) && line.ends_with("succeeded and overwrote the first"),
        "{line}"
    );
}

/// Helper for the test above: opens `TIDEGATE_TEST_OPEN_LAKE` and prints the outcome.
#[tokio::test]
#[ignore = "run by a_store_that_ignores_conditional_put_is_refused_with_the_reason"]
async fn open_the_lake_in_the_environment() {
    let url = std::env::var("TIDEGATE_TEST_OPEN_LAKE").expect("set by the calling test");
    match Lake::open(&url).await {
        Ok(_) => println!("OPEN: ok"),
        Err(e @ Error::UnsupportedLake { .. }) => println!("OPEN: {e}"),
        Err(e) => println!("OPEN: another error: {e}"),
    }
}

#[tokio::test]
async fn other_object_stores_are_refused_with_a_clear_error() {
    let err = Lake::open("gs://bucket/prefix").await.expect_err("unsupported");
    assert_eq!(err.to_string(), "lake gs://bucket/prefix: gs:// lakes are not supported; use a folder or s3://");
}

/// Answers every request as a store with no preconditions would: writes succeed, reads find nothing.
fn serve_blindly(stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let response = match request_line.split(' ').next() {
            Some("PUT") => "HTTP/1.1 200 OK\r\nETag: \"blind\"\r\nContent-Length: 0\r\n\r\n",
            Some("DELETE") => "HTTP/1.1 204 No Content\r\n\r\n",
            _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        };
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

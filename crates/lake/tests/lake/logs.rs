//! Attempts' log copies in the lake (`_tidegate/logs/`): written whole and replaced, listed per
//! step, read by range as a follower reads them, left alone by vacuum and reconciliation of the
//! tables, and swept only when old and not kept, on a folder lake and on an `s3://` lake.

use chrono::{Duration, Utc};
use tidegate_lake::{LOGS_DIR, Lake};

const STEP: &str = "01900000-0000-7000-8000-00000000000a";
const OTHER: &str = "01900000-0000-7000-8000-00000000000b";

async fn check(lake: &Lake) {
    assert!(lake.log_copies(STEP).await.expect("listing").is_empty(), "no copy yet");
    assert_eq!(lake.read_log(STEP, 1, "stdout", 0, 100).await.expect("reading"), None);

    // A running attempt's copy grows; a follower reads on from its offset.
    lake.put_log(STEP, 1, "stdout", b"first\n".to_vec()).await.expect("writing");
    let (head, size) = lake.read_log(STEP, 1, "stdout", 0, 100).await.expect("reading").expect("a copy");
    assert_eq!((head.as_slice(), size), (&b"first\n"[..], 6));
    lake.put_log(STEP, 1, "stdout", b"first\nsecond\n".to_vec()).await.expect("replacing");
    let (more, size) = lake.read_log(STEP, 1, "stdout", 6, 100).await.expect("reading").expect("a copy");
    assert_eq!((more.as_slice(), size), (&b"second\n"[..], 13));
    let (cut, _) = lake.read_log(STEP, 1, "stdout", 0, 3).await.expect("reading").expect("a copy");
    assert_eq!(cut, b"fir", "at most the bytes asked for");
    let (nothing, _) = lake.read_log(STEP, 1, "stdout", 13, 100).await.expect("reading at the end").expect("a copy");
    assert!(nothing.is_empty());

    lake.put_log(STEP, 2, "stderr", b"oops\n".to_vec()).await.expect("writing");
    lake.put_log(OTHER, 1, "stderr", b"other\n".to_vec()).await.expect("writing");
    let copies = lake.log_copies(STEP).await.expect("listing");
    let listed: Vec<(u32, &str, u64)> = copies.iter().map(|c| (c.attempt, c.stream.as_str(), c.size)).collect();
    assert_eq!(listed, [(1, "stdout", 13), (2, "stderr", 5)]);
    assert!(copies[1].url.ends_with(&format!("{LOGS_DIR}/{STEP}/attempt-2.stderr.log")), "{}", copies[1].url);
    assert!(lake.put_log("../escape", 1, "stdout", Vec::new()).await.is_err(), "a step id is one path segment");
    assert!(lake.put_log(STEP, 1, "stdin", Vec::new()).await.is_err(), "only stdout and stderr are copied");

    // Only old copies of steps that are not kept are swept.
    let later = Utc::now() + Duration::minutes(5);
    assert!(lake.sweep_logs(Utc::now() - Duration::minutes(5), &|_| false).await.expect("sweeping").is_empty());
    let swept = lake.sweep_logs(later, &|step| step == OTHER).await.expect("sweeping");
    assert_eq!(swept, [format!("{STEP}/attempt-1.stdout.log"), format!("{STEP}/attempt-2.stderr.log")]);
    assert!(lake.log_copies(STEP).await.expect("listing").is_empty());
    assert_eq!(lake.log_copies(OTHER).await.expect("listing").len(), 1, "a kept step's copy stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_copies_are_written_read_by_range_and_swept_when_old_in_a_folder_lake() {
    let dir = tempfile::tempdir().expect("tmp");
    let lake = Lake::open(dir.path().to_str().expect("utf-8")).await.expect("open");
    check(&lake).await;
    assert!(dir.path().join(LOGS_DIR).join(OTHER).join("attempt-1.stderr.log").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_copies_are_written_read_by_range_and_swept_when_old_in_an_s3_lake() {
    let Ok(base) = std::env::var("TIDEGATE_TEST_S3_URL") else {
        tidegate_testkit::service_missing(
            "log_copies_are_written_read_by_range_and_swept_when_old_in_an_s3_lake",
            "TIDEGATE_TEST_S3_URL (and AWS_* for the client)",
        );
        return;
    };
    let url = format!("{}/logs-{}", base.trim_end_matches('/'), uuid::Uuid::now_v7());
    check(&Lake::open(&url).await.expect("open the s3 lake")).await;
}

mod common;
use common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::CompareSpec;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale() {
    let (_dir, lake) = lake().await;
    let ds = dataset("big", WriteMode::Replace, basic_columns());
    let n = 1_000_000i64;
    let keys: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    let parts: Vec<_> = keys.iter().map(|k| part(k)).collect();
    let pk: Vec<&str> = (0..n).map(|i| keys[(i % 10) as usize].as_str()).collect();
    let names = ["a", "b", "c"];
    let before: Vec<(i64, Option<i64>, Option<&str>)> =
        (0..n).map(|i| (i, Some(i % 1000), Some(names[(i % 3) as usize]))).collect();
    let t = std::time::Instant::now();
    let v = put(&lake, &ds, &parts, rows(&before, Some(&pk)), "s1").await;
    eprintln!("publish {:?}", t.elapsed());
    let after: Vec<(i64, Option<i64>, Option<&str>)> = (0..n)
        .map(|i| (i + 1000, Some(if i % 7 == 0 { 1 } else { i % 1000 }), Some(names[(i % 3) as usize])))
        .collect();
    let pk2: Vec<&str> = (0..n).map(|i| keys[((i + 1000) % 10) as usize].as_str()).collect();
    let staged = lake.stage_batches(&ds, "bf", &parts, vec![rows(&after, Some(&pk2))]).await.expect("stage");
    let k = vec!["id".to_owned()];
    let s = vec!["name".to_owned()];
    for keys in [&k[..], &[][..]] {
        let t = std::time::Instant::now();
        let spec = CompareSpec { dataset: &ds, keys, slice_columns: &s, flag_change_pct: Some(5.0), sample_rows: 3 };
        let c = lake.compare(&spec, Some(v), &[staged.clone()]).await.expect("compare");
        eprintln!("compare keys={keys:?} {:?} totals {:?}", t.elapsed(), c.totals);
        let c2 = lake.compare(&spec, Some(v), &[staged.clone()]).await.expect("compare");
        assert_eq!(serde_json::to_string(&c).unwrap(), serde_json::to_string(&c2).unwrap());
        eprintln!("{}", serde_json::to_string(&c.partitions[0]).unwrap().chars().take(1500).collect::<String>());
    }
    let t = std::time::Instant::now();
    let sizes = lake.partition_sizes("big", &[]).await.unwrap();
    eprintln!("sizes {:?} {:?}", t.elapsed(), &sizes[..2]);
}

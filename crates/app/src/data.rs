//! Reading published data: a dataset's rows (some partitions, at a table version or a release),
//! or a read-only SQL query over every dataset. Both read only what a Delta commit made visible.

use anyhow::{Context, Result, bail};
use tidegate_core::actor::Actor;
use tidegate_lake::arrow::record_batch::RecordBatch;
use tidegate_lake::{Lake, QueryLimits};

use crate::actor::{Access, require};
use crate::workspace::{Workspace, open_lake, runtime};

/// Which rows of one dataset to read.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// The dataset.
    pub dataset: String,
    /// Only these partitions (none: every partition); each key must fit the dataset's partitioning.
    pub partitions: Vec<String>,
    /// A Delta table version (none: the latest), exclusive with `release`.
    pub version: Option<u64>,
    /// The table version this release published.
    pub release: Option<String>,
    /// At most this many rows.
    pub limit: usize,
}

/// A read-only SQL query over the published datasets (each a table under its name).
#[derive(Debug, Clone)]
pub struct SqlRequest {
    /// The query: SELECT, WITH ... SELECT, VALUES or EXPLAIN; anything that writes or reads files
    /// by path is refused.
    pub query: String,
    /// Its memory and time limits.
    pub limits: QueryLimits,
}

/// Reads `request`'s rows of a dataset.
pub fn read(ws: &Workspace, actor: &Actor, request: &ReadRequest) -> Result<Vec<RecordBatch>> {
    require(actor, Access::Read)?;
    let dataset = &request.dataset;
    if !ws.spec.datasets.contains_key(dataset) {
        let names = ws.spec.datasets.keys().map(String::as_str);
        let hint = tidegate_core::spec::did_you_mean(dataset, names).map(|h| format!(" ({h})")).unwrap_or_default();
        bail!("no dataset named {dataset:?} in {}{hint}", ws.spec.file);
    }
    // A key the dataset's partitioning cannot have is a mistake, not a partition without rows.
    tidegate_core::plan::partitions_of(&ws.spec.datasets[dataset], &request.partitions)?;
    let version = match &request.release {
        None => request.version,
        Some(r) => {
            let store = ws.open_store()?;
            let release = store.release(r)?.with_context(|| format!("no release {r:?}"))?;
            let item = release
                .items
                .iter()
                .find(|i| &i.dataset == dataset)
                .with_context(|| format!("release {r} did not publish {dataset}"))?;
            Some(u64::try_from(item.delta_version).context("negative table version")?)
        }
    };
    let batches = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        let parts = (!request.partitions.is_empty()).then_some(request.partitions.as_slice());
        anyhow::Ok(lake.read(dataset, parts, version).await?)
    })?;
    Ok(limit(batches, request.limit))
}

/// Runs a read-only query within its limits.
pub fn sql(ws: &Workspace, actor: &Actor, request: &SqlRequest) -> Result<Vec<RecordBatch>> {
    require(actor, Access::Read)?;
    runtime()?.block_on(async {
        let url = ws.lake_url();
        let lake = Lake::open(&url).await.with_context(|| format!("opening the lake at {url}"))?;
        anyhow::Ok(lake.with_query_limits(request.limits).sql(&request.query).await?)
    })
}

/// The first `n` rows of `batches`.
fn limit(batches: Vec<RecordBatch>, mut n: usize) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    for b in batches {
        if n == 0 {
            break;
        }
        let take = b.num_rows().min(n);
        out.push(b.slice(0, take));
        n -= take;
    }
    out
}

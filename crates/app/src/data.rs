//! Reading published data: a dataset's rows (some partitions, at a table version or a release),
//! or a read-only SQL query over every dataset. Both read only what a Delta commit made visible.

use anyhow::{Context, Result};
use tidegate_core::actor::Actor;
use tidegate_lake::arrow::record_batch::RecordBatch;
use tidegate_lake::{Lake, Pointer, QueryLimits};

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
    /// The table version this release published or, for a dataset it did not publish, the one
    /// its pointer names; `latest` for the newest pointer.
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
    /// Read every dataset at the versions this release's pointer names (`latest`: the newest
    /// pointer), so the query sees one release across datasets; `None` reads each table's latest.
    pub release: Option<String>,
}

/// The pointer readers use to see `release` whole: the newest with `latest`.
pub async fn pointer(lake: &Lake, release: &str) -> Result<Pointer> {
    let found = if release == LATEST { lake.pointer().await? } else { lake.pointer_of(release).await? };
    found
        .ok_or_else(|| match release {
            LATEST => "no release has written a pointer yet: a run writes one when it succeeds, a backfill when it \
                   publishes"
                .to_owned(),
            r => format!(
                "release {r} wrote no pointer: the pointer moves when a run succeeds (its last release writes it) or a \
             backfill publishes; `--release latest` reads the newest"
            ),
        })
        .map_err(|message| crate::Refusal::not_found(message).into())
}

/// The release name that means the newest pointer.
pub const LATEST: &str = "latest";

/// Refuses a dataset the spec does not declare, suggesting the nearest name.
fn declared(ws: &Workspace, dataset: &str) -> Result<()> {
    if !ws.spec.datasets.contains_key(dataset) {
        let names = ws.spec.datasets.keys().map(String::as_str);
        let hint = tidegate_core::spec::did_you_mean(dataset, names).map(|h| format!(" ({h})")).unwrap_or_default();
        crate::refuse!(NotFound, "no dataset named {dataset:?} in {}{hint}", ws.spec.file);
    }
    Ok(())
}

/// A dataset's table versions, newest first, each with the metadata Tidegate wrote on its commit
/// (release, run, step, schema change); none before its first publication.
pub fn versions(ws: &Workspace, actor: &Actor, dataset: &str) -> Result<Vec<tidegate_lake::Commit>> {
    require(actor, Access::Read)?;
    declared(ws, dataset)?;
    runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        if lake.table_version(dataset).await?.is_none() {
            return Ok(Vec::new());
        }
        anyhow::Ok(lake.history(dataset).await?)
    })
}

/// Every partition a dataset's latest version holds, with its rows, bytes and files, by key.
pub fn partitions(ws: &Workspace, actor: &Actor, dataset: &str) -> Result<Vec<tidegate_lake::PartitionSize>> {
    require(actor, Access::Read)?;
    declared(ws, dataset)?;
    runtime()?.block_on(async { anyhow::Ok(open_lake(ws).await?.partition_sizes(dataset, &[]).await?) })
}

/// Reads `request`'s rows of a dataset.
pub fn read(ws: &Workspace, actor: &Actor, request: &ReadRequest) -> Result<Vec<RecordBatch>> {
    require(actor, Access::Read)?;
    let dataset = &request.dataset;
    declared(ws, dataset)?;
    // A key the dataset's partitioning cannot have is a mistake, not a partition without rows.
    tidegate_core::plan::partitions_of(&ws.spec.datasets[dataset], &request.partitions)?;
    let release = whole_release(ws, request.release.as_deref())?;
    let batches = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        let version = match &release {
            None => request.version,
            Some(r) => Some(release_version(ws, &lake, r, dataset).await?),
        };
        let parts = (!request.partitions.is_empty()).then_some(request.partitions.as_slice());
        anyhow::Ok(lake.read_at_most(dataset, parts, version, request.limit).await?)
    })?;
    Ok(limit(batches, request.limit))
}

/// Runs a read-only query within its limits.
pub fn sql(ws: &Workspace, actor: &Actor, request: &SqlRequest) -> Result<Vec<RecordBatch>> {
    require(actor, Access::Read)?;
    let release = whole_release(ws, request.release.as_deref())?;
    runtime()?.block_on(async {
        let url = ws.lake_url();
        let lake = Lake::open(&url).await.with_context(|| format!("opening the lake at {url}"))?;
        let lake = lake.with_query_limits(request.limits);
        match &release {
            None => anyhow::Ok(lake.sql(&request.query).await?),
            Some(r) => {
                let pointer = pointer(&lake, r).await?;
                anyhow::Ok(lake.sql_at(&request.query, &pointer).await?)
            }
        }
    })
}

/// The release `given` names, by its whole id: `latest` as it is, an id or a unique prefix of one
/// as the store finds it (`ids::release`).
fn whole_release(ws: &Workspace, given: Option<&str>) -> Result<Option<String>> {
    match given {
        None => Ok(None),
        Some(LATEST) => Ok(Some(LATEST.to_owned())),
        Some(id) => match crate::ids::release(ws.open_store()?.as_ref(), id) {
            Ok(whole) => Ok(Some(whole)),
            // A release the store does not hold may still name a pointer: the lake answers for it.
            Err(e) if crate::refusal::kind(&e) == Some(crate::Kind::NotFound) => Ok(Some(id.to_owned())),
            Err(e) => Err(e),
        },
    }
}

/// The table version of `dataset` that `release` stands for: the one it published, else the one
/// its pointer names.
async fn release_version(ws: &Workspace, lake: &Lake, release: &str, dataset: &str) -> Result<u64> {
    if release != LATEST {
        let store = ws.open_store()?;
        let Some(record) = store.release(release)? else { crate::refuse!(NotFound, "no release {release:?}") };
        if let Some(item) = record.items.iter().find(|i| i.dataset == dataset) {
            return u64::try_from(item.delta_version).context("negative table version");
        }
    }
    let pointer = pointer(lake, release).await?;
    match pointer.tables.get(dataset) {
        Some(version) => Ok(*version),
        None => crate::refuse!(
            NotFound,
            "release {} (pointer {}) names no version of {dataset}: it was not published yet",
            pointer.release,
            pointer.seq
        ),
    }
}

/// `batches` as a JSON array of objects, one a row, each column a key in the table's order; `[]`
/// when there are no rows.
pub fn json_rows(batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut writer = tidegate_lake::arrow::json::ArrayWriter::new(Vec::new());
    for b in batches {
        writer.write(b)?;
    }
    writer.finish()?;
    let bytes = writer.into_inner();
    Ok(if bytes.is_empty() { b"[]".to_vec() } else { bytes })
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

/// The most releases a listing reads.
pub const RELEASES_LISTED_MAX: u32 = 10_000;

/// The newest `limit` releases (publications and rollbacks), newest first; only those of
/// `dataset` when given (a dataset the spec does not declare is refused as not found).
pub fn releases(
    ws: &Workspace,
    store: &dyn tidegate_store::Store,
    actor: &Actor,
    dataset: Option<&str>,
    limit: u32,
) -> Result<Vec<tidegate_store::ReleaseRecord>> {
    require(actor, Access::Read)?;
    if let Some(d) = dataset
        && !ws.spec.datasets.contains_key(d)
    {
        crate::refuse!(NotFound, "no dataset named {d:?} in {}", ws.spec.file);
    }
    Ok(store.releases(dataset, limit)?)
}

/// The release `id`: what it made visible, by whom, and what it restores if it is a rollback.
pub fn release(store: &dyn tidegate_store::Store, actor: &Actor, id: &str) -> Result<tidegate_store::ReleaseRecord> {
    require(actor, Access::Read)?;
    match store.release(&crate::ids::release(store, id)?)? {
        Some(release) => Ok(release),
        None => crate::refuse!(NotFound, "no release {id:?}"),
    }
}

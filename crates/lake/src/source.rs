//! Looking at an external source's files: whether a folder or an object-store prefix holds at
//! least one file, and whether a Delta table outside the lake holds a partition. Only reads.

use object_store::ObjectStore as _;
use url::Url;

use crate::error::{Error, Result};
use crate::table::Lake;

/// Whether a file's name makes it data rather than a marker or a hidden file (`.x`, `_x`).
pub fn is_data_name(name: &str) -> bool {
    !name.starts_with('.') && !name.starts_with('_')
}

/// Whether the `s3://bucket/prefix` holds at least one object whose name is data
/// ([`is_data_name`]) somewhere under it.
pub async fn prefix_has_files(location: &str) -> Result<bool> {
    use futures::StreamExt as _;
    let url = Url::parse(location)
        .map_err(|e| Error::InvalidLake { url: location.to_owned(), reason: format!("not a URL: {e}") })?;
    let (store, prefix) = crate::s3::open(&url).await?;
    let mut listing = store.list(Some(&prefix));
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(Error::from)?;
        if meta.location.filename().is_some_and(is_data_name) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the Delta table at `location` (a folder or `s3://` URL) exists and has at least one
/// data file in `partition`. A folder that does not exist is not created.
pub async fn table_has_partition(location: &str, partition: &str) -> Result<bool> {
    let trimmed = location.trim_end_matches('/');
    let Some((parent, name)) = trimmed.rsplit_once('/') else {
        return Err(Error::InvalidLake { url: location.to_owned(), reason: "names no table folder".into() });
    };
    if !trimmed.contains("://") && !std::path::Path::new(trimmed).join("_delta_log").is_dir() {
        return Ok(false);
    }
    let lake = Lake::open(parent).await?;
    let sizes = lake.partition_sizes(name, &[partition.to_owned()]).await?;
    Ok(sizes.iter().any(|s| s.n_files > 0))
}

/// The current version of the Delta table at `location` (a folder or `s3://` URL), `None` when
/// there is no table there. A folder that does not exist is not created.
pub async fn table_version_at(location: &str) -> Result<Option<u64>> {
    let trimmed = location.trim_end_matches('/');
    let Some((parent, name)) = trimmed.rsplit_once('/') else {
        return Err(Error::InvalidLake { url: location.to_owned(), reason: "names no table folder".into() });
    };
    if !trimmed.contains("://") && !std::path::Path::new(trimmed).join("_delta_log").is_dir() {
        return Ok(None);
    }
    Lake::open(parent).await?.table_version(name).await
}

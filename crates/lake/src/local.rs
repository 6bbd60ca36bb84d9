//! Folder lakes: object_store's local file system, with a log listing that stats only what it
//! returns.
//!
//! Delta readers find new commits by listing the log from the last version they know
//! (`list_with_offset`), and delta-rs does so after every commit. object_store's local listing
//! walks the folder with `walkdir`, which stats every entry (to follow links) before the offset is
//! applied, so each commit to a table with N versions made N `statx` calls: quadratic over the
//! table's life (an `strace` of 100 one-step publications counted 5,337 on the log's commit
//! files). Here a folder without subfolders (every Delta log) is read with one `read_dir`, and
//! only the entries after the offset are stat'ed; any other listing goes to object_store.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use bytes::Bytes;
use deltalake_core::DeltaResult;
use deltalake_core::logstore::{ObjectStoreFactory, ObjectStoreRef, StorageConfig, object_store_factories};
use futures::stream::{self, BoxStream, StreamExt as _};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt as _,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use url::Url;

/// The local file system, listing flat folders without stat'ing what it skips.
#[derive(Debug, Default)]
pub(crate) struct LocalStore {
    inner: Arc<LocalFileSystem>,
}

impl std::fmt::Display for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalStore({})", self.inner)
    }
}

/// Makes delta-rs use [`LocalStore`] for `file://` tables, once per process.
pub(crate) fn register() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        let key = Url::parse("file://").expect("a scheme URL parses");
        object_store_factories().insert(key, Arc::new(LocalStores));
    });
}

/// Builds delta-rs' object stores for `file://` table URLs, as its default factory does
/// (a store at the file system's root, and the URL's path in it).
struct LocalStores;

impl ObjectStoreFactory for LocalStores {
    fn parse_url_opts(&self, url: &Url, _config: &StorageConfig) -> DeltaResult<(ObjectStoreRef, Path)> {
        let path = Path::from_url_path(url.path())?;
        Ok((Arc::new(LocalStore::default()), path))
    }
}

impl LocalStore {
    /// The objects directly in `prefix` whose location sorts after `offset`, in order, or `None`
    /// when this listing cannot answer for object_store's (a subfolder, a link, a name that is
    /// not plain UTF-8 or needs escaping, a missing folder).
    fn flat_names_after(prefix: &Path, offset: &Path) -> Option<Vec<Path>> {
        let raw = prefix.as_ref();
        if raw.contains('%') {
            return None;
        }
        let dir = std::path::Path::new("/").join(raw);
        let mut locations = Vec::new();
        for entry in std::fs::read_dir(&dir).ok()? {
            let entry = entry.ok()?;
            if !entry.file_type().ok()?.is_file() {
                return None;
            }
            let name = entry.file_name().into_string().ok()?;
            // object_store's own temporary files (`name#N`) are not objects.
            if name.contains('#') {
                continue;
            }
            let location = Path::from(format!("{raw}/{name}"));
            if location.as_ref() != format!("{raw}/{name}") {
                return None;
            }
            if location > *offset {
                locations.push(location);
            }
        }
        locations.sort();
        Some(locations)
    }
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        let Some(locations) = prefix.and_then(|p| Self::flat_names_after(p, offset)) else {
            return self.inner.list_with_offset(prefix, offset);
        };
        let inner = Arc::clone(&self.inner);
        stream::iter(locations)
            .then(move |location| {
                let inner = Arc::clone(&inner);
                async move { inner.head(&location).await }
            })
            // Deleted between the folder read and the stat: no longer there to list.
            .filter(|meta| std::future::ready(!matches!(meta, Err(object_store::Error::NotFound { .. }))))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt as _;

    use super::*;

    async fn listed(store: &dyn ObjectStore, prefix: &Path, offset: &Path) -> Vec<(String, u64)> {
        let mut metas: Vec<ObjectMeta> =
            store.list_with_offset(Some(prefix), offset).try_collect().await.expect("list");
        metas.sort_by(|a, b| a.location.cmp(&b.location));
        metas.into_iter().map(|m| (m.location.to_string(), m.size)).collect()
    }

    /// The fast listing returns exactly what object_store's does, for a flat folder (with one of
    /// object_store's temporary files in it) at several offsets, and for a folder with a
    /// subfolder, which it hands to object_store.
    #[tokio::test]
    async fn lists_what_object_store_lists() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("_delta_log");
        std::fs::create_dir(&log).expect("mkdir");
        for v in 0..25u64 {
            let body = "x".repeat(usize::try_from(v).expect("small"));
            std::fs::write(log.join(format!("{v:020}.json")), body).expect("write");
        }
        std::fs::write(log.join("00000000000000000019.checkpoint.parquet"), "cp").expect("write");
        std::fs::write(log.join("00000000000000000030.json#7"), "partial").expect("write");
        let fast = LocalStore::default();
        let reference = LocalFileSystem::new();
        let prefix = Path::from_filesystem_path(&log).expect("path");
        for from in [0u64, 9, 19, 24, 40] {
            let offset = Path::from(format!("{}/{from:020}", prefix.as_ref()));
            let got = listed(&fast, &prefix, &offset).await;
            assert_eq!(got, listed(&reference, &prefix, &offset).await, "offset {from}");
            // Commit files from `from` on (each sorts after the bare version), the checkpoint if 19 >= from.
            let expected = (0..25u64).filter(|v| *v >= from).count() + usize::from(from <= 19);
            assert_eq!(got.len(), expected, "offset {from}: {got:?}");
        }
        std::fs::create_dir(log.join("_sidecars")).expect("mkdir");
        std::fs::write(log.join("_sidecars").join("a.parquet"), "s").expect("write");
        let offset = Path::from(format!("{}/{:020}", prefix.as_ref(), 20));
        assert!(LocalStore::flat_names_after(&prefix, &offset).is_none(), "a subfolder goes to object_store");
        assert_eq!(listed(&fast, &prefix, &offset).await, listed(&reference, &prefix, &offset).await);
    }
}

#[cfg(test)]
mod wiring {
    /// The registration takes: delta-rs reaches a folder lake's tables through [`super::LocalStore`].
    #[tokio::test]
    async fn folder_lakes_use_the_local_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let lake = crate::Lake::open(dir.path().to_str().expect("utf-8")).await.expect("open");
        let url = lake.table_url("t").expect("url");
        let table = deltalake_core::DeltaTableBuilder::from_url(url).expect("builder").build().expect("table");
        let root = table.log_store().root_object_store(None).to_string();
        assert!(root.starts_with("LocalStore("), "{root}");
    }
}

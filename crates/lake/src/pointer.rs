//! The release pointer: a small JSON file, written after a release's dataset commits, that names
//! one table version per dataset. A consumer who reads every table at the versions the pointer
//! names sees whole releases only, never new features beside old labels (the snapshot-with-pointer
//! pattern). Each pointer is written twice: once under its release's name, never changed again,
//! then as `current.json`, replaced in one atomic put. Only the holder of the store's scheduler
//! role writes pointers, so they advance in one order.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use deltalake_core::DeltaTableBuilder;
use object_store::ObjectStoreExt as _;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};

use crate::df::{self, UserSession};
use crate::table::check_segment;
use crate::{Error, Lake, Result};

/// Where pointers live, under the lake's root (a name no dataset can have).
pub const POINTER_DIR: &str = "_tidegate/releases";
/// The newest pointer's file name in [`POINTER_DIR`].
pub const CURRENT_POINTER: &str = "current.json";

/// Table versions to read together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pointer {
    /// Counts pointers: each is one more than the one it replaced.
    pub seq: u64,
    /// The release that moved it.
    pub release: String,
    /// The run the release completed, if a run's.
    pub run_id: Option<String>,
    /// The backfill it published, if a backfill's.
    pub backfill_id: Option<String>,
    /// When it was written.
    pub written_at: DateTime<Utc>,
    /// The table version of every dataset published so far, as of the release.
    pub tables: BTreeMap<String, u64>,
}

/// What a new pointer says beyond the previous one.
#[derive(Debug, Clone)]
pub struct Advance {
    /// The release moving it.
    pub release: String,
    /// The run the release completed, if any.
    pub run_id: Option<String>,
    /// The backfill it published, if any.
    pub backfill_id: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
    /// The datasets it moves, at their new versions; the others keep theirs.
    pub tables: BTreeMap<String, u64>,
}

impl Lake {
    /// The newest pointer, if a release has written one.
    pub async fn pointer(&self) -> Result<Option<Pointer>> {
        self.read_pointer(CURRENT_POINTER).await
    }

    /// The pointer `release` wrote, if it wrote one.
    pub async fn pointer_of(&self, release: &str) -> Result<Option<Pointer>> {
        check_segment("release id", release)?;
        self.read_pointer(&format!("{release}.json")).await
    }

    /// Writes the pointer after the current one: its tables with `advance`'s versions laid over
    /// them. The release's own file first, then `current.json`: a reader never finds a current
    /// pointer whose release file is missing. Writing the same release again rewrites the same
    /// pointer (a retry after a crash).
    pub async fn advance_pointer(&self, advance: Advance) -> Result<Pointer> {
        check_segment("release id", &advance.release)?;
        let previous = self.pointer().await?;
        if let Some(p) = previous.as_ref().filter(|p| p.release == advance.release) {
            return Ok(p.clone());
        }
        let mut tables = previous.as_ref().map(|p| p.tables.clone()).unwrap_or_default();
        tables.extend(advance.tables);
        let pointer = Pointer {
            seq: previous.map_or(1, |p| p.seq + 1),
            release: advance.release,
            run_id: advance.run_id,
            backfill_id: advance.backfill_id,
            written_at: advance.at,
            tables,
        };
        let bytes = serde_json::to_vec_pretty(&pointer).map_err(|e| Error::internal(e.to_string()))?;
        let store = self.pointer_store()?;
        store.put(&ObjectPath::from(format!("{}.json", pointer.release)), bytes.clone().into()).await?;
        store.put(&ObjectPath::from(CURRENT_POINTER), bytes.into()).await?;
        Ok(pointer)
    }

    /// Runs a read-only `query` with every dataset the pointer names registered at its version
    /// (and no other), within this handle's query limits.
    pub async fn sql_at(&self, query: &str, pointer: &Pointer) -> Result<Vec<arrow::record_batch::RecordBatch>> {
        let session = UserSession::new(self.limits)?;
        for (name, version) in &pointer.tables {
            let table = self.load_at(name, Some(*version)).await?;
            crate::read::register_table(session.ctx(), name, &table).await?;
        }
        df::user_query(&session, query).await
    }

    async fn read_pointer(&self, file: &str) -> Result<Option<Pointer>> {
        let store = self.pointer_store()?;
        let bytes = match store.get(&ObjectPath::from(file)).await {
            Ok(got) => got.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| Error::Query {
            detail: format!("the release pointer {POINTER_DIR}/{file} is not a pointer Tidegate wrote: {e}"),
        })
    }

    /// The object store rooted at [`POINTER_DIR`].
    fn pointer_store(&self) -> Result<std::sync::Arc<dyn object_store::ObjectStore>> {
        let url = self.root_url().join(&format!("{POINTER_DIR}/")).map_err(|e| Error::internal(e.to_string()))?;
        if let Some(root) = self.root() {
            std::fs::create_dir_all(root.join(POINTER_DIR))?;
        }
        Ok(DeltaTableBuilder::from_url(url)?.build()?.object_store())
    }
}

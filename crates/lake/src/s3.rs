//! `s3://` lakes: Amazon S3 and S3-compatible stores (MinIO, Cloudflare R2, ...) through
//! `object_store`, configured the way the AWS tools are, from `AWS_*` environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`, ...).
//!
//! A Delta commit is the creation of `_delta_log/<version>.json`; two writers racing for the same
//! version must not both succeed. Local folders get that from the file system's create-new; an
//! object store needs conditional put (`If-None-Match: *`). Tidegate commits with delta-rs's
//! default log store, which relies on exactly that, and refuses a store that does not honour it:
//! [`open`] probes the store once and names the missing capability instead of risking a lost
//! commit later. No DynamoDB lock table is needed.

use std::sync::{Arc, OnceLock};

use deltalake_core::DeltaResult;
use deltalake_core::logstore::{
    LogStore, LogStoreFactory, ObjectStoreFactory, ObjectStoreRef, StorageConfig, default_logstore, logstore_factories,
    object_store_factories,
};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use url::Url;

use crate::error::{Error, Result};

/// The schemes served by this module.
pub(crate) const SCHEMES: [&str; 2] = ["s3", "s3a"];

/// Connects to the bucket of `url`, checks that it honours conditional put, and registers the
/// `s3` schemes with delta-rs. Returns the bucket's store and the lake's prefix in it.
pub(crate) async fn open(url: &Url) -> Result<(Arc<dyn ObjectStore>, Path)> {
    open_with(url, &[]).await
}

/// [`open`] with client options on top of the environment's.
async fn open_with(url: &Url, options: &[(String, String)]) -> Result<(Arc<dyn ObjectStore>, Path)> {
    register();
    let store = build(url, options).map_err(|reason| Error::InvalidLake { url: url.to_string(), reason })?;
    let prefix = Path::from(url.path());
    probe_conditional_put(&store, &prefix).await.map_err(|reason| Error::UnsupportedLake {
        url: url.to_string(),
        reason: format!(
            "the object store does not honour conditional put (If-None-Match), which Delta commits \
             need so that two writers cannot both create the same version: {reason}"
        ),
    })?;
    Ok((store, prefix))
}

/// An S3 client for the bucket of `url`: the `AWS_*` environment first, then `options` (delta-rs'
/// storage options, if a caller gave any), then the URL; conditional put always on.
fn build(url: &Url, options: &[(String, String)]) -> std::result::Result<Arc<dyn ObjectStore>, String> {
    let mut builder = AmazonS3Builder::from_env();
    for (key, value) in options {
        if let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            builder = builder.with_config(key, value);
        }
    }
    let store = builder
        .with_url(url.as_str())
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

/// Creates a probe object twice with `PutMode::Create`: the first must succeed and the second be
/// refused as already existing. Deletes the probe afterwards.
async fn probe_conditional_put(store: &Arc<dyn ObjectStore>, prefix: &Path) -> std::result::Result<(), String> {
    let probe = prefix.clone().join("_tidegate").join(format!("probe-{}", uuid::Uuid::now_v7()));
    let create = || PutOptions { mode: PutMode::Create, ..Default::default() };
    store
        .put_opts(&probe, PutPayload::from_static(b"probe"), create())
        .await
        .map_err(|e| format!("creating {probe} failed: {e}"))?;
    let second = store.put_opts(&probe, PutPayload::from_static(b"probe"), create()).await;
    let _ = store.delete(&probe).await;
    match second {
        Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
        Ok(_) => Err(format!("a second create of {probe} succeeded and overwrote the first")),
        Err(e) => Err(format!("a second create of {probe} failed with {e} instead of a precondition failure")),
    }
}

/// Registers the S3 object store and log store factories with delta-rs, once per process.
fn register() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        for scheme in SCHEMES {
            let key = Url::parse(&format!("{scheme}://")).expect("a scheme URL parses");
            object_store_factories().insert(key.clone(), Arc::new(S3Stores));
            logstore_factories().insert(key, Arc::new(ConditionalPutLogs));
        }
    });
}

/// Builds delta-rs' object stores for `s3://` table URLs.
struct S3Stores;

impl ObjectStoreFactory for S3Stores {
    fn parse_url_opts(&self, url: &Url, config: &StorageConfig) -> DeltaResult<(ObjectStoreRef, Path)> {
        let options: Vec<(String, String)> = config.raw.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let store = build(url, &options)
            .map_err(|reason| deltalake_core::DeltaTableError::InvalidTableLocation(format!("{url}: {reason}")))?;
        Ok((store, Path::from(url.path())))
    }
}

/// delta-rs' default log store: commits with `PutMode::Create`, which the store honours (checked
/// by [`probe_conditional_put`] when the lake is opened).
struct ConditionalPutLogs;

impl LogStoreFactory for ConditionalPutLogs {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(prefixed_store, root_store, location, options))
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};

    use super::*;

    /// A store that ignores `If-None-Match` (every write succeeds) is refused when the lake is
    /// opened, with the reason, before anything is committed to it.
    #[tokio::test]
    async fn a_store_that_ignores_conditional_put_is_refused_with_the_reason() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || serve_blindly(stream));
            }
        });
        let options: Vec<(String, String)> = [
            ("aws_endpoint_url", endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_region", "us-east-1"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let url = Url::parse("s3://blind-bucket/lake").expect("url");
        let err = open_with(&url, &options).await.expect_err("refused");
        let message = err.to_string();
        assert!(matches!(err, Error::UnsupportedLake { .. }), "{message}");
        assert!(
            message.starts_with(
                "lake s3://blind-bucket/lake: the object store does not honour conditional put \
                 (If-None-Match), which Delta commits need so that two writers cannot both create the \
                 same version: a second create of lake/_tidegate/probe-"
            ) && message.ends_with("succeeded and overwrote the first"),
            "{message}"
        );
    }

    /// Answers as a store with no preconditions would: writes succeed, reads find nothing.
    fn serve_blindly(stream: TcpStream) {
        let Ok(read_half) = stream.try_clone() else { return };
        let mut reader = BufReader::new(read_half);
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
}

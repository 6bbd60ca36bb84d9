//! `--server URL`: the commands that have a route act on a Tidegate server over its HTTP API
//! (`tidegate serve --http`, `tidegate_server`) instead of on local files. Each command sends
//! its request, reads the route's JSON back into the application layer's result type and prints
//! it with the same renderer as the local command, so both print the same text and JSON.
//!
//! The token comes from `TIDEGATE_TOKEN`, `--token-file` or `TIDEGATE_TOKEN_FILE`, never from a
//! flag's value (`ps` shows every process's arguments). Every state-changing POST carries an
//! `Idempotency-Key` (the command's `--idempotency-key`, else one made for this invocation), so
//! the one retry after a connection error, and a user's rerun of a command that died midway
//! with the same key, cannot do the work twice.

pub mod commands;
pub mod logs;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::actor::{TOKEN_FILE_VAR, TOKEN_VAR};

/// The variable naming the server when `--server` does not.
pub const SERVER_VAR: &str = "TIDEGATE_SERVER";

/// How long to wait for a connection to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take, a comparison or a publication included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long to wait before the one retry of a request that met a connection error.
const RETRY_DELAY: Duration = Duration::from_millis(500);
/// The most characters of a body that is not a problem shown in an error.
const BODY_SHOWN_CHARS_MAX: usize = 300;

/// A Tidegate server and the token to present to it.
pub struct Server {
    base: Url,
    token: String,
    /// Where the token came from, for the error that refuses it.
    token_source: String,
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

/// A problem response's fields the CLI reads (RFC 9457, `tidegate_server::Problem`).
#[derive(Debug, Deserialize)]
struct Problem {
    code: String,
    detail: String,
}

impl Server {
    /// The server at `url`, with the token this process was given (`token_file` first).
    pub fn connect(url: &str, token_file: Option<&Path>) -> Result<Server> {
        let mut base = Url::parse(url.trim())
            .map_err(|e| anyhow!("invalid server URL {url:?}: {e} (give one like http://127.0.0.1:8080)"))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            bail!("invalid server URL {url:?}: must start with http:// or https://");
        }
        // Routes are joined below the URL's path (a server behind a proxy at /tidegate/).
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let (token, token_source) = match token_file {
            Some(path) => (
                crate::actor::token_in_file(path, "given by --token-file")?,
                format!("--token-file {}", path.display()),
            ),
            None => match crate::actor::presented_token()? {
                Some(token) => (token, format!("{TOKEN_VAR} or {TOKEN_FILE_VAR}")),
                None => bail!(
                    "acting on the server at {base} needs a token: set {TOKEN_VAR}, or give --token-file PATH (an \
                     admin mints one with `tidegate token create --name NAME --role ROLE` on the server's workspace)"
                ),
            },
        };
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("tidegate/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("setting up the HTTP client")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the HTTP client's runtime")?;
        Ok(Server { base, token, token_source, client, runtime })
    }

    /// `GET` the route at `segments` with `query`, read as `T`.
    pub fn get<T: DeserializeOwned>(&self, segments: &[&str], query: &[(&str, String)]) -> Result<T> {
        self.send(Method::GET, segments, query, None, None)
    }

    /// `POST` `body` to the route at `segments` with `Idempotency-Key: key`, read as `T`. It is
    /// sent once more after a connection error: the key makes the retry safe.
    pub fn post_keyed<T: DeserializeOwned>(&self, segments: &[&str], body: &serde_json::Value, key: &str) -> Result<T> {
        self.send(Method::POST, segments, &[], Some(body), Some(key))
    }

    /// `POST` `body` to a read-only route (a query) at `segments`, read as `T`.
    pub fn post_read<T: DeserializeOwned>(&self, segments: &[&str], body: &serde_json::Value) -> Result<T> {
        self.send(Method::POST, segments, &[], Some(body), None)
    }

    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Result<Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| anyhow!("the server URL {} cannot take a path", self.base))?
            .pop_if_empty()
            .extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        Ok(url)
    }

    fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<&serde_json::Value>,
        key: Option<&str>,
    ) -> Result<T> {
        let url = self.url(segments, query)?;
        let body = body.map(serde_json::to_vec).transpose()?;
        let request = || {
            let mut r = self.client.request(method.clone(), url.clone()).bearer_auth(&self.token);
            if let Some(key) = key {
                r = r.header("Idempotency-Key", key);
            }
            if let Some(body) = &body {
                r = r.header(reqwest::header::CONTENT_TYPE, "application/json").body(body.clone());
            }
            async move {
                let response = r.send().await?;
                let status = response.status();
                Ok::<_, reqwest::Error>((status, response.bytes().await?))
            }
        };
        // Every request this client sends is safe to repeat (a read, a query, or a change under
        // an `Idempotency-Key`), so one that may not have arrived is sent once more.
        let mut answer = self.runtime.block_on(request());
        if answer.as_ref().is_err_and(is_transient) {
            std::thread::sleep(RETRY_DELAY);
            answer = self.runtime.block_on(request());
        }
        let (status, bytes) = answer.map_err(|e| anyhow!("cannot reach the server at {}: {}", self.base, chain(&e)))?;
        if !status.is_success() {
            return Err(self.refusal(status, &bytes));
        }
        serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "reading the answer of the server at {} to {method} {} (is it another version of tidegate?)",
                self.base,
                url.path()
            )
        })
    }

    /// The error a non-success answer is: a problem's `detail`, as the local command words the
    /// same refusal, with what to do about a refused token.
    fn refusal(&self, status: StatusCode, bytes: &[u8]) -> anyhow::Error {
        let Ok(problem) = serde_json::from_slice::<Problem>(bytes) else {
            let text = String::from_utf8_lossy(bytes);
            let shown: String = text.chars().take(BODY_SHOWN_CHARS_MAX).collect();
            return anyhow!("the server at {} answered {status}: {}", self.base, shown.trim());
        };
        match problem.code.as_str() {
            "unauthenticated" => {
                anyhow!("the server at {} refused the token from {}: {}", self.base, self.token_source, problem.detail)
            }
            _ => anyhow!("{}", problem.detail),
        }
    }
}

/// A fresh `Idempotency-Key` for one invocation's change.
pub fn new_key() -> String {
    format!("cli-{}", uuid::Uuid::new_v4())
}

/// Whether a request's error means it may not have reached the server, or its answer was lost.
fn is_transient(e: &reqwest::Error) -> bool {
    e.is_connect() || e.is_timeout() || e.is_request() || e.is_body()
}

/// An error with its causes, as `{:#}` prints an `anyhow` chain (reqwest's own `Display` stops at
/// "error sending request").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

//! A Tidegate workspace for a test: a temp folder holding a `tidegate.toml`, deleted on drop.
//!
//! The folder is `tempfile`'s, named `.tmp` and six random characters under the system's temp
//! folder: the CLI's snapshot tests replace paths of that shape with `[workspace]`.

use std::path::{Path, PathBuf};

/// The spec file's name in a workspace folder.
const SPEC_FILE: &str = "tidegate.toml";

/// A temp folder holding a `tidegate.toml`, to run Tidegate on; deleted, with all in it, on drop.
#[derive(Debug)]
pub struct TestWorkspace {
    dir: tempfile::TempDir,
}

impl TestWorkspace {
    /// A fresh temp folder with `spec` written as its `tidegate.toml`.
    pub fn new(spec: impl AsRef<[u8]>) -> Self {
        let ws = Self { dir: tempfile::tempdir().expect("creating a temp folder for the test workspace") };
        ws.set_spec(spec);
        ws
    }

    /// The workspace folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The workspace's `tidegate.toml`.
    pub fn spec_path(&self) -> PathBuf {
        self.path().join(SPEC_FILE)
    }

    /// The current text of the workspace's `tidegate.toml`.
    pub fn spec(&self) -> String {
        std::fs::read_to_string(self.spec_path()).expect("reading the test workspace's tidegate.toml")
    }

    /// Replaces the workspace's `tidegate.toml` with `spec`.
    pub fn set_spec(&self, spec: impl AsRef<[u8]>) {
        std::fs::write(self.spec_path(), spec).expect("writing the test workspace's tidegate.toml");
    }

    /// Writes `text` to `rel` under the workspace folder, creating the folders on the way.
    pub fn write(&self, rel: &str, text: impl AsRef<[u8]>) {
        let path = self.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("creating folders in the test workspace");
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {} in the test workspace: {e}", path.display()));
    }

    /// The Delta table folder of `dataset` in the workspace's default lake, `.tidegate/lake/<dataset>`.
    pub fn table(&self, dataset: &str) -> PathBuf {
        self.path().join(".tidegate/lake").join(dataset)
    }
}

impl AsRef<Path> for TestWorkspace {
    fn as_ref(&self) -> &Path {
        self.path()
    }
}

//! Logical operation identities: blake3 over a canonical, length-prefixed encoding, so that the
//! same task, partition, code, parameters and pinned inputs always give the same key and any
//! difference, however small, gives another.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::TaskRun;

/// A canonical byte encoding: every field is tagged and length-prefixed, so no two different
/// inputs can encode to the same bytes (`["ab", "c"]` and `["a", "bc"]` differ).
#[derive(Debug, Default)]
pub struct Canonical {
    hasher: blake3::Hasher,
}

impl Canonical {
    /// An encoding for one kind of identity; `domain` (such as `tidegate.step.v1`) keeps kinds apart.
    pub fn new(domain: &str) -> Self {
        let mut c = Self { hasher: blake3::Hasher::new() };
        c.field("domain", domain.as_bytes());
        c
    }

    /// Appends one tagged field of raw bytes; order matters.
    pub fn field(&mut self, tag: &str, value: &[u8]) -> &mut Self {
        for part in [tag.as_bytes(), value] {
            self.hasher.update(&(part.len() as u64).to_le_bytes());
            self.hasher.update(part);
        }
        self
    }

    /// Appends one tagged text field, as its UTF-8 bytes.
    pub fn str(&mut self, tag: &str, value: &str) -> &mut Self {
        self.field(tag, value.as_bytes())
    }

    /// The blake3 hash of everything appended so far, as 64 lowercase hex characters.
    pub fn finish(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}

/// A declared file's path and contents, read by the caller.
#[derive(Debug, Clone)]
pub struct FileContent<'a> {
    /// The path as declared in the task's `files`, relative to the workspace folder.
    pub path: &'a str,
    /// The file's contents.
    pub bytes: &'a [u8],
}

/// The code version of a task: its argv or SQL text and every file it declares, by path and content.
pub fn code_version(run: &TaskRun, files: &[FileContent<'_>]) -> String {
    let mut c = Canonical::new("tidegate.code_version.v1");
    match run {
        TaskRun::Command { argv, .. } => {
            c.str("kind", "command");
            for arg in argv {
                c.str("arg", arg);
            }
        }
        TaskRun::Sql { query } => {
            c.str("kind", "sql").str("query", query);
        }
    }
    let mut files: Vec<&FileContent<'_>> = files.iter().collect();
    files.sort_by_key(|f| f.path);
    for f in files {
        c.str("file", f.path).field("content", f.bytes);
    }
    c.finish()
}

/// An input version pinned when the step was planned.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PinnedInput {
    /// The input dataset's name.
    pub dataset: String,
    /// The partitions read (empty for `latest`: the whole published version).
    #[serde(default)]
    pub partitions: Vec<String>,
    /// The Delta table version read; `None` when the input has no published version yet.
    pub version: Option<i64>,
    /// Inside a backfill: the upstream steps of the same backfill whose staged (unpublished)
    /// output replaces the published rows of the partitions they cover. Empty otherwise, and then
    /// absent from the serialized form, so step keys of ordinary runs are unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub staged_steps: Vec<String>,
}

/// Everything that makes two executions of a step the same logical operation.
#[derive(Debug, Clone, Copy)]
pub struct StepIdentity<'a> {
    /// The task's name.
    pub task: &'a str,
    /// The partition's key.
    pub partition: &'a str,
    /// The task's code version, from [`code_version`].
    pub code_version: &'a str,
    /// The task's `params`.
    pub params: &'a BTreeMap<String, String>,
    /// The input versions pinned for the step, in any order (the key sorts them).
    pub inputs: &'a [PinnedInput],
}

impl StepIdentity<'_> {
    /// The step's idempotency key (64 hex characters).
    pub fn key(&self) -> String {
        let mut c = Canonical::new("tidegate.step.v1");
        c.str("task", self.task).str("partition", self.partition).str("code", self.code_version);
        for (k, v) in self.params {
            c.str("param", k).str("value", v);
        }
        let mut inputs: Vec<&PinnedInput> = self.inputs.iter().collect();
        inputs.sort();
        for i in inputs {
            c.str("input", &i.dataset).str("version", &i.version.map_or_else(|| "none".to_owned(), |v| v.to_string()));
            for p in &i.partitions {
                c.str("input_partition", p);
            }
        }
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(task: &str, partition: &str, params: &[(&str, &str)], inputs: &[(&str, Option<i64>)]) -> String {
        let params: BTreeMap<String, String> = params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let inputs: Vec<PinnedInput> = inputs
            .iter()
            .map(|(d, v)| PinnedInput {
                dataset: (*d).to_owned(),
                partitions: Vec::new(),
                version: *v,
                staged_steps: Vec::new(),
            })
            .collect();
        StepIdentity { task, partition, code_version: "c1", params: &params, inputs: &inputs }.key()
    }

    #[test]
    fn same_identity_same_key_regardless_of_input_order() {
        let a = key("t", "2024-01-01", &[("k", "v")], &[("a", Some(1)), ("b", Some(2))]);
        let b = key("t", "2024-01-01", &[("k", "v")], &[("b", Some(2)), ("a", Some(1))]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn every_field_changes_the_key() {
        let base = key("t", "p", &[("k", "v")], &[("a", Some(1))]);
        assert_ne!(base, key("u", "p", &[("k", "v")], &[("a", Some(1))]));
        assert_ne!(base, key("t", "q", &[("k", "v")], &[("a", Some(1))]));
        assert_ne!(base, key("t", "p", &[("k", "w")], &[("a", Some(1))]));
        assert_ne!(base, key("t", "p", &[("k", "v")], &[("a", Some(2))]));
        assert_ne!(base, key("t", "p", &[("k", "v")], &[("a", None)]));
    }

    #[test]
    fn field_boundaries_cannot_be_shifted() {
        assert_ne!(key("ab", "c", &[], &[]), key("a", "bc", &[], &[]));
    }

    #[test]
    fn code_version_covers_text_and_declared_files() {
        let run = TaskRun::Command { argv: vec!["python3".into(), "x.py".into()], files: vec!["x.py".into()] };
        let v1 = code_version(&run, &[FileContent { path: "x.py", bytes: b"print(1)" }]);
        let v2 = code_version(&run, &[FileContent { path: "x.py", bytes: b"print(2)" }]);
        assert_ne!(v1, v2);
        let sql_a = code_version(&TaskRun::Sql { query: "SELECT 1".into() }, &[]);
        let sql_b = code_version(&TaskRun::Sql { query: "SELECT 2".into() }, &[]);
        assert_ne!(sql_a, sql_b);
    }
}

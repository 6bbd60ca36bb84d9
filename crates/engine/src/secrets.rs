//! A task's secrets: their values, read from Tidegate's environment when an attempt starts, and
//! their redaction from everything the attempt writes down (logs, failures, check details).

use tidegate_core::spec::Task;

/// The shortest secret value accepted. Shorter values are refused rather than redacted:
/// replacing every `abc` in logs and messages would hide ordinary text, and a value that short
/// is guessed, not kept secret.
pub const MIN_SECRET_CHARS: usize = 4;
/// What a secret is replaced with.
pub const MASK: &str = "***";

/// The values to hide. Its `Debug` shows how many there are, never what they are.
#[derive(Clone, Default)]
pub struct Secrets {
    /// Each value, and each line of a value over several lines (a PEM key is logged line by
    /// line), longest first; none empty.
    fragments: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} fragments)", self.fragments.len())
    }
}

impl Secrets {
    /// Hides every non-empty value in `values`, and each line of at least [`MIN_SECRET_CHARS`]
    /// of a value over several lines.
    pub fn new<S: AsRef<str>>(values: &[S]) -> Self {
        let mut fragments: Vec<Vec<u8>> = Vec::new();
        for v in values.iter().map(AsRef::as_ref).filter(|v| !v.is_empty()) {
            fragments.push(v.as_bytes().to_vec());
            if v.contains('\n') {
                let lines =
                    v.lines().map(|l| l.trim_end_matches('\r')).filter(|l| l.chars().count() >= MIN_SECRET_CHARS);
                fragments.extend(lines.map(|l| l.as_bytes().to_vec()));
            }
        }
        fragments.sort_by_key(|f| std::cmp::Reverse(f.len()));
        fragments.dedup();
        Self { fragments }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.fragments.is_empty()
    }

    /// The length of the longest fragment: how far past a cut a secret that starts before it
    /// can reach.
    pub fn longest(&self) -> usize {
        self.fragments.first().map_or(0, Vec::len)
    }

    /// Whether `text` holds a secret, or ends with the first [`MIN_SECRET_CHARS`] or more bytes
    /// of one: a value cut short inside a secret, as Delta's statistics cut long strings.
    pub fn touches(&self, text: &str) -> bool {
        let bytes = text.as_bytes();
        self.fragments
            .iter()
            .any(|f| find(bytes, f).is_some() || (MIN_SECRET_CHARS..f.len()).any(|n| bytes.ends_with(&f[..n])))
    }

    /// `text` with every secret replaced by [`MASK`].
    pub fn redact(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_owned();
        }
        String::from_utf8_lossy(&self.redact_cut(text.as_bytes(), usize::MAX)).into_owned()
    }

    /// The first `keep` bytes of `bytes` with every secret replaced by [`MASK`]; a secret that
    /// starts before the cut is replaced whole, so no part of it is kept.
    pub fn redact_cut(&self, bytes: &[u8], keep: usize) -> Vec<u8> {
        let keep = keep.min(bytes.len());
        let mut out = Vec::with_capacity(keep);
        let mut at = 0;
        for (start, end) in self.ranges(bytes) {
            if start >= keep {
                break;
            }
            out.extend_from_slice(&bytes[at..start]);
            out.extend_from_slice(MASK.as_bytes());
            at = end;
        }
        if at < keep {
            out.extend_from_slice(&bytes[at..keep]);
        }
        out
    }

    /// Where the secrets occur in `bytes`, overlapping occurrences merged, in order.
    fn ranges(&self, bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut found: Vec<(usize, usize)> = Vec::new();
        for f in &self.fragments {
            let mut from = 0;
            while let Some(i) = find(&bytes[from..], f) {
                found.push((from + i, from + i + f.len()));
                from += i + 1;
            }
        }
        found.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(found.len());
        for (s, e) in found {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }
}

/// The first position of `needle` (not empty) in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    (0..=last_start).find(|&i| hay[i] == first && hay[i..].starts_with(needle))
}

/// The task's secrets as `(name, value)`, read from this process's environment. A secret that
/// is not set, is not UTF-8 or is shorter than [`MIN_SECRET_CHARS`] fails the attempt with a
/// message naming it and the task: retrying would meet the same environment.
pub fn from_env(task: &Task) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::with_capacity(task.secrets.len());
    for name in &task.secrets {
        let problem = match std::env::var(name) {
            Ok(value) if value.chars().count() >= MIN_SECRET_CHARS => {
                out.push((name.clone(), value));
                continue;
            }
            Ok(value) if value.is_empty() => "is set but empty".to_owned(),
            Ok(value) => format!(
                "is {} characters long; secrets must be at least {MIN_SECRET_CHARS} characters, as shorter ones \
                 cannot be redacted from logs without hiding ordinary text",
                value.chars().count()
            ),
            Err(std::env::VarError::NotPresent) => "is not set".to_owned(),
            Err(std::env::VarError::NotUnicode(_)) => "is not valid UTF-8".to_owned(),
        };
        return Err(format!(
            "secret {name} of task \"{task_name}\" {problem} in the environment of this tidegate process \
             (the scheduler or worker running the attempt); set it there, or remove it from tasks.{task_name}.secrets",
            task_name = task.name
        ));
    }
    Ok(out)
}

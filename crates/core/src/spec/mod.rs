//! `tidegate.toml`: the typed model and the strict parser that reports every error with its
//! file, line, column and setting.

mod example;
pub mod model;
mod parse;

use std::fmt;

pub use example::EXAMPLE;
pub use model::*;
pub use parse::parse;

/// `did you mean "x"?` when one of `known` is close enough to `word` to be a likely typo: the
/// suggestion the spec parser makes, for other front ends naming things (`tidegate read`).
pub fn did_you_mean<'a>(word: &str, known: impl IntoIterator<Item = &'a str>) -> Option<String> {
    parse::did_you_mean(word, known)
}

/// One problem found in a spec, pointing at the setting that must change.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    /// The spec file the problem is in, as given to the parser.
    pub file: String,
    /// The 1-based line of the offending setting.
    pub line: u32,
    /// The 1-based column of the offending setting, counted in characters.
    pub col: u32,
    /// The dotted path of the setting, such as `datasets.sessions.write.keys`.
    pub setting: String,
    /// What is wrong with the setting and, where it helps, what it must be.
    pub message: String,
    /// A hint such as `did you mean "order_by"?`.
    pub help: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}: {}", self.file, self.line, self.col, self.setting, self.message)?;
        if let Some(help) = &self.help {
            write!(f, " ({help})")?;
        }
        Ok(())
    }
}

/// Every problem found in a spec, in file order. Never empty.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

//! The hand-written walker over toml-span's tree: typed getters that report every problem as a
//! [`Diagnostic`] with its line, column and setting path, and keep going so all errors surface at once.

use std::collections::HashMap;

use toml_span::value::{Table, ValueInner};
use toml_span::{Span, Value};

use crate::spec::{Diagnostic, Loc};

/// Collects diagnostics and remembers where each setting was written, so that a message about one
/// setting can name another one with its position.
pub(crate) struct Ctx<'t> {
    file: &'t str,
    text: &'t str,
    line_starts: Vec<usize>,
    diags: Vec<Diagnostic>,
    sites: HashMap<String, Loc>,
}

impl<'t> Ctx<'t> {
    pub(crate) fn new(file: &'t str, text: &'t str) -> Self {
        let line_starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Self { file, text, line_starts, diags: Vec::new(), sites: HashMap::new() }
    }

    /// The 1-based line and column (in characters) of a byte offset.
    pub(crate) fn loc(&self, span: Span) -> Loc {
        let offset = span.start.min(self.text.len());
        let line_idx = self.line_starts.partition_point(|&s| s <= offset).saturating_sub(1);
        let line_start = self.line_starts.get(line_idx).copied().unwrap_or(0);
        // A span may in theory start inside a multi-byte character; count bytes then.
        let col = self.text.get(line_start..offset).map_or(offset - line_start, |s| s.chars().count());
        Loc { line: to_u32(line_idx + 1), col: to_u32(col + 1) }
    }

    pub(crate) fn report(&mut self, span: Span, path: &Path, message: String, help: Option<String>) {
        let loc = self.loc(span);
        self.report_at(loc, &path.full(), message, help);
    }

    pub(crate) fn report_at(&mut self, loc: Loc, setting: &str, message: String, help: Option<String>) {
        self.diags.push(Diagnostic {
            file: self.file.to_owned(),
            line: loc.line,
            col: loc.col,
            setting: setting.to_owned(),
            message,
            help,
        });
    }

    /// Remembers where `path` was written.
    pub(crate) fn record(&mut self, path: &Path, span: Span) {
        let loc = self.loc(span);
        self.sites.insert(path.full(), loc);
    }

    /// Where `setting` (a full dotted path) was written, if it was.
    pub(crate) fn site(&self, setting: &str) -> Option<Loc> {
        self.sites.get(setting).copied()
    }

    /// `file:line:col`, for naming a second setting inside a message.
    pub(crate) fn at(&self, loc: Loc) -> String {
        format!("{}:{}:{}", self.file, loc.line, loc.col)
    }

    /// `setting = value (file:line:col)`, or `(the default)` when the file does not set it.
    pub(crate) fn mention(&self, setting: &str, value: impl std::fmt::Display) -> String {
        match self.site(setting) {
            Some(loc) => format!("{setting} = {value} at {}", self.at(loc)),
            None => format!("{setting} = {value} (the default)"),
        }
    }

    pub(crate) fn has_errors(&self) -> bool {
        !self.diags.is_empty()
    }

    /// How many problems were reported so far, to tell whether one part of the file was clean.
    pub(crate) fn error_count(&self) -> usize {
        self.diags.len()
    }

    /// The text of the line holding `span`'s start.
    pub(crate) fn line_text(&self, span: Span) -> &'t str {
        let line_idx = self.loc(span).line.saturating_sub(1) as usize;
        let start = self.line_starts.get(line_idx).copied().unwrap_or(0);
        let end = self.line_starts.get(line_idx + 1).copied().unwrap_or(self.text.len());
        self.text.get(start..end).unwrap_or_default().trim()
    }

    /// The diagnostics in file order; diagnostics at one position keep the order they were found in.
    pub(crate) fn into_diagnostics(self) -> Vec<Diagnostic> {
        let mut diags = self.diags;
        diags.sort_by_key(|d| (d.line, d.col));
        diags.dedup();
        diags
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A setting's dotted path, split into the item it belongs to (`tasks.build`) and the part inside
/// the item (`retry.attempts`), which is what messages call the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Path {
    item: String,
    rel: String,
}

impl Path {
    /// A top-level table such as `project`.
    pub(crate) fn root(table: &str) -> Self {
        Self { item: String::new(), rel: table.to_owned() }
    }

    /// A named item such as `tasks.build`; a name that is not a bare TOML key is quoted, as in
    /// `tasks."../x"`, so the path reads the way the file does.
    pub(crate) fn item(table: &str, name: &str) -> Self {
        let bare = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        let item = if bare { format!("{table}.{name}") } else { format!("{table}.\"{}\"", clip(name)) };
        Self { item, rel: String::new() }
    }

    pub(crate) fn join(&self, key: &str) -> Self {
        let rel = if self.rel.is_empty() { key.to_owned() } else { format!("{}.{key}", self.rel) };
        Self { item: self.item.clone(), rel }
    }

    pub(crate) fn index(&self, i: usize) -> Self {
        Self { item: self.item.clone(), rel: format!("{}[{i}]", self.rel) }
    }

    /// The full dotted path, as shown before the message.
    pub(crate) fn full(&self) -> String {
        match (self.item.is_empty(), self.rel.is_empty()) {
            (true, _) => self.rel.clone(),
            (false, true) => self.item.clone(),
            (false, false) => format!("{}.{}", self.item, self.rel),
        }
    }

    /// The setting's name inside its item, as used in messages (`retry.attempts`).
    pub(crate) fn short(&self) -> String {
        if self.rel.is_empty() { self.item.clone() } else { self.rel.clone() }
    }
}

/// A table being read, with its path for messages.
pub(crate) struct Obj<'v, 'de> {
    pub(crate) path: Path,
    pub(crate) span: Span,
    table: &'v Table<'de>,
}

impl<'v, 'de> Obj<'v, 'de> {
    /// Reads `value` as a table; reports a type error otherwise.
    pub(crate) fn open(ctx: &mut Ctx<'_>, path: Path, value: &'v Value<'de>) -> Option<Self> {
        match value.as_ref() {
            ValueInner::Table(table) => Some(Self { path, span: value.span, table }),
            other => {
                let message = format!("expected a table, found {}", describe(other));
                ctx.report(value.span, &path, message, None);
                None
            }
        }
    }

    /// The table's entries in key order, with the span of each key.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&'v str, Span, &'v Value<'de>)> {
        self.table.iter().map(|(k, v)| (k.name.as_ref(), k.span, v))
    }

    /// Reports every key that is not in `known`, suggesting the closest known one.
    pub(crate) fn allow_only(&self, ctx: &mut Ctx<'_>, known: &[&str]) {
        for (key, span, _) in self.entries() {
            if !known.contains(&key) {
                let where_ = if self.path.full().is_empty() {
                    "at the top level".to_owned()
                } else {
                    format!("in {}", self.path.full())
                };
                let help = did_you_mean(key, known.iter().copied())
                    .unwrap_or_else(|| format!("known settings here: {}", known.join(", ")));
                let message = format!("unknown setting \"{key}\" {where_}");
                ctx.report(span, &self.path.join(key), message, Some(help));
            }
        }
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// The value of `key`, if present; remembers where it was written.
    pub(crate) fn get(&self, ctx: &mut Ctx<'_>, key: &str) -> Option<Field<'v, 'de>> {
        let value = self.table.get(key)?;
        let path = self.path.join(key);
        ctx.record(&path, value.span);
        Some(Field { path, value })
    }

    /// Like [`Obj::get`], but a missing key is an error; `example` shows how to write it.
    pub(crate) fn require(&self, ctx: &mut Ctx<'_>, key: &str, example: &str) -> Option<Field<'v, 'de>> {
        let field = self.get(ctx, key);
        if field.is_none() {
            let message = format!("missing required setting {}", self.path.join(key).short());
            let help = format!("add {example}");
            ctx.report(self.span, &self.path.join(key), message, Some(help));
        }
        field
    }

    /// An optional integer setting with a default and bounds. `None` means it was invalid.
    pub(crate) fn u32_or(&self, ctx: &mut Ctx<'_>, key: &str, default: u32, min: u32, max: u32) -> Option<u32> {
        match self.get(ctx, key) {
            None => Some(default),
            Some(f) => f.int_in(ctx, i64::from(min), i64::from(max)).and_then(|n| u32::try_from(n).ok()),
        }
    }

    /// An optional boolean setting with a default. `None` means it was invalid.
    pub(crate) fn bool_or(&self, ctx: &mut Ctx<'_>, key: &str, default: bool) -> Option<bool> {
        match self.get(ctx, key) {
            None => Some(default),
            Some(f) => f.bool(ctx),
        }
    }

    /// An optional non-empty string setting with a default. `None` means it was invalid.
    pub(crate) fn string_or(&self, ctx: &mut Ctx<'_>, key: &str, default: &str) -> Option<String> {
        match self.get(ctx, key) {
            None => Some(default.to_owned()),
            Some(f) => f.non_empty_string(ctx),
        }
    }

    /// An optional array of strings, empty when absent. `None` means it was invalid.
    pub(crate) fn strings_or_empty(&self, ctx: &mut Ctx<'_>, key: &str) -> Option<Vec<Text>> {
        match self.get(ctx, key) {
            None => Some(Vec::new()),
            Some(f) => f.strings(ctx),
        }
    }
}

/// A string with the position it was written at.
#[derive(Debug, Clone)]
pub(crate) struct Text {
    pub(crate) value: String,
    pub(crate) path: Path,
    pub(crate) span: Span,
}

/// One setting's value, with its path for messages.
pub(crate) struct Field<'v, 'de> {
    pub(crate) path: Path,
    pub(crate) value: &'v Value<'de>,
}

impl<'v, 'de> Field<'v, 'de> {
    pub(crate) fn span(&self) -> Span {
        self.value.span
    }

    /// Reports `expected X, found Y`, with a hint when the value is close to what was wanted.
    pub(crate) fn wrong_type(&self, ctx: &mut Ctx<'_>, expected: &str) {
        let found = self.value.as_ref();
        let help = type_hint(expected, found);
        let message = format!("expected {expected}, found {}", describe(found));
        ctx.report(self.span(), &self.path, message, help);
    }

    /// Reports `invalid value V for setting: reason`.
    pub(crate) fn invalid(&self, ctx: &mut Ctx<'_>, shown: impl std::fmt::Display, reason: &str, help: Option<String>) {
        let message = format!("invalid value {shown} for {}: {reason}", self.path.short());
        ctx.report(self.span(), &self.path, message, help);
    }

    pub(crate) fn str(&self, ctx: &mut Ctx<'_>) -> Option<&'v str> {
        let s = self.value.as_str();
        if s.is_none() {
            self.wrong_type(ctx, "a string");
        }
        s
    }

    pub(crate) fn non_empty_string(&self, ctx: &mut Ctx<'_>) -> Option<String> {
        let s = self.str(ctx)?;
        if s.trim().is_empty() {
            self.invalid(ctx, "\"\"", "must not be empty", None);
            return None;
        }
        Some(s.to_owned())
    }

    /// A string holding one read-only query (see `values::query_problem`); `help` says what the
    /// query is for.
    pub(crate) fn query(&self, ctx: &mut Ctx<'_>, help: &str) -> Option<String> {
        let sql = self.non_empty_string(ctx)?;
        if let Some(reason) = super::values::query_problem(&sql) {
            self.invalid(ctx, format!("\"{}\"", clip(&sql)), &reason, Some(help.to_owned()));
            return None;
        }
        Some(sql)
    }

    pub(crate) fn text(&self, ctx: &mut Ctx<'_>) -> Option<Text> {
        let value = self.non_empty_string(ctx)?;
        Some(Text { value, path: self.path.clone(), span: self.span() })
    }

    pub(crate) fn bool(&self, ctx: &mut Ctx<'_>) -> Option<bool> {
        let b = self.value.as_bool();
        if b.is_none() {
            self.wrong_type(ctx, "a boolean (true or false)");
        }
        b
    }

    pub(crate) fn int(&self, ctx: &mut Ctx<'_>) -> Option<i64> {
        let n = self.value.as_integer();
        if n.is_none() {
            self.wrong_type(ctx, "an integer");
        }
        n
    }

    /// An integer in `[min, max]`.
    pub(crate) fn int_in(&self, ctx: &mut Ctx<'_>, min: i64, max: i64) -> Option<i64> {
        let n = self.int(ctx)?;
        if n < min {
            self.invalid(ctx, n, &format!("must be at least {min}"), None);
            return None;
        }
        if n > max {
            self.invalid(ctx, n, &format!("must be at most {max}"), None);
            return None;
        }
        Some(n)
    }

    /// A number; integers are accepted where a float is expected.
    pub(crate) fn number(&self, ctx: &mut Ctx<'_>) -> Option<f64> {
        #[allow(clippy::cast_precision_loss, reason = "settings are far below 2^53")]
        let n = match self.value.as_ref() {
            ValueInner::Float(f) => Some(*f),
            ValueInner::Integer(i) => Some(*i as f64),
            _ => None,
        };
        if n.is_none() {
            self.wrong_type(ctx, "a number");
        }
        n
    }

    pub(crate) fn array(&self, ctx: &mut Ctx<'_>, expected: &str) -> Option<Vec<Field<'v, 'de>>> {
        let Some(items) = self.value.as_array() else {
            self.wrong_type(ctx, expected);
            return None;
        };
        let fields = items.iter().enumerate().map(|(i, value)| Field { path: self.path.index(i), value }).collect();
        Some(fields)
    }

    /// An array of non-empty strings; `None` if the value or any item was invalid (all reported).
    pub(crate) fn strings(&self, ctx: &mut Ctx<'_>) -> Option<Vec<Text>> {
        let items = self.array(ctx, "an array of strings")?;
        let texts: Vec<Option<Text>> = items.iter().map(|f| f.text(ctx)).collect();
        texts.into_iter().collect()
    }

    /// A non-empty array of non-empty strings, each appearing once.
    pub(crate) fn unique_strings(&self, ctx: &mut Ctx<'_>) -> Option<Vec<Text>> {
        let texts = self.strings(ctx)?;
        if texts.is_empty() {
            self.invalid(ctx, "[]", "must list at least one value", None);
            return None;
        }
        let mut ok = true;
        for (i, t) in texts.iter().enumerate() {
            if let Some(first) = texts[..i].iter().find(|p| p.value == t.value) {
                let message = format!(
                    "\"{}\" is listed twice in {} (first at {})",
                    t.value,
                    self.path.short(),
                    ctx.at(ctx.loc(first.span))
                );
                ctx.report(t.span, &t.path, message, None);
                ok = false;
            }
        }
        ok.then_some(texts)
    }

    pub(crate) fn obj(&self, ctx: &mut Ctx<'_>) -> Option<Obj<'v, 'de>> {
        Obj::open(ctx, self.path.clone(), self.value)
    }
}

/// `a string ("x")`, `an integer (3)`: what the user wrote, in words.
pub(crate) fn describe(value: &ValueInner<'_>) -> String {
    match value {
        ValueInner::String(s) => format!("a string (\"{}\")", clip(s)),
        ValueInner::Integer(i) => format!("an integer ({i})"),
        ValueInner::Float(f) => format!("a float ({f})"),
        ValueInner::Boolean(b) => format!("a boolean ({b})"),
        ValueInner::Array(_) => "an array".to_owned(),
        ValueInner::Table(_) => "a table".to_owned(),
    }
}

/// Keeps quoted user input short in messages.
pub(crate) fn clip(s: &str) -> String {
    const MAX_SHOWN_CHARS: usize = 60;
    let escaped = s.escape_debug().to_string();
    if escaped.chars().count() <= MAX_SHOWN_CHARS {
        escaped
    } else {
        let head: String = escaped.chars().take(MAX_SHOWN_CHARS).collect();
        format!("{head}...")
    }
}

/// A hint for the common type mistakes: numbers in quotes, a single string for a list.
fn type_hint(expected: &str, found: &ValueInner<'_>) -> Option<String> {
    match found {
        ValueInner::String(s) if expected.starts_with("an integer") && s.trim().parse::<i64>().is_ok() => {
            Some(format!("write {} without quotes", s.trim()))
        }
        ValueInner::String(s) if expected.starts_with("a number") && s.trim().parse::<f64>().is_ok() => {
            Some(format!("write {} without quotes", s.trim()))
        }
        ValueInner::String(s) if expected.starts_with("a boolean") && matches!(s.as_ref(), "true" | "false") => {
            Some(format!("write {s} without quotes"))
        }
        ValueInner::String(s) if expected.starts_with("an array of strings") => {
            Some(format!("write a list, even for one value: [\"{}\"]", clip(s)))
        }
        ValueInner::Integer(i) if expected.starts_with("a string") => Some(format!("write \"{i}\" in quotes")),
        _ => None,
    }
}

/// The known word closest to `word`, if one is close enough to be a likely typo.
pub(crate) fn closest<'a>(word: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    const MIN_SIMILARITY: f64 = 0.8;
    const MAX_EDITS: usize = 2;
    let lower = word.to_lowercase();
    known
        .into_iter()
        .map(|k| (k, strsim::jaro_winkler(&lower, &k.to_lowercase())))
        .filter(|&(k, score)| {
            score >= MIN_SIMILARITY || (k.len() > 3 && strsim::levenshtein(&lower, &k.to_lowercase()) <= MAX_EDITS)
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _)| k)
        .filter(|k| *k != word)
}

/// `did you mean "x"?` when a known word is close to `word`.
pub(crate) fn did_you_mean<'a>(word: &str, known: impl IntoIterator<Item = &'a str>) -> Option<String> {
    closest(word, known).map(|k| format!("did you mean \"{k}\"?"))
}

/// The longest a dataset, task or pool name may be: it becomes a folder and file name.
pub(crate) const MAX_NAME_LEN: usize = 63;

/// True when `name` matches `^[a-z][a-z0-9_]{0,62}$`.
pub(crate) fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name.len() <= MAX_NAME_LEN
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Reports a dataset, task or pool name that cannot be used as a path segment.
pub(crate) fn check_name(ctx: &mut Ctx<'_>, kind: &str, name: &str, span: Span, path: &Path) -> bool {
    if is_valid_name(name) {
        return true;
    }
    let message = format!(
        "invalid {kind} name \"{}\": names must start with a lowercase letter and contain only \
         lowercase letters, digits and \"_\", at most {MAX_NAME_LEN} characters, because they become \
         folder and file names",
        clip(name)
    );
    let help = name_suggestion(name).map(|s| format!("try \"{s}\""));
    ctx.report(span, path, message, help);
    false
}

/// A valid name close to an invalid one: lowercased, other characters turned into `_`.
fn name_suggestion(name: &str) -> Option<String> {
    let mapped: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    let trimmed = mapped.trim_matches('_');
    let start = trimmed.find(|c: char| c.is_ascii_lowercase())?;
    let candidate: String = trimmed[start..].chars().take(MAX_NAME_LEN).collect();
    is_valid_name(&candidate).then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_paths_so_only_a_safe_alphabet_is_allowed() {
        assert!(is_valid_name("daily_stats2"));
        for bad in ["", "../x", "Events", "2fa", "_x", "a-b", "a.b", &"a".repeat(64)] {
            assert!(!is_valid_name(bad), "{bad:?} should be rejected");
        }
        assert_eq!(name_suggestion("../Raw-Events").as_deref(), Some("raw_events"));
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let text = "a = 1\né = \"x\"\n";
        let ctx = Ctx::new("f.toml", text);
        let offset = text.rfind('=').unwrap_or(0);
        assert_eq!(ctx.loc(Span::new(offset, offset + 1)), Loc { line: 2, col: 3 });
    }

    #[test]
    fn typos_get_a_suggestion_and_unrelated_words_do_not() {
        assert_eq!(closest("retires", ["retry", "inputs"]), Some("retry"));
        assert_eq!(closest("zzz", ["retry", "inputs"]), None);
    }
}
